"""glass trace --pid benchmarks (called by bench/run; `bench/run attach` runs only these).
Results replace the text between the glass-attach markers of docs/benchmarks.md.

The target (generated here: 1000 small functions, two worker threads calling them in
turn) measures itself: every 100 ms it prints how many calls its workers made and the
longest gap either worker saw between two consecutive calls. So the stopped time is
measured from the target's side, as the target feels it, for:

- the floor: ptrace alone stopping every thread and letting it go (seize, interrupt,
  wait, detach), which any attaching tool must pay;
- gdb attaching and detaching (`gdb -p PID -batch`), the naive tool (uftrace cannot
  attach at all);
- glass attaching with 10, 100 and 1000 functions patched, and detaching.

Throughput is the target's calls per second before, during and after tracing. glass's own
account of its stopped windows (printed on stderr) is reported beside the target's.
"""

import ctypes
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import section

ROOT = Path(__file__).resolve().parent.parent
GLASS = ROOT / "target" / "release" / "glass"
BEGIN = "<!-- glass-attach:begin -->"
END = "<!-- glass-attach:end -->"
FUNCTIONS = 1000


def reps():
    return int(os.environ.get("GLASS_BENCH_REPS", "3"))


def target_source():
    functions = "\n".join(
        f"__attribute__((noinline)) unsigned long fn_{i:04d}(unsigned long x) "
        f"{{ return x * {2 * i + 3}u + {i}u; }}"
        for i in range(FUNCTIONS))
    table = ", ".join(f"fn_{i:04d}" for i in range(FUNCTIONS))
    return f"""
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>
{functions}
static unsigned long (*const table[{FUNCTIONS}])(unsigned long) = {{{table}}};
static volatile unsigned long calls[2], max_gap[2], sink;
static void *worker(void *arg) {{
    long me = (long)arg;
    unsigned long last = __rdtsc(), sum = 0;
    for (unsigned long i = 0;; i++) {{
        sum += table[i % {FUNCTIONS}](i);
        unsigned long now = __rdtsc();
        if (now - last > max_gap[me]) max_gap[me] = now - last;
        last = now;
        calls[me]++;
        if ((i & 0xffff) == 0) sink = sum;
    }}
    return NULL;
}}
int main(void) {{
    setvbuf(stdout, NULL, _IOLBF, 0);
    pthread_t t[2];
    for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    struct timespec start, now, tick = {{0, 100000000}};
    clock_gettime(CLOCK_MONOTONIC, &start);
    unsigned long t0 = __rdtsc(), seen = 0;
    for (;;) {{
        nanosleep(&tick, NULL);
        clock_gettime(CLOCK_MONOTONIC, &now);
        double seconds = (now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9;
        unsigned long total = calls[0] + calls[1];
        unsigned long gap = max_gap[0] > max_gap[1] ? max_gap[0] : max_gap[1];
        max_gap[0] = max_gap[1] = 0;
        double hz = (__rdtsc() - t0) / seconds;
        printf("%.3f %lu %.1f\\n", seconds, total - seen, gap / hz * 1e6);
        seen = total;
    }}
}}
"""


class Target:
    """The generated target, running, its 100 ms reports collected with glass's time."""

    def __init__(self, binary):
        self.process = subprocess.Popen([str(binary)], stdout=subprocess.PIPE, text=True)
        self.reports = []  # (monotonic time, calls in the interval, longest gap in us)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            _, calls, gap = line.split()
            self.reports.append((time.monotonic(), int(calls), float(gap)))

    def window(self, start, end):
        return [r for r in self.reports if start <= r[0] - 0.1 and r[0] <= end]

    def worst_gap(self, start, end):
        """The longest gap the workers saw in reports covering [start, end]."""
        return max((r[2] for r in self.reports if r[0] >= start and r[0] - 0.1 <= end + 0.15),
                   default=0.0)

    def rate(self, start, end):
        rows = self.window(start, end)
        return sum(r[1] for r in rows) / (0.1 * len(rows)) if rows else 0.0

    def stop(self):
        self.process.kill()
        self.process.wait()


LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_DETACH, PTRACE_SEIZE, PTRACE_INTERRUPT = 17, 0x4206, 0x4207


def ptrace_floor(pid):
    """Stops every thread with ptrace and lets it go: the least any attach costs."""
    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    for tid in tids:
        LIBC.ptrace(PTRACE_SEIZE, tid, None, None)
    for tid in tids:
        LIBC.ptrace(PTRACE_INTERRUPT, tid, None, None)
    for tid in tids:
        os.waitpid(tid, 0x40000000)  # __WALL
    for tid in tids:
        LIBC.ptrace(PTRACE_DETACH, tid, None, None)


def glass_attach(pid, pattern, recording, seconds):
    run = subprocess.run([str(GLASS), "trace", "--pid", str(pid), "-f", pattern, "-d", str(seconds),
                          "-o", str(recording)], stderr=subprocess.PIPE, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"glass trace --pid failed: {run.stderr}")
    said = run.stderr
    number = lambda pattern: float(re.search(pattern, said).group(1))
    return {
        "patched": int(number(r"instrumented (\d+) functions")),
        "attach_ms": number(r"every thread stopped ([0-9.]+) ms to patch"),
        "load_ms": number(r"stopped ([0-9.]+) ms more to load"),
        "detach_ms": number(r"every thread stopped ([0-9.]+) ms to restore"),
        "unmap_ms": number(r"one stopped ([0-9.]+) ms more to unmap"),
    }


def measure(work, binary, what):
    """One fresh target: 1 s alone, then `what` (returns glass's account, or None), then
    1 s alone again. Returns the target's view of it."""
    target = Target(binary)
    try:
        time.sleep(1.2)
        begin = time.monotonic()
        account, during = what(target.process.pid)
        end = time.monotonic()
        time.sleep(1.2)
        before = target.rate(begin - 1.0, begin)
        after = target.rate(end + 0.2, end + 1.1)
        result = {"before": before, "after": after, "account": account,
                  "quiet": target.worst_gap(begin - 1.0, begin - 0.2)}
        if during:
            # Tracing ran from `during[0]` to `during[1]`: the attach is the first stall,
            # the detach the last.
            result["attach_gap"] = target.worst_gap(begin, during[0])
            result["detach_gap"] = target.worst_gap(during[1], end)
            result["during"] = target.rate(during[0] + 0.2, during[1] - 0.2)
            result["steady"] = target.worst_gap(during[0] + 0.4, during[1] - 0.4)
        else:
            result["gap"] = target.worst_gap(begin, end)
        return result
    finally:
        target.stop()


def run(work):
    work = Path(work)
    source = work / "many.c"
    source.write_text(target_source())
    binary = work / "many"
    subprocess.run(["gcc", "-O2", "-pthread", str(source), "-o", str(binary)], check=True)
    rows = {}

    def floor(pid):
        ptrace_floor(pid)
        return None, None

    def gdb(pid):
        subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "info threads"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return None, None

    rows["floor"] = [measure(work, binary, floor) for _ in range(reps())]
    rows["gdb"] = [measure(work, binary, gdb) for _ in range(reps())]
    for count, pattern in [(10, "fn_000?"), (100, "fn_00??"), (1000, "fn_*")]:
        def traced(pid, pattern=pattern):
            start = time.monotonic()
            account = glass_attach(pid, pattern, work / "attach.glass", 2)
            stop = time.monotonic()
            # glass attaches within its first ~0.1 s and detaches in its last ~0.1 s.
            return account, (start + 0.15, stop - 0.15)
        rows[count] = [measure(work, binary, traced) for _ in range(reps())]
        print(f"bench: attach {count}: {rows[count]}", file=sys.stderr)
    write_section(markdown(rows))


def median(values):
    return statistics.median(values) if values else float("nan")


def markdown(rows):
    lines = [BEGIN, "## glass trace --pid: stopped time to attach and detach, and the target's throughput", ""]
    lines.append(f"Measured {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; `./x bench attach` "
                 f"(`bench/attach_bench.py`), median of {reps()} runs, each on a fresh target: "
                 f"{FUNCTIONS} small functions called in turn by two worker threads (2 cores). The target "
                 "measures its own stalls: the longest gap either worker saw between two calls, around the "
                 "attach and around the detach. glass's own account (stderr) beside it.")
    floor = median([r["gap"] for r in rows["floor"]])
    gdb = median([r["gap"] for r in rows["gdb"]])
    quiet = median([r["quiet"] for rs in rows.values() for r in rs])
    lines += ["", f"With nothing attached, the longest gap in a second is {quiet / 1e3:.2f} ms (the workers "
              "share 2 cores with the target's main thread and the rest of the machine).",
              "On these 2 cores the target's gaps also count the time a worker waits for a core while glass "
              "works (loading, draining): the column \"while tracing\" is the longest gap in the steady middle "
              "of the traced second, with nothing stopped. glass's account is the time the threads were "
              "actually held stopped.",
              "", "| | functions patched | target's longest gap at attach | at detach | while tracing | glass's account: all "
              "threads stopped to patch / to restore | one thread longer: load runtime / unmap rings | "
              "calls/s before | during | after |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines.append(f"| ptrace floor (stop every thread, let go) | – | {floor / 1e3:.2f} ms | – | – | – | – | "
                 f"{median([r['before'] for r in rows['floor']]) / 1e6:.1f} M | – | "
                 f"{median([r['after'] for r in rows['floor']]) / 1e6:.1f} M |")
    lines.append(f"| gdb -p PID -batch (attach, detach) | – | {gdb / 1e3:.1f} ms (both) | – | – | – | – | "
                 f"{median([r['before'] for r in rows['gdb']]) / 1e6:.1f} M | – | "
                 f"{median([r['after'] for r in rows['gdb']]) / 1e6:.1f} M |")
    for count in (10, 100, 1000):
        rs = rows[count]
        acc = lambda key: median([r["account"][key] for r in rs])
        lines.append(
            f"| glass trace --pid | {int(median([r['account']['patched'] for r in rs]))} | "
            f"{median([r['attach_gap'] for r in rs]) / 1e3:.2f} ms | {median([r['detach_gap'] for r in rs]) / 1e3:.2f} ms | "
            f"{median([r['steady'] for r in rs]) / 1e3:.2f} ms | "
            f"{acc('attach_ms'):.2f} / {acc('detach_ms'):.2f} ms | {acc('load_ms'):.2f} / {acc('unmap_ms'):.2f} ms | "
            f"{median([r['before'] for r in rs]) / 1e6:.1f} M | {median([r['during'] for r in rs]) / 1e6:.1f} M | "
            f"{median([r['after'] for r in rs]) / 1e6:.1f} M |")
    g1000 = median([r["attach_gap"] for r in rows[1000]])
    held = median([r["account"]["attach_ms"] for r in rows[1000]])
    lines += ["", f"With 1000 functions: gdb's stall over glass's attach as the target saw it: "
              f"{gdb / max(g1000, 1e-9):.0f}x; glass held every thread stopped {held:.2f} ms to patch, by its "
              f"own clock (the bare ptrace floor, seen from the target, is {floor / 1e3:.2f} ms). "
              "The trampolines are built while the threads run; only the entry jumps are written with every "
              "thread stopped, a page at a time.",
              "Throughput after detach is the untraced rate again: the original code runs, at full speed "
              "(the trampolines stay mapped but unreachable). During tracing every call of a patched function "
              "costs the probe (see the cost per call above); with 1000 of 1000 functions patched, every call "
              "the workers make is traced.", "", END]
    return "\n".join(lines)


def write_section(text):
    section.replace(BEGIN, END, text)
