"""Lost samples: glass's perf backend against `perf record --call-graph dwarf` (called by
bench/run; `bench/run loss` runs only this). Results replace the text between the
glass-loss markers of docs/benchmarks.md.

Each workload is recorded by both tools at 499 and 999 Hz, one after the other in the same
run, with their default stack sizes (glass copies 16 KiB per sample, perf 8 KiB): `node`
running CPU-bound JavaScript, `python3` running CPU-bound Python (tests/fixtures/loss/),
and 16 C threads spinning (tests/fixtures/loss/threads16.c). glass's counts come from its
summary line; perf's from `perf report -D` (its PERF_RECORD_SAMPLE and the `lost:` of its
PERF_RECORD_LOST records).
"""

import os
import re
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from trace_bench import machine

import section  # bench/: the docs section each script rewrites

ROOT = Path(__file__).resolve().parent.parent
GLASS = ROOT / "target" / "release" / "glass"
BEGIN = "<!-- glass-loss:begin -->"
END = "<!-- glass-loss:end -->"
RATES = ("499", "999")
MS = os.environ.get("GLASS_BENCH_LOSS_MS", "3000")


def install(package):
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", package], check=True, env=env,
                   stdout=subprocess.DEVNULL)


def glass(argv, rate, out):
    run = subprocess.run([str(GLASS), "record", "--backend", "perf", "-F", rate, "-o", str(out), "--", *argv],
                         capture_output=True, text=True, check=True)
    samples = int(re.search(r"glass: (\d+) samples", run.stderr).group(1))
    lost = int(re.search(r"lost samples (\d+)", run.stderr).group(1))
    rings = re.search(r"perf rings: (.*)", run.stderr)
    return {"samples": samples, "lost": lost, "rings": rings.group(1) if rings else ""}


def perf(argv, rate, out):
    subprocess.run(["perf", "record", "-q", "-F", rate, "--call-graph", "dwarf", "-o", str(out), "--", *argv],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dump = subprocess.run(["perf", "report", "-D", "-i", str(out)], capture_output=True, text=True).stdout
    samples = dump.count("PERF_RECORD_SAMPLE(")
    lost = sum(int(m) for m in re.findall(r"PERF_RECORD_LOST: .*lost:(\d+)", dump))
    return {"samples": samples, "lost": lost}


def measure(work):
    node = shutil.which("node") or (install("nodejs") or shutil.which("node"))
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else shutil.which("python3")
    threads = work / "threads16"
    subprocess.run(["gcc", "-O2", "-g", "-pthread", str(ROOT / "tests" / "fixtures" / "loss" / "threads16.c"),
                    "-o", str(threads)], check=True)
    loss = ROOT / "tests" / "fixtures" / "loss"
    workloads = [
        ("node (CPU-bound JavaScript)", [node, str(loss / "busy.js"), MS]),
        ("python3 (CPU-bound Python)", [python, str(loss / "busy.py"), MS]),
        ("16 C threads", [str(threads), str(int(MS) // 60)]),
    ]
    rows = []
    for name, argv in workloads:
        for rate in RATES:
            g = glass(argv, rate, work / "loss.glass")
            p = perf(argv, rate, work / "loss.data")
            print(f"bench: loss {name} {rate} Hz: glass {g}, perf {p}", file=sys.stderr)
            rows.append((name, rate, g, p))
    return rows


def markdown(rows):
    lines = [BEGIN, "## Lost samples: glass's perf backend against perf record --call-graph dwarf", "",
             f"Measured {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} on {machine()}; "
             "`./x bench loss` (`bench/loss_bench.py`). Each workload ran about "
             f"{int(MS) / 1000:.0f} s under each tool, one after the other; default stack sizes (glass 16 KiB "
             "per sample, perf 8 KiB). glass sizes its rings per CPU from the rate and the stack size (half a "
             "second of samples) and drains them from a thread of its own; before that (1 MiB rings drained by "
             "the thread that also unwinds) `node` lost 5-7% at 499 Hz and 999 Hz.", "",
             "| workload | rate | glass samples | glass lost | perf samples | perf lost | glass rings |",
             "|---|---|---|---|---|---|---|"]
    for name, rate, g, p in rows:
        lines.append(f"| {name} | {rate} Hz | {g['samples']} | {g['lost']} | {p['samples']} | {p['lost']} | "
                     f"{g['rings']} |")
    glass_lost = sum(g["lost"] for _, _, g, _ in rows)
    perf_lost = sum(p["lost"] for _, _, _, p in rows)
    lines += ["", f"Lost in all: glass {glass_lost}, perf {perf_lost} (goal: glass 0 where perf loses 0).",
              "perf samples in frequency mode (`-F`), glass at a fixed period of CPU time; both sample kernel mode "
              "here (glass records kernel stacks by default where permitted; without them it samples user mode only "
              "and counts fewer).", "", END]
    return "\n".join(lines)


def write_section(text):
    section.replace(BEGIN, END, text)


def run(work):
    if not shutil.which("perf"):
        install("linux-perf")
    write_section(markdown(measure(Path(work))))
