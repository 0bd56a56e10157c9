//! The glass side of the unwinding benchmark (bench/run): unwinds the stack that
//! bench/unwind_peer.c saved (registers, executable mappings, 32 KiB of stack) many
//! times with glass's DWARF unwinder, and prints the time per backtrace.
//! Usage: unwind_bench SNAPSHOT ITERATIONS

use std::path::Path;
use std::time::Instant;

use glass_unwind::{DwarfUnwinder, UnwindRegs};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: unwind_bench SNAPSHOT ITERATIONS");
        std::process::exit(2);
    }
    let bytes = std::fs::read(&args[1]).unwrap_or_else(|e| {
        eprintln!("unwind_bench: {}: {e}", args[1]);
        std::process::exit(1)
    });
    let iterations: usize = args[2].parse().unwrap_or(10000);
    let marker = b"stack\n";
    let split = bytes
        .windows(marker.len())
        .position(|w| w == marker)
        .expect("a stack section");
    let header = std::str::from_utf8(&bytes[..split]).expect("text header");
    let stack = &bytes[split + marker.len()..];
    let mut lines = header.lines();
    let regs: Vec<u64> = lines
        .next()
        .unwrap()
        .split_whitespace()
        .take(3)
        .map(|v| u64::from_str_radix(v, 16).unwrap())
        .collect();
    let regs = UnwindRegs::new(regs[0], regs[1], regs[2]);
    let mut unwinder = DwarfUnwinder::new();
    for line in lines {
        let fields: Vec<&str> = line.splitn(5, ' ').collect();
        if fields.len() == 5 && fields[0] == "map" {
            let hex = |v: &str| u64::from_str_radix(v, 16).unwrap();
            let _ = unwinder.add_module(
                Path::new(fields[4]),
                hex(fields[1]),
                hex(fields[2]),
                hex(fields[3]),
            );
        }
    }
    let sp = regs.sp;
    let mut read = |address: u64| -> Option<u64> {
        let offset = usize::try_from(address.checked_sub(sp)?).ok()?;
        Some(u64::from_le_bytes(
            stack.get(offset..offset + 8)?.try_into().ok()?,
        ))
    };
    let mut frames = Vec::with_capacity(512);
    // The first walk fills framehop's rule cache, as repeated sampling does.
    unwinder.walk(regs, &mut read, 512, &mut frames);
    let depth = frames.len();
    let start = Instant::now();
    for _ in 0..iterations {
        frames.clear();
        unwinder.walk(regs, &mut read, 512, &mut frames);
    }
    let per_backtrace = start.elapsed().as_nanos() as f64 / iterations as f64;
    println!("glass_backtrace_ns {per_backtrace:.1} frames {depth}");
}
