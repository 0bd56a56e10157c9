"""Xen guests (called by bench/run; `bench/run xen` runs only this). Results replace the
text between the glass-xen markers of docs/benchmarks.md.

Everything happens in one boot of the nested Xen of guests/xen (Xen 4.17 and a Debian
dom0 under QEMU TCG, dom0 on one vCPU pinned to pCPU 0 with scheduler weight 4096), with
the PV demo unikernel (guests/xenpv, 2 vCPUs: vCPU 0 alone on pCPU 1 doing rounds of
work with a 3 ms block between them, vCPU 1 spinning on pCPU 0). bench/xen_dom0.sh runs in
dom0 and measures, in rounds whose order alternates:

- the floor (bench/xen_floor.c, libxenctrl): xc_domain_pause, xc_vcpu_getcontext of each
  vCPU, xc_domain_unpause, at 101 and 997 Hz, each part timed apart, run just before glass
  at the same rate; and `bare`, pause and unpause only;
- glass: `glass record --xen uk -F 101|997 -d 10`, its own stopped time per sample, and
  its summary's parts (the multicall, the stack reads); and at 997 Hz with
  `--max-stopped 100` (no budget on the domain's stopped time);
- xenctx, the naive tool: `xenctx -f -s SYMS DOMID VCPU`, about 10 runs per vCPU in all,
  wall time per run;
- the guest's slowdown: vCPU 0's TSC cycles per round over its `rate rounds=25` lines
  (the TSC runs on while the domain is paused, so the cycles per round grow by the time it
  loses) while glass samples it, against the windows with no tool just before and after.

Figures are medians over the rounds (GLASS_BENCH_REPS, default 3; about 5 minutes with
the boot). GLASS_BENCH_XEN_OUT=target/tmp/xen-bench re-renders the section from the last
run's files without booting.
"""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

import section

ROOT = Path(__file__).resolve().parent.parent
GLASS = ROOT / "target" / "release" / "glass"
KIT = ROOT / "target" / "tmp" / "xen-kit"
BEGIN = "<!-- glass-xen:begin -->"
END = "<!-- glass-xen:end -->"
RATES = ("101", "997")
GLASS_SECONDS = 10
XENCTX_RUNS = 10
COMMAND = "./x bench xen"


def reps():
    return max(int(os.environ.get("GLASS_BENCH_REPS", "3")), 1)


def xenctx_runs():
    """xenctx runs per vCPU in each round: about XENCTX_RUNS per vCPU in all."""
    return -(-XENCTX_RUNS // reps())


def med(values):
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def percentile(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, round((len(values) - 1) * p))]


def stamped(path):
    """(time, text) of each line of a file dom0 stamped with $EPOCHREALTIME."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        stamp, _, text = line.partition(" ")
        try:
            out.append((float(stamp), text))
        except ValueError:
            pass
    return out


def glass_figures(lines):
    """glass record's summary (its stderr, stamped): stopped time per sample, the exchange,
    the stack reads, and when sampling began and ended (the lines printed right before the
    first pause and right after the last)."""
    text = "\n".join(t for _, t in lines)
    f = {}
    m = re.search(r"target stopped per sample: mean ([\d.]+) us, p50 ([\d.]+) us, p99 ([\d.]+) us, "
                  r"max ([\d.]+) us; overhead ([\d.]+)% of wall time; missed deadlines (\d+)", text)
    if not m:
        raise RuntimeError("no stopped-time summary in glass's output:\n" + text)
    f.update(mean=float(m[1]), p50=float(m[2]), p99=float(m[3]), max=float(m[4]), overhead=float(m[5]),
             missed=int(m[6]))
    m = re.search(r"stop and registers of \d+ vCPUs? in one exchange: p50 ([\d.]+) us, p99 ([\d.]+) us", text)
    f.update(exchange_p50=float(m[1]), exchange_p99=float(m[2]))
    for vcpu in (0, 1):
        m = re.search(rf"vcpu{vcpu}: (\d+) samples.*?stack read in p50 ([\d.]+) us, p99 ([\d.]+) us; "
                      rf"(?:stack copy (\d+) KiB|(walked in place))", text)
        f[f"read{vcpu}_p50"], f[f"read{vcpu}_p99"] = float(m[2]), float(m[3])
        # A stack walked in place while the domain is stopped copies nothing.
        f[f"copy{vcpu}_kib"] = int(m[4]) if m[4] else 0
        f["stops"] = int(m[1])  # every stop samples every vCPU
    m = re.search(r"(\d+) samples?, .*? in \d+ process(?:es)?, ([\d.]+) s at", text)
    f.update(samples=int(m[1]), seconds=float(m[2]))
    m = re.search(r"stops taken: (\d+) in ([\d.]+) s \(([\d.]+)/s; (\d+) per second the guest ran, (\d+) Hz "
                  r"asked\); glass's own CPU per stop: (\d+) us user, (\d+) us system", text)
    if m:
        f.update(per_s=float(m[3]), per_running_s=float(m[4]), cpu_user=float(m[6]), cpu_system=float(m[7]),
                 cpu=float(m[6]) + float(m[7]))
    m = re.search(r"timer wake-ups: (\d+) after a sleep, late by (\d+) us on average", text)
    if m:
        f.update(wake_ups=int(m[1]), wake_late_us=float(m[2]))
    m = re.search(r"waiting between stops: (\d+)% of the time", text)
    if m:
        f["waiting"] = float(m[1])
    m = re.search(r"vCPUs sampled inside a hypercall \(shown at its caller\): (\d+)", text)
    f["in_hypercall"] = int(m[1]) if m else 0
    start = [t for t, line in lines if "unwind tables of" in line]
    end = [t for t, line in lines if "stop and registers of" in line]
    f["window"] = (start[0], end[0])
    return f


class Console:
    """The guest's `rate rounds=25 cycles=N` lines with their arrival in dom0."""

    def __init__(self, path):
        self.rates = []
        for t, text in stamped(path):
            if text.startswith("rate "):
                fields = dict(x.split("=", 1) for x in text.split()[1:] if "=" in x)
                self.rates.append((t, int(fields["rounds"]), int(fields["cycles"])))

    def window(self, start, end):
        """TSC cycles per round and rounds per second of dom0 time by arrival, over the
        rate lines whose whole span of rounds lies in [start, end]."""
        inside = [(prev, cur) for prev, cur in zip(self.rates, self.rates[1:]) if prev[0] >= start and cur[0] <= end]
        if not inside:
            return {"lines": 0, "cycles": float("nan"), "arrival": float("nan")}
        rounds = sum(cur[1] for _, cur in inside)
        wall = inside[-1][1][0] - inside[0][0][0]
        # The median line: the host's own hiccups (other QEMUs on its 2 cores) make a few
        # lines far longer, both with and without glass.
        return {"lines": len(inside), "cycles": statistics.median(cur[2] / cur[1] for _, cur in inside),
                "arrival": rounds / wall if wall > 0 else float("nan")}


class Others:
    """Watches the host every 2 s while the nested Xen runs: other QEMUs (colleagues' VMs;
    its own QEMU is the one whose command line names `out`), and the CPU time everything
    but its own QEMU used (from /proc/stat and the QEMU's /proc/PID/stat). Lands in
    out/others.txt: checks, checks that saw another QEMU, the most seen at once, and the
    others' CPU use in hundredths of a core on average."""

    def __init__(self, out):
        self.out, self.checks, self.seen, self.most = out, 0, 0, 0
        self.mine = {}  # pid -> its last utime + stime (ticks)
        self.start = self._busy()
        self.mine_ticks = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    @staticmethod
    def _busy():
        """(busy, total) ticks of all CPUs."""
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        idle = fields[3] + fields[4]
        return sum(fields[:8]) - idle, sum(fields[:8])

    def _watch(self):
        while not self.done.wait(2):
            found = 0
            for proc in Path("/proc").iterdir():
                try:
                    cmd = (proc / "cmdline").read_bytes().split(b"\0")
                    if not cmd or not Path(cmd[0].decode(errors="replace")).name.startswith("qemu-system"):
                        continue
                    if str(self.out).encode() in b" ".join(cmd):
                        stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                        ticks = int(stat[11]) + int(stat[12])
                        self.mine_ticks += ticks - self.mine.get(proc.name, 0)
                        self.mine[proc.name] = ticks
                    else:
                        found += 1
                except (OSError, ValueError, IndexError):
                    continue
            self.checks += 1
            self.seen += found > 0
            self.most = max(self.most, found)

    def stop(self):
        self.done.set()
        self.thread.join()
        busy, total = self._busy()
        cores = os.cpu_count() or 1
        # CPU ticks of everything else, in hundredths of a core over the run.
        other = max(busy - self.start[0] - self.mine_ticks, 0) / max(total - self.start[1], 1) * cores * 100
        (self.out / "others.txt").write_text(
            f"checks={self.checks} seen={self.seen} most={self.most} cpu={other:.0f}\n")


def boot_and_measure(work):
    """Builds what dom0 needs, boots the nested Xen once, runs bench/xen_dom0.sh there.
    The run's files stay in target/tmp/xen-bench (logs, stamped console, glass's output):
    GLASS_BENCH_XEN_OUT=target/tmp/xen-bench re-renders the section from them."""
    out = ROOT / "target" / "tmp" / "xen-bench"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    pv = out / "pv"
    subprocess.run([str(ROOT / "guests" / "xenpv" / "build.sh"), str(pv), "0"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([str(ROOT / "guests" / "xenpv" / "build.sh"), str(pv), "0", "hvm"], check=True,
                   stdout=subprocess.DEVNULL)
    elf = pv / "uk-pv.elf"
    floor = out / "xen_floor"
    subprocess.run(["gcc", "-O2", "-Wall", str(ROOT / "bench" / "xen_floor.c"), "-o", str(floor), "-lxenctrl"],
                   check=True)
    syms = out / "uk-pv.syms"
    syms.write_text(subprocess.run(["nm", "-n", str(elf)], capture_output=True, text=True, check=True).stdout)
    (out / "env").write_text(
        f"GLASS={GLASS}\nPV_ELF={elf}\nHVM_ELF={pv / 'uk-hvm.elf'}\nFLOOR={floor}\nSYMS={syms}\nROUNDS={reps()}\nIDLE=5\n"
        f"GLASS_SECONDS={GLASS_SECONDS}\nXENCTX={xenctx_runs()}\nFLOOR_SECONDS=4\nFLOOR_N=4000\n")
    print(f"bench: xen: booting the nested Xen ({reps()} rounds; logs in {out})", file=sys.stderr)
    run_in_nested_xen(ROOT / "bench" / "xen_dom0.sh", out, 900, "max,-smap")
    return out


def run_in_nested_xen(script, out, timeout, cpu):
    """Boots the nested Xen from the kit with dom0 on one pinned vCPU of CPU model `cpu`
    (a QEMU -cpu string), runs `script` in dom0 with its files in `out`, and raises with
    the script's log if it failed. What else ran on the host meanwhile is kept (Others)."""
    env = dict(os.environ, GLASS_XEN_DOM0_VCPUS="1", GLASS_XEN_ARGS="dom0_vcpus_pin", GLASS_XEN_CPU=cpu)
    others = Others(out)
    run = subprocess.run([str(ROOT / "guests" / "xen" / "run.sh"), str(kit()), str(script), str(out),
                          str(timeout)], env=env)
    others.stop()
    if run.returncode != 0:
        log = (out / "script.log").read_text(errors="replace") if (out / "script.log").exists() else ""
        raise RuntimeError(f"the nested Xen run failed ({run.returncode}); logs in {out}\n{log[-3000:]}")


def kit():
    """The nested Xen's kit (GLASS_BENCH_XEN_KIT, else built or found in target/tmp/xen-kit)."""
    given = os.environ.get("GLASS_BENCH_XEN_KIT")
    if given:
        return Path(given)
    subprocess.run([str(ROOT / "guests" / "xen" / "kit.sh"), str(KIT)], check=True, stdout=subprocess.DEVNULL)
    return KIT


def measured_or_kept(kept_env, boot):
    """A finished run's files and meta (date, QEMU, load) named by the environment variable
    `kept_env`, to re-render from; else a new run's, from `boot()` (which returns its
    files' folder)."""
    if not GLASS.exists():
        sys.exit(f"bench: {GLASS} is missing: run `cargo build --release -p glass`")
    if os.environ.get(kept_env):
        out = Path(os.environ[kept_env])
        return out, json.loads((out / "meta.json").read_text())
    version = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True,
                             text=True).stdout.split("\n")[0]
    meta = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "qemu": version,
            "load": [os.getloadavg()[0]]}
    out = boot()
    meta["load"].append(os.getloadavg()[0])
    (out / "meta.json").write_text(json.dumps(meta))
    return out, meta


def parse(out):
    events = [(t, text.split()) for t, text in stamped(out / "events.log")]
    console = Console(out / "console.stamped")
    tsc = re.search(r"Detected ([\d.]+) MHz", (out / "tsc.txt").read_text())
    tsc_hz = float(tsc[1]) * 1e6 if tsc else float("nan")

    # Every window the dom0 script marked: idle, floor, xenctx (by what and round).
    windows, opened = {}, {}
    for t, words in events:
        if words[0].endswith("-start"):
            opened[(words[0][:-6], *words[1:])] = t
        elif words[0].endswith("-end"):
            key = (words[0][:-4], *[w for w in words[1:] if not w.startswith("rc=")])
            if key in opened:
                windows[key] = console.window(opened[key], t)
    idle = [w for key, w in windows.items() if key[0] == "idle" and w["lines"]]
    # The guest alone: the median over every window without a tool in the run (a few of
    # them catch the host busy elsewhere; the median does not follow them).
    alone_cycles = med([w["cycles"] for w in idle])
    alone_arrival = med([w["arrival"] for w in idle])
    quartiles = (statistics.quantiles([w["cycles"] for w in idle], n=4, method="inclusive") if len(idle) >= 2
                 else [float("nan")] * 3)

    def slowdown(window):
        return window["cycles"] / alone_cycles - 1

    others = out / "others.txt"
    r = {"others": dict((k, int(v)) for k, v in (x.split("=") for x in others.read_text().split()))
         if others.exists() else {},
         "glass": {hz: [] for hz in RATES}, "floor": {}, "xenctx": {0: [], 1: []}, "tsc_hz": tsc_hz,
         "alone": {"windows": len(idle), "rounds_per_s": tsc_hz / alone_cycles,
                   "half_iqr": (quartiles[2] - quartiles[0]) / 2 / alone_cycles},
         "floor_slowdown": {hz: med([slowdown(w) for key, w in windows.items() if key[:3] == ("floor", "ctx", hz)])
                            for hz in RATES},
         "xenctx_slowdown": med([slowdown(w) for key, w in windows.items() if key[0] == "xenctx"])}
    for round_ in range(reps()):
        for hz in RATES:
            f = glass_figures(stamped(out / f"glass.{hz}.{round_}.err"))
            during = console.window(*f["window"])
            f["slowdown"] = slowdown(during)
            f["slowdown_arrival"] = alone_arrival / during["arrival"] - 1
            # The slowdown the stopped time alone predicts, if every stop landed on work.
            f["predicted"] = 1 / (1 - f["overhead"] / 100) - 1
            f["lines"] = during["lines"]
            f["rounds_per_s"] = tsc_hz / during["cycles"]
            r["glass"][hz].append(f)
            print(f"bench: xen round {round_} glass {hz} Hz: p50 {f['p50']} us, exchange p50 {f['exchange_p50']} us, "
                  f"slowdown {100 * f['slowdown']:+.1f}% by TSC ({during['lines']} lines), "
                  f"{100 * f['slowdown_arrival']:+.1f}% by arrival, predicted {100 * f['predicted']:+.1f}%",
                  file=sys.stderr)
        path = out / f"glass.997max.{round_}.err"
        if path.exists():
            f = glass_figures(stamped(path))
            during = console.window(*f["window"])
            f["slowdown"] = slowdown(during)
            f["slowdown_arrival"] = alone_arrival / during["arrival"] - 1
            f["predicted"] = 1 / (1 - f["overhead"] / 100) - 1
            f["rounds_per_s"] = tsc_hz / during["cycles"]
            r.setdefault("glass_max", []).append(f)
        for mode in ("ctx", "bare"):
            for hz in RATES:
                line = (out / f"floor.{mode}.{hz}.{round_}").read_text()
                fields = dict(x.split("=", 1) for x in line.split() if "=" in x)
                if "p50_us" not in fields:
                    raise RuntimeError(f"xen_floor {mode} {hz}: {line}")
                r["floor"].setdefault((mode, hz), []).append(
                    {k: float(v) for k, v in fields.items() if k.endswith("_us") or k in ("n", "per_s")})
    r["pvh"] = {hz: [] for hz in RATES}
    r["pvh_floor"] = {hz: [] for hz in RATES}
    for round_ in range(reps()):
        for hz in RATES:
            path = out / f"glass.pvh.{hz}.{round_}.err"
            if not path.exists():
                continue
            try:
                r["pvh"][hz].append(glass_figures(stamped(path)))
            except RuntimeError as error:
                # A run the guardian ended (one pause past the stop bound on a loaded
                # host): said in the section, not a figure.
                r.setdefault("pvh_failed", []).append(f"{hz} Hz round {round_}: {str(error).splitlines()[-1]}")
                continue
            fields = dict(x.split("=", 1) for x in (out / f"floor.pvh.ctx.{hz}.{round_}").read_text().split()
                          if "=" in x)
            r["pvh_floor"][hz].append({k: float(v) for k, v in fields.items()
                                       if k.endswith("_us") or k in ("n", "per_s")})
    # dom0 alone on its pCPU (guest vCPU 1 moved to pCPU 1) at 997 Hz, by budget.
    r["dom0_alone"] = {"25": [], "100": [], "floor": []}
    for round_ in range(reps()):
        for budget in ("25", "100"):
            path = out / f"glass.alone.{budget}.{round_}.err"
            if path.exists():
                r["dom0_alone"][budget].append(glass_figures(stamped(path)))
        path = out / f"floor.alone.997.{round_}"
        if path.exists():
            fields = dict(x.split("=", 1) for x in path.read_text().split() if "=" in x)
            if "per_s" in fields:
                r["dom0_alone"]["floor"].append({k: float(v) for k, v in fields.items()
                                            if k.endswith("_us") or k in ("n", "per_s")})
    for t, words in events:
        if words[0] == "xenctx":
            if words[4] != "rc=0":
                raise RuntimeError(f"xenctx failed: {words}; see {out}/xenctx.v{words[1]}.txt")
            r["xenctx"][int(words[1])].append((t - float(words[3])) * 1e6)
    return r


def own_work(glass):
    """glass's stopped time up to its unpause: the multicall and both vCPUs' stack reads
    (walked in place, or copied with --capture raw; sum of their medians)."""
    return glass["exchange_p50"] + glass["read0_p50"] + glass["read1_p50"]


def markdown(r, meta):
    g = {hz: {k: med([x[k] for x in r["glass"][hz]]) for k in r["glass"][hz][0] if k != "window"} for hz in RATES}
    fl = {key: {k: med([x[k] for x in runs]) for k in runs[0]} for key, runs in r["floor"].items()}
    # glass against the floor measured just before it, round by round: the whole window,
    # and the part up to the unpause.
    pairs = {hz: list(zip(r["glass"][hz], r["floor"][("ctx", hz)])) for hz in RATES}
    vs_floor = {hz: med([x["p50"] / f["p50_us"] for x, f in pairs[hz]]) for hz in RATES}
    vs_floor_own = {hz: med([own_work(x) / (f["pause_p50_us"] + f["ctx_p50_us"]) for x, f in pairs[hz]])
                    for hz in RATES}
    each_round = {hz: ", ".join(f"{x['p50'] / f['p50_us']:.2f}x" for x, f in pairs[hz]) for hz in RATES}
    xenctx_all = r["xenctx"][0] + r["xenctx"][1]
    x50 = percentile(xenctx_all, 0.5)
    vs_xenctx = {hz: x50 / g[hz]["p50"] for hz in RATES}
    rows = []
    for hz in RATES:
        c, b, x = fl[("ctx", hz)], fl[("bare", hz)], g[hz]
        rows += [
            f"| glass record --xen | {hz} Hz | {x['p50']:.0f} us | {x['p99']:.0f} us | {x['mean']:.0f} us | "
            f"{x['exchange_p50']:.0f} + {x['read0_p50']:.0f} + {x['read1_p50']:.0f} us | "
            f"{x['p50'] - own_work(x):.0f} us | {vs_floor[hz]:.2f}x |",
            f"| floor: pause, 2 x getvcpucontext, unpause | {hz} Hz | {c['p50_us']:.0f} us | {c['p99_us']:.0f} us | "
            f"{c['mean_us']:.0f} us | {c['pause_p50_us']:.0f} + {c['ctx_p50_us']:.0f} us | "
            f"{c['unpause_p50_us']:.0f} us "
            "| 1x |",
            f"| floor bare: pause, unpause | {hz} Hz | {b['p50_us']:.0f} us | {b['p99_us']:.0f} us | "
            f"{b['mean_us']:.0f} us | {b['pause_p50_us']:.0f} us | {b['unpause_p50_us']:.0f} us | |",
        ]
    rows.append(f"| xenctx -f -s SYMS DOMID VCPU, wall per run (one vCPU) | {len(xenctx_all)} runs | "
                f"{x50 / 1000:.0f} ms | {percentile(xenctx_all, 0.99) / 1000:.0f} ms | "
                f"{statistics.mean(xenctx_all) / 1000:.0f} ms | | | |")
    slow_rows = []
    for hz in RATES:
        x = g[hz]
        rounds = ", ".join(f"{100 * y['slowdown']:+.0f}%" for y in r["glass"][hz])
        slow_rows.append(
            f"| glass record --xen -F {hz} | {x['stops'] / x['seconds']:.0f} | {x['overhead']:.0f}% | "
            f"{x['rounds_per_s']:.0f} | **{100 * x['slowdown']:+.0f}%** ({rounds}) | "
            f"{100 * x['slowdown_arrival']:+.0f}% | {100 * x['predicted']:+.0f}% |")
    if r.get("glass_max"):
        x = {k: med([y[k] for y in r["glass_max"]]) for k in r["glass_max"][0] if k != "window"}
        rounds = ", ".join(f"{100 * y['slowdown']:+.0f}%" for y in r["glass_max"])
        slow_rows.append(
            f"| glass record --xen -F 997 --max-stopped 100 | {x['stops'] / x['seconds']:.0f} | "
            f"{x['overhead']:.0f}% | {x['rounds_per_s']:.0f} | **{100 * x['slowdown']:+.0f}%** ({rounds}) | "
            f"{100 * x['slowdown_arrival']:+.0f}% | {100 * x['predicted']:+.0f}% |")
    for hz in RATES:
        slow_rows.append(f"| floor (pause, 2 contexts, unpause) at {hz} Hz | | | | "
                         f"{100 * r['floor_slowdown'][hz]:+.0f}% | | |")
    slow_rows.append(f"| xenctx loop (one run after another) | | | | {100 * r['xenctx_slowdown']:+.0f}% | | |")
    o = r["others"]
    load = f"Host: 2 cores, load average {meta['load'][0]:.1f} at the start and {meta['load'][1]:.1f} at the end"
    if "cpu" in o:
        load += f"; everything but this run's QEMU used {o['cpu'] / 100:.2f} cores on average"
    if o.get("seen"):
        load += (f", and other QEMUs (up to {o['most']}) ran beside it in {100 * o['seen'] / o['checks']:.0f}% of "
                 "the checks every 2 s")
    elif o:
        load += ", and no other QEMU was seen in checks every 2 s"
    x = g["101"]
    return [
        BEGIN,
        "## Xen guests: glass against the floor and xenctx",
        "",
        f"Measured {meta['date']} in one boot of the nested Xen of guests/xen ({meta['qemu']}, TCG; Xen 4.17, "
        "Debian dom0 on one vCPU pinned to pCPU 0 with credit weight 4096), "
        f"{reps()} rounds in alternating order, medians over the rounds. {load}. Rerun: `{COMMAND}` (or "
        "`bench/run xen` after `cargo build --release -p glass`); dom0's side is `bench/xen_dom0.sh`, and the "
        "run's files stay in target/tmp/xen-bench. The guest is the PV demo unikernel (guests/xenpv), 2 vCPUs: "
        "vCPU 0 alone on pCPU 1 does rounds of work (beta at the bottom of an 80-frame, 48 KiB stack) and "
        "blocks 3 ms after each; vCPU 1 spins on pCPU 0, beside dom0.",
        "",
        "The floor (`bench/xen_floor.c`, run just before glass at the same rate) is what any libxenctrl-based "
        "sampler pays without reading a single stack: `xc_domain_pause`, `xc_vcpu_getcontext` for each vCPU, "
        "`xc_domain_unpause`, timed with CLOCK_MONOTONIC from before the pause until the unpause returned, as "
        "glass times its own stopped window (`bare`: pause and unpause only). Everything runs under nested TCG "
        "(QEMU emulating the CPUs that Xen, dom0 and the guest run on), so absolute microseconds are 10-100x "
        "native ones and swing with the host's load; the ratios, measured side by side in one boot, are what "
        "carry over. glass's time up to the unpause is its one multicall (pause, both vCPU contexts, and their "
        "states while it learns whether the stub of a blocking hypercall tells them) plus one stack walk per vCPU, "
        "made in place through guest frames it mapped once and keeps; the rest is the unpause "
        "call until it returns to the sampler, which is the same hypercall for the floor. xenctx pauses the domain "
        "itself for each run (after its start-up and symbol-table read, until it has printed the trace), so a "
        "xenctx-based profiler pays a whole process per stack trace.",
        "",
        "| stopped per sample | rate | p50 | p99 | mean | up to the unpause (p50 of each part) | unpause (p50) "
        "| glass p50 / floor p50 |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"**glass / floor, whole window (p50): {vs_floor['101']:.2f}x at 101 Hz, {vs_floor['997']:.2f}x at 997 Hz** "
        f"(goal <= 1.3x; median of the rounds' ratios: {each_round['101']} at 101 Hz, {each_round['997']} at "
        f"997 Hz). Up to the unpause (glass's multicall and both stack walks against the floor's pause and two "
        f"getvcpucontext calls): {vs_floor_own['101']:.2f}x at 101 Hz, {vs_floor_own['997']:.2f}x at 997 Hz. "
        f"**xenctx per stack trace / glass per sample (p50): {vs_xenctx['101']:.0f}x at 101 Hz, "
        f"{vs_xenctx['997']:.0f}x at 997 Hz** (goal >= 10x; a glass sample holds both vCPUs' stacks, a xenctx run "
        "one).",
        "",
        f"Where the time goes, at 101 Hz: glass's one multicall takes {x['exchange_p50']:.0f} us, about what the "
        f"floor's pause alone takes ({fl[('ctx', '101')]['pause_p50_us']:.0f} us), while libxenctrl's two "
        f"`xc_vcpu_getcontext` calls take {fl[('ctx', '101')]['ctx_p50_us']:.0f} us (each its own hypercall, its "
        "5 KiB context bounced through a hypercall buffer per call); glass's stack reads add "
        f"{x['read0_p50']:.0f} us for vCPU 0 ("
        + (f"up to {x['copy0_kib']:.0f} KiB copied when it is deep in beta" if x['copy0_kib'] else
           "walked in place, two words a frame, nothing copied")
        + ") and "
        f"{x['read1_p50']:.0f} us for vCPU 1, and its unpause {x['p50'] - own_work(x):.0f} us.",
        "",
        *rate_section(r, fl),
        "",
        "The guest's slowdown: vCPU 0's TSC cycles per round (its TSC runs on while the domain is paused, so the "
        "cycles per round grow by the time it loses; median over its `rate rounds=25` lines) while glass samples "
        f"it, against the {r['alone']['windows']} windows of 5 s with no tool (before and after each glass run), "
        f"where it did {r['alone']['rounds_per_s']:.0f} rounds/s (the TSC rate, {r['tsc_hz'] / 1e6:.0f} MHz, over "
        f"the median cycles per round; half their interquartile range ±{100 * r['alone']['half_iqr']:.0f}%, a "
        "slowdown within that is noise). \"By arrival\" is the same from when the lines reached dom0, a noisier "
        "check; \"predicted\" is what glass's own stopped share of wall time would cost if the guest stood still "
        "for all of it and every stop landed on work (a stop during vCPU 0's 3 ms block costs it nothing unless "
        "its timer falls due).",
        "",
        "| while | stops/s taken (both vCPUs each) | glass's stopped share of wall time | vCPU 0 rounds/s | "
        "slowdown (rounds) | by arrival | predicted |",
        "|---|---|---|---|---|---|---|",
        *slow_rows,
        "",
        "Stops taken and dom0 CPU per stop, PV and PVH (the unikernel's PVH build, guests/xenpv/build.sh "
        "hvm, placed alike, after the PV rounds). glass's CPU is its own (getrusage: user, and system, which in a "
        "Xen dom0 holds the hypercalls' time in Xen, where a pause waits until every vCPU of the domain is "
        "descheduled) over the recording, stops and everything between them, per stop taken; the floor's is the "
        "same for its pause, contexts and unpause, with nothing between them.",
        "",
        "| guest | rate | glass stops/s | floor stops/s | glass CPU per stop (user + system) | floor CPU per stop "
        "| glass stopped p50 | floor stopped p50 |",
        "|---|---|---|---|---|---|---|---|",
        *cpu_rows(r, g, fl),
        "",
        "What the CPU figures say (issue 22, item 1): glass's user time per stop (unwinding both stacks, "
        f"writing the samples) is {user_shares(r, g)} of its dom0 CPU; the rest is system time, which in this dom0 is "
        "time spent inside the hypercalls, chiefly the pause, which returns only once every vCPU of the domain is "
        "descheduled from its physical CPU. The floor pays the same pause, and it is what bounds the stops taken "
        "per second here: under nested TCG a pause waits for an emulated CPU that the host may not be running.",
        *([""] + [f"PVH runs that produced no figures: {'; '.join(r['pvh_failed'])}"] if r.get("pvh_failed") else []),
        END,
    ]


def rate_section(r, fl):
    """Stops taken against those asked at 997 Hz, with guest vCPU 1 beside dom0 and with dom0
    alone on its pCPU, by budget."""
    def row(label, runs, floor):
        if not runs or "per_running_s" not in runs[0]:
            return []
        x = {k: med([y[k] for y in runs if k in y]) for k in runs[0] if k != "window"}
        late = f"{x['wake_late_us'] / 1000:.1f} ms" if "wake_late_us" in x else "(no sleep)"
        return [f"| {label} | {x['per_s']:.0f} | **{x['per_running_s']:.0f}** ({100 * x['per_running_s'] / 997:.0f}%) | "
                f"{x['overhead']:.0f}% | {x['waiting']:.0f}% | {late} | {x['cpu']:.0f} us | "
                f"{floor:.0f} |"]
    alone_floor = med([f["per_s"] for f in r["dom0_alone"]["floor"]]) if r["dom0_alone"]["floor"] else float("nan")
    shared_floor = fl[("ctx", "997")].get("per_s", float("nan"))
    rows = (row("vCPU 1 beside dom0, budget 25% (default)", r["glass"]["997"], shared_floor)
            + row("vCPU 1 beside dom0, `--max-stopped 100`", r.get("glass_max", []), shared_floor)
            + row("dom0 alone on pCPU 0, budget 25% (default)", r["dom0_alone"]["25"], alone_floor)
            + row("dom0 alone on pCPU 0, `--max-stopped 100`", r["dom0_alone"]["100"], alone_floor))
    if not rows:
        return []
    return [
        "Stops taken at 997 Hz asked. glass keeps its schedule in the guest's running time (a sample per "
        "1/997 s the guest ran, as perf's cpu-clock counts a task's own time): the time it holds the guest "
        "stopped is not counted, so \"per second the guest ran\" is the figure to hold against the 997 asked. "
        "The budget (`--max-stopped`, default 25%) holds the guest stopped for at most that share of wall time on "
        "average, so a stop of 0.4 ms allows at most ~625 stops per second of wall time. The placement "
        "decides the rest: with the guest's spinning vCPU 1 on dom0's pCPU, a dom0 that sleeps for its next "
        "deadline gets the pCPU back only when Xen's credit2 preempts that vCPU (its rate limit is 1 ms), and "
        "glass's summary says how late its timer woke it; with dom0 alone on its pCPU, as Xen's own advice for "
        "dom0 has it, the wake-ups are prompt. The floor's stops/s are wall-clock (it keeps no running-time "
        "schedule and no budget).",
        "",
        "| placement, budget | glass stops/s | per second the guest ran (of 997) | stopped share of wall time "
        "| waiting between stops | timer wake-up late by (mean) | glass dom0 CPU per stop | floor stops/s |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
    ]


def user_shares(r, g):
    """The range of glass's user share of its CPU per stop over the rows of the table."""
    shares = [100 * x["cpu_user"] / x["cpu"] for x in [g[hz] for hz in RATES] + [y for hz in RATES for y in r["pvh"][hz]]
              if x.get("cpu")]
    return f"{min(shares):.0f}-{max(shares):.0f}%" if shares else "(not measured)"


def cpu_rows(r, g, fl):
    """The stops-and-CPU table's rows: PV from the rounds above, PVH from its own."""
    rows = []
    for guest in ("PV", "PVH"):
        for hz in RATES:
            if guest == "PV":
                x, f = g[hz], fl[("ctx", hz)]
            else:
                if not r["pvh"][hz]:
                    continue
                x = {k: med([y[k] for y in r["pvh"][hz] if k in y]) for k in r["pvh"][hz][0] if k != "window"}
                f = {k: med([y[k] for y in r["pvh_floor"][hz]]) for k in r["pvh_floor"][hz][0]}
            if "cpu" not in x:
                continue
            rows.append(
                f"| {guest} | {hz} Hz | {x['per_s']:.0f} | {f.get('per_s', float('nan')):.0f} | "
                f"{x['cpu']:.0f} us ({x['cpu_user']:.0f} + {x['cpu_system']:.0f}) | "
                f"{f.get('cpu_us', float('nan')):.0f} us | {x['p50']:.0f} us | {f['p50_us']:.0f} us |")
    if r.get("glass_max") and "cpu" in r["glass_max"][0]:
        x = {k: med([y[k] for y in r["glass_max"]]) for k in r["glass_max"][0] if k != "window"}
        f = fl[("ctx", "997")]
        rows.insert(2, f"| PV, --max-stopped 100 | 997 Hz | {x['per_s']:.0f} | {f.get('per_s', float('nan')):.0f} | "
                       f"{x['cpu']:.0f} us ({x['cpu_user']:.0f} + {x['cpu_system']:.0f}) | "
                       f"{f.get('cpu_us', float('nan')):.0f} us | {x['p50']:.0f} us | {f['p50_us']:.0f} us |")
    return rows


def write(lines):
    section.replace(BEGIN, END, "\n".join(lines))


def run(work):
    # GLASS_BENCH_XEN_OUT=target/tmp/xen-bench re-renders from a finished run's files.
    out, meta = measured_or_kept("GLASS_BENCH_XEN_OUT", lambda: boot_and_measure(work))
    write(markdown(parse(out), meta))
