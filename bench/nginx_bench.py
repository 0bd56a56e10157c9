"""nginx under wrk (called by bench/run; `bench/run nginx`, `./x bench nginx` runs only
this): Debian's nginx (tests/fixtures/nginx/nginx.conf, one worker running as nobody,
master and worker on core 0) serving a small static page to `wrk -t1 -c32` on core 1 over
loopback, alone and with each tool attached to the worker for the whole wrk run:

- glass record --pid WORKER at 99 and 999 Hz, and its peer perf record -g -F 99/999 -p;
- glass trace --pid WORKER -f '*' --libcalls '*' (every function glass finds in the
  stripped binary: the exported ngx_* by name, the static ones from .eh_frame as sub_*,
  and every libc call through the GOT), and a narrow selection (the per-request
  functions and libc calls the test counts).

Requests/s from wrk, overhead = 1 - rps_with / rps_alone; samples taken and lost per
tool (glass's summary; perf's own count and `perf report`'s "Total Lost Samples"), the
tool's CPU time. Each configuration runs on a fresh nginx, REPS times in turn, and the
median is reported. Results replace the text between the glass-nginx markers of
docs/benchmarks.md.
"""

import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import section

ROOT = Path(__file__).resolve().parent.parent
GLASS = ROOT / "target" / "release" / "glass"
FIXTURE = ROOT / "tests" / "fixtures" / "nginx"
BEGIN = "<!-- glass-nginx:begin -->"
END = "<!-- glass-nginx:end -->"
# Seconds of each wrk run (GLASS_BENCH_NGINX_SECONDS shortens it for a quick try).
SECONDS = float(os.environ.get("GLASS_BENCH_NGINX_SECONDS", "10"))
CONNECTIONS = 32
# A pair of runs (alone, with a tool) during which other work on the machine kept more
# CPUs than this busy is measured again, at most RETRIES times.
QUIET = float(os.environ.get("GLASS_BENCH_NGINX_QUIET", "0.15"))
RETRIES = 3
NARROW = "ngx_event_accept,ngx_http_process_request,ngx_http_close_connection"
NARROW_LIBCALLS = "accept4,writev"


def reps():
    return int(os.environ.get("GLASS_BENCH_REPS", "3"))


def need(command, package):
    if not shutil.which(command) and not Path("/usr/sbin", command).exists():
        print(f"bench: installing {package}", file=sys.stderr)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", package], check=True, env=env,
                       stdout=subprocess.DEVNULL)


def nginx_binary():
    return shutil.which("nginx") or "/usr/sbin/nginx"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid):
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(") ", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


class Nginx:
    """nginx with one worker (nobody), master and worker pinned to core 0, serving the
    fixture page from a world-traversable directory."""

    def __init__(self, work):
        self.prefix = Path(work) / "nginx"
        shutil.rmtree(self.prefix, ignore_errors=True)
        (self.prefix / "html").mkdir(parents=True)
        for path in (Path(work), self.prefix, self.prefix / "html"):
            path.chmod(0o755)
        page = self.prefix / "html" / "index.html"
        shutil.copy(FIXTURE / "index.html", page)
        page.chmod(0o644)
        self.body = page.read_bytes()
        self.port = free_port()
        conf = self.prefix / "nginx.conf"
        conf.write_text((FIXTURE / "nginx.conf").read_text().replace("@PREFIX@", str(self.prefix))
                        .replace("@PORT@", str(self.port)).replace("@WORKERS@", "1"))
        self.master = subprocess.Popen(["taskset", "-c", "0", nginx_binary(), "-p", str(self.prefix), "-c", str(conf),
                                        "-e", str(self.prefix / "error.log")],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            if self.master.poll() is not None:
                raise RuntimeError(f"nginx ended: {(self.prefix / 'error.log').read_text()}")
            try:
                with urllib.request.urlopen(self.url(), timeout=10) as response:
                    if response.status == 200 and response.read() == self.body:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("nginx does not serve")
            time.sleep(0.02)
        workers = children(self.master.pid)
        assert len(workers) == 1, workers
        self.worker = workers[0]
        status = Path(f"/proc/{self.worker}/status").read_text()
        uid = re.search(r"^Uid:\s+(\d+)", status, re.M).group(1)
        assert uid == "65534", f"the worker runs as uid {uid}"

    def url(self):
        return f"http://127.0.0.1:{self.port}/index.html"

    def stop(self):
        self.master.send_signal(signal.SIGTERM)
        try:
            self.master.wait(timeout=30)
        except subprocess.TimeoutExpired:
            for worker in children(self.master.pid):
                os.kill(worker, signal.SIGKILL)
            self.master.kill()
            self.master.wait()


def cpu_ns(pid):
    """Time `pid` has run on a CPU (its schedstat), in nanoseconds."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def busy_seconds():
    """CPU time the whole machine has spent busy (all CPUs, /proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # user nice system idle iowait irq softirq steal: everything but idle and iowait.
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def process_seconds(pid):
    """CPU time of every thread of `pid` (user and system), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(url, worker, tool=None):
    """wrk's requests/s; the worker's CPU time per request over the run, the cost a tool
    adds in the worker itself, which other work on the machine changes less than the
    rate; and the CPUs the rest of the machine kept busy meanwhile (neither nginx, nor
    wrk, nor the tool), which says how disturbed the run was."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = (cpu_ns(worker), busy_seconds(), process_seconds(tool) if tool else 0, time.monotonic())
    client = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", f"-c{CONNECTIONS}", f"-d{SECONDS:g}s", url],
                            capture_output=True, text=True)
    after = (cpu_ns(worker), busy_seconds(), process_seconds(tool) if tool else 0, time.monotonic())
    # The only child reaped meanwhile is wrk (taskset execs it).
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    wrk_seconds = (reaped.ru_utime + reaped.ru_stime) - (children.ru_utime + children.ru_stime)
    out, err = client.stdout, client.stderr
    if client.returncode != 0:
        raise RuntimeError(f"wrk failed: {out}{err}")
    rps = re.search(r"Requests/sec:\s+([0-9.]+)", out)
    requests = re.search(r"(\d+) requests in", out)
    if not rps or not requests:
        raise RuntimeError(f"wrk said: {out}{err}")
    if re.search(r"Non-2xx or 3xx responses|Socket errors", out):
        raise RuntimeError(f"wrk saw errors: {out}")
    worker_s = (after[0] - before[0]) / 1e9
    ours = worker_s + wrk_seconds + (after[2] - before[2])
    return {"rps": float(rps.group(1)), "us_per_request": worker_s * 1e6 / int(requests.group(1)),
            "others": max(0.0, (after[1] - before[1] - ours) / (after[3] - before[3]))}


def has_perf_event(pid):
    """Whether `pid` has opened a perf event (perf record and glass's perf backend)."""
    try:
        return any(os.readlink(fd) == "anon_inode:[perf_event]" for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


def run_tool(command, ready, out):
    """Starts the tool and waits until `ready(process, stderr so far)` says it is on the
    worker: the process and the file its stderr goes to."""
    err_path = out.with_suffix(".err")
    with open(err_path, "w") as err:
        tool = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, text=True)
    deadline = time.monotonic() + 120
    while not ready(tool, err_path.read_text()):
        if tool.poll() is not None:
            raise RuntimeError(f"{command} ended: {err_path.read_text()}")
        if time.monotonic() > deadline:
            tool.kill()
            raise RuntimeError(f"{command} did not start: {err_path.read_text()}")
        time.sleep(0.02)
    return tool, err_path


def finish_tool(tool, err_path):
    """Stops the tool with SIGINT (both tools detach and write their file on it): its
    stderr and CPU seconds."""
    tool.send_signal(signal.SIGINT)
    _, status, usage = os.wait4(tool.pid, 0)
    tool.returncode = os.waitstatus_to_exitcode(status)
    text = err_path.read_text()
    # perf record ends by raising the SIGINT again once its file is written.
    if tool.returncode not in (0, -signal.SIGINT):
        raise RuntimeError(f"{tool.args} failed ({tool.returncode}): {text}")
    return text, usage.ru_utime + usage.ru_stime


def perf_figures(data):
    """Samples perf took, those in user mode (the ones glass took before it recorded kernel stacks), and lost."""
    ips = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip", "-G"], capture_output=True,
                         text=True).stdout.split()
    report = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--sort", "dso", "-g", "none"],
                            capture_output=True, text=True).stdout
    lost = re.search(r"Total Lost Samples: (\d+)", report)
    return {"samples": len(ips), "user": sum(1 for ip in ips if not ip.startswith("ffff")),
            "lost": int(lost.group(1)) if lost else 0}


def measure(work, name, command_of, ready, parse):
    nginx = Nginx(work)
    try:
        out = Path(work) / "nginx-tool.out"
        if command_of is None:
            return wrk(nginx.url(), nginx.worker)
        tool, err_path = run_tool(command_of(nginx.worker, out), ready(nginx.worker), out)
        try:
            served = wrk(nginx.url(), nginx.worker, tool.pid)
        except BaseException:
            tool.kill()
            raise
        text, cpu = finish_tool(tool, err_path)
        row = {**served, "cpu": cpu, **parse(text, out)}
        # The worker serves on, not stopped, after the tool.
        state = Path(f"/proc/{nginx.worker}/stat").read_text().rsplit(") ", 1)[1][0]
        assert state not in "tT", f"{name}: the worker is left in state {state}"
        with urllib.request.urlopen(nginx.url(), timeout=10) as response:
            assert response.status == 200 and response.read() == nginx.body
        return row
    finally:
        nginx.stop()
        for path in Path(work).glob("nginx-tool.*"):
            path.unlink()


def glass_record_parse(text, out):
    samples = re.search(r"glass: (\d+) samples", text)
    lost = re.search(r"lost samples (\d+)", text)
    if not samples or not lost:
        raise RuntimeError(f"no summary from glass record: {text}")
    return {"samples": int(samples.group(1)), "lost": int(lost.group(1))}


def glass_trace_parse(text, out):
    summary = re.search(r"glass: (\d+) records from \d+ threads in [0-9.]+ s; (\d+) lost", text)
    functions = re.search(r"instrumented (\d+) functions, skipped (\d+)", text)
    if not summary or not functions:
        raise RuntimeError(f"no summary from glass trace: {text}")
    return {"records": int(summary.group(1)), "lost": int(summary.group(2)), "bytes": out.stat().st_size,
            "functions": int(functions.group(1)), "skipped": int(functions.group(2))}


def configurations():
    glass_ready = lambda worker: lambda tool, err: has_perf_event(tool.pid)
    perf_ready = lambda worker: lambda tool, err: has_perf_event(tool.pid)
    trace_ready = lambda worker: lambda tool, err: f"attached to pid {worker}" in err
    configs = [("nginx alone", None, None, None)]
    for hz in ("99", "999"):
        configs.append((f"glass record --pid -F {hz}",
                        lambda w, out, hz=hz: [str(GLASS), "record", "--pid", str(w), "-F", hz, "-o", str(out)],
                        glass_ready, glass_record_parse))
        configs.append((f"perf record -g -F {hz} -p",
                        lambda w, out, hz=hz: ["perf", "record", "-g", "-F", hz, "-p", str(w), "-o", str(out)],
                        perf_ready, lambda text, out: perf_figures(out)))
    configs.append(("glass trace --pid -f '*' --libcalls '*'",
                    lambda w, out: [str(GLASS), "trace", "--pid", str(w), "-f", "*", "--libcalls", "*",
                                    "-o", str(out)],
                    trace_ready, glass_trace_parse))
    configs.append((f"glass trace --pid -f {NARROW} --libcalls {NARROW_LIBCALLS}",
                    lambda w, out: [str(GLASS), "trace", "--pid", str(w), "-f", NARROW, "--libcalls",
                                    NARROW_LIBCALLS, "-o", str(out)],
                    trace_ready, glass_trace_parse))
    return configs


def run(work):
    if not GLASS.exists():
        sys.exit(f"bench: {GLASS} is missing: run `cargo build --release -p glass`")
    need("nginx", "nginx")
    need("wrk", "wrk")
    need("perf", "linux-perf")
    started = time.monotonic()
    load = [os.getloadavg()[0]]
    configs = configurations()
    rows = {name: [] for name, *_ in configs}
    retried = 0
    # Every tool run follows a run of nginx alone, and its overhead is against that one:
    # on a shared machine the rate drifts with the others' work, and a pair close in time
    # sees the same drift. A pair during which other work kept more than QUIET CPUs busy
    # is measured again (up to RETRIES times; the last is kept). The configurations in
    # turn, REPS rounds.
    for rep in range(reps()):
        for name, command_of, ready, parse in configs[1:]:
            for attempt in range(RETRIES + 1):
                alone = measure(work, "alone", None, None, None)
                row = measure(work, name, command_of, ready, parse)
                print(f"bench: nginx {name} #{rep + 1}: alone {alone}, with {row}", file=sys.stderr)
                if max(alone["others"], row["others"]) <= QUIET or attempt == RETRIES:
                    break
                retried += 1
            row["overhead"] = 1 - row["rps"] / alone["rps"]
            row["cpu_overhead"] = row["us_per_request"] / alone["us_per_request"] - 1
            rows["nginx alone"].append(alone)
            rows[name].append(row)
    load.append(os.getloadavg()[0])
    version = subprocess.run([nginx_binary(), "-v"], capture_output=True, text=True).stderr.strip()
    write(markdown(rows, version, load, time.monotonic() - started, retried))


def median(rows, key):
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else float("nan")


def markdown(rows, version, load, elapsed, retried):
    wide = rows["glass trace --pid -f '*' --libcalls '*'"]
    others = sorted(r["others"] for rs in rows.values() for r in rs)
    others_median, others_max = statistics.median(others), others[-1]
    lines = [
        BEGIN,
        "## nginx under wrk",
        "",
        f"Measured {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} on {os.cpu_count()} CPUs, load average "
        f"{load[0]:.1f} at the start and {load[1]:.1f} at the end; `./x bench nginx` (`bench/nginx_bench.py`), "
        f"{elapsed / 60:.1f} minutes. Debian's {version.replace('nginx version: ', '')} (stripped) with "
        "tests/fixtures/nginx/nginx.conf: one worker running as nobody, `access_log off`, master and worker on "
        f"core 0; `wrk -t1 -c{CONNECTIONS} -d{SECONDS:g}s` on core 1 fetches a {len((FIXTURE / 'index.html').read_bytes())}-byte "
        "page over loopback (keep-alive). Each tool is attached to the worker before wrk starts and stopped "
        "with SIGINT after it ends (the tools themselves are not pinned: they take their CPU from nginx or wrk, "
        "which is their cost). Every run is on a fresh nginx, and every tool run follows a run of nginx alone: "
        "overhead = 1 - requests/s with the tool / requests/s of that run alone, the median (and range) of "
        f"{reps()} such pairs, configurations in turn. The worker's CPU time per request (its schedstat over the "
        "run) shows the cost in the worker itself (probes; the kernel's sampling, copying stacks), which other "
        "work on the machine changes less than the rate.",
        "",
        f"Other work on these {os.cpu_count()} CPUs during the wrk runs (CPU time neither nginx's worker, nor wrk, nor "
        f"the tool used): {others_median:.2f} CPUs on average (median of the runs kept), {others_max:.2f} at the most; "
        f"{retried} pairs were measured again because it exceeded {QUIET:g} CPUs in one of their runs; "
        "the rate of nginx alone varied from "
        f"{min(r['rps'] for r in rows['nginx alone']) / 1e3:.1f} k to {max(r['rps'] for r in rows['nginx alone']) / 1e3:.1f} k "
        "requests/s across the runs." + (
            " Some runs kept here still shared the machine: their rates measure the share of the CPUs nginx and "
            "wrk got as much as any tool's cost (the kernel divides CPU time between sessions, autogroups, so a "
            "tool's own threads can win this run's processes more of it, and a rate with a tool can exceed the one "
            "alone); the worker's CPU per request is the steadier figure." if others_max > QUIET else ""),
        "",
        "| configuration | requests/s | overhead (range) | worker CPU per request (vs alone) | samples (records) | lost | tool CPU |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, rs in rows.items():
        rps = median(rs, "rps")
        per_request = f"{median(rs, 'us_per_request'):.2f} µs"
        if name == "nginx alone":
            overhead, taken, lost, cpu = "–", "–", "–", "–"
        else:
            spread = sorted(r["overhead"] for r in rs)
            overhead = (f"{100 * median(rs, 'overhead'):.1f}% ({100 * spread[0]:.1f} to "
                        f"{100 * spread[-1]:.1f})")
            per_request += f" ({100 * median(rs, 'cpu_overhead'):+.0f}%)"
            cpu = f"{median(rs, 'cpu'):.2f} s"
            lost = f"{median(rs, 'lost'):.0f}"
            if "records" in rs[0]:
                taken = (f"{median(rs, 'records') / 1e6:.1f} M records, "
                         f"{median(rs, 'bytes') / 2**20:.0f} MiB")
            elif "user" in rs[0]:
                taken = f"{median(rs, 'samples'):.0f} ({median(rs, 'user'):.0f} in user mode)"
            else:
                taken = f"{median(rs, 'samples'):.0f}"
        lines.append(f"| {name} | {rps / 1e3:.1f} k | {overhead} | {per_request} | {taken} | {lost} | {cpu} |")
    lines += [
        "",
        f"`-f '*'` on Debian's stripped nginx: {median(wide, 'functions'):.0f} functions instrumented, "
        f"{median(wide, 'skipped'):.0f} skipped (with the reason, `glass info`) — the exported `ngx_*` by name "
        "(nginx exports its global functions for dynamic modules), its static functions as `sub_<address>` "
        "from `.eh_frame`, and with `--libcalls '*'` every libc call through its GOT. The narrow row traces only "
        "the functions and calls a request goes through once (what crates/glass/tests/nginx.rs counts).",
        "",
        "A worker serving a small page spends most of its time in the kernel (loopback TCP): both tools sample "
        "kernel mode with kernel stacks here (glass by default where permitted, as root; with `--no-kernel` it "
        "samples user mode only and takes about as many samples as perf takes in user mode). glass's lost "
        "samples are counted by its perf rings (PERF_RECORD_LOST), perf's are `perf report`'s "
        "\"Total Lost Samples\".",
        "",
        END,
    ]
    return lines


def write(lines):
    section.replace(BEGIN, END, "\n".join(lines))


if __name__ == "__main__":
    import tempfile
    work = Path(tempfile.mkdtemp(prefix="glass-bench-nginx-"))
    try:
        run(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
