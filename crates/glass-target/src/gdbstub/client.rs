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

use super::packet::{encode, hex_bytes, Decoder, Event};
use super::target_xml::{parse, Layout, Register};

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

/// The registers a sample needs from one vCPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VcpuRegs {
    pub ip: u64,
    pub sp: u64,
    pub fp: u64,
    pub cr3: u64,
    pub cr4: u64,
    pub efer: u64,
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
    /// Whether `g` replies hold what the target description says (else the control
    /// registers are read with `p`, one round trip each).
    g_matches_layout: bool,
    /// Replies read but not yet acknowledged (sent with the next `c`).
    owed_acks: usize,
}

impl Client {
    /// Connects to `address`: `host:port` for TCP, or a path (or `unix:PATH`) for a unix
    /// socket. Reads the target description and the vCPU list, then lets the VM run.
    pub fn connect(address: &str) -> Result<Self, StubError> {
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
            g_matches_layout: false,
            owed_acks: 0,
        };
        client.handshake()?;
        Ok(client)
    }

    fn handshake(&mut self) -> Result<(), StubError> {
        // The stub stops the VM when we connect; a stale stop reply may be queued.
        let supported =
            self.request(b"qSupported:multiprocess+;xmlRegisters=i386;qXfer:features:read+")?;
        self.packet_size = String::from_utf8_lossy(&supported)
            .split(';')
            .find_map(|feature| feature.strip_prefix("PacketSize="))
            .and_then(|hex| usize::from_str_radix(hex, 16).ok())
            .unwrap_or(0);
        self.request(b"?")?;
        let mut registers = self.target_registers()?;
        let g_len = hex_bytes(&self.request(b"g")?).map_or(0, |g| g.len());
        let layout = Layout::new(registers.clone());
        if g_len + 24 == layout.g_len {
            // QEMU 7.x describes ss_base, ds_base and es_base but neither sends them in
            // `g` nor counts them in its register numbers: without them the description
            // matches what the stub does.
            let quirk = ["ss_base", "ds_base", "es_base"];
            if let Some(first) = registers
                .iter()
                .filter(|r| quirk.contains(&r.name.as_str()))
                .map(|r| r.regnum)
                .min()
            {
                registers.retain(|r| !quirk.contains(&r.name.as_str()));
                for register in registers.iter_mut().filter(|r| r.regnum > first) {
                    register.regnum -= 3;
                }
            }
        }
        self.layout = Layout::new(registers);
        for name in ["rip", "rsp", "rbp"] {
            if self.layout.find(name).is_none() {
                return Err(StubError::Protocol(format!(
                    "the target description has no {name} register (not x86-64?)"
                )));
            }
        }
        self.g_matches_layout = g_len == self.layout.g_len;
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
        self.resume()
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
            if matches!(reply.first(), Some(b'T' | b'S')) {
                self.running = false;
                // The stub selects the vCPU that reported the stop (`T05thread:p01.01;`):
                // reading that one needs no `Hg` round trip.
                self.selected = String::from_utf8_lossy(&reply)
                    .split(';')
                    .find_map(|field| field.split_once("thread:").map(|(_, id)| id.to_string()));
                return Ok(());
            }
        }
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
    /// byte and every vCPU's `Hg` and `g` go out in one write. QEMU stops the VM
    /// synchronously on the interrupt (a byte that arrives while the VM runs does nothing
    /// else), sends the stop reply, then answers the queued packets in order with the VM
    /// stopped. Replies are acknowledged with the next `c` (see [`Client::resume`]).
    /// Falls back to [`Client::stop`] and [`Client::registers_of_all`] where the `g`
    /// replies need `p` packets afterwards or the VM is already stopped.
    pub fn stop_with_registers(&mut self, out: &mut [VcpuRegs]) -> Result<(), StubError> {
        if !self.running || !self.g_matches_layout || out.len() != self.vcpus.len() {
            self.stop()?;
            return self.registers_of_all(out);
        }
        let mut batch = std::mem::take(&mut self.batch);
        batch.clear();
        batch.push(0x03);
        encode(b"g", &mut self.framed);
        for select in &self.select_packets {
            batch.extend_from_slice(select);
            batch.extend_from_slice(&self.framed);
        }
        let written = self.stream.write_all(&batch);
        self.batch = batch;
        written?;
        let deadline = Instant::now() + REPLY_TIMEOUT;
        // The stop reply (a stale one may come first: any stop reply means stopped).
        loop {
            let reply = self.unacknowledged_reply(deadline)?;
            if matches!(reply.first(), Some(b'T' | b'S')) {
                break;
            }
        }
        self.running = false;
        self.selected = None;
        for regs in out.iter_mut() {
            let selected = self.unacknowledged_reply(deadline)?;
            if selected != b"OK" {
                return Err(StubError::Refused(
                    "Hg".into(),
                    String::from_utf8_lossy(&selected).into(),
                ));
            }
            let reply = self.unacknowledged_reply(deadline)?;
            *regs = self.parse_registers(&reply)?;
        }
        self.selected = self.vcpus.last().cloned();
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

    /// The registers of vCPU `index` (the VM must be stopped).
    pub fn registers(&mut self, index: usize) -> Result<VcpuRegs, StubError> {
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
        let reply = self.request(b"g")?;
        self.parse_registers(&reply)
    }

    /// The registers of every vCPU (the VM must be stopped), in one write of all the
    /// `Hg`/`g` requests and one read of their replies: QEMU answers queued packets in
    /// order and, in system emulation, does not wait for acknowledgements, so the whole
    /// read costs one round trip instead of two per vCPU.
    pub fn registers_of_all(&mut self, out: &mut [VcpuRegs]) -> Result<(), StubError> {
        if out.len() != self.vcpus.len() {
            return Err(StubError::Protocol(format!(
                "{} vCPUs asked for, the stub has {}",
                out.len(),
                self.vcpus.len()
            )));
        }
        if !self.g_matches_layout {
            // Each reply needs `p` packets afterwards: no pipelining.
            for (index, regs) in out.iter_mut().enumerate() {
                *regs = self.registers(index)?;
            }
            return Ok(());
        }
        let mut batch = std::mem::take(&mut self.batch);
        batch.clear();
        let mut selects = 0;
        for (index, id) in self.vcpus.iter().enumerate() {
            if self.selected.as_deref() != Some(id.as_str()) {
                batch.extend_from_slice(&self.select_packets[index]);
                selects += 1;
            }
            encode(b"g", &mut self.framed);
            batch.extend_from_slice(&self.framed);
        }
        // The last vCPU stays selected.
        if selects > 0 {
            self.selected = self.vcpus.last().cloned();
        }
        let written = self.stream.write_all(&batch);
        self.batch = batch;
        if let Err(error) = written {
            self.selected = None;
            return Err(error.into());
        }
        let deadline = Instant::now() + REPLY_TIMEOUT;
        let mut index = 0;
        let mut selects_left = selects;
        let mut first = true;
        while index < out.len() {
            // Each packet is acknowledged, then answered; replies come in request order.
            // The `Hg` of a vCPU precedes its `g` unless the vCPU was already selected.
            let reply = self.pipelined_reply(deadline)?;
            if reply == b"OK" && selects_left > 0 {
                selects_left -= 1;
                continue;
            }
            if reply.first() == Some(&b'E') {
                self.selected = None;
                return Err(StubError::Refused(
                    if first { "Hg/g".into() } else { "g".into() },
                    String::from_utf8_lossy(&reply).into(),
                ));
            }
            first = false;
            out[index] = self.parse_registers(&reply)?;
            index += 1;
        }
        Ok(())
    }

    /// The next reply of a pipelined batch (after its acknowledgement).
    fn pipelined_reply(&mut self, deadline: Instant) -> Result<Vec<u8>, StubError> {
        loop {
            match self.next_event(deadline)? {
                Event::Ack => {}
                Event::Packet(payload) => {
                    self.stream.write_all(b"+")?;
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

    /// A `g` reply's registers (the control registers with `p` where the reply does not
    /// match the description).
    fn parse_registers(&mut self, reply: &[u8]) -> Result<VcpuRegs, StubError> {
        let bytes = hex_bytes(reply)
            .ok_or_else(|| StubError::Protocol("register reply is not hex".into()))?;
        let value = |name: &str| self.layout.value(&bytes, name).unwrap_or(0);
        let mut regs = VcpuRegs {
            ip: value("rip"),
            sp: value("rsp"),
            fp: value("rbp"),
            cr3: value("cr3"),
            cr4: value("cr4"),
            efer: value("efer"),
        };
        if bytes.len() != self.layout.g_len {
            // The reply does not match the description: the general registers come
            // first and are placed right; the control registers are asked for by number.
            regs.cr3 = self.register("cr3")?;
            regs.cr4 = self.register("cr4")?;
            regs.efer = self.register("efer")?;
        }
        Ok(regs)
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
                Ok(0) => return Err(StubError::Closed),
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
                Err(e) => return Err(e.into()),
            }
        }
    }
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
