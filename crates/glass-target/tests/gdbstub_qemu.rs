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
