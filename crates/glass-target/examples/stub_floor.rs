//! The floor of a guest sample (bench/run): stop the VM and let it go, with no reads,
//! through glass's RSP client. Prints the median and p99 in microseconds.
//! Usage: stub_floor ADDRESS ITERATIONS
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let address = args.next().expect("usage: stub_floor ADDRESS ITERATIONS");
    let iterations: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(500);
    let mut client = glass_target::gdbstub::client::Client::connect(&address).expect("connect");
    let mut times = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let start = Instant::now();
        client.stop().expect("stop");
        client.resume().expect("resume");
        times.push(start.elapsed());
        std::thread::sleep(Duration::from_millis(2));
    }
    client.detach().expect("detach");
    times.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "floor_p50_us {:.1} floor_p99_us {:.1}",
        us(times[times.len() / 2]),
        us(times[times.len() * 99 / 100])
    );
}
