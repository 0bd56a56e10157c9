"""VM guests by architecture (called by bench/run; `bench/run aarch64` runs only this).
Results replace the text between the glass-arch markers of docs/benchmarks.md.

The same measurement, in the same run, for the AArch64 demo guest (guests/aarch64,
`qemu-system-aarch64 -M virt`, two vCPUs, frame records) and the x86-64 demo guest
(guests/demo, `qemu-system-x86_64`, two vCPUs, frame pointers), each with its RAM shared through a file and a TCP GDB stub:

Both run under `-accel tcg,thread=single`: with two busy vCPU threads on these 2-CPU
machines, multi-threaded TCG takes every CPU and QEMU stops the VM late (docs/guests.md).

- the floor: stub_floor in `fused` mode, glass's own RSP client stopping the VM and
  reading every vCPU's registers in one exchange, then letting it go, with no stack read
  (what any sampler through the stub pays);
- glass recording the guest (`--gdb` with `--guest-memory`): its stopped time per sample
  (its own account), against that floor;
- the guest's slowdown: how much its own clock (which stands still while the VM is
  stopped) falls behind the wall clock while glass samples it at 101 and 997 Hz, against
  the windows alone either side; and its work rate (rounds per second of host time, from
  the arrival of the `rate` lines it prints), a noisier check.

Rounds alternate the order of the rates; figures are medians over the rounds.
"""

import os
import re
import socket
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
STUB_FLOOR = ROOT / "target" / "release" / "examples" / "stub_floor"
BEGIN = "<!-- glass-arch:begin -->"
END = "<!-- glass-arch:end -->"
RATES = ("101", "997")
WINDOW = float(os.environ.get("GLASS_BENCH_GUEST_WINDOW", "3"))


def reps():
    return max(int(os.environ.get("GLASS_BENCH_REPS", "3")), 1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Vm:
    """A guest with shared RAM and a TCP GDB stub; its serial port (stdout) read line by
    line with the host time of arrival."""

    def __init__(self, name, command, ram_mib):
        self.ram = Path(f"/dev/shm/glass-bench-{os.getpid()}-{name}")
        self.address = f"127.0.0.1:{free_port()}"
        self.lines = []
        full = [*command, "-serial", "stdio", "-display", "none", "-nodefaults",
                "-object", f"memory-backend-file,id=mem,size={ram_mib}M,mem-path={self.ram},share=on",
                "-machine", "memory-backend=mem", "-gdb", f"tcp:{self.address}"]
        self.proc = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 60
        while len(self.rates(0, float("inf"))) < 3:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError(f"guest {name} printed no work rate: {self.lines[-5:]}")
            time.sleep(0.1)

    def _read(self):
        for raw in iter(self.proc.stdout.readline, b""):
            self.lines.append((time.monotonic(), raw.decode(errors="replace").strip()))

    def rates(self, start, end):
        """(arrival, rounds, guest clock ticks) of the `rate rounds=N cycles=C` lines in
        [start, end]."""
        out = []
        for t, line in list(self.lines):
            if line.startswith("rate ") and start <= t <= end:
                fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
                out.append((t, int(fields.get("rounds", 0)), int(fields.get("cycles", 0))))
        return out

    def close(self):
        self.proc.kill()
        self.proc.wait()
        self.ram.unlink(missing_ok=True)


def window(vm, command=None):
    """Rounds per second of host time and guest clock ticks per second of host time while
    `command` runs (or for WINDOW seconds), and the command's standard error."""
    start = time.monotonic()
    err = ""
    if command:
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"{command} failed:\n{run.stderr}")
        err = run.stderr
    else:
        time.sleep(WINDOW)
    lines = vm.rates(start, time.monotonic())
    rate = clock = float("nan")
    if len(lines) >= 3:
        # The first line closes work that began before the window.
        wall = lines[-1][0] - lines[0][0]
        if wall > 0:
            rate = sum(line[1] for line in lines[1:]) / wall
            clock = sum(line[2] for line in lines[1:]) / wall
    return (rate, clock), err


def floor(vm, hz):
    iterations = min(max(int(hz), 100), 300)
    gap_us = max(int(1e6 / float(hz)) - 300, 100)
    out = subprocess.run([str(STUB_FLOOR), vm.address, str(iterations), "fused", str(gap_us)],
                         capture_output=True, text=True, check=True).stdout.split()
    figures = dict(zip(out[::2], out[1::2]))
    return float(figures["floor_p50_us"]), float(figures["floor_p99_us"])


def stopped(stderr):
    m = re.search(r"target stopped per sample: mean ([\d.]+) us, p50 ([\d.]+) us, p99 ([\d.]+) us", stderr)
    if not m:
        raise RuntimeError(f"no stopped-time summary in:\n{stderr}")
    return float(m.group(2)), float(m.group(3))


def measure(name, command, ram_mib, elf):
    vm = Vm(name, command, ram_mib)
    r = {"alone": [], "runs": {hz: [] for hz in RATES}}
    try:
        before, _ = window(vm)
        r["alone"].append(before)
        for round_ in range(reps()):
            for hz in (RATES if round_ % 2 == 0 else tuple(reversed(RATES))):
                floor_p50, floor_p99 = floor(vm, hz)
                rate, err = window(vm, [str(GLASS), "record", "-F", hz, "-d", str(WINDOW), "--gdb", vm.address,
                                        "--symbols", str(elf), "--guest-memory", str(vm.ram), "-o",
                                        str(Path("/tmp") / f"glass-bench-{os.getpid()}.glass")])
                after, _ = window(vm)
                r["alone"].append(after)
                p50, p99 = stopped(err)
                alone = [(b + a) / 2 for b, a in zip(before, after)]
                r["runs"][hz].append({"p50": p50, "p99": p99, "floor_p50": floor_p50, "floor_p99": floor_p99,
                                      "slowdown": alone[1] / rate[1], "rate_slowdown": alone[0] / rate[0]})
                print(f"bench: {name} at {hz} Hz: p50 {p50} us (floor {floor_p50} us), slowdown by its "
                      f"clock x{r['runs'][hz][-1]['slowdown']:.3f}, by its work rate "
                      f"x{r['runs'][hz][-1]['rate_slowdown']:.3f}", file=sys.stderr)
                before = after
    finally:
        vm.close()
        Path(f"/tmp/glass-bench-{os.getpid()}.glass").unlink(missing_ok=True)
    return r


def med(values):
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def markdown(results):
    rows = []
    for name, r in results["guests"].items():
        for hz in RATES:
            runs = r["runs"][hz]
            p50, p99 = med([x["p50"] for x in runs]), med([x["p99"] for x in runs])
            f50, f99 = med([x["floor_p50"] for x in runs]), med([x["floor_p99"] for x in runs])
            slow = med([x["slowdown"] for x in runs])
            rate_slow = med([x["rate_slowdown"] for x in runs])
            rows.append(f"| {name} | {hz} Hz | {p50:.0f} / {p99:.0f} us | {f50:.0f} / {f99:.0f} us | "
                        f"{p50 / f50:.2f}x | {100 * (slow - 1):+.1f}% | {100 * (rate_slow - 1):+.1f}% |")
    return [
        BEGIN,
        "## VM guests by architecture: AArch64 beside x86-64",
        "",
        f"Measured {results['date']} ({results['qemu_arm']}; {results['qemu_x86']}), load average "
        f"{results['load'][0]:.1f} at the start and {results['load'][1]:.1f} at the end, {reps()} rounds; "
        "`./x bench aarch64` (or `bench/run aarch64` after the release build). Both guests run two busy "
        "vCPUs (vCPU 0 a 60/30/10 split with an idle wait between rounds, vCPU 1 another workload) with "
        "their RAM shared through a file; glass samples them through QEMU's GDB stub with `--guest-memory` "
        "(its own page walk: AArch64 stage 1 through TTBR1 with 4 KiB stack pages, x86-64 4-level). Both "
        "run under `-accel tcg,thread=single`: two busy vCPU threads under multi-threaded TCG take both host "
        "CPUs, and QEMU then stops the VM late (docs/guests.md).",
        "",
        "- stopped per sample: glass's own account (p50 / p99) of how long the VM was held stopped;",
        "- floor: `stub_floor ADDRESS N fused`, glass's RSP client stopping the VM and reading every vCPU's",
        "  registers in one exchange and continuing, without any stack read, at the same rate just before;",
        "- slowdown by its clock: the guest's own clock (which stands still while the VM is stopped) per second",
        "  of wall time, alone (windows either side) against while glass samples it: the time the guest loses;",
        "- by its work: vCPU 0's rounds per second of host time, the same way. Under `thread=single` QEMU's one",
        "  TCG thread runs the vCPUs in turn and each stop starts the turn again at vCPU 0, so vCPU 0 can do more",
        "  work per second while sampled than alone: this column shows QEMU's scheduling more than glass's cost.",
        "",
        "| guest | rate | stopped per sample | floor | vs floor | slowdown by its clock | by its work |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "The AArch64 sample also reads five registers per vCPU (CPSR, TTBR0_EL1, TTBR1_EL1, TCR_EL1, SCTLR) with",
        "`p` packets in the same pipelined exchange, which the floor includes; QEMU's AArch64 stub sends them",
        "only on request.",
        END,
    ]


def write(lines):
    section.replace(BEGIN, END, "\n".join(lines))


def run(work):
    if not STUB_FLOOR.exists():
        sys.exit(f"bench: {STUB_FLOOR} is missing: run `cargo build --release -p glass-target --example stub_floor`")
    arm_dir, x86_dir = work / "aarch64", work / "demo"
    subprocess.run([str(ROOT / "guests" / "aarch64" / "build.sh"), str(arm_dir)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([str(ROOT / "guests" / "demo" / "build.sh"), str(x86_dir), "0"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    version = lambda program: subprocess.run([program, "--version"], capture_output=True,
                                             text=True).stdout.split("\n")[0]
    results = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "qemu_arm": version("qemu-system-aarch64"), "qemu_x86": version("qemu-system-x86_64"),
               "guests": {}}
    load = os.getloadavg()[0]
    results["guests"]["AArch64, 2 vCPUs"] = measure(
        "aarch64",
        ["qemu-system-aarch64", "-M", "virt", "-cpu", "cortex-a57", "-smp", "2", "-m", "128", "-accel",
         "tcg,thread=single", "-kernel", str(arm_dir / "uk-fp.elf")],
        128, arm_dir / "uk-fp.elf")
    results["guests"]["x86-64, 2 vCPUs"] = measure(
        "x86",
        ["qemu-system-x86_64", "-accel", "tcg,thread=single", "-smp", "2", "-m", "64", "-kernel", str(x86_dir / "guest-fp.img")],
        64, x86_dir / "guest-fp.elf")
    results["load"] = (load, os.getloadavg()[0])
    write(markdown(results))
