//! The breakpoint floor of tracing a guest's calls (bench/trace_guest_bench.py): what
//! timing every call costs when each call traps out of the guest, DRAKVUF's design (an
//! int3 at a function's entry and one at its return address, each caught outside the
//! VM), done as cheaply as glass's own RSP client can do it against QEMU's GDB stub. glass
//! trace --vm patches the guest's code instead and never stops it; this is the design it
//! is measured against.
//!
//! Per call, two stops: the entry breakpoint (`Z0` at the function) stops the VM; the
//! client reads the vCPU's rsp and the return address there, moves the breakpoint to the
//! return address and lets the VM run; the return stops it again, and the breakpoint goes
//! back to the entry. Moving it rather than keeping both saves the single step a
//! breakpoint at the current pc needs before the VM may continue (QEMU would stop at it
//! again at once), and pairs each return with its entry for a function that does not
//! recurse (the demo's tick and alpha). Each stop is two stub round trips at least.
//!
//! One line: `calls N seconds S calls_per_s X per_call_us X stopped_per_call_us X
//! entry_stop_p50_us X return_stop_p50_us X call_p50_us X`, where `stopped` is the time
//! from each stop reply to the `c` that ends it, as the client sees it, and `call` the
//! time from the entry stop to the return stop.
//! Usage: int3_floor ADDRESS FUNCTION_ADDRESS CALLS
use std::time::{Duration, Instant};

use glass_target::gdbstub::client::Client;

fn main() {
    let usage = "usage: int3_floor ADDRESS FUNCTION_ADDRESS CALLS";
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [address, function, calls] = &args[..] else {
        fail(usage)
    };
    let entry = function
        .strip_prefix("0x")
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .unwrap_or_else(|| fail("int3_floor: FUNCTION_ADDRESS must be hex, 0x..."));
    let calls: usize = calls
        .parse()
        .ok()
        .filter(|&n| n > 0)
        .unwrap_or_else(|| fail("int3_floor: CALLS must be a positive number"));
    if let Err(e) = run(address, entry, calls) {
        fail(&format!("int3_floor: {e}"));
    }
}

fn fail(message: &str) -> ! {
    eprintln!("{message}");
    std::process::exit(2)
}

fn run(address: &str, entry: u64, calls: usize) -> Result<(), String> {
    let wait = Duration::from_secs(30);
    let mut client = Client::connect(address).map_err(|e| e.to_string())?;
    let e = |e: glass_target::gdbstub::client::StubError| e.to_string();
    client.stop().map_err(e)?;
    client.breakpoint(entry, true).map_err(e)?;
    client.resume().map_err(e)?;
    let (mut entry_stops, mut return_stops, mut durations) = (vec![], vec![], vec![]);
    let mut stopped = Duration::ZERO;
    let mut started = None;
    for _ in 0..calls {
        if !client.wait_for_stop(wait).map_err(e)? {
            return Err(format!("no call of {entry:#x} within {wait:?}"));
        }
        let at_entry = Instant::now();
        started.get_or_insert(at_entry);
        // The return address is the word at rsp on entry.
        let rsp = client.register("rsp").map_err(e)?;
        let word = client.read_memory(rsp, 8).map_err(e)?;
        let back = u64::from_le_bytes(
            word.try_into()
                .map_err(|_| format!("cannot read the return address at {rsp:#x}"))?,
        );
        client.breakpoint(entry, false).map_err(e)?;
        client.breakpoint(back, true).map_err(e)?;
        client.resume().map_err(e)?;
        entry_stops.push(at_entry.elapsed());

        if !client.wait_for_stop(wait).map_err(e)? {
            return Err(format!(
                "the call of {entry:#x} did not return within {wait:?}"
            ));
        }
        let at_return = Instant::now();
        client.breakpoint(back, false).map_err(e)?;
        client.breakpoint(entry, true).map_err(e)?;
        client.resume().map_err(e)?;
        return_stops.push(at_return.elapsed());
        durations.push(at_return - at_entry);
        stopped += entry_stops[entry_stops.len() - 1] + return_stops[return_stops.len() - 1];
    }
    let seconds = started.map_or(0.0, |s| s.elapsed().as_secs_f64());
    client.stop().map_err(e)?;
    client.breakpoint(entry, false).map_err(e)?;
    client.detach().map_err(e)?;
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        us(v[v.len() / 2])
    };
    println!(
        "calls {calls} seconds {seconds:.6} calls_per_s {:.1} per_call_us {:.2} stopped_per_call_us {:.2} \
         entry_stop_p50_us {:.1} return_stop_p50_us {:.1} call_p50_us {:.1}",
        calls as f64 / seconds,
        seconds * 1e6 / calls as f64,
        us(stopped) / calls as f64,
        median(&mut entry_stops),
        median(&mut return_stops),
        median(&mut durations),
    );
    Ok(())
}
