"""Xen on ARM64 (called by bench/run: `bench/run xen-arm64`, and after the x86 part by
`bench/run xen`). Results replace the text between the glass-xen-arm64 markers of
docs/benchmarks.md.

One boot of the nested Xen on ARM64 of guests/xen-arm64 (qemu-system-aarch64 TCG, Xen
4.17, an arm64 dom0 on one vCPU pinned to pCPU 0 with weight 4096) with guests/aarch64's
unikernel as a 2-vCPU domU, both vCPUs on pCPU 1 (dom0 alone on pCPU 0).
bench/xen_arm64_dom0.sh runs, per round and rate
(101 and 997 Hz), a window of the guest alone and one with the aarch64 glass recording
it, and takes glass's CPU time in dom0 with busybox time. Figures per rate, medians over
the rounds:

- stops taken per second against those requested (glass's samples per vCPU over its
  recording's seconds);
- stopped time per trace (glass's own: from before the pause until the unpause returned)
  and, within it, the one multicall of pause, both vCPU contexts and states;
- dom0 CPU per stop: glass's user+system time (its guardian's included) over its stops;
- the guest's slowdown by its own clock: vCPU 0's virtual-counter ticks per 25 rounds
  (`rate` lines; the counter runs on while the domain is paused) with glass against the
  window alone just before.

GLASS_BENCH_REPS (default 2) sets the rounds, GLASS_BENCH_XEN_ARM64_OUT re-renders the
section from a finished run's files without booting.
"""

import json
import os
import re
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import section

ROOT = Path(__file__).resolve().parent.parent
TRIPLE = "aarch64-unknown-linux-gnu"
GLASS = ROOT / "target" / TRIPLE / "release" / "glass"
KIT = ROOT / "target" / "tmp" / "xen-arm64-kit"
BEGIN = "<!-- glass-xen-arm64:begin -->"
END = "<!-- glass-xen-arm64:end -->"
RATES = ("101", "997")
SECONDS = 20
COMMAND = "./x bench xen"


def build_glass():
    env = dict(os.environ, CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER="aarch64-linux-gnu-gcc")
    subprocess.run(["cargo", "build", "--release", "--locked", "-p", "glass", "--target", TRIPLE],
                   cwd=ROOT, env=env, check=True)


def boot_and_measure(work, rounds):
    subprocess.run([str(ROOT / "guests" / "xen-arm64" / "kit.sh"), str(KIT)], check=True,
                   stdout=subprocess.DEVNULL)
    out = work / "xen-arm64"
    out.mkdir(parents=True, exist_ok=True)
    (out / "env").write_text(f"GLASS={GLASS}\nSECONDS_PER_WINDOW={SECONDS}\nROUNDS={rounds}\n"
                             f"RATES=\"{' '.join(RATES)}\"\n")
    env = dict(os.environ, GLASS_XEN_ARM64_BIND=str(GLASS.parent))
    status = subprocess.run([str(ROOT / "guests" / "xen-arm64" / "run.sh"), str(KIT),
                             str(ROOT / "bench" / "xen_arm64_dom0.sh"), str(out), "1800"], env=env)
    if status.returncode != 0:
        sys.exit(f"bench: the nested Xen on ARM64 run failed ({status.returncode}); logs in {out}")
    return out


def ticks_per_round(console):
    """Median virtual-counter ticks per round over a window's `rate` lines (every 5
    rounds in the Xen build; the first, which may have started before the window, left
    out)."""
    values = []
    for line in console.read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) > 1 and fields[1] == "rate":
            kv = dict(f.split("=", 1) for f in fields[2:] if "=" in f)
            values.append(int(kv["cycles"]) / int(kv["rounds"]))
    return statistics.median(values[1:] or values) if values else float("nan")


def glass_figures(err, timing):
    text = err.read_text()
    f = {}
    m = re.search(r"target stopped per sample: mean ([\d.]+) us, p50 ([\d.]+) us, p99 ([\d.]+) us", text)
    f.update(stopped_p50=float(m[2]), stopped_p99=float(m[3]))
    m = re.search(r"stop and registers of \d+ vCPUs? in one exchange: p50 ([\d.]+) us, p99 ([\d.]+) us", text)
    f.update(exchange_p50=float(m[1]), exchange_p99=float(m[2]))
    m = re.search(r"vcpu0: (\d+) samples.*?stack read in p50 ([\d.]+) us", text)
    f.update(stops=int(m[1]), read0_p50=float(m[2]))
    m = re.search(r"\d+ samples, \d+ threads? in \d+ process(?:es)?, ([\d.]+) s at", text)
    f["seconds"] = float(m[1])
    user, system, _elapsed = (float(x) for x in timing.read_text().split()[-3:])
    f["cpu_per_stop_ms"] = (user + system) * 1000 / max(f["stops"], 1)
    f["taken_per_s"] = f["stops"] / f["seconds"]
    # glass's schedule counts the guest's running time (the stopped time is not counted).
    m = re.search(r"\(([\d.]+)/s; (\d+) per second the guest ran", text)
    f["per_running_s"] = float(m[2]) if m else float("nan")
    return f


def parse(out, rounds):
    rows = {}
    for rate in RATES:
        per_round = []
        for r in range(1, rounds + 1):
            f = glass_figures(out / f"glass.{r}.{rate}.err", out / f"glass.{r}.{rate}.time")
            alone = ticks_per_round(out / f"alone.{r}.{rate}.console")
            with_glass = ticks_per_round(out / f"glass.{r}.{rate}.console")
            f["slowdown"] = (with_glass / alone - 1) * 100
            per_round.append(f)
        rows[rate] = {k: statistics.median(f[k] for f in per_round) for k in per_round[0]}
        # Per round too: on a shared host the rounds differ more than the rates do.
        rows[rate]["rounds"] = per_round
    return rows


def markdown(rows, meta):
    lines = [
        BEGIN,
        "## Xen on ARM64: glass record --xen in an arm64 dom0",
        "",
        f"Measured {meta['date']} in one boot of the nested Xen on ARM64 of guests/xen-arm64 "
        f"({meta['qemu']}, TCG, `-M virt,virtualization=on,gic-version=2 -cpu cortex-a57 -smp 2`; "
        "Xen 4.17 for arm64, an arm64 dom0 on one vCPU pinned to pCPU 0 with credit weight 4096), "
        f"{meta['rounds']} rounds, medians over the rounds. Host: 2 cores, load average "
        f"{meta['load'][0]:.1f} at the start and {meta['load'][1]:.1f} at the end. Rerun: `{COMMAND}` "
        "(or `bench/run xen-arm64`); dom0's side is `bench/xen_arm64_dom0.sh`. The guest is "
        "guests/aarch64's unikernel built for Xen (`uk-xen-nofp`, CFI only), 2 vCPUs both on pCPU 1 "
        "(dom0 alone on pCPU 0): vCPU 0 does rounds of alpha/beta/gamma (beta 80 frames, 48 KiB deep) and waits "
        "in wfi 4 ms after each, vCPU 1 spins in delta. glass is the aarch64 release build, "
        f"recording {SECONDS} s per window.",
        "",
        "Median (each round in brackets):",
        "",
        "| rate | stops taken / requested per s | per second the guest ran | stopped per trace p50 | of which pause + 2 contexts, one multicall, p50 | vCPU 0 stack read p50 | dom0 CPU per stop | guest slowdown, own clock |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rate in RATES:
        r = rows[rate]

        def each(key, fmt):
            return ", ".join(fmt(f[key]) for f in r["rounds"])

        lines.append(
            f"| {rate} Hz | {r['taken_per_s']:.1f} / {rate} ({each('taken_per_s', lambda v: f'{v:.1f}')}) "
            f"| **{r['per_running_s']:.0f}** ({each('per_running_s', lambda v: f'{v:.0f}')}) "
            f"| {r['stopped_p50'] / 1000:.2f} ms ({each('stopped_p50', lambda v: f'{v / 1000:.2f}')}) "
            f"| {r['exchange_p50'] / 1000:.2f} ms ({each('exchange_p50', lambda v: f'{v / 1000:.2f}')}) "
            f"| {r['read0_p50']:.0f} us "
            f"| {r['cpu_per_stop_ms']:.2f} ms ({each('cpu_per_stop_ms', lambda v: f'{v:.2f}')}) "
            f"| **{r['slowdown']:+.0f}%** ({each('slowdown', lambda v: f'{v:+.0f}%')}) |")
    lines += [
        "",
        "Under nested TCG every hypercall is emulated twice over (QEMU emulating the CPUs that "
        "Xen, dom0 and the guest run on), so absolute times are 10-100x native ones and swing "
        "with the host's load. The stopped time "
        "per trace runs from before the pause until the unpause returned to glass; the one "
        "multicall (pause, both contexts and states) and the stack reads are the parts glass "
        "times itself, the rest is the unpause and dom0 waiting for its emulated CPU. dom0 CPU "
        "is glass's and its guardian's user+system time (busybox time), hypercalls included. "
        "glass keeps its schedule in the guest's running time (the time it holds the guest "
        "stopped is not counted, as perf's cpu-clock counts a task's own time), takes a late tick at once "
        "(one at a time), and keeps the domain stopped for at most 25% of wall time on average "
        "(`--max-stopped`), so at 997 Hz the stops taken per second the "
        "guest ran are the figure to hold against the rate asked. The guest's slowdown compares its ticks per round (the counter "
        "runs on through pauses) with the window alone just before; on a loaded host that "
        "window's own noise is of the same order.",
        END,
    ]
    return lines


def write(lines):
    section.replace(BEGIN, END, "\n".join(lines))


def run(work):
    rounds = int(os.environ.get("GLASS_BENCH_REPS", "2"))
    if os.environ.get("GLASS_BENCH_XEN_ARM64_OUT"):
        out = Path(os.environ["GLASS_BENCH_XEN_ARM64_OUT"])
        meta = json.loads((out / "meta.json").read_text())
    else:
        build_glass()
        version = subprocess.run(["qemu-system-aarch64", "--version"], capture_output=True,
                                 text=True).stdout.split("\n")[0]
        meta = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "qemu": version,
                "load": [os.getloadavg()[0]], "rounds": rounds}
        out = boot_and_measure(work, rounds)
        meta["load"].append(os.getloadavg()[0])
        (out / "meta.json").write_text(json.dumps(meta))
    write(markdown(parse(out, meta["rounds"]), meta))


if __name__ == "__main__":
    run(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "target" / "tmp" / "xen-arm64-bench")
