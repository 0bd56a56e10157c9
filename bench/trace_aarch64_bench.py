"""glass trace on AArch64: cost per traced call against the timer-read floor and against
uprobes, in one boot of an arm64 Linux guest under QEMU TCG (called by bench/run;
`bench/run trace-aarch64`, `./x bench trace-aarch64`, runs only this). Results replace
the text between the glass-trace-aarch64 markers of docs/benchmarks.md.

The guest is guests/linux's kit (Debian 12's arm64 kernel, busybox, glibc) booted by
guests/linux/run-script.sh with `--cpu max` (max,pauth-impdef=on). In that one boot,
REPS times (GLASS_BENCH_REPS, default 3), one case after the other in each round:

- tests/fixtures/trace/callloop.c (aarch64-linux-gnu-gcc -O2) with CALLS calls of
  `tiny`, natively: it times its own loop (GLASS_FIXTURE_TIMING=1);
- the floor, bench/timer_floor_aarch64.c: CALLS iterations of two back-to-back reads of
  CNTVCT_EL0 (the two timestamps of every traced call), timed the same way; it also
  prints CNTFRQ_EL0;
- callloop under the aarch64 glass, `glass trace --max-threads 8 -f tiny`: its summary
  must say 2 x CALLS records and 0 lost;
- callloop with UPROBE_CALLS calls under uprobes on `tiny`, entry and return, defined
  through tracefs as `perf probe -x` defines them (perf is not in the guest): once with
  tracing on (each hit writes its event into a ring buffer large enough for every one of
  them, as glass writes its records; the buffer's count must be 2 x UPROBE_CALLS), once
  with tracing off (the traps and the handlers, no event written: the least a uprobe
  costs). uprobe_profile's hit count must be UPROBE_CALLS in both.

Cost per call: (loop time - native loop time for as many calls) / calls, in ns of the
guest's clock and in ticks of its generic timer (CNTFRQ_EL0); the ratios glass / floor
and uprobes / glass. Medians over the rounds.
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
TRIPLE = "aarch64-unknown-linux-gnu"
GLASS = ROOT / "target" / TRIPLE / "release" / "glass"
KIT = ROOT / "target" / "tmp" / "linux-kit"
RUN_SCRIPT = ROOT / "guests" / "linux" / "run-script.sh"
CALLLOOP = ROOT / "tests" / "fixtures" / "trace" / "callloop.c"
FLOOR = ROOT / "bench" / "timer_floor_aarch64.c"
# The guest's /out comes back here, and stays for a look after the run.
OUT = ROOT / "target" / "tmp" / "trace-aarch64-bench"
BEGIN = "<!-- glass-trace-aarch64:begin -->"
END = "<!-- glass-trace-aarch64:end -->"
COMMAND = "./x bench trace-aarch64"
CPU = "max"
SMP = 2
RAM_MIB = 1024
# Calls per run, so that a traced run takes about 3 s under TCG on the project's 2-core
# host (measured: ~500 ns per call under glass, ~30 us under uprobes): glass's runs and
# the native and floor runs take CALLS, the uprobe runs (two breakpoint traps and a
# single step per call) UPROBE_CALLS.
CALLS = int(os.environ.get("GLASS_BENCH_AARCH64_CALLS", "6000000"))
UPROBE_CALLS = int(os.environ.get("GLASS_BENCH_AARCH64_UPROBE_CALLS", "100000"))
# The trace buffer per CPU for the uprobe runs, in KiB: every event of a run fits
# (about 32 bytes each), so none overwrites another.
TRACE_BUFFER_KB = 32768
TIMEOUT = int(os.environ.get("GLASS_BENCH_AARCH64_TIMEOUT", "2400"))


def reps():
    return max(int(os.environ.get("GLASS_BENCH_REPS", "3")), 1)


GUEST_SCRIPT = r"""N=@CALLS@ NU=@UPROBE_CALLS@ R=@REPS@ OFF=@OFFSET@
export GLASS_FIXTURE_TIMING=1
cat /proc/cpuinfo >$OUT/cpuinfo.txt
uname -r >$OUT/uname.txt
T=/sys/kernel/tracing
[ -e $T/uprobe_events ] || mount -t tracefs nodev $T 2>$OUT/tracefs.err
# What `perf probe -x /work/callloop tiny` and `tiny%return` write.
echo "p:glassbench/entry /work/callloop:$OFF" >>$T/uprobe_events 2>>$OUT/uprobe.err
echo "r:glassbench/exit /work/callloop:$OFF" >>$T/uprobe_events 2>>$OUT/uprobe.err
cat $T/uprobe_events >$OUT/uprobe_events.txt 2>&1
echo @BUFFER_KB@ >$T/buffer_size_kb
cat $T/buffer_size_kb >$OUT/buffer_size_kb.txt
# uprobe_run NAME TRACING_ON: callloop NU under both probes, enabled only for this run.
uprobe_run() {
    echo 0 >$T/tracing_on
    echo >$T/trace
    cat $T/uprobe_profile >$OUT/$1.before
    echo $2 >$T/tracing_on
    echo 1 >$T/events/glassbench/enable
    ./callloop $NU >$OUT/$1.out 2>$OUT/$1.err
    echo $? >$OUT/$1.status
    echo 0 >$T/events/glassbench/enable
    echo 0 >$T/tracing_on
    cat $T/uprobe_profile >$OUT/$1.after
    cat $T/per_cpu/cpu*/stats >$OUT/$1.stats
}
./callloop $NU >$OUT/native-u.out 2>/dev/null
i=1
while [ $i -le $R ]; do
    ./callloop $N >$OUT/native-$i.out 2>$OUT/native-$i.err
    ./timer_floor_aarch64 $N >$OUT/floor-$i.out 2>$OUT/floor-$i.err
    ./glass trace --max-threads 8 -f tiny -o $OUT/x.glass -- ./callloop $N >$OUT/glass-$i.out 2>$OUT/glass-$i.err
    echo $? >$OUT/glass-$i.status
    rm -f $OUT/x.glass
    uprobe_run uprobe-on-$i 1
    uprobe_run uprobe-off-$i 0
    echo "round $i done at $(cut -d' ' -f1 /proc/uptime) s"
    i=$((i + 1))
done
"""


def cross_compile(source, out):
    subprocess.run(["aarch64-linux-gnu-gcc", "-O2", "-g", "-fno-omit-frame-pointer", str(source), "-o", str(out),
                    "-lpthread"], check=True)
    return out


def file_offset(binary, symbol):
    """The file offset of `symbol`'s first byte (what uprobe_events takes): its address
    from nm, through the LOAD segment that holds it (readelf -l)."""
    nm = subprocess.run(["aarch64-linux-gnu-nm", str(binary)], capture_output=True, text=True, check=True).stdout
    address = next(int(f[0], 16) for f in (line.split() for line in nm.splitlines())
                   if len(f) == 3 and f[2] == symbol and f[1] in "tT")
    segments = subprocess.run(["aarch64-linux-gnu-readelf", "-lW", str(binary)], capture_output=True, text=True,
                              check=True).stdout
    for line in segments.splitlines():
        fields = line.split()
        if fields and fields[0] == "LOAD":
            offset, vaddr, filesz = int(fields[1], 16), int(fields[2], 16), int(fields[4], 16)
            if vaddr <= address < vaddr + filesz:
                return address - vaddr + offset
    raise RuntimeError(f"{symbol} (0x{address:x}) is in no LOAD segment of {binary}")


def build_glass():
    env = dict(os.environ, CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER="aarch64-linux-gnu-gcc")
    subprocess.run(["cargo", "build", "--release", "--locked", "-p", "glass", "--target", TRIPLE],
                   cwd=ROOT, env=env, check=True)


def boot(work, calls, uprobe_calls, rounds):
    """The one boot: builds the fixtures, runs GUEST_SCRIPT, returns /out's directory."""
    if not GLASS.exists():
        build_glass()
    subprocess.run([str(ROOT / "guests" / "linux" / "kit.sh"), str(KIT), "aarch64"], check=True,
                   stdout=subprocess.DEVNULL)
    bins = work / "trace-aarch64-bin"
    bins.mkdir(parents=True, exist_ok=True)
    callloop = cross_compile(CALLLOOP, bins / "callloop")
    floor = cross_compile(FLOOR, bins / "timer_floor_aarch64")
    offset = file_offset(callloop, "tiny")
    glass = bins / "glass"
    shutil.copy2(GLASS, glass)
    script = bins / "trace_aarch64.sh"
    text = GUEST_SCRIPT
    for key, value in (("CALLS", calls), ("UPROBE_CALLS", uprobe_calls), ("REPS", rounds),
                       ("OFFSET", f"0x{offset:x}"), ("BUFFER_KB", TRACE_BUFFER_KB)):
        text = text.replace(f"@{key}@", str(value))
    script.write_text(text)
    shutil.rmtree(OUT, ignore_errors=True)
    started = datetime.now(timezone.utc)
    load_before = os.getloadavg()[0]
    run = subprocess.run([str(RUN_SCRIPT), "--arch", "aarch64", "--cpu", CPU, "--smp", str(SMP),
                          "--ram", str(RAM_MIB), "--timeout", str(TIMEOUT), str(KIT), str(OUT), str(script),
                          str(glass), str(callloop), str(floor)])
    if run.returncode != 0:
        raise RuntimeError(f"run-script.sh failed ({run.returncode}); console: {OUT / 'serial.log'}")
    status = (OUT / "status").read_text().strip()
    if status != "0":
        raise RuntimeError(f"the guest's script exited with {status}; console: {OUT / 'serial.log'}")
    return {"started": started, "load": (load_before, os.getloadavg()[0]), "offset": offset, "calls": calls, "uprobe_calls": uprobe_calls,
            "rounds": rounds}


def read(name):
    path = OUT / name
    if not path.exists():
        raise RuntimeError(f"no $OUT/{name} from the guest; console: {OUT / 'serial.log'}")
    return path.read_text()


def seconds(name):
    match = re.search(r"work_seconds=([0-9.]+)", read(name))
    if not match:
        raise RuntimeError(f"no work_seconds in $OUT/{name}: {read(name)[-2000:]}")
    return float(match.group(1))


def profile_hits(text):
    """uprobe_profile's hit count per event name."""
    hits = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[-1].isdigit():
            hits[fields[-2].split("/")[-1]] = int(fields[-1])
    return hits


def buffer_events(text):
    """Events the trace buffer took in a run (entries kept plus overwritten), all CPUs."""
    total = 0
    for key in ("entries", "overrun"):
        total += sum(int(v) for v in re.findall(rf"^{key}: (\d+)", text, re.M))
    return total


def parse(boot_info):
    n, nu, rounds = boot_info["calls"], boot_info["uprobe_calls"], boot_info["rounds"]
    expected_out = read("native-1.out")
    native, floor, glass, on, off, ticks_between, lost, records, rates = [], [], [], [], [], [], [], [], []
    frequency = None
    problems = []
    for i in range(1, rounds + 1):
        native.append(seconds(f"native-{i}.err"))
        floor.append(seconds(f"floor-{i}.err"))
        fields = dict(kv.split("=", 1) for kv in read(f"floor-{i}.out").split())
        frequency = int(fields["cntfrq"])
        ticks_between.append(float(fields["ticks_between"]))
        err = read(f"glass-{i}.err")
        # The rate is "cycle rate X GHz", or "timer rate X MHz" where glass names the generic timer.
        summary = re.search(r"glass: (\d+) records from .*?; (\d+) lost.*?(?:cycle|timer) rate ([0-9.]+) ([GM])Hz",
                            err)
        if read(f"glass-{i}.status").strip() != "0" or not summary:
            raise RuntimeError(f"glass trace in round {i} failed: {err[-2000:]}")
        records.append(int(summary.group(1)))
        lost.append(int(summary.group(2)))
        rates.append(float(summary.group(3)) * (1e9 if summary.group(4) == "G" else 1e6))
        if records[-1] != 2 * n or lost[-1] != 0:
            problems.append(f"round {i}: glass wrote {records[-1]} records, {lost[-1]} lost (expected {2 * n}, 0)")
        if read(f"glass-{i}.out") != expected_out:
            problems.append(f"round {i}: callloop printed something else under glass")
        glass.append(seconds(f"glass-{i}.err"))
        for mode, store in (("on", on), ("off", off)):
            name = f"uprobe-{mode}-{i}"
            if read(f"{name}.status").strip() != "0":
                raise RuntimeError(f"callloop under uprobes ({name}) failed: {read(name + '.err')[-2000:]}")
            before, after = profile_hits(read(f"{name}.before")), profile_hits(read(f"{name}.after"))
            hits = {k: after.get(k, 0) - before.get(k, 0) for k in ("entry", "exit")}
            events = buffer_events(read(f"{name}.stats"))
            if hits["entry"] != nu:
                problems.append(f"{name}: the entry uprobe hit {hits['entry']} times, not {nu}")
            if mode == "on" and events != 2 * nu:
                problems.append(f"{name}: {events} events in the trace buffer, not {2 * nu}")
            if mode == "off" and events != 0:
                problems.append(f"{name}: {events} events in the trace buffer with tracing off")
            store.append({"seconds": seconds(f"{name}.err"), "hits": hits, "events": events})
    if problems:
        raise RuntimeError("trace-aarch64 bench: " + "; ".join(problems) + f" (guest's files in {OUT})")
    cpuinfo = read("cpuinfo.txt")

    def first(key):
        match = re.search(rf"^{key}\s*:\s*(\S+)", cpuinfo, re.M)
        return match.group(1) if match else "?"

    native_s = statistics.median(native)
    native_ns = native_s / n * 1e9
    floor_ns = statistics.median(floor) / n * 1e9
    glass_ns = (statistics.median(glass) - native_s) / n * 1e9
    on_ns = statistics.median(r["seconds"] for r in on) / nu * 1e9 - native_ns
    off_ns = statistics.median(r["seconds"] for r in off) / nu * 1e9 - native_ns
    return {
        "n": n, "nu": nu, "rounds": rounds, "native": native, "floor": floor, "glass": glass,
        "on": [r["seconds"] for r in on], "off": [r["seconds"] for r in off],
        "native_ns": native_ns, "floor_ns": floor_ns, "glass_ns": glass_ns, "on_ns": on_ns, "off_ns": off_ns,
        "glass_round_ns": [(g - native_s) / n * 1e9 for g in glass],
        "frequency": frequency, "ticks_between": statistics.median(ticks_between), "records": records,
        "lost": lost, "glass_rate": rates[0], "hits": on[0]["hits"], "events": on[0]["events"],
        "vcpus": len(re.findall(r"^processor\s*:", cpuinfo, re.M)),
        "cpu_part": f"CPU implementer {first('CPU implementer')}, part {first('CPU part')}",
        "kernel": read("uname.txt").strip(), "offset": boot_info["offset"], "started": boot_info["started"],
        "load": boot_info["load"],
        "buffer_kb": read("buffer_size_kb.txt").strip(),
    }


def host_cpu():
    sys.path.insert(0, str(ROOT / "bench"))
    import trace_bench
    return trace_bench.cpu()


def qemu_version():
    out = subprocess.run(["qemu-system-aarch64", "--version"], capture_output=True, text=True).stdout
    return out.splitlines()[0] if out else "qemu-system-aarch64"


def commit():
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "crates", "Cargo.lock"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return f"`{head}`" + (" (glass built from a working tree with uncommitted changes in crates/)" if dirty else "")


def rerun(rounds):
    return COMMAND if rounds == 3 else f"GLASS_BENCH_REPS={rounds} {COMMAND}"


def markdown(r):
    freq = r["frequency"]

    def ticks(ns):
        return ns * freq / 1e9

    def spread(values, n):
        return ", ".join(f"{v / n * 1e9:.0f}" for v in values)

    ratio_floor = r["glass_ns"] / r["floor_ns"]
    ratio_on = r["on_ns"] / r["glass_ns"]
    ratio_off = r["off_ns"] / r["glass_ns"]
    lines = [
        BEGIN,
        "## glass trace on AArch64: cost per call against the timer-read floor and uprobes",
        "",
        f"Measured {r['started']:%Y-%m-%d %H:%M} UTC at commit {commit()}, in one boot of an arm64 Linux "
        f"guest ({qemu_version()}, TCG, `-M virt -cpu max,pauth-impdef=on -smp {SMP} -m {RAM_MIB}`: the guest "
        f"sees {r['cpu_part']} (QEMU's own IDs), {r['vcpus']} CPUs, Linux {r['kernel']}) on a host with {os.cpu_count()} CPUs "
        f"({host_cpu()}; load average {r['load'][0]:.1f} at the start and {r['load'][1]:.1f} at the end: "
        f"other work shares these CPUs). Rerun: `{rerun(r['rounds'])}` (`bench/trace_aarch64_bench.py`; the guest is "
        "guests/linux's kit run by `guests/linux/run-script.sh`). "
        f"Medians of {r['rounds']} round{'s' if r['rounds'] != 1 else ''} in that boot, each round running "
        "every case once.",
        "",
        f"`tests/fixtures/trace/callloop.c` (aarch64-linux-gnu-gcc -O2) times its own loop of calls of `tiny`; "
        "cost per call = (loop time − native loop time for as many calls) / calls. Ticks are the generic "
        f"timer's (CNTVCT_EL0, {freq / 1e6:g} MHz by CNTFRQ_EL0; glass's summary measured "
        f"{r['glass_rate'] / 1e6:g} MHz), what glass's records hold.",
        "",
        "| case | calls | loop time per round (s) | ns per call | timer ticks per call | against the floor |",
        "|---|---|---|---|---|---|",
        f"| native (`./callloop {r['n']}`) | {r['n']:,} | "
        f"{', '.join(f'{v:.3f}' for v in r['native'])} | {r['native_ns']:.1f} (the whole call) | – | – |",
        f"| the floor: two back-to-back CNTVCT_EL0 reads (`bench/timer_floor_aarch64.c`) | {r['n']:,} pairs | "
        f"{', '.join(f'{v:.3f}' for v in r['floor'])} | **{r['floor_ns']:.1f}** a pair | "
        f"{ticks(r['floor_ns']):.2f} | 1x |",
        f"| `glass trace --max-threads 8 -f tiny` | {r['n']:,} | {', '.join(f'{v:.3f}' for v in r['glass'])} | "
        f"**{r['glass_ns']:.1f}** | {ticks(r['glass_ns']):.2f} | **{ratio_floor:.1f}x** |",
        f"| uprobes on `tiny`, entry + return, tracing on (events written) | {r['nu']:,} | "
        f"{', '.join(f'{v:.3f}' for v in r['on'])} | **{r['on_ns']:,.0f}** | {ticks(r['on_ns']):,.0f} | "
        f"{r['on_ns'] / r['floor_ns']:.0f}x |",
        f"| uprobes on `tiny`, entry + return, tracing off (traps only) | {r['nu']:,} | "
        f"{', '.join(f'{v:.3f}' for v in r['off'])} | {r['off_ns']:,.0f} | {ticks(r['off_ns']):,.0f} | "
        f"{r['off_ns'] / r['floor_ns']:.0f}x |",
        "",
        f"**uprobes / glass: {ratio_on:.0f}x** with the events written ({ratio_off:.0f}x for the traps alone). "
        f"glass's cost per call by round: {', '.join(f'{v:.1f}' for v in r['glass_round_ns'])} ns; "
        f"records each glass run wrote: {r['records'][0]:,} (2 per call), lost: {r['lost']}. The floor's two "
        f"reads are {r['ticks_between']:.2f} ticks apart on average.",
        "",
        "What the figures are. This is TCG: QEMU translates the guest's code for the host's CPU, so "
        "absolute nanoseconds are emulation nanoseconds (the guest's clock follows the host's), and the costs "
        "of instructions are not those of any AArch64 core: a read of CNTVCT_EL0 is a call into QEMU, not a "
        "register read, and a trap into the kernel is emulated exception entry and return. The ratios "
        "are the figures to read, and only as relations between code paths under the same emulator: "
        "*glass / floor* is what glass's whole probe path (the `B` to the trampoline, the call of "
        "`glass_enter`, the shadow entry, the exit stub, two ring records published with a store-release) "
        "costs against the two timestamps that any tracer of calls must take (the floor loop's own add "
        "and branch are in the floor, which makes it a little high); *uprobes / glass* is what the "
        "kernel's way costs against glass's. Neither ratio is a hardware core's: under TCG every indirect "
        "branch (glass's `blr` to the probe, its `ret`s, the exit stub's) leaves QEMU's chain of translated "
        "blocks for a lookup of the next one, which a core's branch predictor does not charge, so the probe "
        "path weighs more against the two timer reads here than it would on hardware. glass's cost per call "
        f"ran from {min(r['glass_round_ns']):.0f} to {max(r['glass_round_ns']):.0f} ns over the rounds and the "
        f"uprobe runs' loops (tracing on) from {min(r['on']):.2f} to {max(r['on']):.2f} s: the host's other work "
        "moves single rounds, hence the medians.",
        "",
        f"uprobes: `p:glassbench/entry /work/callloop:0x{r['offset']:x}` and `r:glassbench/exit` at the same "
        "offset (`tiny`'s file offset, from nm and the LOAD segment's offset and address), written to "
        "tracefs's `uprobe_events` as `perf probe -x callloop tiny` and `tiny%return` write them (perf is not "
        "in the guest), enabled only around each uprobe run. Each call takes the entry breakpoint, the "
        "single step out of line of the instruction it replaced (`tiny`'s first, a `mov`) and the return trampoline's breakpoint. With tracing on, "
        f"each hit writes its event into the ftrace ring buffer ({r['buffer_kb']} KiB per CPU: every event "
        "of a run fits, none overwritten), as glass writes a record per entry and exit: the like-for-like "
        "figure. With tracing off the events stay enabled, so every trap and handler runs, and only the "
        "write is skipped: what a uprobe costs at least (x86-64's figure, counted by `perf stat`, is of "
        f"that kind). Checked every run: uprobe_profile's hits ({r['hits']['entry']:,} per run, as many "
        f"calls) and, with tracing on, the buffer's events ({r['events']:,}, two per call).",
        "",
        END,
    ]
    return "\n".join(lines)


def write_section(text):
    section.replace(BEGIN, END, text)


def run(work):
    work = Path(work)
    info = boot(work, CALLS, UPROBE_CALLS, reps())
    results = parse(info)
    print(f"bench: trace aarch64: {results}", file=sys.stderr)
    write_section(markdown(results))


if __name__ == "__main__":
    import tempfile
    scratch = Path(tempfile.mkdtemp(prefix="glass-bench-"))
    try:
        run(scratch)
        print((ROOT / "docs" / "benchmarks.md").read_text())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
