//! The floor of a guest sample (bench/run): stop the VM and let it go through glass's RSP
//! client, with no reads, or with the one read a sample cannot do without: every vCPU's
//! registers. Prints medians and 99th percentiles in microseconds, per part:
//!
//!   stop      interrupt (0x03) to the stop reply
//!   regs      every vCPU's registers: `all` is one pipelined exchange
//!             (`Client::registers_of_all`), `each` one `Hg` + `g` round trip per vCPU
//!             (`Client::registers`, no `Hg` for the vCPU that reported the stop)
//!   continue  writing `c` (not waited on: there is no reply; QEMU resumes the VM)
//!   floor     the three together: what a sampler keeps the VM stopped for, as it sees it
//!
//! `fused` is what glass does: `Client::stop_with_registers`, the interrupt and every
//! vCPU's `Hg` + `g` in ONE write (QEMU stops the VM synchronously on the 0x03 byte,
//! then answers the queued packets in order, stopped), so stop + registers cost one
//! round trip; `stop` is then that whole exchange and `regs` 0. In every mode the `c` is
//! not waited on (`Client::resume`).
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
    let mut regs = vec![VcpuRegs::default(); vcpus];
    for _ in 0..iterations {
        let start = Instant::now();
        if mode == "fused" {
            client
                .stop_with_registers(&mut regs)
                .expect("stop and registers");
        } else {
            client.stop().expect("stop");
        }
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
