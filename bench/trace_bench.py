"""glass trace benchmarks, against uftrace in the same run (called by bench/run; `bench/run
trace` runs only these). Results replace the text between the glass-trace markers of
docs/benchmarks.md.

1. Cost per instrumented call (entry + exit) on tests/fixtures/trace/callloop.c, from the
   fixture's own timing of its loop (a tool's start-up and shut-down are not the target's
   cost): glass -f tiny; uftrace on a -pg build; uftrace -P tiny and -P . on the
   unmodified -O2 binary. Bytes written per call.
2. Coverage with every function asked for: functions glass instruments (-f '*') against
   what uftrace -P . patches (its `dynamic patch stats`), on xz, gzip and python3, and
   whether both runs print exactly what the program prints alone.
3. Sustained drain throughput: records per second with 1, 2 and 4 producing threads, and
   how many were lost.
4. The floor, per exit path, in the same run: ns and cycles per traced call against two
   back-to-back rdtsc (every call's two timestamps), for C's two exit paths (callloop.c's
   `tiny` at its return sites, and with its return address replaced: the figures of 1.)
   and the Go exit path
   (tests/fixtures/trace/goloop.go's `main.tiny`, entry and each `ret` patched), with
   uprobes on the same Go function (`perf probe`, counted by `perf stat`) as the anchor.
"""

import os
import re
import shutil
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import section

ROOT = Path(__file__).resolve().parent.parent
GLASS = ROOT / "target" / "release" / "glass"
CALLLOOP = ROOT / "tests" / "fixtures" / "trace" / "callloop.c"
GOLOOP = ROOT / "tests" / "fixtures" / "trace" / "goloop.go"
BEGIN = "<!-- glass-trace:begin -->"
END = "<!-- glass-trace:end -->"
CALLS = int(os.environ.get("GLASS_BENCH_CALLS", "20000000"))
# Records per thread ring in the throughput runs: with more producing threads than
# cores, the drain is sometimes not scheduled for a few milliseconds.
RING = 4 << 20
# The Go exit path: GO_ROUNDS rounds of GO_CALLS calls of goloop's main.tiny, 100 ms
# apart. glass's Go records are three words each and its drain of them is slower than
# the probe on a 2-CPU machine, so one long loop overflows the ring and a lost record
# costs the probe no rdtsc: the rounds (6 words a call, 3 M words a round in a ring of
# GO_RING words) let the drain empty the ring between them, so that every record is
# kept and the ring's pages are touched once, as the C path's are in its 20 M calls.
GO_CALLS = 500_000
GO_ROUNDS = int(os.environ.get("GLASS_BENCH_GO_ROUNDS", "20"))
GO_RING = 4 << 20
# Calls under uprobes (each one a trap into the kernel: microseconds).
UPROBE_CALLS = int(os.environ.get("GLASS_BENCH_UPROBE_CALLS", "100000"))
# Back-to-back rdtsc pairs timed for the floor.
PAIRS = 5_000_000


def reps():
    return int(os.environ.get("GLASS_BENCH_REPS", "3"))


def work_seconds(command, cwd):
    env = dict(os.environ, GLASS_FIXTURE_TIMING="1")
    run = subprocess.run(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    if run.returncode != 0:
        raise RuntimeError(f"{command} failed ({run.returncode}): {run.stderr[-2000:]}")
    match = re.search(r"work_seconds=([0-9.]+)", run.stderr)
    if not match:
        raise RuntimeError(f"no timing from {command}: {run.stderr[-2000:]}")
    return float(match.group(1)), run


def size_of(path):
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


RDTSC_C = r"""
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>
int main(void) {
    struct timespec a, b;
    unsigned long sum = 0;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < 20000000; i++) sum += __rdtsc();
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.3f %lu\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 2e7, sum & 1);
    return 0;
}
"""


def rdtsc_ns(work):
    """What one rdtsc costs here: every timestamp of every tracer pays it."""
    source = work / "rdtsc.c"
    source.write_text(RDTSC_C)
    subprocess.run(["gcc", "-O2", str(source), "-o", str(work / "rdtsc")], check=True)
    runs = [float(subprocess.run([str(work / "rdtsc")], capture_output=True, text=True, check=True)
                  .stdout.split()[0]) for _ in range(reps())]
    return statistics.median(runs)


def per_call(work):
    binary = work / "callloop"
    pg = work / "callloop_pg"
    subprocess.run(["gcc", "-O2", "-g", str(CALLLOOP), "-o", str(binary), "-lpthread"], check=True)
    subprocess.run(["gcc", "-O2", "-g", "-pg", str(CALLLOOP), "-o", str(pg), "-lpthread"], check=True)
    n = str(CALLS)
    tools = {
        "native": lambda out: [str(binary), n],
        "glass trace -f tiny": lambda out: [str(GLASS), "trace", "-q", "-o", str(out), "-f", "tiny",
                                            "--", str(binary), n],
        "glass trace -f tiny --exit-probe return-address": lambda out: [
            str(GLASS), "trace", "-q", "-o", str(out), "-f", "tiny", "--exit-probe", "return-address",
            "--", str(binary), n],
        "uftrace record (-pg build)": lambda out: ["uftrace", "record", "-d", str(out), str(pg), n],
        "uftrace record -P tiny": lambda out: ["uftrace", "record", "-d", str(out), "-P", "tiny",
                                               str(binary), n],
        "uftrace record -P .": lambda out: ["uftrace", "record", "-d", str(out), "-P", ".",
                                            str(binary), n],
    }
    results = {}
    rate = None
    for name, command in tools.items():
        times, sizes = [], []
        for i in range(reps()):
            out = work / f"out-{len(results)}-{i}"
            seconds, run = work_seconds(command(out), work)
            times.append(seconds)
            if name != "native":
                sizes.append(size_of(out))
            if name.startswith("glass"):
                info = subprocess.run([str(GLASS), "info", str(out)], capture_output=True, text=True).stdout
                measured = re.search(r"cycle counter ([0-9.]+) GHz", info)
                rate = rate or (float(measured.group(1)) * 1e9 if measured else None)
                lost = re.search(r"losses:\s+(\d+) records lost", info)
                results.setdefault("glass lost", []).append(int(lost.group(1)) if lost else -1)
            shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink(missing_ok=True)
        results[name] = (statistics.median(times), statistics.median(sizes) if sizes else 0)
    lost = results.pop("glass lost", None)
    native = results["native"][0]
    rows = []
    for name, (seconds, size) in results.items():
        if name == "native":
            continue
        ns = (seconds - native) * 1e9 / CALLS
        rows.append((name, seconds, ns, ns * rate / 1e9 if rate else None, size / CALLS))
    return {"native": native, "rows": rows, "rate": rate, "lost": lost, "rdtsc": rdtsc_ns(work)}


RDTSC_PAIR_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <x86intrin.h>
/* The floor of a traced call: its two timestamps, two back-to-back rdtsc (as both of
 * glass's probes take them, without a fence). Prints ns per pair by the clock and the
 * counter ticks between the two reads of a pair, on average. */
int main(int argc, char **argv) {
    long pairs = argc > 1 ? atol(argv[1]) : 5000000;
    struct timespec a, b;
    unsigned long delta = 0;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < pairs; i++) {
        unsigned long first = __rdtsc();
        unsigned long second = __rdtsc();
        delta += second - first;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.3f %.2f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / pairs,
           (double)delta / pairs);
    return 0;
}
"""


def cpu():
    """The CPU as /proc/cpuinfo names it, with its family, model and stepping, and
    whether it runs under a hypervisor."""
    fields = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    name = fields.get("model name", "unknown")
    details = ", ".join(f"{key.split()[-1]} {fields[key]}" for key in ("cpu family", "model", "stepping")
                        if key in fields)
    text = f"{name} ({fields.get('vendor_id', '?')} {details})" if details else name
    if "hypervisor" in fields.get("flags", "").split():
        text += ", under a hypervisor"
    return text


def rdtsc_pair(work):
    """ns per pair of back-to-back rdtsc (median of the runs) and the counter ticks
    between the two reads."""
    source = work / "rdtsc_pair.c"
    source.write_text(RDTSC_PAIR_C)
    subprocess.run(["gcc", "-O2", str(source), "-o", str(work / "rdtsc_pair")], check=True)
    runs = [subprocess.run([str(work / "rdtsc_pair"), str(PAIRS)], capture_output=True, text=True,
                           check=True).stdout.split() for _ in range(reps())]
    return statistics.median(float(r[0]) for r in runs), statistics.median(float(r[1]) for r in runs)


def go_build(work):
    if not shutil.which("go"):
        install("golang-go")
    out = work / "goloop"
    env = dict(os.environ, CGO_ENABLED="1")
    if not env.get("HOME") and not env.get("XDG_CACHE_HOME"):
        env["GOCACHE"] = str(work / "gocache")
    subprocess.run(["go", "build", "-o", str(out), str(GOLOOP)], check=True, env=env, cwd=work)
    return out


def install(package):
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", package], check=True, env=env,
                   stdout=subprocess.DEVNULL)


def go_path(work, goloop):
    """goloop untraced and traced by glass -f main.tiny: seconds of loop, records lost
    and the counter rate glass measured."""
    args = [str(GO_CALLS), str(GO_ROUNDS)]
    native = statistics.median(work_seconds([str(goloop), *args, "0"], work)[0] for _ in range(reps()))
    times, lost, rate = [], [], None
    for i in range(reps()):
        out = work / f"go-{i}.glass"
        seconds, run = work_seconds([str(GLASS), "trace", "-o", str(out), "--ring-size", str(GO_RING),
                                     "--max-threads", "16", "-f", "main.tiny", "--", str(goloop), *args,
                                     "100"], work)
        summary = re.search(r"glass: (\d+) records from .*?; (\d+) lost.*?cycle rate ([0-9.]+) GHz",
                            run.stderr)
        if not summary:
            raise RuntimeError(f"no summary from glass trace of goloop: {run.stderr[-2000:]}")
        if int(summary.group(1)) + int(summary.group(2)) != 2 * GO_CALLS * GO_ROUNDS:
            raise RuntimeError(f"glass traced {summary.group(1)} + {summary.group(2)} lost records of "
                               f"goloop, not 2 per call: {run.stderr[-2000:]}")
        times.append(seconds)
        lost.append(int(summary.group(2)))
        rate = rate or float(summary.group(3)) * 1e9
        out.unlink(missing_ok=True)
    return {"native": native, "traced": statistics.median(times), "times": times, "lost": lost,
            "rate": rate, "calls": GO_CALLS * GO_ROUNDS}


def uprobes(work, goloop):
    """perf probe on goloop's main.tiny: the loop's time with an entry uprobe, and with
    an entry uprobe and a uretprobe (which replaces the return address, as Go's runtime
    does not expect), each counted by perf stat. Returns rows, or the reason there are
    none."""
    if not shutil.which("perf"):
        try:
            install("linux-perf")
        except subprocess.CalledProcessError as e:
            return f"perf is not installed and could not be ({e})"
    tracing = Path("/sys/kernel/tracing")
    mounted = False
    if not (tracing / "uprobe_events").exists() and not Path("/sys/kernel/debug/tracing/uprobe_events").exists():
        mount = subprocess.run(["mount", "-t", "tracefs", "nodev", str(tracing)], capture_output=True, text=True)
        if mount.returncode != 0 or not (tracing / "uprobe_events").exists():
            return f"no tracefs with uprobe_events here (mount -t tracefs: {mount.stderr.strip() or 'no uprobe_events'})"
        mounted = True
    group = "glassbench"
    events = {}
    # Left by an interrupted run, they would make perf probe refuse the names.
    subprocess.run(["perf", "probe", "-q", "-d", f"{group}:*"], capture_output=True)
    try:
        for key, spec in (("entry", f"{group}:goloop_tiny=main.tiny"),
                          ("return", f"{group}:goloop_tiny_exit=main.tiny%return")):
            added = subprocess.run(["perf", "probe", "-x", str(goloop), spec], capture_output=True, text=True)
            name = re.search(rf"({group}:\S+)", added.stdout + added.stderr) if added.returncode == 0 else None
            if not name:
                if key == "entry":
                    return f"`perf probe -x goloop main.tiny` failed: {(added.stdout + added.stderr).strip()[-300:]}"
                events[key] = None
                events["return_error"] = (added.stdout + added.stderr).strip()[-300:]
                continue
            events[key] = name.group(1)
        cases = [("uprobe on entry (`perf probe -x goloop main.tiny`)", [events["entry"]])]
        if events.get("return"):
            cases.append(("uprobe on entry + uretprobe (`main.tiny%return`)", [events["entry"], events["return"]]))
        rows = []
        for label, evs in cases:
            times, outcome = [], "ok"
            for i in range(reps()):
                stat = work / f"uprobe-{i}.stat"
                env = dict(os.environ, GLASS_FIXTURE_TIMING="1")
                run = subprocess.run(["perf", "stat", "-x,", "-o", str(stat), "-e", ",".join(evs), "--",
                                      str(goloop), str(UPROBE_CALLS), "1", "0"], capture_output=True, text=True,
                                     env=env, cwd=work)
                if run.returncode != 0:
                    outcome = f"goloop failed under it (exit {run.returncode}): {run.stderr.strip()[-200:]}"
                    break
                counts = [int(line.split(",")[0]) for line in stat.read_text().splitlines()
                          if line and not line.startswith("#") and line.split(",")[0].isdigit()]
                if counts != [UPROBE_CALLS] * len(evs):
                    outcome = f"perf stat counted {counts}, not {UPROBE_CALLS} each"
                    break
                times.append(float(re.search(r"work_seconds=([0-9.]+)", run.stderr).group(1)))
            rows.append({"name": label, "seconds": statistics.median(times) if outcome == "ok" else None,
                         "outcome": outcome})
        if not events.get("return"):
            rows.append({"name": "uprobe on entry + uretprobe (`main.tiny%return`)", "seconds": None,
                         "outcome": f"perf probe refused it: {events.get('return_error')}"})
        return rows
    finally:
        subprocess.run(["perf", "probe", "-q", "-d", f"{group}:*"], capture_output=True)
        if mounted:
            subprocess.run(["umount", str(tracing)], capture_output=True)


def exit_paths(work, calls):
    """Issue 33's floor: each exit path's cost per call against two rdtsc, and uprobes
    on the same Go function, all in this run."""
    pair_ns, pair_ticks = rdtsc_pair(work)
    goloop = go_build(work)
    go = go_path(work, goloop)
    rate = go["rate"] or calls["rate"]
    c_native = calls["native"]
    traced = {name: seconds for name, seconds, *_ in calls["rows"]}
    rows = [{"name": "glass, C, return sites (the default: entry and each `ret` patched)",
             "target": "callloop.c `tiny`", "calls": CALLS, "native": c_native,
             "traced": traced["glass trace -f tiny"]},
            {"name": "glass, C, return address replaced (`--exit-probe return-address`)",
             "target": "callloop.c `tiny`", "calls": CALLS, "native": c_native,
             "traced": traced["glass trace -f tiny --exit-probe return-address"]},
            {"name": "glass, Go exit path (entry and each `ret` patched)", "target": "goloop.go `main.tiny`",
             "calls": go["calls"], "native": go["native"], "traced": go["traced"]}]
    probes = uprobes(work, goloop)
    if isinstance(probes, list):
        native = statistics.median(work_seconds([str(goloop), str(UPROBE_CALLS), "1", "0"], work)[0]
                                   for _ in range(reps()))
        for probe in probes:
            rows.append({"name": probe["name"], "target": "goloop.go `main.tiny`", "calls": UPROBE_CALLS,
                         "native": native, "traced": probe["seconds"],
                         "outcome": probe["outcome"]})
    for row in rows:
        if row["traced"] is not None:
            row["ns"] = (row["traced"] - row["native"]) * 1e9 / row["calls"]
            row["cycles"] = row["ns"] * rate / 1e9 if rate else None
    return {"cpu": cpu(), "rate": rate, "pair_ns": pair_ns, "pair_ticks": pair_ticks, "rows": rows,
            "go_lost": go["lost"], "go_ns": [(t - go["native"]) * 1e9 / go["calls"] for t in go["times"]],
            "uprobes": None if isinstance(probes, list) else probes}


def floor_markdown(floor):
    rate = floor["rate"]
    pair_cycles = floor["pair_ns"] * rate / 1e9 if rate else None
    cyc = (lambda v: f"{v:.0f}" if v is not None else "?")
    lines = ["", "### The floor: cost per traced call against two rdtsc, by exit path", "",
             f"CPU: {floor['cpu']}; its time-stamp counter runs at {rate / 1e9:.3f} GHz (glass's measured "
             f"cycle rate), and cycles here are counter ticks. Two back-to-back `rdtsc` (a call's two "
             f"timestamps, {PAIRS:,} pairs timed by the clock) cost **{floor['pair_ns']:.1f} ns, "
             f"{cyc(pair_cycles)} cycles** a pair (one `rdtsc`: {floor['pair_ns'] / 2:.1f} ns); the counter "
             f"advances {floor['pair_ticks']:.0f} ticks between the two reads of a pair.", "",
             "Cost per call = (traced loop − untraced loop) / calls, each program timing its own loop. "
             f"The Go loop runs {GO_ROUNDS} rounds of {GO_CALLS:,} calls on one thread, 100 ms apart, "
             f"so that glass's drain empties the ring ({GO_RING >> 20} M words) between rounds and no record "
             "is lost (a lost record costs the probe no `rdtsc`); the C loop is the "
             f"{CALLS:,} calls above. "
             "uprobes: `perf probe -x goloop` on `main.tiny`, counted with `perf stat -e` (no samples "
             "written: the least a uprobe costs), every call counted.", "",
             "| exit path | target | calls | untraced loop | traced loop | ns per call | cycles per call | × two rdtsc |",
             "|---|---|---|---|---|---|---|---|",
             f"| two back-to-back `rdtsc` (the floor) | – | {PAIRS:,} pairs | – | – | {floor['pair_ns']:.1f} | "
             f"{cyc(pair_cycles)} | 1.0 |"]
    for row in floor["rows"]:
        if row["traced"] is None:
            lines.append(f"| {row['name']} | {row['target']} | {row['calls']:,} | {row['native']:.4f} s | "
                         f"– | – | – | {row['outcome']} |")
            continue
        ratio = row["ns"] / floor["pair_ns"]
        lines.append(f"| {row['name']} | {row['target']} | {row['calls']:,} | {row['native']:.4f} s | "
                     f"{row['traced']:.3f} s | {row['ns']:.1f} | {cyc(row['cycles'])} | {ratio:.1f} |")
    lines.append("")
    if floor["uprobes"]:
        lines.append(f"No uprobes figure: {floor['uprobes']}.")
    if len(floor["go_ns"]) > 1:
        lines.append(f"The Go path's runs: {min(floor['go_ns']):.1f} to {max(floor['go_ns']):.1f} ns per call "
                     "(glass's drain shares the machine's CPUs with the target: where the scheduler puts "
                     "them moves it).")
    if any(floor["go_lost"]):
        lines.append(f"Records glass lost on the Go path: {floor['go_lost']}: its figure is then too low.")
    else:
        lines.append(f"Records glass lost on the Go path: {floor['go_lost']}.")
    go = floor["rows"][1]
    entry = next((r for r in floor["rows"] if r["name"].startswith("uprobe on entry (")), None)
    if entry and entry["traced"] is not None and go["traced"] is not None:
        lines.append(f"An entry uprobe alone costs {entry['ns'] / go['ns']:.0f}x what glass's Go path costs for "
                     "the entry and the exit (a trap into the kernel at each call).")
    ret = next((r for r in floor["rows"] if "uretprobe" in r["name"]), None)
    if ret and ret["traced"] is not None:
        lines.append("The uretprobe replaces `main.tiny`'s return address, which Go's runtime does not expect "
                     "(a traceback or a stack copy while it is hijacked goes wrong); `main.tiny` is a leaf with "
                     "no stack check, so goloop ran to its end under it here.")
    return lines


def coverage(work):
    data = work / "input.txt"
    data.write_text("".join(f"line {i} {i * 7919 % 1000}\n" for i in range(200_000)))
    cases = [
        ("xz", ["/usr/bin/xz", "-c", "-6", str(data)]),
        ("gzip", ["/usr/bin/gzip", "-c", "-9", str(data)]),
        ("python3", ["/usr/bin/python3", "-c", "import json; print(sum(len(json.dumps({'a': i})) for i in range(3000)))"]),
    ]
    rows = []
    for name, command in cases:
        if not Path(command[0]).exists():
            continue
        native = subprocess.run(command, capture_output=True)
        glass = subprocess.run([str(GLASS), "trace", "-o", str(work / "cov.glass"), "-f", "*", "--"] + command,
                               capture_output=True)
        said = glass.stderr.decode(errors="replace")
        m = re.search(r"instrumented (\d+) functions, skipped (\d+)", said)
        instrumented, skipped = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
        named = count_named(work / "cov.glass")
        uft_dir = work / "cov.uftrace"
        uft = subprocess.run(["uftrace", "record", "-vv", "-d", str(uft_dir), "-P", "."] + command,
                             capture_output=True)
        text = uft.stderr.decode(errors="replace")
        patched = sum(int(x) for x in re.findall(r"dynamic:\s+patched:\s+(\d+)", text))
        total = sum(int(x) for x in re.findall(r"dynamic:\s+total:\s+(\d+)", text))
        shutil.rmtree(uft_dir, ignore_errors=True)
        rows.append({
            "program": name,
            "glass": instrumented,
            "glass_named": named,
            "glass_skipped": skipped,
            "glass_same": glass.stdout == native.stdout and glass.returncode == native.returncode,
            "uftrace": patched,
            "uftrace_total": total,
            "uftrace_same": uft.stdout == native.stdout and uft.returncode == native.returncode,
        })
    return rows


def count_named(recording):
    """Instrumented functions that have a symbol name (not `sub_<address>` from
    .eh_frame), as `glass info` counts them."""
    info = subprocess.run([str(GLASS), "info", str(recording)], capture_output=True,
                          text=True).stdout
    named = re.search(r"(\d+) named by a symbol", info)
    if named:
        return int(named.group(1))
    total = re.search(r"tracing:\s+(\d+) functions? instrumented", info)
    return int(total.group(1)) if total else 0


def throughput(work):
    binary = work / "callloop"
    rows = []
    for threads in (1, 2, 4):
        calls = CALLS // threads
        out = work / f"tp-{threads}.glass"
        seconds, run = work_seconds([str(GLASS), "trace", "-o", str(out), "-f", "tiny", "--ring-size",
                                     str(RING), "--", str(binary), str(calls), str(threads)], work)
        info = subprocess.run([str(GLASS), "info", str(out)], capture_output=True, text=True).stdout
        lost = int(re.search(r"losses:\s+(\d+) records lost", info).group(1))
        duration = float(re.search(r"duration:\s+([0-9.]+) s", info).group(1))
        records = 2 * calls * threads
        rows.append({"threads": threads, "records": records, "work": seconds, "session": duration,
                     "rate": (records - lost) / seconds, "lost": lost, "size": out.stat().st_size})
        out.unlink(missing_ok=True)
    return rows


def machine():
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    import platform
    return f"{os.cpu_count()} CPUs ({model}), Linux {platform.release()}"


def markdown(calls, cover, drain, floor):
    lines = [BEGIN, "## glass trace: cost per call, coverage and drain throughput against uftrace; the floor", ""]
    lines.append(f"Measured {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} on {machine()}; "
                 f"`./x bench trace` (`bench/trace_bench.py`), median of {reps()} runs.")
    lines += ["", f"### Cost per instrumented call (entry + exit), {CALLS:,} calls of a tiny function", "",
              "`tests/fixtures/trace/callloop.c` times its own loop; cost per call = (traced loop − "
              "untraced loop) / calls. Cycles from glass's measured counter rate"
              + (f" ({calls['rate'] / 1e9:.3f} GHz)." if calls["rate"] else "."), "",
              "| tool | loop time | ns per call | cycles per call | bytes written per call |",
              "|---|---|---|---|---|",
              f"| native (`./callloop {CALLS}`) | {calls['native']:.3f} s | – | – | – |"]
    glass_ns = None
    for name, seconds, ns, cycles, size in calls["rows"]:
        cyc = f"{cycles:.0f}" if cycles is not None else "?"
        lines.append(f"| {name} | {seconds:.3f} s | {ns:.1f} | {cyc} | {size:.1f} |")
        if name.startswith("glass"):
            glass_ns = glass_ns or ns
    lines.append("")
    if glass_ns:
        ratios = [f"{name}: {ns / glass_ns:.1f}x" for name, _, ns, _, _ in calls["rows"]
                  if not name.startswith("glass")]
        lines.append("uftrace's cost per call over glass's: " + ", ".join(ratios) +
                     " (goal: at least 3x). LProfile publishes ~195 cycles per measured call.")
        lines.append("")
        vm = " (a VM)" if "hypervisor" in cpu() else ""
        rest = ("the rest of the probe (trampolines, shadow stack, ring) is the difference."
                if glass_ns > 2 * calls["rdtsc"] else
                "the rest of the probe (trampolines, shadow stack, ring) runs while the two "
                "`rdtsc` do, and costs nothing more.")
        lines.append(f"One `rdtsc` costs {calls['rdtsc']:.1f} ns on this machine{vm}, so the two "
                     f"timestamps of a call are {2 * calls['rdtsc']:.1f} ns of glass's {glass_ns:.1f} ns "
                     f"(`tiny` takes return-site probes by default); {rest}")
    if calls["lost"]:
        lines.append(f"Records glass lost in these runs: {calls['lost']} (ring full or write failed).")
    lines += ["", "### Coverage: every function asked for (`glass trace -f '*'`, `uftrace record -P .`)", "",
              "| program | glass: instrumented (with a symbol) | glass: skipped | glass output identical | "
              "uftrace -P .: patched of its candidates | uftrace output identical |",
              "|---|---|---|---|---|---|"]
    for row in cover:
        lines.append(f"| {row['program']} | {row['glass']} ({row['glass_named']}) | {row['glass_skipped']} | "
                     f"{'yes' if row['glass_same'] else 'NO'} | {row['uftrace']} of {row['uftrace_total']} | "
                     f"{'yes' if row['uftrace_same'] else 'NO'} |")
    lines += ["", "uftrace only knows functions with a symbol (none in stripped xz and gzip, the exported "
              "API of python3); glass also finds the local functions of stripped code from `.eh_frame` "
              "(`sub_<address>`). uftrace's count is from its `dynamic patch stats` (`-vv`).",
              "", "### Drain throughput: records per second into the file, without loss", "",
              "`callloop N T`: T threads each calling `tiny` N times (2 records per call); rings of "
              f"{RING >> 20} M records (32 MiB) per thread (`--ring-size {RING}`); the file on this machine's disk. "
              "Records/s counts only the records that reached the file.", "",
              "| producing threads | records | loop time | records/s | records lost | file bytes per record |",
              "|---|---|---|---|---|---|"]
    for row in drain:
        lines.append(f"| {row['threads']} | {row['records']:,} | {row['work']:.3f} s | {row['rate'] / 1e6:.1f} M | "
                     f"{row['lost']:,} | {row['size'] / row['records']:.2f} |")
    lines += floor_markdown(floor)
    lines += ["", END]
    return "\n".join(lines)


def write_section(text):
    section.replace(BEGIN, END, text)


def run(work):
    if not shutil.which("uftrace"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "uftrace"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
    work = Path(work)
    calls = per_call(work)
    print(f"bench: trace per call: {calls}", file=sys.stderr)
    cover = coverage(work)
    print(f"bench: trace coverage: {cover}", file=sys.stderr)
    drain = throughput(work)
    print(f"bench: trace drain: {drain}", file=sys.stderr)
    floor = exit_paths(work, calls)
    print(f"bench: trace floor: {floor}", file=sys.stderr)
    write_section(markdown(calls, cover, drain, floor))
