//! A running QEMU seen through its monitor: QMP over a unix socket (`--qmp SOCKET`), or
//! libvirt's access to the same monitor (`--libvirt DOMAIN`, [`crate::libvirt`]).
//!
//! What glass needs from a monitor is small: run an HMP command (`gdbserver`, `info
//! chardev`, `info mtree -f`, `gpa2hva`), the VM's run state, QEMU's pid, and after the
//! GDB stub connection broke, whether QEMU ended and how (QMP's `SHUTDOWN` event). The
//! client is a few lines of JSON over a socket with serde_json: QMP's framing is one JSON
//! object per line, and no crate on crates.io offers a synchronous client with deadlines
//! on every read (qapi-rs is async, qmp-client needs tokio), which a profiler that must
//! never hang on a wedged QEMU needs.
//!
//! [`RamRanges`] turns the monitor's view of guest-physical RAM (the flat view of the
//! `memory` address space, and `gpa2hva` for each RAM range) into the host addresses in
//! QEMU's own process, read with process_vm_readv ([`glass_mem::ProcessRam`]): no shared
//! memory backend needed.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use glass_mem::HostRange;
use serde_json::{json, Value};

/// How long QEMU has to answer one monitor command.
pub const MONITOR_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// Input the user gave that cannot be used (no such socket, no permission, a busy
    /// monitor, a stub in use): said in one line, exit status 2.
    #[error("{0}")]
    BadInput(String),
    /// The monitor did not answer in the time glass gives it ([`MONITOR_TIMEOUT`]).
    #[error("{0}")]
    TimedOut(String),
    /// The monitor broke while glass used it.
    #[error("{0}")]
    Failed(String),
}

impl From<MonitorError> for crate::TargetError {
    fn from(error: MonitorError) -> Self {
        match error {
            MonitorError::BadInput(text) => crate::TargetError::BadInput(text),
            MonitorError::TimedOut(text) | MonitorError::Failed(text) => {
                crate::TargetError::Io(std::io::Error::other(text))
            }
        }
    }
}

/// Opens the monitor `--qmp` or `--libvirt` names, and the guardian's arguments for it.
pub fn open_monitor(
    qmp: Option<&str>,
    libvirt: Option<&str>,
) -> Result<(Box<dyn Monitor>, Vec<String>), crate::TargetError> {
    match (qmp, libvirt) {
        (Some(path), _) => Ok((
            Box::new(Qmp::connect(path)?),
            vec!["--qmp".into(), path.into()],
        )),
        (None, Some(domain)) => Ok((
            Box::new(crate::libvirt::Libvirt::open(domain)?),
            vec!["--libvirt".into(), domain.into()],
        )),
        (None, None) => Err(crate::TargetError::BadInput(
            "--qmp or --libvirt needed".into(),
        )),
    }
}

/// What the guardian does for a glass that died attached through QEMU's monitor:
/// removes the stub glass enabled (QEMU closes it and its socket) and, if the VM is
/// still stopped (`paused` or `debug`), lets it run with `cont`. The monitor, not the
/// stub: no new stub connection to wait for, and it works whether glass died before,
/// during or after enabling it. Retried until `until`: QEMU's QMP socket takes a new
/// client once it has seen glass's connection close. Returns what it did.
pub fn unhook(qmp: Option<&str>, libvirt: Option<&str>, until: Instant) -> Result<String, String> {
    let mut monitor = loop {
        match open_monitor(qmp, libvirt) {
            Ok((monitor, _)) => break monitor,
            Err(error) if Instant::now() > until => return Err(error.to_string()),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let status = monitor.status().map_err(|e| e.to_string())?;
    // glass began with the VM running (it refuses any other state); QEMU's stub stops
    // it as `paused` (an interrupt, a new connection) or `debug` (a breakpoint): a VM
    // found so after glass died was stopped by glass. It runs first, then the stub goes.
    let resumed = status == "paused" || status == "debug";
    if resumed {
        monitor.hmp("cont").map_err(|e| e.to_string())?;
    }
    let stubs = monitor.hmp("info chardev").unwrap_or_default();
    let had_stub = existing_stub(&stubs).is_some();
    if had_stub {
        monitor.hmp("gdbserver none").map_err(|e| e.to_string())?;
    }
    Ok(match (had_stub, resumed) {
        (true, true) => "removed the GDB stub glass enabled and let the VM run (cont)",
        (true, false) => "removed the GDB stub glass enabled (the VM was running)",
        (false, true) => "let the VM run (cont; no GDB stub was left)",
        (false, false) => "found no GDB stub left and the VM running",
    }
    .to_string())
}

/// What glass asks of QEMU's monitor, whoever carries it (QMP, libvirt).
pub trait Monitor {
    /// Runs an HMP command and returns its text.
    fn hmp(&mut self, command: &str) -> Result<String, MonitorError>;

    /// Runs a QMP command and returns its `return` value.
    fn qmp(&mut self, command: &str, arguments: Option<Value>) -> Result<Value, MonitorError>;

    /// The VM's run state (`running`, `paused`, `debug`, `shutdown`, ...).
    fn status(&mut self) -> Result<String, MonitorError>;

    /// QEMU's process id.
    fn qemu_pid(&self) -> i32;

    /// What the monitor says of a QEMU whose GDB stub connection broke: `Some(how)` if
    /// the VM ended (waits a bounded time for the monitor to say so), `None` if QEMU
    /// still runs it.
    fn ending(&mut self) -> Option<String>;

    /// How the user named the VM (`QMP socket PATH`, `libvirt domain NAME`).
    fn describe(&self) -> String;

    /// Between samples: takes in what the monitor sent (QMP's events), without waiting.
    fn drain(&mut self) {}
}

/// A QMP connection (capabilities negotiated), with the events it has seen.
pub struct Qmp {
    path: String,
    stream: UnixStream,
    reader: BufReader<UnixStream>,
    pid: i32,
    /// Events received so far (`SHUTDOWN`, ...; the first 256), oldest first.
    pub events: Vec<Value>,
    /// STOP and RESUME events received (not kept).
    pub stops: u64,
    /// A line read in part.
    partial: String,
    closed: bool,
}

impl Qmp {
    /// Connects to QEMU's QMP socket at `path` and leaves capabilities negotiation.
    pub fn connect(path: &str) -> Result<Qmp, MonitorError> {
        let bad = |what: String| MonitorError::BadInput(format!("--qmp {path}: {what}"));
        let meta = std::fs::metadata(path).map_err(|e| bad(io_text(&e)))?;
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(bad(
                "not a unix socket (QEMU's -qmp unix:PATH,server=on,wait=off)".into(),
            ));
        }
        let stream = UnixStream::connect(path).map_err(|e| match e.raw_os_error() {
            Some(libc::ECONNREFUSED) => bad(
                "connection refused: no QEMU listens there (a socket left by a QEMU that ended?)"
                    .into(),
            ),
            _ => bad(io_text(&e)),
        })?;
        let pid = peer_pid(&stream).ok_or_else(|| {
            bad("cannot tell which process serves the socket (SO_PEERCRED)".into())
        })?;
        let reader = BufReader::new(stream.try_clone().map_err(|e| bad(io_text(&e)))?);
        let mut qmp = Qmp {
            path: path.to_string(),
            stream,
            reader,
            pid,
            events: Vec::new(),
            stops: 0,
            partial: String::new(),
            closed: false,
        };
        // A QMP monitor serves one client at a time: a second connection is accepted by
        // the kernel but QEMU never greets it.
        let greeting = qmp.read_message(Instant::now() + MONITOR_TIMEOUT).map_err(|e| match e {
            MonitorError::TimedOut(_) => bad(
                "QEMU did not greet: its QMP monitor is busy with another client (libvirt? then use --libvirt DOMAIN)".into(),
            ),
            other => other,
        })?;
        if greeting.get("QMP").is_none() {
            return Err(bad(format!("not a QMP monitor (it said {greeting})")));
        }
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    /// Runs a QMP command; its `return` value.
    pub fn execute(
        &mut self,
        command: &str,
        arguments: Option<Value>,
    ) -> Result<Value, MonitorError> {
        let mut message = json!({ "execute": command });
        if let Some(arguments) = arguments {
            message["arguments"] = arguments;
        }
        let mut line = message.to_string();
        line.push('\n');
        self.stream
            .write_all(line.as_bytes())
            .map_err(|e| self.failed(&format!("sending {command}"), &io_text(&e)))?;
        let deadline = Instant::now() + MONITOR_TIMEOUT;
        loop {
            let reply = self.read_message(deadline)?;
            if reply.get("event").is_some() {
                self.keep(reply);
                continue;
            }
            if let Some(value) = reply.get("return") {
                return Ok(value.clone());
            }
            if let Some(error) = reply.get("error") {
                let desc = error
                    .get("desc")
                    .and_then(Value::as_str)
                    .unwrap_or("refused");
                return Err(MonitorError::Failed(format!("QMP {command}: {desc}")));
            }
        }
    }

    /// Reads events until `deadline` or until the monitor closes (QEMU ended); whether it
    /// closed.
    pub fn wait_closed(&mut self, deadline: Instant) -> bool {
        while !self.closed {
            match self.read_message(deadline) {
                Ok(message) if message.get("event").is_some() => self.keep(message),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        self.closed
    }

    /// The first event named `name` seen so far.
    pub fn event(&self, name: &str) -> Option<&Value> {
        self.events
            .iter()
            .find(|e| e.get("event").and_then(Value::as_str) == Some(name))
    }

    fn read_message(&mut self, deadline: Instant) -> Result<Value, MonitorError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(MonitorError::TimedOut(format!(
                    "QEMU's QMP monitor at {} did not answer within {:?}",
                    self.path, MONITOR_TIMEOUT
                )));
            }
            let _ = self.stream.set_read_timeout(Some(left));
            if let Some(message) = self.read_line()? {
                return Ok(message);
            }
        }
    }

    /// One message if a whole line came (a line cut by a timeout stays in `partial`
    /// for the next read).
    fn read_line(&mut self) -> Result<Option<Value>, MonitorError> {
        match self.reader.read_line(&mut self.partial) {
            Ok(0) => {
                self.closed = true;
                return Err(MonitorError::Failed(format!(
                    "QEMU's QMP monitor at {} closed the connection",
                    self.path
                )));
            }
            Ok(_) if self.partial.ends_with('\n') => {}
            Ok(_) => return Ok(None),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                if self.partial.len() > 16 << 20 {
                    return Err(self.failed("reading", "a message longer than 16 MiB"));
                }
                return Ok(None);
            }
            Err(e) => return Err(self.failed("reading", &io_text(&e))),
        }
        let line = std::mem::take(&mut self.partial);
        serde_json::from_str(line.trim())
            .map(Some)
            .map_err(|e| self.failed("reading", &format!("not JSON: {e}")))
    }

    /// Reads the events QEMU has sent so far without waiting: every stop of the VM
    /// for a sample makes QEMU send STOP and RESUME, which it buffers without bound
    /// while no one reads them (and a full buffer at its exit would lose the SHUTDOWN
    /// event behind them). STOP and RESUME are counted, not kept.
    pub fn drain(&mut self) {
        if self.closed || self.stream.set_nonblocking(true).is_err() {
            return;
        }
        while let Ok(Some(message)) = self.read_line() {
            self.keep(message);
        }
        let _ = self.stream.set_nonblocking(false);
    }

    fn keep(&mut self, event: Value) {
        match event.get("event").and_then(Value::as_str) {
            Some("STOP" | "RESUME") => self.stops += 1,
            _ if self.events.len() < 256 => self.events.push(event),
            _ => {}
        }
    }

    fn failed(&self, doing: &str, what: &str) -> MonitorError {
        MonitorError::Failed(format!("QMP monitor at {}: {doing}: {what}", self.path))
    }
}

impl Monitor for Qmp {
    fn qmp(&mut self, command: &str, arguments: Option<Value>) -> Result<Value, MonitorError> {
        self.execute(command, arguments)
    }

    fn hmp(&mut self, command: &str) -> Result<String, MonitorError> {
        let text = self.execute(
            "human-monitor-command",
            Some(json!({ "command-line": command })),
        )?;
        Ok(text.as_str().unwrap_or_default().replace("\r\n", "\n"))
    }

    fn status(&mut self) -> Result<String, MonitorError> {
        let status = self.execute("query-status", None)?;
        Ok(status
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_string())
    }

    fn qemu_pid(&self) -> i32 {
        self.pid
    }

    fn ending(&mut self) -> Option<String> {
        // QEMU still answers: it runs, whatever became of the stub. It answers nothing
        // once its main loop has ended (it is exiting): the reply never comes, then the
        // socket closes.
        let alive = match self.status() {
            Ok(_) => true,
            Err(_) => !self.wait_closed(Instant::now() + Duration::from_secs(10)),
        };
        if alive {
            return None;
        }
        Some(match self.event("SHUTDOWN") {
            Some(event) => {
                let reason = event
                    .pointer("/data/reason")
                    .and_then(Value::as_str)
                    .unwrap_or("shutdown");
                let by_guest = event.pointer("/data/guest").and_then(Value::as_bool) == Some(true);
                if by_guest {
                    format!("guest powered off (QMP SHUTDOWN event, {reason}); QEMU exited")
                } else {
                    format!("VM shut down by the host (QMP SHUTDOWN event, {reason}); QEMU exited")
                }
            }
            None => "QEMU ended without a SHUTDOWN event (its QMP monitor closed)".to_string(),
        })
    }

    fn describe(&self) -> String {
        format!("QMP socket {}", self.path)
    }

    fn drain(&mut self) {
        Qmp::drain(self)
    }
}

/// The pid of the process at the other end of a unix socket.
fn peer_pid(stream: &UnixStream) -> Option<i32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes a ucred into `cred`, whose size `len` gives.
    let done = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (done == 0 && cred.pid > 0).then_some(cred.pid)
}

/// An I/O error's text without its `(os error N)`.
pub(crate) fn io_text(error: &std::io::Error) -> String {
    let text = error.to_string();
    text.split(" (os error").next().unwrap_or(&text).to_string()
}

/// Whether QEMU already has a GDB stub, from `info chardev`: `Some(in use)` (a
/// debugger is connected to it) if it has, `None` if not. The stub's chardev is named
/// `gdb`; its filename starts with `disconnected:` while no debugger is connected.
pub fn existing_stub(chardevs: &str) -> Option<(bool, String)> {
    chardevs.lines().find_map(|line| {
        let filename = line.trim().strip_prefix("gdb: filename=")?;
        Some((!filename.starts_with("disconnected:"), filename.to_string()))
    })
}

/// The RAM ranges of the `memory` address space's flat view (`info mtree -f`): the
/// lines of kind `ram` or `rom` (RAM that the machine maps read-only, such as the
/// shadowed BIOS area), as (start, length).
pub fn flat_ram(mtree: &str) -> Vec<(u64, u64)> {
    let mut ranges = Vec::new();
    let mut in_memory = false;
    for line in mtree.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("FlatView #") {
            in_memory = false;
            continue;
        }
        if trimmed.starts_with("AS \"memory\"") {
            in_memory = true;
            continue;
        }
        if !in_memory {
            continue;
        }
        // 0000000000100000-0000000003ffffff (prio 0, ram): pc.ram @0000000000100000
        let Some((span, rest)) = trimmed.split_once(' ') else {
            continue;
        };
        if !(rest.contains(", ram)") || rest.contains(", rom)")) {
            continue;
        }
        let Some((start, end)) = span.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
        else {
            continue;
        };
        if end >= start {
            ranges.push((start, end - start + 1));
        }
    }
    ranges
}

/// The host address in `gpa2hva`'s answer (`Host virtual address for 0x100000 (pc.ram)
/// is 0x7f7913f00000`).
pub fn parse_gpa2hva(text: &str) -> Option<u64> {
    let hex = text.trim().rsplit(" is 0x").next()?;
    if !text.contains(" is 0x") {
        return None;
    }
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// The guest's RAM ranges with their host addresses in QEMU's process, through the
/// monitor; merges ranges that continue each other in both spaces.
pub fn ram_ranges(monitor: &mut dyn Monitor) -> Result<Vec<HostRange>, MonitorError> {
    let mtree = monitor.hmp("info mtree -f")?;
    let mut out: Vec<HostRange> = Vec::new();
    for (start, len) in flat_ram(&mtree) {
        let answer = monitor.hmp(&format!("gpa2hva 0x{start:x}"))?;
        let Some(host) = parse_gpa2hva(&answer) else {
            continue;
        };
        match out.last_mut() {
            Some(last)
                if last.guest_physical + last.len == start
                    && last.host_virtual + last.len == host =>
            {
                last.len += len
            }
            _ => out.push(HostRange {
                guest_physical: start,
                len,
                host_virtual: host,
            }),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured from QEMU 7.2 (Debian 12), qemu-system-x86_64 -m 64.
    const MTREE: &str = "FlatView #1\n AS \"cpu-smm-0\", root: memory\n Root memory region: memory\n  0000000000000000-00000000000c2fff (prio 0, ram): pc.ram\n\nFlatView #2\n AS \"memory\", root: system\n AS \"cpu-memory-0\", root: system\n Root memory region: system\n  0000000000000000-00000000000c2fff (prio 0, ram): pc.ram\n  00000000000c3000-00000000000e7fff (prio 0, rom): pc.ram @00000000000c3000\n  0000000000100000-0000000003ffffff (prio 0, ram): pc.ram @0000000000100000\n  00000000fec00000-00000000fec00fff (prio 0, i/o): ioapic\n  00000000fffc0000-00000000ffffffff (prio 0, rom): pc.bios\n\nFlatView #3\n AS \"i440FX\", root: bus master container\n";

    #[test]
    fn ram_of_the_memory_address_space_only() {
        assert_eq!(
            flat_ram(MTREE),
            vec![
                (0, 0xc3000),
                (0xc3000, 0x25000),
                (0x100000, 0x3f00000),
                (0xfffc0000, 0x40000)
            ]
        );
        assert!(flat_ram("garbage\n  x-y (ram)").is_empty());
    }

    #[test]
    fn stubs_and_host_addresses_are_read_from_hmp_text() {
        assert_eq!(
            parse_gpa2hva("Host virtual address for 0x100000 (pc.ram) is 0x7f7913f00000\r\n"),
            Some(0x7f79_13f0_0000)
        );
        assert_eq!(parse_gpa2hva("No memory is mapped at address 0x1"), None);
        let none = "#chr080: filename=gdb\ncompat_monitor0: filename=unix:/q.sock,server=on\n";
        assert_eq!(existing_stub(none), None);
        let idle = "gdb: filename=disconnected:unix:/g.sock,server=on\n";
        assert_eq!(existing_stub(idle).map(|s| s.0), Some(false));
        let used = "gdb: filename=unix:/g.sock,server=on\n";
        assert_eq!(existing_stub(used).map(|s| s.0), Some(true));
    }
}
