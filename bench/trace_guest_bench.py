"""glass trace --vm: what timing every call of a unikernel costs the guest (called by
bench/run; `bench/run trace-guest` runs only this). Results replace the text between
the glass-trace-guest markers of docs/benchmarks.md.

All in one run, on the demo unikernel built to time its own calls (guests/demo/build.sh
OUT ROUNDS TICKS: rdtsc around every call of alpha, beta, gamma_ and tick, a function
whose body is two instructions, called TICKS times a round), one vCPU, QEMU TCG:

- the probe's instructions per call: under `-icount shift=0` the guest's TSC counts its
  instructions, so the guest's own median per call with glass tracing minus without is
  what the probe adds, to the instruction; against the process probe's path, counted by
  single-stepping one call of an empty function with gdb (bench/probe_path.c and .py)
  with and without `glass trace` (hardware counters count nothing on these VMs);
- the guest's slowdown at about 1, 100 and 10,000 traced calls per millisecond, the rate
  read from the trace (calls of the traced function over run_workload's one call): the
  guest's work time by its own clock (its `rate` lines; under TCG without icount the TSC
  follows the host's clock) and the run's wall time, alone and under glass;
- the stop glass holds the VM for at attach and at detach (`glass trace --qmp`: the
  notes it prints), a fresh VM each time (a traced VM keeps glass's region);
- the breakpoint floor (crates/glass-target/examples/int3_floor.rs, DRAKVUF's design:
  the VM stops at the entry and at the return of each call) on the same function, tick at
  about 100 calls/ms: its cost per call against glass's.
"""

import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import section

ROOT = Path(__file__).resolve().parent.parent
GLASS = ROOT / "target" / "release" / "glass"
INT3_FLOOR = ROOT / "target" / "release" / "examples" / "int3_floor"
BEGIN = "<!-- glass-trace-guest:begin -->"
END = "<!-- glass-trace-guest:end -->"
QEMU = ["qemu-system-x86_64", "-accel", "tcg,thread=single", "-smp", "1", "-display", "none",
        "-nodefaults", "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"]
# (name, TICKS a round, rounds, spin loop a unit, functions traced, the function whose
# calls make the rate): a round of the demo takes about 0.2 ms, so one call a round is
# 5 a millisecond; the first guest's units are 5 times longer.
RATES = [
    ("~1 call/ms", 0, 3000, 100000, "run_workload,alpha", "alpha"),
    ("~100 calls/ms", 20, 12000, 20000, "run_workload,tick", "tick"),
    ("~10,000 calls/ms", 8000, 1000, 20000, "run_workload,tick", "tick"),
]
INT3_CALLS = 2000


def reps():
    return max(int(os.environ.get("GLASS_BENCH_REPS", "3")), 1)


def build(work, rounds, ticks, units=20000):
    out = work / f"guest-{rounds}-{ticks}-{units}"
    if not out.exists():
        subprocess.run([str(ROOT / "guests" / "demo" / "build.sh"), str(out), str(rounds), str(ticks)],
                       check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, UNIT_ITERATIONS=str(units)))
    return out


def symbol(elf, name):
    for line in subprocess.run(["nm", str(elf)], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == name:
            return int(parts[0], 16)
    raise RuntimeError(f"no {name} in {elf}")


def guest_output(text):
    """The guest's own figures: per function (calls, p50, min), and its `rate` lines'
    cycles, one a chunk of 200 rounds (the last partial chunk is not printed)."""
    own = {}
    for m in re.finditer(r"^self (\S+) calls=(\d+) p50=(\d+) min=(\d+)$", text, re.M):
        own[m.group(1)] = (int(m.group(2)), int(m.group(3)), int(m.group(4)))
    chunks = [int(c) for c in re.findall(r"^rate rounds=200 cycles=(\d+)$", text, re.M)]
    if not text.rstrip().endswith("done"):
        raise RuntimeError(f"the guest did not finish:\n{text[-400:]}")
    return own, chunks


def run_guest(work, guest, icount, functions=None, lossless=True):
    """One run of the guest to its end, alone or under `glass trace --vm -f functions`:
    (its own figures, the sum of its rate cycles, wall seconds, glass's counts and the
    records it lost)."""
    serial = work / "serial"
    serial.unlink(missing_ok=True)
    command = [*QEMU, *(["-icount", "shift=0"] if icount else []), "-m", "64", "-serial", f"file:{serial}",
               "-kernel", str(guest / "guest-fp.img")]
    recording = work / "guest.glass"
    if functions:
        command = [str(GLASS), "trace", "--vm", "-o", str(recording), "-f", functions, "--symbols",
                   str(guest / "guest-fp.elf"), "--", *command]
    started = time.monotonic()
    run = subprocess.run(command, capture_output=True, text=True)
    wall = time.monotonic() - started
    # The guest powers off through isa-debug-exit: QEMU's (and glass's) status 1.
    if run.returncode != 1:
        raise RuntimeError(f"{command[:3]} ended {run.returncode}:\n{run.stderr[-2000:]}")
    own, chunks = guest_output(serial.read_text())
    counts = None
    if functions:
        m = re.search(r"(\d+) records from .*; (\d+) lost", run.stderr)
        if not m or (lossless and int(m.group(2)) != 0):
            raise RuntimeError(f"glass lost records or did not say:\n{run.stderr}")
        counts = calls(recording)
        counts["records"], counts["lost"] = int(m.group(1)), int(m.group(2))
        rate = re.search(r"cycle rate ([\d.]+) GHz", run.stderr)
        counts["ghz"] = float(rate.group(1)) if rate else float("nan")
        counts["bytes"] = recording.stat().st_size
        recording.unlink()
    return own, chunks, wall, counts


UNITS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def calls(recording):
    """`glass report --format calls`: per function (calls, total seconds, p50 seconds)."""
    out = subprocess.run([str(GLASS), "report", str(recording), "--format", "calls"], capture_output=True,
                         text=True, check=True).stdout
    result = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) < 11 or not f[0].isdigit():
            continue
        # calls, total, self, self cycles, min, p50, p50 cycles, p99, max, the name (then
        # notes such as "(1 unwound)").
        try:
            total = float(f[1]) * UNITS[f[2]]
            p50 = float(f[8]) * UNITS[f[9]]
        except (KeyError, ValueError, IndexError):
            continue
        result[f[15]] = (int(f[0]), total, p50)
    return result


def instructions(work):
    """The guest's median instructions per call under -icount shift=0, alone and traced."""
    ticks = 50
    guest = build(work, 1200, ticks)
    alone, alone_chunks, _, _ = run_guest(work, guest, True)
    traced, traced_chunks, _, counts = run_guest(work, guest, True, "alpha,beta,gamma_,tick")
    for name in ("alpha", "beta", "gamma_", "tick"):
        if traced[name][0] != counts[name][0]:
            raise RuntimeError(f"{name}: the guest counted {traced[name][0]} calls, glass {counts[name][0]}")
    calls_made = sum(traced[name][0] for name in ("alpha", "beta", "gamma_", "tick"))
    # As docs/guests.md measured it first: the median chunk of 200 rounds (the first, which
    # holds the stop to patch, is not it), traced less alone, over its calls.
    per_chunk = 200 * (3 + ticks)
    return {"alone": alone, "traced": traced,
            "per_call_from_rate": (statistics.median(traced_chunks) - statistics.median(alone_chunks)) / per_chunk,
            "per_chunk": per_chunk, "calls": calls_made}


def process_probe(work):
    """Instructions of one call of `empty`, single-stepped by gdb, alone and traced."""
    program = work / "probe_path"
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", str(ROOT / "bench" / "probe_path.c"), "-o",
                    str(program)], check=True)
    counts = {}
    for name, command in (("alone", [str(program)]),
                          ("glass", [str(GLASS), "trace", "-o", str(work / "probe.glass"), "-f", "empty", "--",
                                     str(program)])):
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        pid = int(proc.stdout.readline())
        out = subprocess.run(["gdb", "-nx", "-batch", "-p", str(pid), "-x", str(ROOT / "bench" / "probe_path.py")],
                             capture_output=True, text=True, timeout=120).stdout
        proc.communicate(timeout=60)
        m = re.search(r"^instructions ([\d ]+)$", out, re.M)
        if not m:
            raise RuntimeError(f"gdb counted nothing ({name}):\n{out[-1000:]}")
        counts[name] = statistics.median(int(c) for c in m.group(1).split())
    (work / "probe.glass").unlink(missing_ok=True)
    return counts


def slowdown(work):
    results = {}
    for name, ticks, rounds, units, functions, counted in RATES:
        guest = build(work, rounds, ticks, units)
        runs = {"alone": [], "glass": []}
        for rep in range(reps()):
            for mode in (("alone", "glass") if rep % 2 == 0 else ("glass", "alone")):
                own, chunks, wall, counts = run_guest(work, guest, False, functions if mode == "glass" else None,
                                                      lossless=False)
                # The guest's clock over its run (every 200-round chunk but the last, partial).
                cycles = sum(chunks)
                entry = {"own": own, "cycles": cycles, "wall": wall}
                if counts:
                    # A full ring drops records (and says so): the calls lost with them.
                    if counts["lost"] == 0 and own[counted][0] != counts[counted][0]:
                        raise RuntimeError(f"{counted}: the guest counted {own[counted][0]}, glass {counts[counted][0]}")
                    entry["lost"] = counts["lost"] / (counts["records"] + counts["lost"])
                    entry["rate_per_ms"] = counts[counted][0] / (counts["run_workload"][1] * 1e3)
                    entry["calls"] = counts[counted][0]
                    entry["ghz"] = counts["ghz"]
                    entry["bytes"] = counts["bytes"]
                    entry["glass_p50"] = counts[counted][2]
                runs[mode].append(entry)
                print(f"bench: trace-guest {name} {mode}: wall {wall:.2f} s, guest clock {cycles / 1e9:.3f} G "
                      f"cycles{', %.0f calls/ms' % entry['rate_per_ms'] if counts else ''}", file=sys.stderr)
        results[name] = {"runs": runs, "counted": counted, "functions": functions, "ticks": ticks,
                         "rounds": rounds, "units": units}
    return results


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_vm(work, guest, extra):
    proc = subprocess.Popen([*QEMU, "-serial", f"file:{work / 'vm-serial'}", *extra, "-kernel",
                             str(guest / "guest-fp.img")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while (work / "vm-serial").read_text(errors="replace").count("rate") < 2 if (work / "vm-serial").exists() else True:
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("the guest did not start")
        time.sleep(0.05)
    return proc


def stop_vm(work, proc):
    proc.kill()
    proc.wait()
    (work / "vm-serial").unlink(missing_ok=True)


def attach_detach(work):
    """Per fresh VM: glass trace --qmp's own account of the stop at attach and detach."""
    guest = build(work, 0, RATES[1][1])
    stops = []
    for _ in range(reps()):
        qmp = work / "vm.qmp"
        proc = start_vm(work, guest, ["-m", "64,slots=1,maxmem=1G", "-qmp", f"unix:{qmp},server=on,wait=off"])
        try:
            run = subprocess.run([str(GLASS), "trace", "--qmp", str(qmp), "--symbols", str(guest / "guest-fp.elf"),
                                  "-f", "alpha,beta,gamma_,tick", "-d", "1", "-o", str(work / "qmp.glass")],
                                 capture_output=True, text=True)
        finally:
            stop_vm(work, proc)
        attach = re.search(r"the VM stopped ([\d.]+) ms to patch", run.stderr)
        detach = re.search(r"detached: the VM stopped ([\d.]+) ms", run.stderr)
        if run.returncode != 0 or not attach or not detach:
            raise RuntimeError(f"glass trace --qmp:\n{run.stderr}")
        stops.append((float(attach.group(1)), float(detach.group(1))))
        print(f"bench: trace-guest attach {stops[-1][0]} ms, detach {stops[-1][1]} ms", file=sys.stderr)
    (work / "qmp.glass").unlink(missing_ok=True)
    return stops


def int3(work):
    """The breakpoint floor on tick at ~100 calls/ms (the guest of RATES[1], run forever)."""
    guest = build(work, 0, RATES[1][1])
    address = f"127.0.0.1:{free_port()}"
    proc = start_vm(work, guest, ["-m", "64", "-gdb", f"tcp:{address}"])
    try:
        out = subprocess.run([str(INT3_FLOOR), address, hex(symbol(guest / "guest-fp.elf", "tick")),
                              str(INT3_CALLS)], capture_output=True, text=True, timeout=300)
    finally:
        stop_vm(work, proc)
    if out.returncode != 0:
        raise RuntimeError(f"int3_floor: {out.stderr}")
    f = out.stdout.split()
    figures = {f[i]: float(f[i + 1]) for i in range(0, len(f) - 1, 2)}
    print(f"bench: trace-guest int3 floor: {figures}", file=sys.stderr)
    return figures


def med(values):
    return statistics.median(values) if values else float("nan")


def markdown(r):
    ins, probe = r["instructions"], r["process"]
    rows = []
    for name in ("alpha", "beta", "gamma_", "tick"):
        a, t = ins["alone"][name], ins["traced"][name]
        rows.append(f"| {name} | {t[0]} | {a[1]} | {t[1]} | {t[1] - a[1]} |")
    slow_rows = []
    # Under TCG without icount the guest's TSC is the host's: glass's cycle rate.
    ghz = med([x["ghz"] for s in r["slowdown"].values() for x in s["runs"]["glass"]])
    for name, s in r["slowdown"].items():
        alone, glass = s["runs"]["alone"], s["runs"]["glass"]
        rate = med([x["rate_per_ms"] for x in glass])
        clock_a, clock_g = med([x["cycles"] for x in alone]), med([x["cycles"] for x in glass])
        wall_a, wall_g = med([x["wall"] for x in alone]), med([x["wall"] for x in glass])
        # The guest's own count: glass's is short by the calls a full ring dropped.
        calls_n = glass[0]["own"][s["counted"]][0]
        own_a = med([x["own"][s["counted"]][1] for x in alone])
        own_g = med([x["own"][s["counted"]][1] for x in glass])
        cost_ns = (clock_g - clock_a) / calls_n / ghz
        s["cost_ns"] = cost_ns
        slow_rows.append(
            f"| {name} | `{s['functions']}`, {s['rounds']} rounds, tick {s['ticks']}/round, units of {s['units']:,} | "
            f"{calls_n:,} | "
            f"{rate:,.0f} | {clock_a / ghz / 1e9:.3f} / {clock_g / ghz / 1e9:.3f} s | {100 * (clock_g / clock_a - 1):+.1f}% | "
            f"{wall_a:.2f} / {wall_g:.2f} s | {100 * (wall_g / wall_a - 1):+.1f}% | {own_a:,.0f} / {own_g:,.0f} | "
            f"{cost_ns:.0f} ns | {100 * med([x['lost'] for x in glass]):.2f}% | "
            f"{med([x['bytes'] for x in glass]) / calls_n:.1f} |")
    attach = [a for a, _ in r["attach"]]
    detach = [d for _, d in r["attach"]]
    floor = r["int3"]
    mid = r["slowdown"][RATES[1][0]]
    alone_runs = mid["runs"]["alone"]
    # The time a call of tick takes alone at this rate, the guest's work time over its calls.
    untraced_us = med([x["cycles"] for x in alone_runs]) / ghz / 1e3 / alone_runs[0]["own"]["tick"][0]
    int3_cost_us = floor["per_call_us"] - untraced_us
    # glass's cost a call as the guest itself sees it: its median call of tick traced less
    # alone (the work-time figure of the table is the same cost buried in the host's noise).
    own = [med([x["own"]["tick"][1] for x in mid["runs"][mode]]) for mode in ("alone", "glass")]
    glass_cost_us = (own[1] - own[0]) / ghz / 1e3
    probe_added = probe["glass"] - probe["alone"]
    guest_added = ins["traced"]["tick"][1] - ins["alone"]["tick"][1]
    return [
        BEGIN,
        "## glass trace --vm: the cost of timing every call of a unikernel",
        "",
        f"Measured {r['date']} ({r['qemu']}), load average {r['load'][0]:.1f} at the start and "
        f"{r['load'][1]:.1f} at the end, {reps()} runs a configuration; `./x bench trace-guest` (or "
        "`bench/run trace-guest` after the release build), {:.1f} min. The demo unikernel built to time its own "
        "calls (`guests/demo/build.sh OUT ROUNDS TICKS`: rdtsc before and after every call of alpha, beta, gamma_ "
        "and of `tick`, a function whose body is two instructions, called TICKS times a round; the guest prints "
        "each function's calls and median), one vCPU (`-smp 1`), `-accel tcg,thread=single`.".format(r["minutes"]),
        "",
        "### Instructions the probe adds to a call",
        "",
        "Under `-icount shift=0` the guest's TSC counts its instructions: the guest's own median per call with "
        "`glass trace --vm -f alpha,beta,gamma_,tick` minus without is what the probe adds (1200 rounds, tick 50 "
        "a round; the guest's counts equal glass's).",
        "",
        "| function | calls | median alone | median traced | added by the probe |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"From the guest's `rate` lines instead (its whole clock, traced minus alone, over the {ins['calls']:,} "
        f"traced calls): {ins['per_call_from_rate']:.1f} instructions a call.",
        "",
        f"**The guest probe adds {guest_added} instructions to a call; the process probe adds "
        f"{probe_added:.0f}.** The process figure is one call of `empty` (two instructions) in "
        "bench/probe_path.c single-stepped by gdb from its call to its return, alone "
        f"({probe['alone']:.0f}: call, body, ret) and under `glass trace -f empty` ({probe['glass']:.0f}: the "
        "entry jump, the trampoline, glass_enter with its shadow-stack push and record, the function, the exit "
        "stub and its record), median of 5 calls. `perf stat -e instructions` would count it without stepping, "
        "but this VM has no hardware counters. The guest's trampoline keeps no per-thread state (it calls the "
        "function and is returned to) and reserves each record with a `lock cmpxchg` on the ring's head.",
        "",
        "### The guest's slowdown by rate of traced calls",
        "",
        "The rate is glass's: the traced function's calls over the time of run_workload's one call (traced with "
        "it). Work time is the guest's own clock summed over its `rate` lines (under TCG without icount its TSC "
        "follows the host's clock), so QEMU's start and glass's set-up are out of it; wall time is the whole "
        "run's, QEMU's boot and, under glass, patching and writing the recording included. Median of "
        f"{reps()} runs each, alone and traced in alternate order. The guest's median is its own rdtsc around "
        f"the counted function's calls, in TSC cycles ({ghz:.3f} GHz: the guest's TSC under TCG is the host's).",
        "",
        "| rate | traced | calls (the guest's count) | calls/ms | work time alone / glass | slowdown | wall alone / glass | "
        "slowdown | guest's median alone / glass | cost a call | records lost | recording bytes a call |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *slow_rows,
        "",
        "### The stop at attach and at detach",
        "",
        f"`glass trace --qmp SOCKET -f alpha,beta,gamma_,tick -d 1` on a running guest (tick {RATES[1][1]} a round), a "
        "fresh VM each time (`-m 64,slots=1,maxmem=1G`), glass's own notes: the VM stopped to hot-plug nothing "
        "(the region is plugged while it runs), map the region, write four trampolines and four entry jumps, and "
        "at the end to put the bytes back and read them again.",
        "",
        "| | median | runs |",
        "|---|---|---|",
        f"| attach: VM stopped to patch | {med(attach):.1f} ms | {', '.join(f'{a:.1f}' for a in attach)} |",
        f"| detach: VM stopped to restore | {med(detach):.1f} ms | {', '.join(f'{d:.1f}' for d in detach)} |",
        "",
        "### Against the breakpoint floor",
        "",
        "`int3_floor` (crates/glass-target/examples/int3_floor.rs), DRAKVUF's design through glass's own RSP "
        "client: a breakpoint on tick's entry stops the VM; the client reads rsp and the return address, moves "
        "the breakpoint there and lets the VM run; the return stops it again and the breakpoint goes back to the "
        f"entry. {INT3_CALLS} calls of tick in the guest at about 100 calls/ms (run forever). Most of the wall "
        "time a call lies outside the stops as the client sees them: QEMU 7.2 drops all its translated code "
        "whenever a breakpoint is set or removed (`breakpoint_invalidate` calls `tb_flush`), four times a call "
        "here, so the guest runs on from freshly translated code, and each stop and resume passes through "
        "QEMU's main loop.",
        "",
        "| | per call |",
        "|---|---|",
        f"| int3 floor: wall time a call ({floor['calls_per_s']:,.0f} calls/s) | {floor['per_call_us']:.1f} us |",
        f"| int3 floor: VM held stopped (two stops, client's view) | {floor['stopped_per_call_us']:.1f} us "
        f"(entry stop p50 {floor['entry_stop_p50_us']:.1f} us, return stop p50 {floor['return_stop_p50_us']:.1f} us) |",
        f"| int3 floor: cost a call (wall a call less tick's untraced {untraced_us:.2f} us) | {int3_cost_us:.1f} us |",
        f"| glass: cost a call (the guest's median call of tick, {own[1]:.0f} cycles traced less {own[0]:.0f} "
        f"alone) | {glass_cost_us * 1e3:.0f} ns |",
        f"| glass: cost a call (work time traced less alone, over the calls: the table above) | "
        f"{mid['cost_ns']:.0f} ns |",
        "",
        f"**A call costs the guest {int3_cost_us / glass_cost_us:,.0f}x more under the breakpoint floor than "
        f"under glass ({int3_cost_us:.1f} us against {glass_cost_us * 1e3:.0f} ns): glass / int3 = "
        f"{glass_cost_us / int3_cost_us:.5f}.**",
        END,
    ]


def write_section(text):
    section.replace(BEGIN, END, text)


def run(work):
    for path, what in ((GLASS, "cargo build --release -p glass"),
                       (INT3_FLOOR, "cargo build --release -p glass-target --example int3_floor")):
        if not path.exists():
            sys.exit(f"bench: {path} is missing: run `{what}`")
    if not shutil.which("gdb"):
        sys.exit("bench: gdb is missing (apt-get install gdb)")
    started = time.monotonic()
    work = Path(work) / "trace-guest"
    work.mkdir(parents=True, exist_ok=True)
    version = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True).stdout
    r = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "qemu": version.split("\n")[0],
         "load": [os.getloadavg()[0]]}
    r["instructions"] = instructions(work)
    print(f"bench: trace-guest instructions: {r['instructions']}", file=sys.stderr)
    r["process"] = process_probe(work)
    print(f"bench: trace-guest process probe: {r['process']}", file=sys.stderr)
    r["slowdown"] = slowdown(work)
    r["attach"] = attach_detach(work)
    r["int3"] = int3(work)
    r["load"].append(os.getloadavg()[0])
    r["minutes"] = (time.monotonic() - started) / 60
    write_section("\n".join(markdown(r)))
