//! The floor of a guest sample (bench/run): stop the VM and let it go through glass's RSP
//! client, with no reads, or with the one read a sample cannot do without: every vCPU's
//! registers. Prints medians and 99th percentiles in microseconds, per part:
//!
//!   stop      interrupt (0x03) to the stop reply
//!   regs      every vCPU's registers: `all` is one pipelined exchange
//!             (`Client::registers_of_all`), `each` one `Hg` + `g` round trip per vCPU
//!             (`Client::registers`, no `Hg` for the vCPU that reported the stop)
//!   continue  `c` and its `+` acknowledgement (there is no reply; QEMU resumes the VM)
//!   floor     the three together: what a sampler keeps the VM stopped for, as it sees it
//!
//! `fused` is a prototype of what a client could still cut: the interrupt and every
//! vCPU's `Hg` + `g` go out in ONE write (QEMU stops the VM synchronously on the 0x03
//! byte, then answers the queued packets in order, stopped), so stop + registers cost one
//! round trip instead of two; the replies are acknowledged only by the `+` sent with `c`
//! (QEMU's system-mode stub does not wait for acknowledgements), and the `c` is not
//! waited on. `stop` is then that whole exchange and `regs` 0. It speaks the protocol on
//! a raw TCP socket (after glass's client has listed the vCPUs).
//!
//! One line: `floor_p50_us X floor_p99_us X stop_p50_us X ... vcpus N mode M`.
//! Usage: stub_floor ADDRESS [ITERATIONS] [none|all|each|fused] [GAP_US]
//! (default 500 iterations, `none`, 2000 us between a continue and the next stop).
use std::time::{Duration, Instant};

use glass_target::gdbstub::client::{Client, VcpuRegs};

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: stub_floor ADDRESS [ITERATIONS] [none|all|each|fused] [GAP_US]";
    let address = args.next().expect(usage);
    let iterations: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(500);
    let mode = args.next().unwrap_or_else(|| "none".into());
    if !["none", "all", "each", "fused"].contains(&mode.as_str()) {
        panic!("{usage}");
    }
    let gap = Duration::from_micros(args.next().and_then(|n| n.parse().ok()).unwrap_or(2000));
    let mut client = Client::connect(&address).expect("connect");
    let vcpus = client.vcpus.len();
    let (mut stop, mut read, mut resume, mut total) = (vec![], vec![], vec![], vec![]);
    if mode == "fused" {
        let ids = client.vcpus.clone();
        client.detach().expect("detach");
        drop(client);
        fused(&address, &ids, iterations, gap, &mut stop, &mut resume);
        read = vec![Duration::ZERO; stop.len()];
        total = stop.iter().zip(&resume).map(|(a, b)| *a + *b).collect();
        print(vcpus, &mode, &mut total, &mut stop, &mut read, &mut resume);
        return;
    }
    let mut regs = vec![VcpuRegs::default(); vcpus];
    for _ in 0..iterations {
        let start = Instant::now();
        client.stop().expect("stop");
        let stopped = Instant::now();
        match mode.as_str() {
            "all" => client.registers_of_all(&mut regs).expect("registers"),
            "each" => {
                for (index, slot) in regs.iter_mut().enumerate() {
                    *slot = client.registers(index).expect("registers");
                }
            }
            _ => {}
        }
        let read_done = Instant::now();
        client.resume().expect("resume");
        let end = Instant::now();
        stop.push(stopped - start);
        read.push(read_done - stopped);
        resume.push(end - read_done);
        total.push(end - start);
        std::thread::sleep(gap);
    }
    client.detach().expect("detach");
    print(vcpus, &mode, &mut total, &mut stop, &mut read, &mut resume);
}

fn print(
    vcpus: usize,
    mode: &str,
    total: &mut [Duration],
    stop: &mut [Duration],
    read: &mut [Duration],
    resume: &mut [Duration],
) {
    let mut line = String::new();
    for (name, times) in [
        ("floor", total),
        ("stop", stop),
        ("regs", read),
        ("continue", resume),
    ] {
        times.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        line += &format!(
            "{name}_p50_us {:.1} {name}_p99_us {:.1} ",
            us(times[times.len() / 2]),
            us(times[times.len() * 99 / 100])
        );
    }
    println!("{line}vcpus {vcpus} mode {mode}");
}

/// The fused exchange on a raw connection: per iteration one write of 0x03 and every
/// vCPU's `Hg`/`g`, a read of the stop reply and the 2N answers, then `c`.
fn fused(
    address: &str,
    vcpus: &[String],
    iterations: usize,
    gap: Duration,
    stop: &mut Vec<Duration>,
    resume: &mut Vec<Duration>,
) {
    use glass_target::gdbstub::packet::encode;
    use std::io::Write;
    let mut raw = Raw::connect(address);
    let frame = |payload: &[u8], out: &mut Vec<u8>| {
        let mut framed = Vec::new();
        encode(payload, &mut framed);
        out.extend_from_slice(&framed);
    };
    let is_stop = |p: &[u8]| matches!(p.first(), Some(b'T' | b'S'));
    // The connection stopped the VM (and may have queued a stop reply): the handshake
    // glass's client does, then let it run.
    let mut out = Vec::new();
    frame(
        b"qSupported:multiprocess+;xmlRegisters=i386;qXfer:features:read+",
        &mut out,
    );
    raw.stream.write_all(&out).expect("write");
    while !raw.next().windows(10).any(|w| w == b"PacketSize") {}
    let mut batch = vec![0x03u8];
    for id in vcpus {
        frame(format!("Hg{id}").as_bytes(), &mut batch);
        frame(b"g", &mut batch);
    }
    let mut cont = vec![b'+'];
    frame(b"c", &mut cont);
    raw.stream.write_all(&cont).expect("write");
    std::thread::sleep(gap);
    for _ in 0..iterations {
        let start = Instant::now();
        raw.stream.write_all(&batch).expect("write");
        while !is_stop(&raw.next()) {}
        for _ in vcpus {
            let mut reply = raw.next();
            while is_stop(&reply) {
                reply = raw.next(); // a second, stale stop reply
            }
            assert_eq!(reply, b"OK", "Hg refused");
            let g = raw.next();
            assert!(
                g.len() >= 256 && g.iter().all(u8::is_ascii_hexdigit),
                "bad g reply"
            );
        }
        let stopped = Instant::now();
        raw.stream.write_all(&cont).expect("write");
        let end = Instant::now();
        stop.push(stopped - start);
        resume.push(end - stopped);
        std::thread::sleep(gap);
    }
    // Detach: stop, then D (the VM runs on).
    raw.stream.write_all(&[0x03]).expect("write");
    while !is_stop(&raw.next()) {}
    let mut detach = vec![b'+'];
    match vcpus.first().and_then(|id| id.strip_prefix('p')) {
        Some(id) => frame(
            format!("D;{}", id.split('.').next().unwrap_or("1")).as_bytes(),
            &mut detach,
        ),
        None => frame(b"D", &mut detach),
    }
    raw.stream.write_all(&detach).expect("write");
    while raw.next() != b"OK" {}
}

/// A bare RSP connection: packets in arrival order, acknowledgements skipped.
struct Raw {
    stream: std::net::TcpStream,
    decoder: glass_target::gdbstub::packet::Decoder,
    pending: std::collections::VecDeque<Vec<u8>>,
    buf: Vec<u8>,
}

impl Raw {
    fn connect(address: &str) -> Raw {
        let stream = std::net::TcpStream::connect(address).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        Raw {
            stream,
            decoder: Default::default(),
            pending: Default::default(),
            buf: vec![0; 65536],
        }
    }

    fn next(&mut self) -> Vec<u8> {
        use glass_target::gdbstub::packet::Event;
        use std::io::Read;
        loop {
            if let Some(packet) = self.pending.pop_front() {
                return packet;
            }
            let n = self.stream.read(&mut self.buf).expect("read");
            assert!(n > 0, "the stub closed the connection");
            for &byte in &self.buf[..n] {
                if let Some(Event::Packet(p)) = self.decoder.push(byte).expect("decode") {
                    self.pending.push_back(p);
                }
            }
        }
    }
}
