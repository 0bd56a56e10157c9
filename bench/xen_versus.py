"""glass against a uniprof-like reference on Xen (issue 34; called by bench/run's xen entry,
after bench/xen_bench.py). Results replace the text between the glass-xen-versus markers
of docs/benchmarks.md.

uniprof, the seed's Xen profiler, is not run here: bench/xen_reference.c does what it does
(pause; every vCPU's context through libxencall with one reused hypercall buffer; a
frame-record walk reading two words per frame through cached foreign mappings; unpause;
a loop that takes late ticks at once, spins for deadlines nearer than its shortest
nanosleep and keeps no budget) and writes raw traces, symbolized here with the guest
ELF's `nm -n`. Both run in one boot of the nested Xen of guests/xen on the set-up of the
issue: the PV demo unikernel with one vCPU, alone on pCPU 1; dom0 alone on pCPU 0
(pinned, credit2 weight 4096). bench/xen_versus_dom0.sh runs in dom0, in rounds of
alternating order: the reference and glass at 101 Hz, at 997 Hz, and glass at 997 Hz with
`--max-stopped 100` (the reference has no budget, so its 997 Hz run is the comparison),
and glass's 101 Hz and `--max-stopped 100` runs again on `--clock wall` (the reference's
clock, where glass's default counts the guest's running time), with windows of no tool between them for the guest's own pace.

Figures per run, medians over the rounds (GLASS_BENCH_REPS, default 3): traces per wall
second (and per second the guest ran), the stopped window's p50 and each part of it, the
guest's slowdown by its own TSC rounds against the no-tool windows, and the worst of the
alpha/beta/gamma shares against the guest's own split over the run (its console's
cumulative `split ... time=` lines).

GLASS_BENCH_XEN_VERSUS_OUT=target/tmp/xen-versus re-renders the section from a finished
run's files without booting. GLASS_BENCH_XEN_KIT=DIR uses an already built kit of
guests/xen/kit.sh as it is (default: target/tmp/xen-kit, built or refreshed first).
"""

import bisect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import section
from xen_bench import Console, med, measured_or_kept, run_in_nested_xen, stamped

ROOT = Path(__file__).resolve().parent.parent
GLASS = ROOT / "target" / "release" / "glass"
BEGIN = "<!-- glass-xen-versus:begin -->"
END = "<!-- glass-xen-versus:end -->"
SECONDS = 8
IDLE = 5
# glass's runs: RUN names its files; the reference runs at the rate alone (no budget).
RUNS = {"101": ("101", "101"), "997": ("997", "997"), "997max": ("997", "997"),
        "101wall": ("101", "101"), "997maxwall": ("997", "997")}
# The table's sections, in order, and the goals each holds glass to.
TITLES = {"101": "101 Hz",
          "101wall": "101 Hz, glass with `--clock wall` (the reference's clock)",
          "997": "997 Hz",
          "997max": "997 Hz, glass with `--max-stopped 100` (the reference's 997 Hz runs)",
          "997maxwall": "997 Hz, glass with `--max-stopped 100 --clock wall` (the reference's 997 Hz runs)"}
GOAL_RATE = ("101", "101wall", "997max", "997maxwall")
GOAL_P50 = ("101", "101wall", "997")
FUNCTIONS = ("alpha", "beta", "gamma")
COMMAND = "./x bench xen"


def reps():
    return max(int(os.environ.get("GLASS_BENCH_REPS", "3")), 1)


def fields_of(line):
    return dict(x.split("=", 1) for x in line.split() if "=" in x)


def number(pattern, text, name, where, required=True):
    """The first group of `pattern` in `text` as a float; a figure the bench cannot do
    without fails the run by name (glass's summary wording may change under it)."""
    m = re.search(pattern, text)
    if m:
        return float(m[1])
    if required:
        raise RuntimeError(f"{where}: no {name} in glass's summary (pattern {pattern!r}); its output:\n{text}")
    return float("nan")


def glass_figures(path):
    """What the bench needs of glass record's stamped stderr. Only the stopped time's p50
    and the rate are required; the parts are taken where glass names them as it did when
    this was written, and every summary line that gives a p50 is kept verbatim for the
    section, so that new or renamed parts still show."""
    lines = stamped(path)
    text = "\n".join(t for _, t in lines)
    where = str(path)
    f = {"p50": number(r"stopped per sample:[^\n]*?p50 ([\d.]+) us", text, "stopped p50", where),
         "p99": number(r"stopped per sample:[^\n]*?p99 ([\d.]+) us", text, "stopped p99", where, False),
         "mean": number(r"stopped per sample:[^\n]*?mean ([\d.]+) us", text, "stopped mean", where, False),
         "overhead": number(r"overhead ([\d.]+)% of wall", text, "overhead", where, False),
         "exchange": number(r"in one exchange: p50 ([\d.]+) us", text, "exchange", where, False),
         "read": number(r"vcpu0: [^\n]*?stack read in p50 ([\d.]+) us", text, "stack read", where, False),
         "user": number(r"own CPU per stop: ([\d.]+) us user", text, "user CPU", where, False),
         "system": number(r"own CPU per stop: [\d.]+ us user, ([\d.]+) us system", text, "system CPU", where,
                          False),
         "waiting": number(r"waiting between stops: ([\d.]+)%", text, "waiting", where, False)}
    m = re.search(r"stops taken: (\d+) in ([\d.]+) s \(([\d.]+)/s; ([\d.]+) per second the guest ran", text)
    if m:
        f.update(stops=int(m[1]), per_s=float(m[3]), per_running_s=float(m[4]))
    else:
        # Older or newer wording: the samples over the recording's length (one vCPU: a
        # sample per stop).
        m = re.search(r"glass: (\d+) samples?,[^\n]*? ([\d.]+) s at", text)
        if not m:
            raise RuntimeError(f"{where}: neither `stops taken` nor the samples line in glass's summary:\n{text}")
        f.update(stops=int(m[1]), per_s=int(m[1]) / float(m[2]), per_running_s=float("nan"))
    f["cpu"] = f["user"] + f["system"]
    # The resume as glass times it, where its summary says; else the rest of its p50.
    resume = number(r"resume, until it returned to glass: p50 ([\d.]+) us", text, "resume", where, False)
    f["unpause"] = resume if resume == resume else f["p50"] - f["exchange"] - f["read"]
    # The deadlines of its schedule (in the guest's running time) that it took.
    m = re.search(r"of its (\d+) deadlines, (\d+) taken", text)
    f["taken_share"] = 100 * int(m[2]) / max(int(m[1]), 1) if m else float("nan")
    f["stop_lines"] = [t for t in (line.removeprefix("glass: ") for _, line in lines)
                       if re.search(r"p50 [\d.]+ us", t)]
    # The sampling window: from glass's own account of -d (set-up before it, the sampled
    # seconds), anchored at its first line; else the lines xen_bench.py uses; else the
    # whole process.
    m = re.search(r"sampled ([\d.]+) s; before it ([\d.]+) s setting up", text)
    first = lines[0][0] if lines else float("nan")
    if m:
        start = path_start(path) + float(m[2])
        f["window"] = (start, start + float(m[1]))
    else:
        start = [t for t, line in lines if "unwind tables of" in line]
        end = [t for t, line in lines if "stop and registers of" in line]
        f["window"] = (start[0] if start else first, end[0] if end else lines[-1][0])
    return f


def path_start(path):
    """When dom0 started the run in `path` (its glass-start event)."""
    run, round_ = path.name.split(".")[1:3]
    for t, text in stamped(path.parent / "events.log"):
        if text.split()[:3] == ["glass-start", run, round_]:
            return t
    raise RuntimeError(f"no glass-start {run} {round_} in {path.parent}/events.log")


def reference_figures(path):
    line = path.read_text().strip()
    f = fields_of(line)
    if "p50_us" not in f or "per_s" not in f:
        err = path.parent / path.name.replace(".out", ".err")
        raise RuntimeError(f"xen_reference gave no figures ({path}): {line}\n"
                           f"{err.read_text() if err.exists() else ''}")
    f = {k: float(v) for k, v in f.items()}
    # The deadlines of its schedule (wall-clock) that it took.
    f["taken_share"] = 100 * f["stops"] / max(f["hz"] * f["seconds"], 1)
    # Per second the guest ran, as glass counts it: the stopped time taken out.
    running = f["seconds"] - f["stops"] * f["mean_us"] / 1e6
    f["per_running_s"] = f["traces"] / running if running > 0 else float("nan")
    f["window"] = (f["start_real"], f["end_real"])
    return f


class Symbols:
    """Text symbols of the guest ELF from `nm -n`, looked up by address."""

    def __init__(self, elf):
        out = subprocess.run(["nm", "-n", str(elf)], capture_output=True, text=True, check=True).stdout
        self.starts, self.names = [], []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "tTwW":
                self.starts.append(int(parts[0], 16))
                self.names.append(parts[2])

    def name(self, address):
        i = bisect.bisect_right(self.starts, address) - 1
        return self.names[i] if i >= 0 else "?"


def reference_stacks(traces, symbols):
    """vCPU 0's traces as lists of function names. A return address is looked up one byte
    back, inside the call it returns from (a call ending a function would otherwise name
    the next one)."""
    stacks = []
    for line in traces.read_text().splitlines():
        words = line.split()
        if len(words) < 3 or words[1] != "0":
            continue
        addresses = [int(w, 16) for w in words[2:]]
        stacks.append([symbols.name(a if i == 0 else a - 1) for i, a in enumerate(addresses)])
    return stacks


def glass_stacks(recording, folded):
    """vCPU 0's stacks of glass's recording (`glass report --format folded --threads`, kept
    beside it so that a re-render needs no glass run)."""
    if not folded.exists():
        run = subprocess.run([str(GLASS), "report", str(recording), "--format", "folded", "--threads"],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"glass report {recording} failed: {run.stderr}")
        folded.write_text(run.stdout)
    stacks = []
    for line in folded.read_text().splitlines():
        if not line.strip():
            continue
        stack, count = line.rsplit(" ", 1)
        frames = stack.split(";")
        if len(frames) > 1 and frames[1].startswith("vcpu0"):
            stacks += [frames] * int(count)
    return stacks


def split_of(stacks):
    """alpha/beta/gamma shares of the stacks that hold one of them (the busy ones), as the
    Xen tests count glass's (crates/glass/tests/xen.rs: a sample counts for a function when
    its stack holds it)."""
    counts = {fn: sum(1 for s in stacks if fn in s) for fn in FUNCTIONS}
    busy = sum(counts.values())
    shares = {fn: 100 * n / busy if busy else float("nan") for fn, n in counts.items()}
    return shares, busy


def own_split(console_lines, window):
    """The guest's own split over a run: the difference of its cumulative `time=TA/TB/TG`
    between the first and the last split line that reached dom0 inside the window."""
    inside = [(t, text) for t, text in console_lines if window[0] <= t <= window[1] and text.startswith("split ")]
    if len(inside) < 2:
        return None
    first, last = (fields_of(text) for _, text in (inside[0], inside[-1]))
    delta = [int(y) - int(x) for x, y in zip(first["time"].split("/"), last["time"].split("/"))]
    busy = sum(delta)
    if busy <= 0:
        return None
    own = {fn: 100 * d / busy for fn, d in zip(FUNCTIONS, delta)}
    own["rounds"] = int(last["rounds"]) - int(first["rounds"])
    return own


def worst(shares, own):
    if own is None:
        return float("nan")
    return max(abs(shares[fn] - own[fn]) for fn in FUNCTIONS)


def boot_and_measure():
    """Builds the guest and the reference, boots the nested Xen once and runs
    bench/xen_versus_dom0.sh there; the run's files stay in target/tmp/xen-versus."""
    out = ROOT / "target" / "tmp" / "xen-versus"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    pv = out / "pv"
    subprocess.run([str(ROOT / "guests" / "xenpv" / "build.sh"), str(pv), "0"], check=True,
                   stdout=subprocess.DEVNULL)
    reference = out / "xen_reference"
    subprocess.run(["gcc", "-O2", "-Wall", str(ROOT / "bench" / "xen_reference.c"), "-o", str(reference),
                    "-lxenctrl", "-lxencall", "-lxenforeignmemory"], check=True)
    (out / "env").write_text(f"GLASS={GLASS}\nPV_ELF={pv / 'uk-pv.elf'}\nREF={reference}\nROUNDS={reps()}\n"
                             f"IDLE={IDLE}\nRUN_SECONDS={SECONDS}\n")
    print(f"bench: xen versus: booting the nested Xen ({reps()} rounds; logs in {out})", file=sys.stderr)
    # As the Xen tests boot it (crates/glass/tests/xen.rs): SVM without SMAP and without AVX.
    timeout = 600 + reps() * (3 * IDLE + 7 * (SECONDS + 40))
    run_in_nested_xen(ROOT / "bench" / "xen_versus_dom0.sh", out, timeout, "max,-smap,-avx,-avx2")
    return out


def parse(out):
    events = [(t, text.split()) for t, text in stamped(out / "events.log")]
    console = Console(out / "console.stamped")
    console_lines = stamped(out / "console.stamped")
    tsc = re.search(r"Detected ([\d.]+) MHz", (out / "tsc.txt").read_text())
    tsc_hz = float(tsc[1]) * 1e6 if tsc else float("nan")
    opened, idle = {}, {}
    for t, words in events:
        if words[0] == "idle-start":
            opened[words[1]] = t
        elif words[0] == "idle-end" and words[1] in opened:
            w = console.window(opened[words[1]], t)
            if w["lines"]:
                # Windows are named ROUND.a/b/c.
                idle.setdefault(int(words[1].split(".")[0]), []).append(w)
    if not idle:
        raise RuntimeError(f"no window without a tool has the guest's rate lines; see {out}/console.stamped")
    alone = med([w["cycles"] for ws in idle.values() for w in ws])
    # Each run is held against its own round's windows: the host's load (other sessions'
    # VMs on its 2 cores) changes over minutes, and the guest's pace with it.
    alone_in = {round_: med([w["cycles"] for w in ws]) for round_, ws in idle.items()}
    symbols = Symbols(out / "pv" / "uk-pv.elf")
    r = {"glass": {run: [] for run in RUNS}, "ref": {hz: [] for hz in ("101", "997")}, "tsc_hz": tsc_hz,
         "alone": {"windows": sum(len(ws) for ws in idle.values()), "rounds_per_s": tsc_hz / alone}}

    def guest_side(f, stacks, round_):
        during = console.window(*f["window"])
        f["slowdown"] = during["cycles"] / alone_in.get(round_, alone) - 1
        f["rate_lines"] = during["lines"]
        f["split"], f["busy"] = split_of(stacks)
        f["own"] = own_split(console_lines, f["window"])
        f["worst"] = worst(f["split"], f["own"])
        return f

    # The rounds the run left (a re-render need not have GLASS_BENCH_REPS as the run had).
    rounds = sorted(int(p.name.split(".")[2]) for p in out.glob("glass.101.*.err"))
    # A run from before the --clock wall runs re-renders without them.
    for run in [run for run in RUNS if not (out / f"glass.{run}.{rounds[0] if rounds else 0}.err").exists()]:
        del r["glass"][run]
    if not rounds:
        raise RuntimeError(f"no glass runs in {out}")
    r["rounds"] = len(rounds)
    for round_ in rounds:
        for run in r["glass"]:
            base = f"glass.{run}.{round_}"
            f = glass_figures(out / f"{base}.err")
            r["glass"][run].append(guest_side(f, glass_stacks(out / f"{base}.glass", out / f"{base}.folded"), round_))
        for hz in r["ref"]:
            base = f"ref.{hz}.{round_}"
            f = reference_figures(out / f"{base}.out")
            stacks = reference_stacks(out / f"{base}.traces", symbols)
            # Traces whose leaf is mix_block: its caller, gamma, is not in them (below).
            f["mix_leaf"] = sum(1 for s in stacks if s and s[0] == "mix_block" and "gamma" not in s)
            r["ref"][hz].append(guest_side(f, stacks, round_))
        for run in r["glass"]:
            g = r["glass"][run][-1]
            x = r["ref"][RUNS[run][1]][-1]
            print(f"bench: xen versus round {round_} {run}: glass {g['per_s']:.0f}/s p50 {g['p50']:.0f} us "
                  f"slowdown {100 * g['slowdown']:+.1f}% split {fmt_split(g)}; reference {x['per_s']:.0f}/s "
                  f"p50 {x['p50_us']:.0f} us slowdown {100 * x['slowdown']:+.1f}% split {fmt_split(x)}",
                  file=sys.stderr)
    others = out / "others.txt"
    r["others"] = (dict((k, int(v)) for k, v in (x.split("=") for x in others.read_text().split()))
                   if others.exists() else {})
    return r


def fmt_split(f):
    shares = "/".join(f"{f['split'][fn]:.1f}" for fn in FUNCTIONS)
    own = "/".join(f"{f['own'][fn]:.1f}" for fn in FUNCTIONS) if f["own"] else "?"
    return f"{shares} against the guest's {own} ({f['busy']} busy)"


def median_of(runs, key):
    return med([f[key] for f in runs if key in f])


def split_text(runs):
    """The median round's split: the one whose worst point is the median."""
    ok = sorted((f for f in runs if f["worst"] == f["worst"]), key=lambda f: f["worst"])
    if not ok:
        return "no split"
    f = ok[(len(ok) - 1) // 2]
    shares = "/".join(f"{f['split'][fn]:.1f}" for fn in FUNCTIONS)
    own = "/".join(f"{f['own'][fn]:.1f}" for fn in FUNCTIONS)
    return f"{shares} of {f['busy']} busy traces, the guest's own {own} over {f['own']['rounds']} rounds"


def num(value, spec=".0f", unit=""):
    """A figure for the table, or a dash where a run did not give it."""
    return "—" if value != value else f"{value:{spec}}{unit}"


def goal(glass, reference, better):
    """Whether glass meets a goal against the reference (or, with `better` "at most N",
    an absolute bound)."""
    if glass != glass or reference != reference:
        return "no figure"
    met = glass >= reference if better == "more" else glass <= reference
    return "yes" if met else "**no**"


def markdown(r, meta):
    g = r["glass"]
    ref = r["ref"]
    rows = []
    for run, title in TITLES.items():
        if run not in g:
            continue
        x, y = g[run], ref[RUNS[run][1]]

        def both(gkey, rkey, scale=1.0):
            return median_of(x, gkey) * scale, median_of(y, rkey) * scale

        rows.append(f"| **{title}** | | | |")
        gv, rv = both("per_s", "per_s")
        goal_rate = run in GOAL_RATE
        rows.append(f"| traces per wall second{' (goal: glass ≥)' if goal_rate else ''} | {num(gv, '.1f')} | "
                    f"{num(rv, '.1f')} | {goal(gv, rv, 'more') if goal_rate else ''} |")
        gv, rv = both("per_running_s", "per_running_s")
        rows.append(f"| traces per second the guest ran | {num(gv)} | {num(rv)} | |")
        gv, rv = both("taken_share", "taken_share")
        clock = "wall time" if run.endswith("wall") else "the guest's running time"
        rows.append(f"| deadlines taken, in each tool's own clock (glass: {clock}; the reference: wall time) | "
                    f"{num(gv, '.1f', '%')} | {num(rv, '.1f', '%')} | |")
        gv, rv = both("p50", "p50_us")
        goal_p50 = run in GOAL_P50
        rows.append(f"| stopped per trace, p50{' (goal: glass ≤)' if goal_p50 else ''} | {num(gv, unit=' us')} | "
                    f"{num(rv, unit=' us')} | {goal(gv, rv, 'less') if goal_p50 else ''} |")
        rows.append(f"| stopped per trace, p99 / mean | {num(median_of(x, 'p99'), unit=' us')} / "
                    f"{num(median_of(x, 'mean'), unit=' us')} | {num(median_of(y, 'p99_us'), unit=' us')} / "
                    f"{num(median_of(y, 'mean_us'), unit=' us')} | |")
        rows.append(f"| part (p50): pause and contexts | {num(median_of(x, 'exchange'), unit=' us')} (one "
                    f"multicall) | {num(median_of(y, 'pause_p50_us'), unit=' us')} + "
                    f"{num(median_of(y, 'ctx_p50_us'), unit=' us')} | |")
        rows.append(f"| part (p50): the stack (glass: its walk in place; the reference: its frame-record walk) | "
                    f"{num(median_of(x, 'read'), unit=' us')} | {num(median_of(y, 'walk_p50_us'), unit=' us')} | |")
        rows.append(f"| part (p50): unpause (glass: until the call returned) | {num(median_of(x, 'unpause'), unit=' us')} "
                    f"| {num(median_of(y, 'unpause_p50_us'), unit=' us')} | |")
        gv, rv = both("cpu", "cpu_us")
        rows.append(f"| dom0 CPU per trace (user + system) | {num(gv, unit=' us')} | {num(rv, unit=' us')} | |")
        gv, rv = both("slowdown", "slowdown", 100)
        goal_slow = run == "997"
        rows.append(f"| guest slowdown by its own TSC rounds{' (goal: glass ≤)' if goal_slow else ''} | "
                    f"{num(gv, '+.0f', '%')} | {num(rv, '+.0f', '%')} | {goal(gv, rv, 'less') if goal_slow else ''} |")
        gv, rv = both("worst", "worst")
        goal_split = run == "997"
        rows.append(f"| alpha/beta/gamma: worst point against the guest's own"
                    f"{' (goal: glass ≤ 3)' if goal_split else ''} | {num(gv, '.1f')} ({split_text(x)}) | "
                    f"{num(rv, '.1f')} ({split_text(y)}) | {goal(gv, 3.0, 'less') if goal_split else ''} |")
    o = r["others"]
    load = f"Host: 2 cores, load average {meta['load'][0]:.1f} at the start and {meta['load'][1]:.1f} at the end"
    if "cpu" in o:
        load += f"; everything but this run's QEMU used {o['cpu'] / 100:.2f} cores on average"
    if o.get("seen"):
        load += (f", and other QEMUs (up to {o['most']}) ran beside it in {100 * o['seen'] / o['checks']:.0f}% of "
                 "the checks every 2 s")
    elif o:
        load += ", and no other QEMU was seen in checks every 2 s"
    ref_cut = sum(f.get("walk_cut", 0) for hz in ref for f in ref[hz])
    frames = median_of(ref["997"], "frames_mean")
    late = {hz: med([100 * f["late"] / f["stops"] for f in ref[hz] if f["stops"]]) for hz in ref}
    mix_leaf = {hz: med([100 * f["mix_leaf"] / max(f["traces"], 1) for f in ref[hz]]) for hz in ref}
    stop_lines = g["997"][0]["stop_lines"] if g["997"] else []
    return [
        BEGIN,
        "## Xen guests: glass against a uniprof-like reference (issue 34)",
        "",
        f"Measured {meta['date']} in one boot of the nested Xen of guests/xen ({meta['qemu']}, TCG; Xen 4.17), "
        f"{r['rounds']} round{'s' if r['rounds'] != 1 else ''} in alternating order, {SECONDS} s per run, medians over the rounds. {load}. Rerun: "
        f"`{COMMAND}` (this part: bench/xen_versus.py with bench/xen_versus_dom0.sh in dom0; the run's files stay "
        "in target/tmp/xen-versus).",
        "",
        "The reference is `bench/xen_reference.c`, written from a description of uniprof (the seed's Xen "
        "profiler), not from its code: per tick it pauses the domain, reads each vCPU's context "
        "(`XEN_DOMCTL_getvcpucontext`) through libxencall with one hypercall buffer allocated at start (uniprof's "
        "fast variant), walks the frame records from rip/rbp reading only their two words through foreign "
        "mappings cached per guest page and never invalidated, and unpauses; late ticks are taken at once, "
        "deadlines nearer than its shortest nanosleep are spun for, and nothing bounds the guest's stopped time. "
        "Its traces are symbolized afterwards with the guest ELF's `nm -n`. The guest is the PV demo unikernel "
        "(guests/xenpv) with one vCPU, alone on pCPU 1, doing rounds of alpha 60% / beta 30% (at the bottom of "
        "an 80-frame, 48 KiB stack) / gamma 10% (in mix_block, an assembly leaf without a frame record) of its "
        "busy time, blocking 3 ms after each; dom0's one vCPU alone on pCPU 0, pinned, credit2 weight 4096. "
        f"The guest's slowdown is its TSC cycles per `rate rounds=25` line (their median over the run) against "
        f"the median of its own round's windows of {IDLE} s with no tool ({r['alone']['windows']} in all, where it "
        f"did {r['alone']['rounds_per_s']:.0f} rounds/s); the split is "
        "vCPU 0's samples whose stack holds alpha, beta or gamma, against the guest's own account over the same "
        "run (its cumulative `split ... time=` lines).",
        "",
        "| figure | glass | reference | goal met? |",
        "|---|---|---|---|",
        *rows,
        "",
        "How to read it. The rates are traces of vCPU 0 (one per stop); \"per second the guest ran\" leaves "
        "out the time the tool held the guest stopped: glass's is from its summary, the reference's from its "
        "stops and their mean stopped time. glass takes the pause and the context in one multicall, so its "
        "first part is both; each part's p50 is its own (so they need not add up to the whole's). "
        "glass keeps its schedule in the guest's running time by default (perf's cpu-clock semantics: the time it "
        "holds the guest stopped is not counted), the reference in wall time, so at the same rate asked the "
        "reference takes more traces per wall second and more still per second the guest ran; the deadlines row "
        "holds each to its own clock, and the `--clock wall` sections run glass on the reference's clock. A late "
        "deadline glass takes at once, one at a time (the others count as passed), where the reference runs every "
        "late one back to back; with `--clock wall --max-stopped 100` glass too takes every one, up to 8 back to "
        "back. The reference's "
        f"ticks were late (taken at once, no sleep) in {num(late['101'])}% of its stops at 101 Hz and "
        f"{num(late['997'])}% at 997 Hz; its walks averaged {num(frames, '.1f')} frames at 997 Hz, and "
        f"{ref_cut:.0f} of them in all runs ended at a page it could not map. A frame-record walk cannot name "
        "the caller of a function that keeps no frame record: from mix_block the first record is gamma's, whose "
        "return address is in dispatch, so the reference's traces in gamma's time name mix_block and dispatch "
        f"but no gamma ({num(mix_leaf['997'], '.1f')}% of its traces at 997 Hz, {num(mix_leaf['101'], '.1f')}% at "
        "101 Hz) and count for none of the three; glass unwinds mix_block by its CFI. A dash: the run gave no "
        "such figure (a slowdown needs two of the guest's rate lines, 25 rounds apart, inside the run, which a "
        "guest held stopped most of the time may not print).",
        "",
        "glass's own figures of the stop at 997 Hz (round 0), as its summary gives them:",
        "",
        *[f"    {line}" for line in stop_lines],
        END,
    ]


def write(lines):
    section.replace(BEGIN, END, "\n".join(lines))


def run(work=None):
    # GLASS_BENCH_XEN_VERSUS_OUT=target/tmp/xen-versus re-renders from a finished run's files.
    out, meta = measured_or_kept("GLASS_BENCH_XEN_VERSUS_OUT", boot_and_measure)
    write(markdown(parse(out), meta))


if __name__ == "__main__":
    run()
