//! The RSP client against a real QEMU (TCG) gdbstub: handshake, target description,
//! vCPU enumeration, stop/registers/memory/continue, detach; and a stub that never
//! answers. QEMU boots its firmware here (no guest kernel needed for the protocol).

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use glass_target::gdbstub::client::{Client, StubError};

fn socket_path(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gdbstub");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

struct Qemu(Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_qemu(socket: &std::path::Path, vcpus: u32) -> Qemu {
    let child = Command::new("qemu-system-x86_64")
        .args([
            "-accel",
            "tcg",
            "-S",
            "-display",
            "none",
            "-nodefaults",
            "-m",
            "64",
            "-smp",
        ])
        .arg(vcpus.to_string())
        .arg("-gdb")
        .arg(format!("unix:{},server=on,wait=off", socket.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("qemu-system-x86_64 is installed (./x test installs qemu-system-x86)");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "QEMU did not open its stub");
        std::thread::sleep(Duration::from_millis(20));
    }
    Qemu(child)
}

#[test]
fn talks_to_qemu() {
    let socket = socket_path("talk");
    let _qemu = start_qemu(&socket, 2);
    let mut client = Client::connect(socket.to_str().unwrap()).expect("connects");
    assert_eq!(client.vcpus.len(), 2, "{:?}", client.vcpus);
    for register in ["rip", "rsp", "rbp", "cr3", "cr4", "efer"] {
        assert!(
            client.layout.find(register).is_some(),
            "{register} missing from the target description"
        );
    }
    // Let the firmware run until it waits in its "no bootable device" loop, below 1 MiB
    // (SeaBIOS's set-up runs relocated near the top of RAM first: on a loaded host that
    // outlasted a fixed 200 ms wait), then sample it a few times.
    // (Three stops in a row there: its real-mode start is below 1 MiB too, briefly.)
    let settled = Instant::now() + Duration::from_secs(30);
    let mut below = 0;
    while below < 3 {
        client.stop().unwrap();
        let ip = client.registers(0).unwrap().ip();
        client.resume().unwrap();
        below = if ip < 0x10_0000 { below + 1 } else { 0 };
        assert!(
            Instant::now() < settled,
            "the firmware still ran at {ip:#x}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut instruction_pointers = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        client.stop().unwrap();
        let regs = client.registers(0).unwrap();
        let _second = client.registers(1).unwrap();
        let bytes = client.read_memory(0xf_fff0, 16).unwrap();
        client.resume().unwrap();
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert_eq!(bytes.len(), 16, "the reset vector is readable");
        instruction_pointers.push(regs.ip());
        std::thread::sleep(Duration::from_millis(50));
    }
    // No guest: the firmware ends in its "no bootable device" loop, below 1 MiB.
    assert!(
        instruction_pointers.iter().all(|&ip| ip < 0x10_0000),
        "{instruction_pointers:x?}"
    );
    client.detach().unwrap();
    drop(client);
    // After detach the VM runs and a new connection works.
    let mut again = Client::connect(socket.to_str().unwrap()).expect("reconnects");
    again.stop().unwrap();
    again.registers(0).unwrap();
    again.detach().unwrap();
}

#[test]
fn a_stub_that_never_answers_times_out() {
    let socket = socket_path("silent");
    let listener = UnixListener::bind(&socket).unwrap();
    let server = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_secs(7));
        drop(stream);
    });
    let t0 = Instant::now();
    let error = Client::connect(socket.to_str().unwrap())
        .err()
        .expect("fails");
    assert!(matches!(error, StubError::Timeout(_)), "{error}");
    assert!(t0.elapsed() < Duration::from_secs(7), "{:?}", t0.elapsed());
    server.join().unwrap();
}

#[test]
fn a_stub_that_answers_garbage_or_hangs_up_is_an_error() {
    use std::io::{Read, Write};
    let socket = socket_path("garbage");
    let listener = UnixListener::bind(&socket).unwrap();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut buf = [0u8; 256];
        let _ = stream.read(&mut buf);
        // An ack, then half a packet, then hang up.
        let _ = stream.write_all(b"+$qSupported:garb");
    });
    let error = Client::connect(socket.to_str().unwrap())
        .err()
        .expect("fails");
    assert!(
        matches!(error, StubError::Closed | StubError::Protocol(_)),
        "{error}"
    );
    server.join().unwrap();
}

/// The demo unikernel's serial console: its work rate, `rate rounds=200 cycles=N`
/// lines, the mean of the last `lines` whole ones after `at_least` lines in all.
fn mean_rate(console: &std::path::Path, at_least: usize, lines: usize) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(console).unwrap_or_default();
        let whole = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
        let rates: Vec<f64> = whole
            .lines()
            .filter_map(|l| l.strip_prefix("rate rounds=200 cycles=")?.parse().ok())
            .collect();
        if rates.len() >= at_least.max(lines) {
            let last = &rates[rates.len() - lines..];
            return last.iter().sum::<f64>() / lines as f64;
        }
        assert!(
            Instant::now() < deadline,
            "the guest printed {} rate lines: {text}",
            rates.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The count of rate lines the guest printed so far.
fn rate_lines(console: &std::path::Path) -> usize {
    std::fs::read_to_string(console)
        .unwrap_or_default()
        .matches("cycles=")
        .count()
}

/// Code written through the stub reaches execution: QEMU's TCG drops the translated
/// blocks holding the written bytes. The guest tracer writes its entry jumps this way.
/// A write into guest RAM behind QEMU's back (the shared RAM file) is not noticed by TCG:
/// the old code keeps running from its translated blocks, so glass may write only code
/// that never ran that way (a fresh trampoline region). What this QEMU does there is
/// printed, not asserted: the tracer's design does not depend on it.
#[test]
fn code_written_through_the_stub_runs() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stub_code_write");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let built = Command::new(repo.join("guests/demo/build.sh"))
        .arg(&dir)
        .arg("0")
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(built.success(), "guests/demo/build.sh");
    let nm = Command::new("nm")
        .arg(dir.join("guest-fp.elf"))
        .output()
        .unwrap();
    let alpha = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .find_map(|l| {
            let (address, name) = l.split_once(" T ")?;
            (name == "alpha").then(|| u64::from_str_radix(address, 16).unwrap())
        })
        .expect("the demo guest has alpha");
    let ram = dir.join("ram");
    let console = dir.join("console");
    let socket = socket_path("code");
    let _qemu = Qemu(
        Command::new("qemu-system-x86_64")
            .args([
                "-accel",
                "tcg,thread=single",
                "-m",
                "64",
                "-display",
                "none",
            ])
            .args(["-nodefaults", "-object"])
            .arg(format!(
                "memory-backend-file,id=mem,size=64M,mem-path={},share=on",
                ram.display()
            ))
            .args(["-machine", "memory-backend=mem", "-serial"])
            .arg(format!("file:{}", console.display()))
            .arg("-gdb")
            .arg(format!("unix:{},server=on,wait=off", socket.display()))
            .arg("-kernel")
            .arg(dir.join("guest-fp.img"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("qemu-system-x86_64 is installed (./x test installs qemu-system-x86)"),
    );
    // alpha is 60% of the guest's work: `xor eax, eax; ret` in its place takes it out.
    // Under -icount the guest's TSC counts its instructions: the rate is the work done,
    // whatever else the host runs.
    let returns_at_once = [0x31, 0xc0, 0xc3];
    let before = mean_rate(&console, 20, 10);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "QEMU did not open its stub");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut client = Client::connect(socket.to_str().unwrap()).expect("connects");

    // Behind QEMU's back, with the VM stopped as the tracer would have it.
    client.stop().unwrap();
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().write(true).open(&ram).unwrap();
        file.write_all_at(&returns_at_once, alpha).unwrap();
    }
    client.resume().unwrap();
    let seen = rate_lines(&console);
    let behind = mean_rate(&console, seen + 15, 10);
    eprintln!(
        "a write into guest RAM behind QEMU's back: {:.0}% of the work rate before (100%: the old code still runs)",
        100.0 * behind / before
    );

    client.stop().unwrap();
    client.write_memory(alpha, &returns_at_once).unwrap();
    assert_eq!(client.read_memory(alpha, 3).unwrap(), returns_at_once);
    client.resume().unwrap();
    let seen = rate_lines(&console);
    let after = mean_rate(&console, seen + 15, 10);
    eprintln!(
        "the same bytes through the stub: {:.0}% of the rate before",
        100.0 * after / before
    );
    // 40% of the instructions per round are left (alpha's 60% gone).
    assert!(
        after < before * 0.7,
        "alpha still runs after the stub's write: {after:.0} cycles per 200 rounds, {before:.0} before"
    );
    client.detach().unwrap();
}
