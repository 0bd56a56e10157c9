//! A small, fast GDB remote serial protocol client: the few packets a sampler needs
//! (stop, registers of each vCPU, memory, continue), over TCP or a unix socket.
//!
//! Every wait has a deadline: a stub that answers garbage, closes mid-packet or never
//! answers gives one error, never a hang. Opening a connection to QEMU's stub stops the
//! VM; [`Client::connect`] resumes it at once.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::packet::{encode, hex_bytes, push_hex, Decoder, Event};
use super::target_xml::{parse, Layout, Register};
pub use crate::arch::{Arch, VcpuRegs};
use crate::stop_mark::StopMark;

/// How long one reply may take before the stub is considered gone.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum StubError {
    #[error("cannot connect to the GDB stub at {0}: {1}")]
    Connect(String, io::Error),
    #[error("the GDB stub closed the connection")]
    Closed,
    #[error("the GDB stub did not answer within {0:?}")]
    Timeout(Duration),
    /// The stub's last packet: the target exited (`W` with its status, `X` with the
    /// signal that ended it). QEMU sends `W00` as it shuts down.
    #[error("the VM ended (its GDB stub's last packet: {0})")]
    Exited(String),
    #[error("the GDB stub sent a malformed reply: {0}")]
    Protocol(String),
    #[error("the GDB stub refused {0}: {1}")]
    Refused(String, String),
    #[error("{0}")]
    Io(#[from] io::Error),
}

trait Stream: Read + Write + Send {
    fn set_read_deadline(&self, timeout: Option<Duration>) -> io::Result<()>;
}

impl Stream for TcpStream {
    fn set_read_deadline(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(timeout)
    }
}

impl Stream for UnixStream {
    fn set_read_deadline(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(timeout)
    }
}

/// Where one of the registers a sample needs comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Bytes `offset..offset + size` of the `g` reply.
    G { offset: usize, size: usize },
    /// A `p` request of this register number.
    P(u32),
    /// The stub does not have it: reads as 0.
    Missing,
}

pub struct Client {
    stream: Box<dyn Stream>,
    decoder: Decoder,
    buffer: std::collections::VecDeque<u8>,
    framed: Vec<u8>,
    pub layout: Layout,
    /// The stub's vCPU thread ids, as it spells them (`1`, `p1.2`, ...).
    pub vcpus: Vec<String>,
    running: bool,
    /// The vCPU the stub reads registers of (`Hg`), when known.
    selected: Option<String>,
    /// The largest packet the stub accepts and sends (`PacketSize` of `qSupported`).
    packet_size: usize,
    /// Reused for pipelined requests.
    batch: Vec<u8>,
    /// Per vCPU, its framed `Hg` packet (built once).
    select_packets: Vec<Vec<u8>>,
    /// The guest's architecture, from the target description's registers.
    arch: Arch,
    /// Per register of [`VcpuRegs::names`], where its value comes from.
    sources: Vec<Source>,
    /// The framed `p` requests of the registers not in `g`, in `sources` order.
    p_packets: Vec<Vec<u8>>,
    /// Replies read but not yet acknowledged (sent with the next `c`).
    owed_acks: usize,
    /// The exit packet (`W..`/`X..`) the stub sent, if it did.
    exit_packet: Option<String>,
    /// The stub closed the connection (or the socket broke).
    closed: bool,
}

impl Client {
    /// Connects to `address`: `host:port` for TCP, or a path (or `unix:PATH`) for a unix
    /// socket. Reads the target description and the vCPU list, then lets the VM run.
    pub fn connect(address: &str) -> Result<Self, StubError> {
        Self::connect_marked(address, None)
    }

    /// [`Client::connect`], saying in `mark` that glass holds the VM stopped from the
    /// stub's first answer (the stub is alive; it stopped the VM when it took the
    /// connection) on. The caller ends the mark once this returns: the handshake ends
    /// by letting the VM run. A stub that never answers is not a stop glass holds: it
    /// ends in [`REPLY_TIMEOUT`] with an error.
    pub fn connect_marked(address: &str, mark: Option<&StopMark>) -> Result<Self, StubError> {
        Self::connect_holding(address, mark, false)
    }

    /// [`Client::connect_marked`] that leaves the VM stopped (the caller resumes it): for a
    /// VM started stopped (`-S`), which must not run before the caller has set
    /// breakpoints.
    pub fn connect_held(address: &str, mark: Option<&StopMark>) -> Result<Self, StubError> {
        Self::connect_holding(address, mark, true)
    }

    fn connect_holding(
        address: &str,
        mark: Option<&StopMark>,
        hold: bool,
    ) -> Result<Self, StubError> {
        let stream: Box<dyn Stream> = match address
            .strip_prefix("unix:")
            .or(address.starts_with('/').then_some(address))
        {
            Some(path) => Box::new(
                UnixStream::connect(path).map_err(|e| StubError::Connect(address.into(), e))?,
            ),
            None => {
                let stream = TcpStream::connect(address)
                    .map_err(|e| StubError::Connect(address.into(), e))?;
                stream.set_nodelay(true)?;
                Box::new(stream)
            }
        };
        let mut client = Client {
            stream,
            decoder: Decoder::new(),
            buffer: std::collections::VecDeque::with_capacity(4096),
            framed: Vec::with_capacity(256),
            layout: Layout::default(),
            vcpus: Vec::new(),
            running: false,
            selected: None,
            packet_size: 0,
            batch: Vec::with_capacity(256),
            select_packets: Vec::new(),
            arch: Arch::X86_64,
            sources: Vec::new(),
            p_packets: Vec::new(),
            owed_acks: 0,
            exit_packet: None,
            closed: false,
        };
        client.handshake(mark)?;
        if !hold {
            client.resume()?;
        }
        Ok(client)
    }

    fn handshake(&mut self, mark: Option<&StopMark>) -> Result<(), StubError> {
        // The stub stops the VM when we connect; a stale stop reply may be queued.
        let supported =
            self.request(b"qSupported:multiprocess+;xmlRegisters=i386;qXfer:features:read+")?;
        if let Some(mark) = mark {
            mark.begin();
        }
        self.packet_size = String::from_utf8_lossy(&supported)
            .split(';')
            .find_map(|feature| feature.strip_prefix("PacketSize="))
            .and_then(|hex| usize::from_str_radix(hex, 16).ok())
            .unwrap_or(0);
        self.request(b"?")?;
        let registers = self.target_registers()?;
        let g_len = hex_bytes(&self.request(b"g")?).map_or(0, |g| g.len());
        self.layout = Layout::for_g_reply(registers, g_len);
        self.arch = if self.layout.find("rip").is_some() {
            Arch::X86_64
        } else if self.layout.find("pc").is_some() && self.layout.find("x29").is_some() {
            Arch::Aarch64
        } else {
            return Err(StubError::Protocol(
                "the target description is neither x86-64 nor AArch64 (no rip, no pc/x29)".into(),
            ));
        };
        self.plan_sources(g_len)?;
        self.vcpus = self.thread_ids()?;
        if self.vcpus.is_empty() {
            return Err(StubError::Protocol("the stub lists no vCPUs".into()));
        }
        self.select_packets = self
            .vcpus
            .iter()
            .map(|id| {
                let mut framed = Vec::new();
                encode(format!("Hg{id}").as_bytes(), &mut framed);
                framed
            })
            .collect();
        Ok(())
    }

    /// Leaves out the registers that find a Linux guest's current task (read only with
    /// `--guest-btf`): on AArch64 they are `p` requests, a round trip's worth of stopped
    /// time per sample that nothing else needs.
    pub fn without_task_registers(&mut self) {
        let from = VcpuRegs::task_registers_from(self.arch);
        for source in self.sources.iter_mut().skip(from) {
            *source = Source::Missing;
        }
        self.p_packets = self
            .sources
            .iter()
            .filter_map(|source| match source {
                Source::P(regnum) => {
                    let mut framed = Vec::new();
                    encode(format!("p{regnum:x}").as_bytes(), &mut framed);
                    Some(framed)
                }
                _ => None,
            })
            .collect();
    }

    /// The guest's architecture.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// Decides where each needed register comes from. Where the `g` reply is as long as
    /// the description says, every register is in it; otherwise (QEMU's AArch64 stub
    /// sends the core registers only; system registers only on `p`) the required general
    /// registers, which come first, are taken from `g` and the rest asked for with `p`.
    fn plan_sources(&mut self, g_len: usize) -> Result<(), StubError> {
        let names = VcpuRegs::names(self.arch);
        let required = VcpuRegs::required(self.arch);
        let whole = g_len == self.layout.g_len;
        self.sources.clear();
        self.p_packets.clear();
        for (index, aliases) in names.iter().enumerate() {
            let found = aliases
                .iter()
                .find_map(|name| self.layout.find(name).map(|slot| (name, slot)));
            let source = match found {
                None if index < required => {
                    return Err(StubError::Protocol(format!(
                        "the target description has no {} register",
                        aliases[0]
                    )))
                }
                None => Source::Missing,
                Some((_, (offset, size)))
                    if (whole || index < required) && offset + size <= g_len =>
                {
                    Source::G { offset, size }
                }
                Some((name, _)) => {
                    let regnum = self.layout.regnum(name).unwrap_or(0);
                    let mut framed = Vec::new();
                    encode(format!("p{regnum:x}").as_bytes(), &mut framed);
                    self.p_packets.push(framed);
                    Source::P(regnum)
                }
            };
            self.sources.push(source);
        }
        Ok(())
    }

    /// Reads `target.xml` and the annexes it includes.
    fn target_registers(&mut self) -> Result<Vec<Register>, StubError> {
        let mut registers = Vec::new();
        let mut next_regnum = 0;
        let mut pending = vec!["target.xml".to_string()];
        let mut seen = 0;
        while let Some(annex) = pending.pop() {
            seen += 1;
            if seen > 32 {
                return Err(StubError::Protocol(
                    "too many target description annexes".into(),
                ));
            }
            let xml = self.read_annex(&annex)?;
            let description = parse(&xml, &mut next_regnum);
            registers.extend(description.registers);
            // Includes are read in document order.
            pending.extend(description.includes.into_iter().rev());
        }
        Ok(registers)
    }

    fn read_annex(&mut self, annex: &str) -> Result<String, StubError> {
        let mut text = Vec::new();
        loop {
            let request = format!("qXfer:features:read:{annex}:{:x},ffb", text.len());
            let reply = self.request(request.as_bytes())?;
            match reply.first() {
                Some(b'm') => text.extend_from_slice(&reply[1..]),
                Some(b'l') => {
                    text.extend_from_slice(&reply[1..]);
                    break;
                }
                _ => {
                    return Err(StubError::Refused(
                        format!("reading {annex}"),
                        String::from_utf8_lossy(&reply).into(),
                    ))
                }
            }
            if text.len() > 1 << 20 {
                return Err(StubError::Protocol(format!("{annex} is too long")));
            }
        }
        Ok(String::from_utf8_lossy(&text).into_owned())
    }

    fn thread_ids(&mut self) -> Result<Vec<String>, StubError> {
        let mut ids = Vec::new();
        let mut reply = self.request(b"qfThreadInfo")?;
        while reply.first() == Some(&b'm') {
            ids.extend(
                reply[1..]
                    .split(|&b| b == b',')
                    .map(|id| String::from_utf8_lossy(id).into_owned()),
            );
            reply = self.request(b"qsThreadInfo")?;
            if ids.len() > 4096 {
                break;
            }
        }
        Ok(ids)
    }

    /// Stops the VM (all vCPUs) and waits for the stop reply.
    pub fn stop(&mut self) -> Result<(), StubError> {
        if !self.running {
            return Ok(());
        }
        self.stream.write_all(&[0x03])?;
        let deadline = Instant::now() + REPLY_TIMEOUT;
        loop {
            let reply = self.receive(deadline)?;
            if self.stopped_by(&reply) {
                return Ok(());
            }
        }
    }

    /// Whether `reply` is a stop reply; if so, the VM is stopped, and the vCPU that
    /// reported it (`T05thread:p01.01;`) is the selected one: reading it needs no `Hg`
    /// round trip.
    fn stopped_by(&mut self, reply: &[u8]) -> bool {
        if !matches!(reply.first(), Some(b'T' | b'S')) {
            return false;
        }
        self.running = false;
        self.selected = String::from_utf8_lossy(reply)
            .split(';')
            .find_map(|field| field.split_once("thread:").map(|(_, id)| id.to_string()));
        true
    }

    /// Lets the VM run; the reply comes only at the next stop. The `c` goes out with the
    /// acknowledgements still owed for pipelined replies, in one write, and its own
    /// acknowledgement is not waited for (the next exchange reads past it): on a stream
    /// socket nothing is corrupted, and QEMU's system-mode stub never retransmits.
    pub fn resume(&mut self) -> Result<(), StubError> {
        if self.running {
            return Ok(());
        }
        let mut batch = std::mem::take(&mut self.batch);
        batch.clear();
        batch.resize(self.owed_acks, b'+');
        encode(b"c", &mut self.framed);
        batch.extend_from_slice(&self.framed);
        let written = self.stream.write_all(&batch);
        self.batch = batch;
        written?;
        self.owed_acks = 0;
        self.running = true;
        self.selected = None;
        Ok(())
    }

    /// Stops the VM and reads every vCPU's registers in one round trip: the interrupt
    /// byte and every vCPU's `Hg`, `g` and `p` requests go out in one write. QEMU stops
    /// the VM synchronously on the interrupt (a byte that arrives while the VM runs does
    /// nothing else), sends the stop reply, then answers the queued packets in order with
    /// the VM stopped. Replies are acknowledged with the next `c` (see
    /// [`Client::resume`]). Where the VM is already stopped, the same without the
    /// interrupt.
    pub fn stop_with_registers(&mut self, out: &mut [VcpuRegs]) -> Result<(), StubError> {
        let interrupt = self.running;
        self.exchange_registers(interrupt, out)
    }

    /// Makes vCPU `index` the one `g`, `p` and `m` packets apply to (an `Hg` round trip
    /// unless it already is).
    pub fn select(&mut self, index: usize) -> Result<(), StubError> {
        let id = self
            .vcpus
            .get(index)
            .cloned()
            .ok_or_else(|| StubError::Protocol(format!("no vCPU {index}")))?;
        if self.selected.as_deref() != Some(id.as_str()) {
            let select = format!("Hg{id}");
            let reply = self.request(select.as_bytes())?;
            if reply != b"OK" {
                return Err(StubError::Refused(
                    select,
                    String::from_utf8_lossy(&reply).into(),
                ));
            }
            self.selected = Some(id);
        }
        Ok(())
    }

    /// The registers of vCPU `index` (the VM must be stopped).
    pub fn registers(&mut self, index: usize) -> Result<VcpuRegs, StubError> {
        self.select(index)?;
        let g = self.request(b"g")?;
        let mut p_replies = Vec::with_capacity(self.p_packets.len());
        for source in self.sources.clone() {
            if let Source::P(regnum) = source {
                p_replies.push(self.request(format!("p{regnum:x}").as_bytes())?);
            }
        }
        self.parse_registers(&g, &p_replies)
    }

    /// The registers of every vCPU (the VM must be stopped), in one write of all the
    /// `Hg`/`g`/`p` requests and one read of their replies: QEMU answers queued packets
    /// in order and, in system emulation, does not wait for acknowledgements, so the
    /// whole read costs one round trip instead of several per vCPU.
    pub fn registers_of_all(&mut self, out: &mut [VcpuRegs]) -> Result<(), StubError> {
        if self.running {
            return Err(StubError::Protocol(
                "registers asked for while the VM runs".into(),
            ));
        }
        self.exchange_registers(false, out)
    }

    fn exchange_registers(
        &mut self,
        interrupt: bool,
        out: &mut [VcpuRegs],
    ) -> Result<(), StubError> {
        if out.len() != self.vcpus.len() {
            return Err(StubError::Protocol(format!(
                "{} asked for, the stub has {}",
                glass_format::count(out.len() as u64, "vCPU"),
                self.vcpus.len()
            )));
        }
        let mut batch = std::mem::take(&mut self.batch);
        batch.clear();
        if interrupt {
            batch.push(0x03);
        }
        encode(b"g", &mut self.framed);
        for select in &self.select_packets {
            batch.extend_from_slice(select);
            batch.extend_from_slice(&self.framed);
            for p in &self.p_packets {
                batch.extend_from_slice(p);
            }
        }
        let written = self.stream.write_all(&batch);
        self.batch = batch;
        written?;
        let deadline = Instant::now() + REPLY_TIMEOUT;
        if interrupt {
            // The stop reply (a stale one may come first: any stop reply means stopped).
            loop {
                let reply = self.unacknowledged_reply(deadline)?;
                if matches!(reply.first(), Some(b'T' | b'S')) {
                    break;
                }
            }
            self.running = false;
        }
        self.selected = None;
        let mut p_replies = Vec::with_capacity(self.p_packets.len());
        for regs in out.iter_mut() {
            let selected = self.unacknowledged_reply(deadline)?;
            if selected != b"OK" {
                return Err(StubError::Refused(
                    "Hg".into(),
                    String::from_utf8_lossy(&selected).into(),
                ));
            }
            let g = self.unacknowledged_reply(deadline)?;
            if g.first() == Some(&b'E') {
                return Err(StubError::Refused(
                    "g".into(),
                    String::from_utf8_lossy(&g).into(),
                ));
            }
            p_replies.clear();
            for _ in 0..self.p_packets.len() {
                p_replies.push(self.unacknowledged_reply(deadline)?);
            }
            *regs = self.parse_registers(&g, &p_replies)?;
        }
        self.selected = self.vcpus.last().cloned();
        if !interrupt {
            // Not followed by a `c` that would carry them.
            let acks = vec![b'+'; self.owed_acks];
            self.stream.write_all(&acks)?;
            self.owed_acks = 0;
        }
        Ok(())
    }

    /// The next packet of a pipelined exchange, its acknowledgement owed (sent with the
    /// next `c`). Stop replies other than the one awaited are skipped by the callers.
    fn unacknowledged_reply(&mut self, deadline: Instant) -> Result<Vec<u8>, StubError> {
        loop {
            match self.next_event(deadline)? {
                Event::Ack => {}
                Event::Packet(payload) => {
                    self.owed_acks += 1;
                    // A stop reply that was already queued (the VM stopped on its own)
                    // answers nothing of this exchange.
                    if !self.running && matches!(payload.first(), Some(b'T' | b'S')) {
                        continue;
                    }
                    return Ok(payload);
                }
                Event::Nack | Event::BadChecksum => {
                    self.selected = None;
                    return Err(StubError::Protocol(
                        "a pipelined packet was corrupted on the way".into(),
                    ));
                }
            }
        }
    }

    /// One vCPU's registers from its `g` reply and the replies to the `p` requests (in
    /// `sources` order). A `p` the stub refuses reads as 0.
    fn parse_registers(&self, g: &[u8], p_replies: &[Vec<u8>]) -> Result<VcpuRegs, StubError> {
        let g =
            hex_bytes(g).ok_or_else(|| StubError::Protocol("register reply is not hex".into()))?;
        let little_endian = |bytes: &[u8]| {
            let mut word = [0u8; 8];
            let n = bytes.len().min(8);
            word[..n].copy_from_slice(&bytes[..n]);
            u64::from_le_bytes(word)
        };
        let mut values = [0u64; 16];
        let mut p_index = 0;
        for (value, source) in values.iter_mut().zip(&self.sources) {
            *value = match *source {
                Source::G { offset, size } => g
                    .get(offset..offset + size)
                    .map(little_endian)
                    .ok_or_else(|| StubError::Protocol("short register reply".into()))?,
                Source::P(_) => {
                    let reply = p_replies.get(p_index).map(Vec::as_slice).unwrap_or(b"");
                    p_index += 1;
                    hex_bytes(reply).map_or(0, |bytes| little_endian(&bytes))
                }
                Source::Missing => 0,
            };
        }
        Ok(VcpuRegs::from_values(
            self.arch,
            &values[..self.sources.len()],
        ))
    }

    /// One register by name, with a `p` packet (0 if the stub has no such register).
    pub fn register(&mut self, name: &str) -> Result<u64, StubError> {
        let Some(regnum) = self.layout.regnum(name) else {
            return Ok(0);
        };
        let reply = self.request(format!("p{regnum:x}").as_bytes())?;
        let bytes = hex_bytes(&reply)
            .ok_or_else(|| StubError::Protocol(format!("{name} reply is not hex")))?;
        let mut word = [0u8; 8];
        let n = bytes.len().min(8);
        word[..n].copy_from_slice(&bytes[..n]);
        Ok(u64::from_le_bytes(word))
    }

    /// Sets (`Z0`) or clears (`z0`) a breakpoint at a guest-virtual address, with the VM
    /// stopped. QEMU keeps its breakpoints out of guest memory (TCG checks them as it
    /// translates), so the guest never sees one.
    pub fn breakpoint(&mut self, address: u64, set: bool) -> Result<(), StubError> {
        let request = format!("{}0,{address:x},1", if set { 'Z' } else { 'z' });
        let reply = self.request(request.as_bytes())?;
        if reply != b"OK" {
            return Err(StubError::Refused(
                request,
                String::from_utf8_lossy(&reply).into(),
            ));
        }
        Ok(())
    }

    /// While the VM runs: waits up to `wait` for it to stop by itself (a breakpoint
    /// hit); whether it did. The vCPU that stopped it is the selected one.
    pub fn wait_for_stop(&mut self, wait: Duration) -> Result<bool, StubError> {
        if !self.running {
            return Ok(true);
        }
        let deadline = Instant::now() + wait;
        loop {
            match self.receive(deadline) {
                Ok(reply) if self.stopped_by(&reply) => return Ok(true),
                Ok(_) => {}
                Err(StubError::Timeout(_)) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
    }

    /// Sets one register of the selected vCPU (see [`Client::select`]) by name, with a
    /// `P` packet: the width the target description gives it, little-endian.
    pub fn set_register(&mut self, name: &str, value: u64) -> Result<(), StubError> {
        let regnum = self
            .layout
            .regnum(name)
            .ok_or_else(|| StubError::Protocol(format!("the stub has no register {name}")))?;
        let bytes = self.layout.find(name).map_or(8, |(_, size)| size.min(8));
        let mut request = format!("P{regnum:x}=");
        push_hex(&value.to_le_bytes()[..bytes], &mut request);
        let reply = self.request(request.as_bytes())?;
        if reply != b"OK" {
            return Err(StubError::Refused(
                format!("setting {name}"),
                String::from_utf8_lossy(&reply).into(),
            ));
        }
        Ok(())
    }

    /// Makes `m` and `M` packets address guest-physical memory (`true`) or the
    /// selected vCPU's virtual memory (`false`, the stub's default): QEMU's
    /// `Qqemu.PhyMemMode`.
    pub fn physical_memory_mode(&mut self, physical: bool) -> Result<(), StubError> {
        let request = format!("Qqemu.PhyMemMode:{}", u8::from(physical));
        let reply = self.request(request.as_bytes())?;
        if reply != b"OK" {
            return Err(StubError::Refused(
                request,
                String::from_utf8_lossy(&reply).into(),
            ));
        }
        Ok(())
    }

    /// The most bytes one [`Client::read_memory`] returns: the reply carries them in hex
    /// (two characters a byte) inside the stub's packet size, less the framing; 1 KiB
    /// when the stub does not say.
    pub fn max_memory_read(&self) -> usize {
        match self.packet_size {
            0 => 1024,
            size => ((size.saturating_sub(8)) / 2).clamp(64, 1 << 16) & !7,
        }
    }

    /// Reads guest-virtual memory through the stub (the slow path, one round trip per
    /// call). Returns the bytes the stub could read.
    pub fn read_memory(&mut self, address: u64, len: usize) -> Result<Vec<u8>, StubError> {
        let request = format!("m{address:x},{len:x}");
        let reply = self.request(request.as_bytes())?;
        if reply.first() == Some(&b'E') {
            return Ok(Vec::new());
        }
        hex_bytes(&reply).ok_or_else(|| StubError::Protocol("memory reply is not hex".into()))
    }

    /// Writes guest-virtual memory through the stub (`M` packets, split to fit the
    /// stub's packet size), with the VM stopped. This is the write path for code: QEMU
    /// writes through its debug access, which drops the translated blocks (TCG) that
    /// hold the written bytes, where a write into guest RAM behind QEMU's back leaves
    /// them running the old code (tests/gdbstub_qemu.rs shows both).
    pub fn write_memory(&mut self, address: u64, bytes: &[u8]) -> Result<(), StubError> {
        // "M<addr>,<len>:" plus two characters a byte must fit in a packet.
        let chunk = (self.max_memory_read().saturating_sub(32)).max(16);
        for (index, part) in bytes.chunks(chunk).enumerate() {
            let at = address + (index * chunk) as u64;
            let mut request = format!("M{at:x},{:x}:", part.len());
            push_hex(part, &mut request);
            let reply = self.request(request.as_bytes())?;
            if reply != b"OK" {
                return Err(StubError::Refused(
                    format!("a write of {} bytes at {at:#x}", part.len()),
                    String::from_utf8_lossy(&reply).into(),
                ));
            }
        }
        Ok(())
    }

    /// Detaches: the VM runs on, untraced.
    pub fn detach(&mut self) -> Result<(), StubError> {
        if self.running {
            self.stop()?;
        }
        // With the multiprocess extension (ids like `p1.2`), detach names the process.
        let detach = match self.vcpus.first().and_then(|id| id.strip_prefix('p')) {
            Some(id) => format!("D;{}", id.split('.').next().unwrap_or("1")),
            None => "D".to_string(),
        };
        let reply = self.request(detach.as_bytes())?;
        self.running = true;
        if reply != b"OK" {
            return Err(StubError::Refused(
                detach,
                String::from_utf8_lossy(&reply).into(),
            ));
        }
        Ok(())
    }

    /// Sends a packet and returns its reply.
    fn request(&mut self, payload: &[u8]) -> Result<Vec<u8>, StubError> {
        self.send(payload)?;
        self.receive(Instant::now() + REPLY_TIMEOUT)
    }

    fn send(&mut self, payload: &[u8]) -> Result<(), StubError> {
        encode(payload, &mut self.framed);
        for _attempt in 0..3 {
            self.stream.write_all(&self.framed)?;
            let deadline = Instant::now() + REPLY_TIMEOUT;
            loop {
                match self.next_event(deadline)? {
                    Event::Ack => return Ok(()),
                    Event::Nack => break,
                    // A stop reply queued from before (QEMU sends one on connect).
                    Event::Packet(_) | Event::BadChecksum => continue,
                }
            }
        }
        Err(StubError::Protocol(
            "the stub rejected a packet three times".into(),
        ))
    }

    fn receive(&mut self, deadline: Instant) -> Result<Vec<u8>, StubError> {
        loop {
            match self.next_event(deadline)? {
                Event::Packet(payload) => {
                    self.stream.write_all(b"+")?;
                    return Ok(payload);
                }
                Event::BadChecksum => self.stream.write_all(b"-")?,
                Event::Ack | Event::Nack => {}
            }
        }
    }

    fn next_event(&mut self, deadline: Instant) -> Result<Event, StubError> {
        loop {
            // Bytes already buffered first.
            while let Some(b) = self.buffer.pop_front() {
                if let Some(event) = self
                    .decoder
                    .push(b)
                    .map_err(|e| StubError::Protocol(format!("{e:?}")))?
                {
                    if let Event::Packet(payload) = &event {
                        if let Some(exit) = exit_packet(payload) {
                            self.exit_packet = Some(exit.clone());
                            return Err(StubError::Exited(exit));
                        }
                    }
                    return Ok(event);
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(StubError::Timeout(REPLY_TIMEOUT));
            }
            self.stream.set_read_deadline(Some(left))?;
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    self.closed = true;
                    return Err(StubError::Closed);
                }
                Ok(n) => self.buffer.extend(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(StubError::Timeout(REPLY_TIMEOUT));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.closed |= broken(&e);
                    return Err(e.into());
                }
            }
        }
    }

    /// After a failure: the exit packet the stub sent before it closed the connection
    /// (`W00`: QEMU shut down), read from what is left on the socket if it was not read
    /// yet (a write that failed because QEMU had gone leaves its last words unread).
    /// Reads until the stub closes the connection, for at most `wait`.
    pub fn last_words(&mut self, wait: Duration) -> Option<String> {
        let deadline = Instant::now() + wait;
        while self.exit_packet.is_none() && !self.closed && Instant::now() < deadline {
            match self.next_event(deadline) {
                Ok(_) => {}
                Err(StubError::Timeout(_)) => break,
                Err(StubError::Io(e)) if !broken(&e) => break,
                Err(_) => {}
            }
        }
        self.exit_packet.clone()
    }

    /// Whether glass has let the VM run (and not stopped it since).
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// Whether the connection is gone (closed by the stub, reset, or broken on write).
    pub fn is_closed(&self) -> bool {
        self.closed
    }
}

/// An exit packet: `W` or `X` and two hex digits, optionally `;process:PID`.
fn exit_packet(payload: &[u8]) -> Option<String> {
    let (&kind, rest) = payload.split_first()?;
    let code = rest.split(|&b| b == b';').next()?;
    (matches!(kind, b'W' | b'X') && code.len() == 2 && code.iter().all(u8::is_ascii_hexdigit))
        .then(|| String::from_utf8_lossy(payload).into_owned())
}

fn broken(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
    )
}

impl Drop for Client {
    /// Never leave the guest stopped: whatever happens to glass, let the VM go.
    fn drop(&mut self) {
        if !self.running {
            // Fire and forget: a stub that has stopped answering must not hold glass.
            encode(b"c", &mut self.framed);
            let _ = self.stream.write_all(&self.framed);
        }
    }
}

/// What the guardian does for a glass that died (`--gdb`, `--vm --keep-vm`): connects to
/// the stub and detaches (the VM runs). See [`reconnect`].
pub fn let_run(stub: &str, until: Instant, gone: &mut dyn FnMut() -> bool) -> Result<(), String> {
    reconnect(stub, until, gone, &mut |client| {
        client.detach().map_err(|e| e.to_string())
    })
}

/// Connects to the stub a dead glass held and runs `then` on the connection, retrying
/// until `until`: QEMU takes the new connection once it has seen the dead one close.
/// Gives up early once `gone` says the VMM is (a launched QEMU that exited).
pub fn reconnect<T>(
    stub: &str,
    until: Instant,
    gone: &mut dyn FnMut() -> bool,
    then: &mut dyn FnMut(&mut Client) -> Result<T, String>,
) -> Result<T, String> {
    let mut last = String::new();
    while Instant::now() < until {
        if gone() {
            return Err("QEMU has exited".into());
        }
        match Client::connect(stub) {
            Ok(mut client) => return then(&mut client),
            Err(error) => last = error.to_string(),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::exit_packet;

    #[test]
    fn exit_packets_are_told_from_replies() {
        assert_eq!(exit_packet(b"W00").as_deref(), Some("W00"));
        assert_eq!(exit_packet(b"X09").as_deref(), Some("X09"));
        assert_eq!(
            exit_packet(b"W01;process:1").as_deref(),
            Some("W01;process:1")
        );
        // Replies that are not: hex memory, OK, errors, stop replies, odd lengths.
        for reply in [
            &b"00ff"[..],
            b"OK",
            b"E01",
            b"T05thread:p01.01;",
            b"W",
            b"W0",
            b"Wzz",
            b"",
        ] {
            assert_eq!(
                exit_packet(reply),
                None,
                "{:?}",
                String::from_utf8_lossy(reply)
            );
        }
    }
}
