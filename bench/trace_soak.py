"""glass trace --pid soak (called by bench/run; `bench/run trace-soak` runs only this, and
the full `./x bench` does not: it takes tens of minutes). Results replace the text between
the glass-trace-soak markers of docs/benchmarks.md.

GLASS_SOAK_CYCLES (default 1000) attach/detach cycles, each one `glass trace --pid PID -f
FUNCS -d 0.05..0.2 -o FILE`, on self-checking targets started afresh every 100 cycles
(GLASS_SOAK_PER_TARGET),
alternately tests/fixtures/trace/states.c (threads in every waiting state, `mix` traced)
and tests/fixtures/trace/nfd.c (2-4 workers pausing between rounds, some of its six stages
traced). In a random ~30% of cycles glass is SIGKILLed after a random delay, in another
~10% it stops itself at a random named step (GLASS_TEST_STOP_AT) and is SIGKILLed there;
in about a third of the killed cycles its guardian (`glass __trace-guardian --pid PID`) is
SIGKILLed too: before glass, or (random kills only) a few milliseconds after it, while
it is taking the probes out. The choices come from GLASS_SOAK_SEED (default 1), so a run
can be repeated (the moments the kills land in still depend on the machine's timing).

After every cycle, once glass and its guardian have ended and one more second has passed:
the target must be alive, none of its threads traced (TracerPid 0) or stopped (state t or
T), and, unless a killed guardian left the probes for the next glass, the traced
functions' bytes must be those read before the target's first attach. The session file
of every glass (/dev/shm/glass-trace-<glass pid>-*) must be gone once the cycle after its
own has ended. Every 100 cycles the target is ended with SIGTERM: it must print "errors:
0" (nfd: the same round checksum as an untraced run) and exit 0. glass's own account of
every attach and detach (the time every thread was held stopped) is collected as it goes.
GLASS_SOAK_LOG=PATH keeps one JSON line per cycle (and the rest of the results last);
`python3 bench/trace_soak.py --render PATH` rewrites the section from it.
"""

import ctypes
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from trace_bench import machine

import section  # bench/: the docs section each script rewrites

ROOT = Path(__file__).resolve().parent.parent
GLASS = ROOT / "target" / "release" / "glass"
BEGIN = "<!-- glass-trace-soak:begin -->"
END = "<!-- glass-trace-soak:end -->"
FIXTURES = ROOT / "tests" / "fixtures" / "trace"

# Where GLASS_TEST_STOP_AT can stop glass (crates/glass/tests/trace_states.rs names the same).
STEPS = ["attach-safe-point", "inject-call", "attach-runtime", "attach-ledger", "attach-prepared",
         "attach-stopped", "attach-patched", "detach-code-restored", "detach-stopped", "detach-restored"]
NFD_STAGES = ["process_batch", "parse_packet", "classify", "rule_match", "rewrite", "forward"]
CYCLES_PER_TARGET = int(os.environ.get("GLASS_SOAK_PER_TARGET", "100"))
SETTLE = 1.0  # seconds after a cycle before the target is checked
PATIENCE = 120.0  # seconds glass (or its guardian) may take before it counts as hung
# glass's lines that are not failures.
INFORMATIONAL = ("attached to pid", "detached from pid", "test hook: stopped at", "instrumented ",
                 "which died attached: taken out", "its guardian took the probes out",
                 "its guardian found nothing to take out", " records from ")


def cycles():
    return int(os.environ.get("GLASS_SOAK_CYCLES", "1000"))


def seed():
    return int(os.environ.get("GLASS_SOAK_SEED", "1"))


def make_subreaper():
    """Guardians outlive the glass that started them: make them ours to reap, so that no
    zombie piles up under an init that might not reap."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def reap_orphans(keep):
    """Reaps the ended children that are not subprocess's (orphaned guardians)."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in keep:
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == me:
            try:
                os.waitpid(int(entry), os.WNOHANG)
            except ChildProcessError:
                pass


def process_state(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def guardian_of(pid):
    """The `glass __trace-guardian` watching an attachment to `pid`, if one runs."""
    wanted = f"__trace-guardian\0--pid\0{pid}\0".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if wanted in Path(f"/proc/{entry}/cmdline").read_bytes():
                    return int(entry)
            except OSError:
                pass
    return None


def kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def session_files(glass_pid):
    return sorted(p for p in Path("/dev/shm").glob(f"glass-trace-{glass_pid}-*"))


def percentiles(values):
    if not values:
        return None
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"n": len(ordered), "p50": statistics.median(ordered), "p99": p99, "max": ordered[-1]}


class Target:
    """A running workload: its stderr collected as it comes, its traced functions' bytes
    read before any attach."""

    def __init__(self, workload):
        self.workload = workload
        self.process = subprocess.Popen([str(workload["binary"]), *workload["args"]], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        self.pid = self.process.pid
        self.lines = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if not self.ready.wait(60):
            self.process.kill()
            raise RuntimeError(f"{workload['name']} never said ready: {self.lines}")
        self.code = self.code_now()
        self.seen = 0  # stderr lines already judged

    def _read(self):
        for line in self.process.stderr:
            if line.strip() == "ready" and not self.ready.is_set():
                self.ready.set()
            else:
                self.lines.append(line.rstrip("\n"))

    def alive(self):
        return self.process.poll() is None

    def new_complaints(self):
        """Lines on its stderr since the last call that are not its normal ones."""
        fresh, self.seen = self.lines[self.seen:], len(self.lines)
        return [l for l in fresh if not l.endswith(" rounds")]

    def held(self):
        """Its threads that are traced or stopped: (tid, state, TracerPid)."""
        found = []
        try:
            tids = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return found
        for tid in tids:
            try:
                status = Path(f"/proc/{self.pid}/task/{tid}/status").read_text()
            except OSError:
                continue  # a thread that just ended
            state = re.search(r"^State:\s+(\S)", status, re.M).group(1)
            tracer = int(re.search(r"^TracerPid:\s+(\d+)", status, re.M).group(1))
            if tracer != 0 or state in "tT":
                found.append((int(tid), state, tracer))
        return found

    def code_now(self):
        """The bytes of the functions glass patches, as the target's memory holds them."""
        binary = str(Path(self.workload["binary"]).resolve())
        base = None
        for line in Path(f"/proc/{self.pid}/maps").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 6 and parts[5] == binary and int(parts[2], 16) == 0:
                base = int(parts[0].split("-")[0], 16)
                break
        offset = base if self.workload["pie"] else 0
        with open(f"/proc/{self.pid}/mem", "rb") as memory:
            code = {}
            for name, (value, size) in self.workload["symbols"].items():
                memory.seek(offset + value)
                code[name] = memory.read(size)
            return code

    def finish(self):
        """SIGTERM; what is wrong with how it ended, or None."""
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return "did not end within 60 s of SIGTERM"
        out = self.process.stdout.read()
        self.reader.join(5)
        complaints = [l for l in self.lines if not l.endswith(" rounds")]
        if out != self.workload["expected"] or code != 0 or complaints:
            return f"exit {code}, stdout {out.strip()!r}, stderr {complaints[:3]}"
        return None

    def kill(self):
        self.process.kill()
        self.process.wait()


def compile_workloads(work):
    workloads = {}
    for name in ("states", "nfd"):
        binary = work / name
        subprocess.run(["gcc", "-O2", "-g", "-pthread", str(FIXTURES / f"{name}.c"), "-o", str(binary)],
                       check=True)
        functions = ["mix"] if name == "states" else NFD_STAGES
        symbols = {}
        for line in subprocess.run(["nm", "-S", "--defined-only", str(binary)], capture_output=True,
                                   text=True, check=True).stdout.splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[3] in functions:
                symbols[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
        pie = binary.read_bytes()[16] == 3  # e_type ET_DYN
        workloads[name] = {"name": name, "binary": binary, "symbols": symbols, "pie": pie}
    workloads["states"]["expected"] = "errors: 0\n"
    untraced = subprocess.run([str(workloads["nfd"]["binary"]), "2", "300"], capture_output=True, text=True,
                              check=True)
    workloads["nfd"]["expected"] = untraced.stdout
    return workloads


def functions_for(workload, rng):
    if workload["name"] == "states":
        return "mix"
    if rng.random() < 0.1:  # the hot rule_match too: the rings fill, records are dropped
        return ",".join(NFD_STAGES)
    return rng.choice(["process_batch,classify,rewrite", "process_batch,parse_packet,forward",
                       "parse_packet,rewrite", "classify,forward"])


class Glass:
    """One `glass trace --pid`, its stderr (and its guardian's, which shares it) collected
    until the last of them closes it."""

    def __init__(self, pid, functions, seconds, output, step=None):
        env = dict(os.environ)
        env.pop("GLASS_TEST_STOP_AT", None)
        if step:
            env["GLASS_TEST_STOP_AT"] = step
        self.start = time.monotonic()
        self.process = subprocess.Popen([str(GLASS), "trace", "--pid", str(pid), "-f", functions, "-d",
                                         f"{seconds:.3f}", "-o", str(output)], stderr=subprocess.PIPE,
                                        env=env, text=True)
        self.pid = self.process.pid
        self.text = []
        self.reader = threading.Thread(target=lambda: self.text.extend(self.process.stderr), daemon=True)
        self.reader.start()

    def end(self):
        """Waits for glass and for the end of its stderr; False if either hangs."""
        try:
            self.process.wait(timeout=PATIENCE)
        except subprocess.TimeoutExpired:
            kill(self.pid)
            self.process.wait()
            self.reader.join(PATIENCE)
            return False
        self.reader.join(PATIENCE)
        return not self.reader.is_alive()

    def stderr(self):
        return "".join(self.text)


def figure(pattern, text):
    match = re.search(pattern, text)
    return float(match.group(1)) if match else None


def failure_lines(text):
    """glass's lines that say something went wrong, digits replaced so that they group."""
    lines = [l for l in text.splitlines() if l.strip() and not any(k in l for k in INFORMATIONAL)]
    return [re.sub(r"\d+(\.\d+)?", "N", l.strip()) for l in lines]


def one_cycle(index, target, rng, typical, output):
    """Runs one cycle on `target`; returns what happened."""
    workload = target.workload["name"]
    roll = rng.random()
    kind = "random" if roll < 0.30 else "step" if roll < 0.40 else "normal"
    guardian_kill = None
    if kind != "normal" and rng.random() < 1 / 3:
        guardian_kill = "first" if kind == "step" or rng.random() < 0.5 else "during"
    step = rng.choice(STEPS) if kind == "step" else None
    seconds = rng.uniform(0.05, 0.2)
    delay = rng.uniform(0, typical) if kind == "random" else None
    guardian_wait = rng.uniform(0, 0.01)
    functions = functions_for(target.workload, rng)
    record = {"cycle": index, "workload": workload, "target": target.pid, "kind": kind, "step": step,
              "guardian_kill": guardian_kill, "seconds": round(seconds, 3), "functions": functions}
    glass = Glass(target.pid, functions, seconds, output, step)
    record["glass"] = glass.pid
    killed = False
    if kind == "random":
        time.sleep(delay)
        record["delay_ms"] = round(1000 * delay, 1)
        killed = glass.process.poll() is None
    elif kind == "step":
        deadline = time.monotonic() + PATIENCE
        while process_state(glass.pid) != "T" and glass.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        killed = process_state(glass.pid) == "T"
        if not killed:
            record["step_not_reached"] = True
    guardian = None
    if killed:
        guardian = guardian_of(target.pid)
        record["guardian_seen"] = bool(guardian)
        if not guardian_kill:
            guardian = None
        if guardian_kill == "first" and guardian:
            kill(guardian)
        kill(glass.pid)
        if guardian_kill == "during" and guardian:
            time.sleep(guardian_wait)
            if f"__trace-guardian\0--pid\0{target.pid}\0".encode() in _cmdline(guardian):
                kill(guardian)
            else:
                guardian = None  # it had already finished
    record["killed"] = killed
    record["guardian_killed"] = bool(guardian)
    if killed:
        record["held_after_kill_ms"] = watch_held(target, glass)
    record["ended"] = glass.end()
    record["wall_ms"] = round(1000 * (time.monotonic() - glass.start), 1)
    said = glass.stderr()
    record["rc"] = glass.process.returncode
    record["stderr"] = said
    record["attach_ms"] = figure(r"every thread stopped ([0-9.]+) ms to patch", said)
    record["load_ms"] = figure(r"stopped ([0-9.]+) ms more to load the runtime", said)
    record["restore_ms"] = figure(r"every thread stopped ([0-9.]+) ms to restore", said)
    record["unmap_ms"] = figure(r"one stopped ([0-9.]+) ms more to unmap", said)
    record["guardian_ms"] = figure(r"its guardian took the probes out in ([0-9.]+) ms", said)
    record["recovered"] = "which died attached: taken out" in said
    if killed:
        record["phase"] = ("after detaching" if "detached from pid" in said else
                           "attached, before the end of detach" if "attached to pid" in said else
                           "before the end of attach")
        if "its guardian took the probes out" in said:
            record["guardian"] = "took the probes out"
        elif "its guardian found nothing to take out" in said:
            record["guardian"] = "found nothing to take out"
        elif "its guardian could not" in said:
            record["guardian"] = "could not take the probes out"
        elif record["phase"] == "after detaching":
            record["guardian"] = "had nothing to do (glass had detached)"
        elif not record["guardian_seen"]:
            record["guardian"] = "not started yet"
        else:
            record["guardian"] = "said nothing"
    # A failed attach: glass ended on its own (not killed) with an error, or hung.
    if not record["ended"]:
        record["failure"] = ["glass or its guardian did not end within 120 s"]
    elif not killed and (record["rc"] != 0 or "detached from pid" not in said or "panicked" in said):
        record["failure"] = failure_lines(said) or [f"exit {record['rc']} without a message"]
    elif killed:
        bad = [l for l in failure_lines(said) if "could not" in l or "panicked" in l]
        if bad:
            record["failure"] = bad
    return record


def watch_held(target, glass):
    """While a killed glass's guardian works (until glass's stderr closes): the longest
    time, sampled every 20 ms, that some thread of the target was seen stopped."""
    longest, since = 0.0, None
    deadline = time.monotonic() + PATIENCE
    while glass.reader.is_alive() and time.monotonic() < deadline:
        now = time.monotonic()
        if any(state in "tT" for _, state, _ in target.held()):
            since = now if since is None else since
            longest = max(longest, now - since)
        else:
            since = None
        time.sleep(0.02)
    return round(1000 * longest, 1)


def _cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def check_target(target, record, probes_pending):
    """A second after the cycle: alive, no thread held, its code as before. Returns a
    reason the target is broken, or None."""
    time.sleep(SETTLE)
    if not target.alive():
        target.reader.join(5)
        return f"died (exit {target.process.returncode}); stderr {target.lines[-3:]}"
    held = target.held()
    if held:
        time.sleep(5)
        still = target.held()
        return (f"threads traced or stopped a second after the cycle: {held[:4]}"
                + (f"; still after 5 s more: {still[:4]}" if still else "; let go within 5 s"))
    complaints = target.new_complaints()
    if complaints:
        return f"wrong output: {complaints[:3]}"
    if not probes_pending and target.code_now() != target.code:
        record["code_left_patched"] = True
    return None


def soak(work):
    make_subreaper()
    rng = random.Random(seed())
    workloads = compile_workloads(work)
    output = work / "soak.glass"
    log = open(os.environ["GLASS_SOAK_LOG"], "w") if os.environ.get("GLASS_SOAK_LOG") else None
    records, broken, left = [], [], []
    targets = 0
    typical = {"states": 0.5, "nfd": 0.5}  # seconds a whole glass run takes, updated as it goes
    walls = {"states": [], "nfd": []}
    total = cycles()
    started = time.monotonic()
    index = 0
    while index < total:
        name = "states" if targets % 2 == 0 else "nfd"
        workload = dict(workloads[name])
        workload["args"] = [] if name == "states" else [str(rng.choice([2, 3, 4])), "0",
                                                        str(rng.choice([500, 1000, 2000]))]
        target = Target(workload)
        targets += 1
        pending_files = []  # glass pids whose session files are checked after the next cycle
        probes_pending = False  # a killed guardian left probes for the next glass
        for _ in range(min(CYCLES_PER_TARGET, total - index)):
            record = one_cycle(index, target, rng, typical[name], output)
            index += 1
            records.append(record)
            if record["kind"] == "normal" and record.get("rc") == 0:
                walls[name].append(record["wall_ms"] / 1000)
                typical[name] = statistics.median(walls[name][-20:])
            if record["guardian_killed"] and record.get("phase") != "after detaching":
                probes_pending = True
            elif not record["killed"] and record.get("rc") == 0:
                probes_pending = False  # a glass that ran its course took out any left
            reap_orphans({target.pid})
            for pid, cycle in pending_files:
                for path in session_files(pid):
                    left.append({"file": path.name, "cycle": cycle["cycle"], "kind": cycle["kind"],
                                 "guardian_killed": cycle["guardian_killed"]})
                    path.unlink(missing_ok=True)
            pending_files = [(record["glass"], record)]
            why = check_target(target, record, probes_pending)
            if log:
                log.write(json.dumps(record) + "\n")
                log.flush()
            if why:
                broken.append({"cycle": record["cycle"], "workload": name, "kind": record["kind"],
                               "step": record["step"], "guardian_killed": record["guardian_killed"],
                               "why": why})
                print(f"soak: cycle {record['cycle']}: {name} broken: {why}", file=sys.stderr)
                target.kill()
                target = Target(workload)
                targets += 1
                probes_pending = False
            if index % 50 == 0:
                print(f"soak: {index}/{total} cycles, {time.monotonic() - started:.0f} s, "
                      f"{len(broken)} targets broken", file=sys.stderr)
        why = target.finish()
        if why:
            broken.append({"cycle": index - 1, "workload": name, "kind": "end of the target's run",
                           "step": None, "guardian_killed": False, "why": why})
            print(f"soak: {name} ended wrong: {why}", file=sys.stderr)
        for pid, cycle in pending_files:
            for path in session_files(pid):
                left.append({"file": path.name, "cycle": cycle["cycle"], "kind": cycle["kind"],
                             "guardian_killed": cycle["guardian_killed"]})
                path.unlink(missing_ok=True)
        reap_orphans(set())
    results = {"records": records, "broken": broken, "left": left, "targets": targets,
               "minutes": (time.monotonic() - started) / 60, "seed": seed()}
    if log:
        results["log"] = log
    return results


def run(work):
    work = Path(work)
    if not GLASS.exists():
        sys.exit(f"bench: {GLASS} is missing: run `cargo build --release -p glass -p glass-probe`")
    load = [os.getloadavg()[0]]
    results = soak(work)
    load.append(os.getloadavg()[0])
    results["load"] = load
    results["measured"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    log = results.pop("log", None)
    if log:
        # The last line: the rest of the results, so that `--render LOG` can redo the section.
        log.write(json.dumps({k: v for k, v in results.items() if k != "records"}) + "\n")
        log.close()
    print(f"soak: {summary_line(results)}", file=sys.stderr)
    write_section(markdown(results))


def write_section(text):
    section.replace(BEGIN, END, text)


def render(path):
    """Rewrites the section from a GLASS_SOAK_LOG of a whole run, without running it again."""
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    results = dict(lines[-1], records=lines[:-1])
    write_section(markdown(results))


def summary_line(results):
    records = results["records"]
    return (f"{len(records)} cycles, {sum(r['killed'] for r in records)} kills, "
            f"{len(results['broken'])} targets broken, {len(results['left'])} session files left, "
            f"{sum(1 for r in records if r.get('failure'))} failures")


def describe(record):
    """A cycle in a few words: how glass ended in it."""
    if record["kind"] == "normal" or not record["killed"]:
        return "left alone"
    how = "killed at random" if record["kind"] == "random" else f"killed at {record['step']}"
    if record["guardian_killed"]:
        return how + " with its guardian"
    return how + f" (its guardian: {record['guardian']})"


def stall_row(label, values):
    p = percentiles([v for v in values if v is not None])
    if not p:
        return f"| {label} | 0 | – | – | – |"
    return f"| {label} | {p['n']} | {p['p50']:.2f} ms | {p['p99']:.2f} ms | {p['max']:.2f} ms |"


def markdown(results):
    records, broken, left = results["records"], results["broken"], results["left"]
    count = lambda test: sum(1 for r in records if test(r))
    kinds = Counter(r["kind"] for r in records)
    random_kills = count(lambda r: r["kind"] == "random" and r["killed"])
    step_kills = count(lambda r: r["kind"] == "step" and r["killed"])
    too_late = count(lambda r: r["kind"] == "random" and not r["killed"])
    guardian_first = count(lambda r: r["guardian_killed"] and r["guardian_kill"] == "first")
    guardian_during = count(lambda r: r["guardian_killed"] and r["guardian_kill"] == "during")
    failures = [r for r in records if r.get("failure")]
    groups = Counter(line for r in failures for line in dict.fromkeys(r["failure"]))
    first_seen, after = {}, {}
    for r in failures:
        for line in dict.fromkeys(r["failure"]):
            first_seen.setdefault(line, r)
            before = records[r["cycle"] - 1] if r["cycle"] else None
            same = before and before["target"] == r["target"]
            after.setdefault(line, Counter())[describe(before) if same else "none (the target's first cycle)"] += 1
    patched = [r for r in records if r.get("code_left_patched")]
    spells = refusal_spells(records)
    lines = [BEGIN, "## glass trace --pid soak: attach and detach again and again, glass killed at random", ""]
    lines.append(
        f"Measured {results['measured']} on {machine()} (2 cores shared "
        f"with other work: load average {results['load'][0]:.1f} at the start, {results['load'][1]:.1f} at the "
        f"end); `./x bench trace-soak` (or `bench/run trace-soak` after `cargo build --release -p glass -p "
        f"glass-probe`; `bench/trace_soak.py`), GLASS_SOAK_CYCLES={len(records)}, "
        f"GLASS_SOAK_SEED={results.get('seed', seed())}, "
        f"{results['minutes']:.0f} minutes. Not part of the full `./x bench`.")
    lines += [
        "",
        "Each cycle is one `glass trace --pid PID -f FUNCS -d 0.05..0.2 -o FILE`. The target is restarted every "
        f"{CYCLES_PER_TARGET} cycles ({results['targets']} targets), alternately `tests/fixtures/trace/states.c` "
        "(threads in nanosleep, a futex, epoll_wait, read, waitpid, sigsuspend with a handler, a spinner, a "
        "vector-register holder, thread churn; `mix` traced) and `tests/fixtures/trace/nfd.c` (2-4 workers "
        "pausing 0.5-2 ms between rounds; two to six of its stages traced). In ~30% of cycles glass is SIGKILLed "
        "after a random delay (0 to a whole glass run), in ~10% at a random named step (`GLASS_TEST_STOP_AT`); in "
        "about a third of those its guardian is SIGKILLed too, before glass or 0-10 ms after it (while it takes "
        "the probes out). A second after each cycle (glass and its guardian ended) the target must be alive "
        "with no thread traced or stopped, and its traced functions' bytes as before its first attach (unless a "
        "killed guardian left the probes to the next glass); at the end of each target's run it must print "
        "`errors: 0` (nfd: the untraced run's round checksum) and exit 0. A glass's session file "
        "(`/dev/shm/glass-trace-<its pid>-*`) must be gone once the next cycle has ended.",
        "",
        "| cycles | left alone | killed at random | random kill too late (glass had ended) | killed at a step | guardian killed too: before glass / while taking out |",
        "|---|---|---|---|---|---|",
        f"| {len(records)} | {kinds['normal']} | {random_kills} | {too_late} | {step_kills} | "
        f"{guardian_first} / {guardian_during} |",
        "",
        "| targets broken (died, wrong output, left traced or stopped) | code left patched | session files left | "
        "attaches that failed (and guardians that could not take out) | dead glasses' probes taken out by the next glass |",
        "|---|---|---|---|---|",
        f"| **{len(broken)}** | {len(patched)} | {len(left)} | {len(failures)} | {count(lambda r: r['recovered'])} |",
        "",
    ]
    phases = Counter(r["phase"] for r in records if r["killed"] and r["kind"] == "random")
    outcomes = Counter(r["guardian"] for r in records if r["killed"] and not r["guardian_killed"])
    lines.append("Where the random kills landed (from what glass had printed): "
                 + ", ".join(f"{n} {phase}" for phase, n in phases.most_common()) + ". "
                 "The guardians of killed glasses (not killed themselves): "
                 + ", ".join(f"{n} {what}" for what, n in outcomes.most_common()) + ".")
    steps = Counter(r["step"] for r in records if r["kind"] == "step" and r["killed"])
    lines.append("Kills at a step: " + ", ".join(f"{step} {steps[step]}" for step in STEPS) + ".")
    lines += ["", "The stall each attach and detach costs, by glass's own account (stderr), over every cycle that "
              "got that far:", "",
              "| stall | cycles | p50 | p99 | max |", "|---|---|---|---|---|"]
    for name in ("states", "nfd"):
        subset = [r for r in records if r["workload"] == name]
        lines.append(stall_row(f"{name}: every thread stopped to patch", [r["attach_ms"] for r in subset]))
        lines.append(stall_row(f"{name}: one thread more to load the runtime", [r["load_ms"] for r in subset]))
        lines.append(stall_row(f"{name}: every thread stopped to restore", [r["restore_ms"] for r in subset]))
        lines.append(stall_row(f"{name}: one thread more to unmap the rings", [r["unmap_ms"] for r in subset]))
    lines.append(stall_row("guardian: glass's death to probes out", [r["guardian_ms"] for r in records]))
    lines.append(stall_row("killed glass: longest a target thread was seen stopped (sampled every 20 ms) "
                           "until its guardian ended", [r.get("held_after_kill_ms") for r in records if r["killed"]]))
    slow = [r for r in records if (r["guardian_ms"] or 0) > 1000]
    if slow:
        lines += ["", f"Guardians that took more than a second to take the probes out: {len(slow)} ("
                  + "; ".join(f"cycle {r['cycle']}, {r['workload']}, {describe(r)}: {r['guardian_ms'] / 1000:.1f} s, "
                              f"a thread seen stopped up to {r['held_after_kill_ms']:.0f} ms" for r in slow[:10]) + ")."]
    if broken:
        lines += ["", "Targets broken:", ""]
        for b in broken:
            how = b["kind"] + (f" at {b['step']}" if b["step"] else "") + (", guardian killed" if b["guardian_killed"] else "")
            lines.append(f"- cycle {b['cycle']} ({b['workload']}, {how}): {b['why']}")
    if patched:
        cycles_named = ", ".join(f"{r['cycle']} ({describe(r)})" for r in patched[:20])
        recovered = all(records[r["cycle"] + 1]["recovered"] for r in patched if r["cycle"] + 1 < len(records))
        lines += ["", f"Code left patched a second after the cycle, in cycles {cycles_named}"
                  + ("; each time the next glass took the probes out." if recovered else ".")]
    if left:
        by = Counter((l["kind"], l["guardian_killed"]) for l in left)
        lines += ["", "Session files left after the next cycle, by the cycle of the glass that made them: "
                  + ", ".join(f"{n} from {kind} kills{' with the guardian killed' if g else ''}"
                              for (kind, g), n in by.most_common()) + "."]
    if groups:
        lines += ["", "Attaches that failed (and guardians that could not take out), grouped by message (digits as N), with the workloads they failed "
                  "on and what the cycle before was (on the same target):", ""]
        for line, n in groups.most_common():
            on = Counter(r["workload"] for r in failures if line in r["failure"])
            lines.append(f"- {n} x `` {line} `` (first in cycle {first_seen[line]['cycle']}; on "
                         + ", ".join(f"{name} {k}" for name, k in on.most_common()) + "; the cycle before: "
                         + ", ".join(f"{k} {what}" for what, k in after[line].most_common()) + ")")
    if spells:
        lines += ["", "Targets no glass could attach to for a while (from a failed attach to the next glass that "
                  "attached and detached; the cycles between were all refused or killed):", ""]
        for first, last, refused, success in spells:
            line = (f"- cycles {first['cycle']}-{last['cycle']} ({first['workload']}): {refused} attaches failed, "
                    f"the first with `` {first['failure'][0]} ``")
            before = records[first["cycle"] - 1] if first["cycle"] else None
            if before and before["target"] == first["target"]:
                line += f" (the cycle before: {describe(before)})"
            else:
                line += " (the target's first cycle)"
            if success is None:
                line += "; no attach worked again before the target's end"
            else:
                between = records[last["cycle"] + 1:success["cycle"]]
                if between:
                    line += "; then " + "; ".join(f"cycle {r['cycle']} {describe(r)}" for r in between)
                line += f"; the attach of cycle {success['cycle']} worked"
            lines.append(line)
    lines += ["", END]
    return "\n".join(lines)


def refusal_spells(records):
    """Runs of three or more failed attaches on one target (killed cycles between them
    aside): (first failed cycle, last failed cycle, failures, the next cycle whose glass
    ran its course, or None if the target ended first)."""
    spells, current = [], None
    for r in records:
        if current and r["target"] != current[0]["target"]:
            if current[2] >= 3:
                spells.append((*current, None))
            current = None
        if r["killed"]:
            continue
        if r.get("failure") and r["ended"]:
            current = [current[0], r, current[2] + 1] if current else [r, r, 1]
        elif r["rc"] == 0 and current:
            if current[2] >= 3:
                spells.append((*current, r))
            current = None
    if current and current[2] >= 3:
        spells.append((*current, None))
    return spells


if __name__ == "__main__":
    if sys.argv[1:2] == ["--render"] and len(sys.argv) == 3:
        render(sys.argv[2])
    else:
        sys.exit("usage: bench/trace_soak.py --render GLASS_SOAK_LOG (the soak itself: bench/run trace-soak)")
