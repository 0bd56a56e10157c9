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
BEGIN = "<!-- glass-trace:begin -->"
END = "<!-- glass-trace:end -->"
CALLS = int(os.environ.get("GLASS_BENCH_CALLS", "20000000"))
# Records per thread ring in the throughput runs: with more producing threads than
# cores, the drain is sometimes not scheduled for a few milliseconds.
RING = 4 << 20


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
    .eh_frame), read from the recording's TraceFunction records (docs/format.md)."""
    data = Path(recording).read_bytes()
    pos, named = 16, 0

    def varint(b, p):
        value, shift = 0, 0
        while True:
            c = b[p]
            p += 1
            value |= (c & 0x7F) << shift
            shift += 7
            if c < 0x80:
                return value, p

    while pos + 5 <= len(data):
        tag = data[pos]
        length = int.from_bytes(data[pos + 1:pos + 5], "little")
        payload = data[pos + 5:pos + 5 + length]
        pos += 5 + length
        if tag == 9:  # TraceFunction: id, module, address, size, name
            p = varint(payload, 0)[1]
            n, p = varint(payload, p)
            p += n
            p = varint(payload, p)[1]
            p = varint(payload, p)[1]
            n, p = varint(payload, p)
            name = payload[p:p + n].decode(errors="replace")
            named += not name.startswith("sub_")
    return named


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


def markdown(calls, cover, drain):
    lines = [BEGIN, "## glass trace: cost per call, coverage and drain throughput against uftrace", ""]
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
            glass_ns = ns
    lines.append("")
    if glass_ns:
        ratios = [f"{name}: {ns / glass_ns:.1f}x" for name, _, ns, _, _ in calls["rows"]
                  if not name.startswith("glass")]
        lines.append("uftrace's cost per call over glass's: " + ", ".join(ratios) +
                     " (goal: at least 3x). LProfile publishes ~195 cycles per measured call.")
        lines.append("")
        lines.append(f"One `rdtsc` costs {calls['rdtsc']:.1f} ns on this machine (a VM), so the two "
                     f"timestamps of a call are {2 * calls['rdtsc']:.1f} ns of glass's {glass_ns:.1f} ns; "
                     "the rest of the probe (shadow stack, ring, return hijack) is the difference.")
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
    write_section(markdown(calls, cover, drain))
