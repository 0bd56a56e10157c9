"""Report speed (called by bench/run; `bench/run report` runs only this one). Results
replace the text between the glass-report markers of docs/benchmarks.md.

1. Trace reports: `glass report --format calls` on `glass trace` recordings of about 10 M,
   50 M and 100 M call records (bench/report_calls.c: two threads serving requests
   through 42 small functions at depths 1-8). Wall time, CPU time, minor page faults
   and peak memory, with 1 decoding worker and with one per CPU (the default); the calls
   the report finds are checked against the calls the program counted. Then
   `--format tree`, `--format flamegraph` and `--format invocations --root handle` (one
   row per request) of the same files (default workers).
2. Sample reports against `perf report --stdio` on the same workload recorded for the
   same time at 999 Hz: frame-pointer stacks (glass record, perf record -g), DWARF stacks
   unwound while recording (glass record on a build without frame pointers) and at
   report time (glass record --capture raw), against perf record --call-graph dwarf,
   which perf report always unwinds at report time. Workloads: tests/fixtures/split.c
   (C, with and without frame pointers) and a Python script (python3, libc, libm).
   glass is timed twice: the first report of a build (an empty symbol cache: its symbol
   indexes are built), and a report of a new recording once the cache holds the builds
   (indexed by a report of an earlier recording of the same workload).
"""

import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import section  # bench/: the docs section each script rewrites

ROOT = Path(__file__).resolve().parent.parent
GLASS = ROOT / "target" / "release" / "glass"
BEGIN = "<!-- glass-report:begin -->"
END = "<!-- glass-report:end -->"
# Requests per thread for about 10 M, 50 M and 100 M records (34.25 records a request).
SIZES = [("10 M", 146_000), ("50 M", 730_000), ("100 M", 1_460_000)]
FUNCTIONS = "handle,stage*,helper*,walk"
SECONDS = float(os.environ.get("GLASS_BENCH_REPORT_SECONDS", "4"))
# Measured by hand with the build before tree, flamegraph and invocations streamed.
BEFORE_STREAMING_PATHS = ("`--format tree` 1.16 s wall and 1.28 GB peak RSS, `flamegraph` 2.10 s and 1.78 GB, "
                          "`invocations --root handle` 3.98 s and 1.84 GB; streamed: 0.15 s and 18 MB, 0.16 s "
                          "and 18 MB, 0.34 s and 149 MB (the same outputs).")

PYTHON_WORK = """
import json, re, sys, time

end = time.time() + float(sys.argv[1])
n = 0
while time.time() < end:
    d = {str(i): [i, i * 2, {"k": str(i)}] for i in range(300)}
    s = json.dumps(d)
    json.loads(s)
    re.findall(r"\\d+", s)
    sorted(d.items(), key=lambda kv: kv[1][1])
    n += 1
print(n)
"""


def reps():
    return int(os.environ.get("GLASS_BENCH_REPS", "3"))


def measured(command):
    """Runs `command` (output discarded): wall seconds, CPU seconds (user + system),
    minor page faults, peak resident KiB."""
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.monotonic() - start
    if status != 0:
        raise RuntimeError(f"{command} failed ({status})")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_minflt, usage.ru_maxrss


def median_run(command):
    runs = [measured(command) for _ in range(reps())]
    return tuple(statistics.median(r[i] for r in runs) for i in range(4))


def trace_reports(work):
    program = work / "report_calls"
    subprocess.run(["gcc", "-O2", "-g", "-pthread", str(ROOT / "bench" / "report_calls.c"), "-o", str(program)],
                   check=True)
    rows = []
    for label, requests in SIZES:
        recording = work / f"calls-{requests}.glass"
        traced = subprocess.run([str(GLASS), "trace", "-q", "--ring-size", str(4 << 20), "-o", str(recording),
                                 "-f", FUNCTIONS, "--", str(program), str(requests), "2"],
                                capture_output=True, text=True, check=True)
        made = int(traced.stdout.split("calls=")[1].split()[0])
        report = subprocess.run([str(GLASS), "report", str(recording), "--format", "calls"],
                                capture_output=True, text=True, check=True).stdout
        header = report.splitlines()[0]
        found = int(re.search(r": (\d+) calls,", header).group(1))
        lost = "no records lost" not in header
        records = 2 * found
        one = median_run([str(GLASS), "report", str(recording), "--format", "calls", "--jobs", "1"])
        default = median_run([str(GLASS), "report", str(recording), "--format", "calls"])
        # The call tree and the flame graph, summed per call path as the file streams.
        tree = median_run([str(GLASS), "report", str(recording), "--format", "tree", "-o", os.devnull])
        flame = median_run([str(GLASS), "report", str(recording), "--format", "flamegraph", "-o", os.devnull])
        # One row per request: LProfile's per-packet view.
        invocations = median_run([str(GLASS), "report", str(recording), "--format", "invocations", "--root",
                                  "handle", "-o", os.devnull])
        rows.append({"label": label, "records": records, "bytes": recording.stat().st_size, "made": made,
                     "found": found, "lost": lost, "one": one, "default": default, "tree": tree,
                     "flame": flame, "invocations": invocations})
        print(f"bench: report {label}: {rows[-1]}", file=sys.stderr)
        recording.unlink()
    return rows


def build_id(path):
    """The GNU build id of the ELF file at `path`, in hex (the symbol cache's key)."""
    notes = subprocess.run(["readelf", "-n", os.path.realpath(path)], capture_output=True, text=True).stdout
    return re.search(r"Build ID: ([0-9a-f]+)", notes).group(1)


def sample_reports(work):
    split = work / "split"
    split_nofp = work / "split_nofp"
    source = ROOT / "tests" / "fixtures" / "split.c"
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", str(source), "-o", str(split)], check=True)
    subprocess.run(["gcc", "-O2", "-g", "-fomit-frame-pointer", str(source), "-o", str(split_nofp)], check=True)
    script = work / "work.py"
    script.write_text(PYTHON_WORK)
    # split runs ~0.44 ms a round: rounds for the same time as the Python script.
    rounds = str(int(SECONDS * 2250))
    # (name, command, glass options, perf event, perf options). The C workload never
    # enters the kernel but by chance (a page fault): recorded user-only by both tools, or
    # whether perf report reads /proc/kallsyms (60 ms) would depend on one sample.
    user = ["--no-kernel"]
    cases = [
        ("split.c, frame pointers", [str(split), rounds], user, "cpu-clock:u", ["-g"]),
        ("split.c without frame pointers: DWARF while recording", [str(split_nofp), rounds], user,
         "cpu-clock:u", ["--call-graph", "dwarf"]),
        ("split.c without frame pointers: --capture raw", [str(split_nofp), rounds], ["--capture", "raw"],
         "cpu-clock:u", ["--call-graph", "dwarf"]),
        ("python3 script (kernel stacks too)", ["python3", str(script), str(SECONDS)], [], "cpu-clock", ["-g"]),
        ("python3 script: --capture raw", ["python3", str(script), str(SECONDS)], ["--capture", "raw"],
         "cpu-clock", ["--call-graph", "dwarf"]),
    ]
    rows = []
    for name, target, glass_options, event, perf_options in cases:
        earlier, glass_file, perf_file = work / "earlier.glass", work / "s.glass", work / "s.data"
        for recording in (earlier, glass_file):
            subprocess.run([str(GLASS), "record", "-q", "-F", "999", *glass_options, "-o", str(recording), "--",
                            *target], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run(["perf", "record", "-q", "-e", event, "-F", "999", *perf_options, "-o", str(perf_file),
                        "--", *target], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        info = subprocess.run([str(GLASS), "info", str(glass_file)], capture_output=True, text=True).stdout
        found = re.search(r"(\d+) samples \(.*?\), (\d+) raw stack snapshots", info)
        samples = str(int(found.group(1)) + int(found.group(2))) if found else "?"
        report = [str(GLASS), "report", str(glass_file)]
        first_runs = []
        for rep in range(reps()):
            cache = work / f"cache-first-{rep}"
            shutil.rmtree(cache, ignore_errors=True)
            os.environ["GLASS_SYMBOL_CACHE"] = str(cache)
            first_runs.append(measured(report))
        first = tuple(statistics.median(r[i] for r in first_runs) for i in range(4))
        # The builds indexed by a report of the earlier recording: the usual case.
        cache = work / "cache-known"
        shutil.rmtree(cache, ignore_errors=True)
        os.environ["GLASS_SYMBOL_CACHE"] = str(cache)
        measured([str(GLASS), "report", str(earlier)])
        known = median_run(report)
        # A program of the user's first reported, the system's libraries already indexed
        # (by any earlier report on this machine): the cache less the program's index.
        executable = shutil.which(target[0])
        if Path(executable).read_bytes()[:4] != b"\x7fELF":
            # A launcher script (pyenv's shim) execs the interpreter: ask it which.
            executable = subprocess.run([target[0], "-c", "import sys; print(sys.executable)"],
                                        capture_output=True, text=True, check=True).stdout.strip()
        program = build_id(executable)
        new_runs = []
        for rep in range(reps()):
            new_program = work / f"cache-new-program-{rep}"
            shutil.rmtree(new_program, ignore_errors=True)
            shutil.copytree(cache, new_program, ignore=shutil.ignore_patterns(program + "*"))
            os.environ["GLASS_SYMBOL_CACHE"] = str(new_program)
            new_runs.append(measured(report))
        new = tuple(statistics.median(r[i] for r in new_runs) for i in range(4))
        del os.environ["GLASS_SYMBOL_CACHE"]
        perf = median_run(["perf", "report", "-i", str(perf_file), "--stdio"])
        rows.append({"name": name, "perf_options": " ".join(["-e", event, *perf_options]),
                     "glass_options": " ".join(glass_options),
                     "samples": samples, "glass_bytes": glass_file.stat().st_size,
                     "perf_bytes": perf_file.stat().st_size, "first": first, "new": new, "glass": known,
                     "perf": perf})
        print(f"bench: sample report {name}: {rows[-1]}", file=sys.stderr)
    return rows


def markdown(trace_rows, sample_rows):
    lines = [BEGIN, "## Report speed: traces at disk speed, sample reports against perf report", ""]
    lines.append(f"Measured {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; `./x bench report` "
                 f"(`bench/report_bench.py`), median of {reps()} runs, 2 cores, files in the page cache. "
                 "Wall time is what a user waits; CPU time is user + system of all threads.")
    lines += ["", "### `glass report --format calls` on traces",
              "",
              "`glass trace -f '" + FUNCTIONS + "'` of `bench/report_calls.c` (two threads serving requests through "
              "42 small functions, depths 1 to 8). The report streams the file in 2 MiB blocks and sums each "
              "traced thread's calls on one of its decoding workers (`--jobs`, default one per CPU); "
              "`calls found` is the report's count against the calls the program counted.", "",
              "| records | file | calls found / made | workers | wall | records/s | CPU | minor faults | peak RSS |",
              "|---|---|---|---|---|---|---|---|---|"]
    for row in trace_rows:
        check = f"{row['found']:,} / {row['made']:,}" + (" (records lost)" if row["lost"] else "")
        for workers, figures in (("1", row["one"]), ("2 (default)", row["default"])):
            wall, cpu, faults, rss = figures
            lines.append(f"| {row['records'] / 1e6:.1f} M | {row['bytes'] / 2**20:.0f} MiB | {check} | {workers} | "
                         f"{wall:.2f} s | {row['records'] / wall / 1e6:.0f} M/s | {cpu:.2f} s | {faults:,.0f} | "
                         f"{rss / 1024:.0f} MiB |")
    lines += ["",
              "Before (the whole recording read into memory, every call built, then the model every format "
              "shares): 100 M records of this workload took 49 s wall, 16 s of it in the kernel, 2.2 M minor "
              "page faults and 7.4 GB; the 4 s nginx trace of the issue (56 M records, 208 MB) 10.9 s.", "",
              "### `--format tree`, `flamegraph` and `invocations` on the same traces", "",
              "Summed while the file streams (as `calls`, default workers): the tree and the flame graph "
              "per call path, the invocations one row per call of the root (`--root handle`: one per "
              "request, 34.25 records each). Wall time, records/s, CPU time and peak RSS.", "",
              "| records | tree | flame graph | invocations (rows) |",
              "|---|---|---|---|"]
    for row in trace_rows:
        cells = []
        for key in ("tree", "flame", "invocations"):
            wall, cpu, _, rss = row[key]
            cells.append(f"{wall:.2f} s, {row['records'] / wall / 1e6:.0f} M/s, CPU {cpu:.2f} s, "
                         f"{rss / 1024:.0f} MiB")
        lines.append(f"| {row['records'] / 1e6:.1f} M | " + " | ".join(cells) + " |")
    lines += ["",
              "Before (every call built in memory first), on a 17 M-record trace of this workload: "
              + BEFORE_STREAMING_PATHS, "",
              "### Sample reports against `perf report --stdio`", "",
              f"The same workload recorded by each tool for about {SECONDS:.0f} s at 999 Hz, then each tool's "
              "default report of its own file (glass: the top table; perf: its `--stdio` report with "
              "call chains). glass is timed on the first report of the builds (an empty symbol cache: "
              "each module's symbol index is built from its DWARF and symbols) and on a new recording "
              "once the cache holds them (indexed by a report of an earlier recording of the same "
              "workload: what every later report of these programs costs), and between the two on the "
              "first report of the program once the system's libraries are indexed (by any earlier report "
              "on the machine: the cache less the program's own index). `perf/glass` is perf's "
              "time over glass's.", "",
              "| workload | glass record | perf record | samples (glass) | file glass / perf | glass first report "
              "wall (CPU) | glass, new program, wall | glass, builds known, wall (CPU) | perf wall (CPU) | "
              "perf/glass first | perf/glass new program | perf/glass known (CPU) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in sample_rows:
        f, n, g, p = row["first"], row["new"], row["glass"], row["perf"]
        lines.append(f"| {row['name']} | {row['glass_options'] or 'default'} | {row['perf_options']} | "
                     f"{row['samples']} | {row['glass_bytes'] / 1024:.0f} / {row['perf_bytes'] / 1024:.0f} KiB | "
                     f"{f[0] * 1e3:.0f} ms ({f[1] * 1e3:.0f}) | {n[0] * 1e3:.1f} ms | "
                     f"{g[0] * 1e3:.1f} ms ({g[1] * 1e3:.1f}) | "
                     f"{p[0] * 1e3:.0f} ms ({p[1] * 1e3:.0f}) | {p[0] / f[0]:.1f}x | {p[0] / n[0]:.1f}x | "
                     f"{p[0] / g[0]:.1f}x ({p[1] / g[1]:.1f}x) |")
    lines += ["",
              "What each report has to do: perf report with `--call-graph dwarf` data unwinds every sample's "
              "copied stack at report time (libunwind/libdw over each module's CFI); glass's default recording "
              "was unwound while recording, so its report only symbolizes. With `--capture raw` glass unwinds "
              "at report time too (its own DWARF unwinder over the modules' mapped unwind sections, on all "
              "cores). perf report names frames from symbol tables; glass names inlined functions too, from "
              "DWARF, which used to be most of a short report's time (inflating libc's compressed debug "
              "sections, walking libpython's 23 MB). Now each build's DWARF and symbols are read once into a "
              "symbol index kept under `~/.cache/glass/symbols` by build id (`GLASS_SYMBOL_CACHE`), mapped "
              "and binary-searched by every later report, whichever recording it reads; the index names every "
              "address exactly as addr2line does (tests compare the two on every address of libc, libpython "
              "and glass itself). The first report of a build pays for the index (about 65 ms each on one core for "
              "libc and libpython, 0.6 s for glass's own Rust DWARF; libc's 45 ms when a second core is free; the modules the samples run in are "
              "indexed side by side, one per core), more than the lazy lookups it replaces: the first report "
              "of the python3 workload takes about as long as perf's, every later one a tenth of it or less. "
              "A build is indexed once per machine: the system's libraries (libc, and libpython for every "
              "Python script) by whichever report meets them first, so a new program of the user's pays only "
              "for its own index (the `new program` column: for these small programs, next to nothing; for "
              "the python3 rows the interpreter's executable, libpython being a library). Where perf report "
              "has little to do (a small program recorded user-only, "
              "frame pointers: it reads two symbol tables, ~9 ms) both reports are near what starting the "
              "program costs (glass: ~1.3 ms for `glass --version`) and the ratio stays near 5x; one kernel "
              "sample makes perf report read /proc/kallsyms (~60 ms more), while glass names kernel frames "
              "from the symbols the recording kept.",
              "", END]
    return "\n".join(lines)


def write_section(text):
    section.replace(BEGIN, END, text)


def run(work):
    work = Path(work)
    trace_rows = trace_reports(work)
    sample_rows = sample_reports(work)
    write_section(markdown(trace_rows, sample_rows))
