//! `glass trace --vm`: every call of the demo unikernel's functions timed from outside
//! the guest (guests/demo, built to run a known number of rounds and power off): exact
//! counts with nothing lost, each vCPU's stack its own thread, the guest's work split as
//! it is built, its output whole; and bad input refused in one line.

mod common;
use common::*;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The demo guest built to run `rounds` rounds of dispatch (alpha, beta, gamma_) on
/// vCPU 0 and then power off; vCPU 1 calls checksum_blocks for as long as it runs.
fn demo(dir: &Path, rounds: u32) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guests/demo/build.sh");
    let status = Command::new(script)
        .arg(dir)
        .arg(rounds.to_string())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "guests/demo/build.sh");
    dir.to_path_buf()
}

fn qemu(dir: &Path, serial: &Path) -> Vec<String> {
    [
        "qemu-system-x86_64",
        "-accel",
        "tcg,thread=single",
        "-smp",
        "2",
        "-m",
        "64",
        "-display",
        "none",
        "-nodefaults",
        "-device",
        "isa-debug-exit,iobase=0xf4,iosize=0x04",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        "-serial".to_string(),
        format!("file:{}", serial.display()),
        "-kernel".to_string(),
        dir.join("guest-fp.img").display().to_string(),
    ])
    .collect()
}

/// `glass trace --vm -o RECORDING -f FUNCTIONS --symbols SYMBOLS -- COMMAND`.
fn trace_vm(
    recording: &Path,
    functions: &str,
    symbols: &Path,
    command: Vec<String>,
) -> std::process::Output {
    trace_vm_far(recording, functions, symbols, command, false)
}

/// [`trace_vm`], with AArch64 far patches (adrp, add, br x16) forced by glass's test hook
/// where `far`.
fn trace_vm_far(
    recording: &Path,
    functions: &str,
    symbols: &Path,
    command: Vec<String>,
    far: bool,
) -> std::process::Output {
    let mut args: Vec<String> = [
        "trace",
        "--vm",
        "-o",
        recording.to_str().unwrap(),
        "-f",
        functions,
        "--symbols",
        symbols.to_str().unwrap(),
        "--",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(command);
    let mut glass = Command::new(GLASS);
    glass.args(&args);
    if far {
        glass.env("GLASS_TEST_AARCH64_REACH", "no-near-slot");
    }
    glass.output().expect("glass runs")
}

#[test]
fn every_call_of_a_unikernel_is_timed_from_outside() {
    let _alone = exclusive();
    let dir = scratch("trace_guest");
    let rounds = 3000;
    let guest = demo(&dir, rounds);
    let serial = dir.join("serial");
    let recording = dir.join("guest.glass");
    // Multi-threaded TCG: the two vCPUs run at once on two host threads, and both call
    // checkpoint (spin_units' first step), so their probes reserve ring slots at the
    // same time.
    let mut command = qemu(&guest, &serial);
    let accel = command
        .iter()
        .position(|a| a == "tcg,thread=single")
        .unwrap();
    command[accel] = "tcg,thread=multi".into();
    let output = trace_vm(
        &recording,
        "run_workload,dispatch,alpha,beta,gamma_,checksum_blocks,checkpoint",
        &guest.join("guest-fp.elf"),
        command,
    );
    let err = stderr(&output);
    // The guest powers off through isa-debug-exit: QEMU's status 1 is glass's.
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(err.contains("instrumented 7 functions, skipped 0"), "{err}");
    assert!(err.contains(" 0 lost"), "{err}");

    // The guest ran to its end, its output whole.
    let console = std::fs::read_to_string(&serial).unwrap();
    assert!(
        console.starts_with("glass demo guest: alpha 60% beta 30% gamma 10%\n")
            && console.ends_with("done\n"),
        "{console}"
    );
    assert_eq!(
        console.matches("rate rounds=200").count() as u32,
        rounds / 200,
        "{console}"
    );

    let calls = calls_and_self(&recording);
    let count = |name: &str| calls.get(name).map_or(0, |c| c.0);
    assert_eq!(count("run_workload"), 1, "{calls:?}");
    for name in ["dispatch", "alpha", "beta", "gamma_"] {
        assert_eq!(count(name), u64::from(rounds), "{name}: {calls:?}");
    }
    // vCPU 1 called checksum_blocks all the while, on its own stack: a second thread.
    assert!(count("checksum_blocks") > 100, "{calls:?}");
    // Both vCPUs' calls of checkpoint, none lost: one a call of alpha, beta, gamma_ and
    // checksum_blocks (less one if the VM powered off between a checksum_blocks' entry
    // and its checkpoint).
    let expected = 3 * u64::from(rounds) + count("checksum_blocks");
    assert!(
        count("checkpoint") == expected || count("checkpoint") + 1 == expected,
        "checkpoint: {} calls, {expected} expected: {calls:?}",
        count("checkpoint")
    );
    let info = stdout(&glass(&["info", recording.to_str().unwrap()]));
    assert!(info.contains("from 2 threads"), "{info}");
    let tree = stdout(&glass(&[
        "report",
        recording.to_str().unwrap(),
        "--format",
        "tree",
    ]));
    let depth = |name: &str| {
        let line = tree
            .lines()
            .find(|l| l.trim_end().ends_with(name))
            .unwrap_or_else(|| panic!("{name} not in the tree:\n{tree}"));
        // The column the name starts at: its depth in the tree.
        line.rfind(name).unwrap()
    };
    // alpha under dispatch under run_workload; checksum_blocks a root of its own.
    assert!(
        depth("alpha") > depth("dispatch") && depth("dispatch") > depth("run_workload"),
        "{tree}"
    );
    assert_eq!(depth("checksum_blocks"), depth("run_workload"), "{tree}");

    // Each call of alpha does 6 units of work, beta 3, gamma 1: their median times say
    // so. (Not their totals: under TCG a vCPU's time includes the other vCPU's turns
    // and QEMU's own pauses, which land on the long calls more than their share.)
    let median = |name: &str| calls[name].1;
    for (name, units) in [("alpha", 6.0), ("beta", 3.0)] {
        let ratio = median(name) / median("gamma_");
        assert!(
            (ratio - units).abs() < units * 0.15,
            "{name}: a call takes {ratio:.2} times gamma_'s, built as {units}"
        );
    }
}

#[test]
fn bad_input_is_one_line() {
    let dir = scratch("trace_guest_bad");
    let guest = demo(&dir, 1);
    let serial = dir.join("serial");
    let recording = dir.join("bad.glass");
    let symbols = guest.join("guest-fp.elf");
    let run =
        |functions: &str, command: Vec<String>| trace_vm(&recording, functions, &symbols, command);
    assert_clean_failure(
        &run("no_such_function", qemu(&guest, &serial)),
        2,
        "no function of",
    );
    let mut not_qemu = qemu(&guest, &serial);
    not_qemu[0] = "qemu-system-riscv64".into();
    assert_clean_failure(
        &run("alpha", not_qemu),
        2,
        "traces the guests of qemu-system-x86_64 and qemu-system-aarch64",
    );
    // AArch64: the virt machine under TCG only, with glass's own device tree.
    let mut not_virt = qemu(&guest, &serial);
    not_virt[0] = "qemu-system-aarch64".into();
    assert_clean_failure(&run("alpha", not_virt.clone()), 2, "give -M virt");
    not_virt.extend(["-M", "virt", "-enable-kvm"].map(String::from));
    assert_clean_failure(&run("alpha", not_virt.clone()), 2, "under TCG only");
    let kvm = not_virt.iter().position(|a| a == "-enable-kvm").unwrap();
    not_virt[kvm] = "-dtb".into();
    not_virt.push("own.dtb".into());
    assert_clean_failure(&run("alpha", not_virt), 2, "its own -dtb");
    let mut with_stub = qemu(&guest, &serial);
    with_stub.extend(["-gdb".to_string(), "tcp::1234".to_string()]);
    assert_clean_failure(&run("alpha", with_stub), 2, "adds its own -gdb");
    let mut big = qemu(&guest, &serial);
    let m = big.iter().position(|a| a == "-m").unwrap();
    big[m + 1] = "8G".into();
    assert_clean_failure(&run("alpha", big), 2, "RAM above 4 GiB");
    // Nothing patchable (boot.S's long_mode: a function symbol without a size): refused
    // before QEMU starts.
    let output = run("long_mode", qemu(&guest, &serial));
    assert_clean_failure(&output, 2, "none of the matching functions can be patched");
    assert!(
        stderr(&output).contains("size unknown"),
        "{}",
        stderr(&output)
    );
}

/// `qemu-system-aarch64 -M virt` (TCG, two vCPUs) booting the AArch64 demo `elf`, its
/// serial port in `serial`.
fn qemu_aarch64(elf: &Path, serial: &Path) -> Vec<String> {
    [
        "qemu-system-aarch64",
        "-M",
        "virt",
        "-cpu",
        "cortex-a57",
        "-smp",
        "2",
        "-m",
        "128",
        "-accel",
        "tcg",
        "-display",
        "none",
        "-nodefaults",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        "-serial".to_string(),
        format!("file:{}", serial.display()),
        "-kernel".to_string(),
        elf.display().to_string(),
    ])
    .collect()
}

/// The AArch64 demo unikernel (guests/aarch64, both builds: with frame records and
/// without) traced from outside for a known number of rounds on vCPU 0: every call
/// counted as the guest makes them, nothing lost, the records timed by the guest's
/// generic timer, and an assembly function without DWARF arguments left alone with the
/// reason. (vCPU 1's delta is not traced: it may be called first, while vCPU 0 is in the
/// middle of a round whose calls would then go untimed.)
#[test]
fn every_call_of_an_aarch64_unikernel_is_timed_from_outside() {
    let _alone = exclusive();
    let dir = scratch("trace_guest_aarch64");
    let rounds = 30u64;
    let guest = build_guest_image("aarch64", &dir, &[&rounds.to_string()]);
    // Each build with B patches; the one with frame records again with far patches (adrp,
    // add, br x16: what a kernel whose code spans more than B's reach takes).
    for (image, far) in [
        ("uk-fp.elf", false),
        ("uk-nofp.elf", false),
        ("uk-fp.elf", true),
    ] {
        let serial = dir.join(format!("{image}.{far}.serial"));
        let recording = dir.join(format!("{image}.{far}.glass"));
        let elf = guest.join(image);
        let output = trace_vm_far(
            &recording,
            "run,dispatch,alpha,beta,gamma,descend,spin_block,idle_wait,mix_block",
            &elf,
            qemu_aarch64(&elf, &serial),
            far,
        );
        let err = stderr(&output);
        // PSCI SYSTEM_OFF: QEMU exits 0.
        assert_eq!(output.status.code(), Some(0), "{image}: {err}");
        assert!(err.contains("instrumented 8 functions, skipped 1"), "{err}");
        assert_eq!(
            err.contains("patched with adrp, add and br x16"),
            far,
            "{err}"
        );
        assert!(err.contains(" 0 lost"), "{err}");
        let console = std::fs::read_to_string(&serial).unwrap();
        assert!(
            console.starts_with("glass aarch64 guest:")
                && console.ends_with(&format!("done rounds={rounds}\n")),
            "{image}: {console}"
        );
        let calls = calls_and_self(&recording);
        let count = |name: &str| calls.get(name).map_or(0, |c| c.0);
        // run is under way when the guest powers off (it calls power_off after it).
        assert_eq!(count("run"), 1, "{image}: {calls:?}");
        for name in [
            "dispatch",
            "alpha",
            "beta",
            "gamma",
            "spin_block",
            "idle_wait",
        ] {
            assert_eq!(count(name), rounds, "{image}: {name}: {calls:?}");
        }
        assert_eq!(count("descend"), 80 * rounds, "{image}: {calls:?}");
        let info = stdout(&glass(&["info", recording.to_str().unwrap()]));
        assert!(
            info.contains("mix_block") && info.contains("may take arguments on the stack"),
            "{info}"
        );
        // Timed by CNTVCT_EL0 at its own frequency (62.5 MHz in QEMU 7.2's virt).
        assert!(info.contains("cycle counter 0.062 GHz"), "{info}");
        // alpha does 6 units of work, gamma 1 (mix_block): their total times say so,
        // within TCG's noise. (Totals: a busy host stretches some calls of each, which
        // skews medians and minimums, 10-11 under load, but not the sums much.)
        let total = |name: &str| {
            calls_table(&recording)
                .into_iter()
                .find(|row| row.name == name)
                .map_or(0.0, |row| row.total_ns)
        };
        let ratio = total("alpha") / total("gamma");
        assert!(
            (4.0..8.0).contains(&ratio),
            "{image} (far {far}): alpha/gamma {ratio:.2}"
        );
    }
}

/// A QMP monitor the test holds, past its greeting and capabilities negotiation.
struct Monitor(std::io::BufReader<std::os::unix::net::UnixStream>);

impl Monitor {
    fn connect(socket: &Path) -> Monitor {
        let stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
        let mut monitor = Monitor(std::io::BufReader::new(stream));
        monitor.execute(r#"{"execute":"qmp_capabilities"}"#);
        monitor
    }

    /// The reply line of one command.
    fn execute(&mut self, request: &str) -> String {
        use std::io::{BufRead, Write};
        let line = format!("{request}\n");
        self.0.get_mut().write_all(line.as_bytes()).unwrap();
        loop {
            let mut reply = String::new();
            self.0.read_line(&mut reply).unwrap();
            assert!(!reply.contains(r#""error""#), "{request}: {reply}");
            if reply.contains(r#""return""#) {
                return reply;
            }
        }
    }

    /// HMP's answer to `command`.
    fn hmp(&mut self, command: &str) -> String {
        let reply = self.execute(&format!(
            r#"{{"execute":"human-monitor-command","arguments":{{"command-line":"{command}"}}}}"#
        ));
        let at = reply.find(r#""return": ""#).expect("a text answer") + 11;
        reply[at..]
            .trim_end()
            .trim_end_matches(['}', '"'])
            .replace("\\r\\n", "\n")
    }
}

/// A QEMU the test started, ended with the test whatever happens.
struct Qemu(std::process::Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A demo guest that runs forever (2 vCPUs) under a QEMU with a QMP socket and a free
/// memory slot, once it has printed its work rate twice.
fn running_vm(dir: &Path) -> (Qemu, PathBuf, PathBuf, PathBuf) {
    running_vm_with(dir, &[])
}

/// The same, with `extra` arguments for QEMU.
fn running_vm_with(dir: &Path, extra: &[&str]) -> (Qemu, PathBuf, PathBuf, PathBuf) {
    let guest = demo(dir, 0);
    let serial = dir.join("serial");
    let socket = dir.join("qmp.sock");
    let qemu = Qemu(
        Command::new("qemu-system-x86_64")
            .args(["-accel", "tcg,thread=single", "-smp", "2"])
            .args([
                "-m",
                "64,slots=1,maxmem=1G",
                "-display",
                "none",
                "-nodefaults",
            ])
            .arg("-serial")
            .arg(format!("file:{}", serial.display()))
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", socket.display()))
            .arg("-kernel")
            .arg(guest.join("guest-fp.img"))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let started = std::time::Instant::now();
    while rates(&serial) < 2 {
        assert!(started.elapsed().as_secs() < 60, "the guest did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    (qemu, guest.join("guest-fp.elf"), serial, socket)
}

/// How many work-rate lines the running guest has printed.
fn rates(serial: &Path) -> usize {
    std::fs::read_to_string(serial)
        .unwrap_or_default()
        .matches("rate")
        .count()
}

/// `glass trace --qmp SOCKET --symbols ELF -f FUNCTIONS -d SECONDS -o RECORDING`.
fn trace_qmp(
    socket: &Path,
    symbols: &Path,
    functions: &str,
    seconds: &str,
    recording: &Path,
) -> Command {
    let mut command = Command::new(GLASS);
    command.args([
        "trace",
        "--qmp",
        socket.to_str().unwrap(),
        "--symbols",
        symbols.to_str().unwrap(),
        "-f",
        functions,
        "-d",
        seconds,
        "-o",
        recording.to_str().unwrap(),
    ]);
    command
}

/// The guest's .text as its image has it: its address and bytes.
fn text_of(elf: &Path, dir: &Path) -> (u64, Vec<u8>) {
    let sections = Command::new("readelf")
        .args(["-SW"])
        .arg(elf)
        .output()
        .unwrap();
    let address = String::from_utf8_lossy(&sections.stdout)
        .lines()
        .find_map(|l| {
            let l = l.split_once(']')?.1;
            let mut words = l.split_whitespace();
            (words.next()? == ".text").then(|| {
                words.next();
                u64::from_str_radix(words.next().unwrap(), 16).unwrap()
            })
        })
        .expect(".text in readelf -S");
    let out = dir.join("text.bin");
    let header = Command::new("readelf").arg("-h").arg(elf).output().unwrap();
    let objcopy = if String::from_utf8_lossy(&header.stdout).contains("AArch64") {
        "aarch64-linux-gnu-objcopy"
    } else {
        "objcopy"
    };
    let status = Command::new(objcopy)
        .args(["-O", "binary", "--only-section=.text"])
        .arg(elf)
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    (address, std::fs::read(&out).unwrap())
}

/// Whether the VM runs, with no GDB stub left (or its own, `-gdb`, with no one
/// connected), and its .text reads as the image has it (QMP memsave, through vCPU 0's
/// page tables): None when so, else what differs.
fn left_as_found(socket: &Path, text: &(u64, Vec<u8>), dir: &Path) -> Option<String> {
    left_as_found_with(socket, text, dir, false)
}

/// [`left_as_found`]; `own_stub`: the VM was started with a stub of its own (`-gdb`).
fn left_as_found_with(
    socket: &Path,
    text: &(u64, Vec<u8>),
    dir: &Path,
    own_stub: bool,
) -> Option<String> {
    let mut monitor = Monitor::connect(socket);
    let status = monitor.hmp("info status");
    if !status.contains("running") {
        return Some(status);
    }
    let chardevs = monitor.hmp("info chardev");
    // The stub's character device is `gdb` (`#chrN: filename=gdb` is not one).
    if chardevs.lines().any(|l| {
        l.trim().starts_with("gdb:") && !(own_stub && l.contains("filename=disconnected:"))
    }) {
        return Some(chardevs);
    }
    let saved = dir.join("text-now.bin");
    let _ = std::fs::remove_file(&saved);
    // QMP's `val` is an int64: an upper-half address goes as a negative one.
    monitor.execute(&format!(
        r#"{{"execute":"memsave","arguments":{{"val":{},"size":{},"filename":"{}"}}}}"#,
        text.0 as i64,
        text.1.len(),
        saved.display()
    ));
    let now = std::fs::read(&saved).unwrap();
    let differ = now.iter().zip(&text.1).filter(|(a, b)| a != b).count();
    (now != text.1).then(|| format!("{differ} bytes of .text differ from the image"))
}

/// A trace of the running demo VM that attached (`reused`: in an earlier trace's
/// region), detached with the code as before and lost nothing: the calls of each
/// function, dispatch's callees within one of dispatch (calls under way at attach or
/// detach are the only ones that may differ).
fn check_attached_trace(
    output: &std::process::Output,
    recording: &Path,
    reused: bool,
) -> impl Fn(&str) -> u64 {
    let err = stderr(output);
    assert!(output.status.success(), "{err}");
    assert!(err.contains("the code reads as before"), "{err}");
    assert!(err.contains(" 0 lost"), "{err}");
    assert_eq!(
        err.contains("in glass's region of an earlier trace"),
        reused,
        "{err}"
    );
    let calls = calls_and_self(recording);
    let count = move |name: &str| calls.get(name).map_or(0, |c| c.0);
    assert!(count("dispatch") > 50, "dispatch: {}", count("dispatch"));
    for name in ["alpha", "beta", "gamma_"] {
        assert!(
            count(name).abs_diff(count("dispatch")) <= 1,
            "{name}: {} calls, dispatch {}",
            count(name),
            count("dispatch")
        );
    }
    count
}

/// Whether the guest goes on printing its rate.
fn assert_guest_works(serial: &Path) {
    let before = rates(serial);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(rates(serial) > before, "the guest stopped after glass");
}

/// The AArch64 demo running (forever) under `qemu-system-aarch64 -M virt` with a GDB stub
/// of its own and a QMP socket, traced through the stub (`--gdb`, in RAM the guest does
/// not use) twice, the second time in the first one's region: each call counted once,
/// the code put back (its .text read through QMP as the image has it) and the guest
/// running on; then glass killed while it traces, and its guardian putting the code
/// back.
#[test]
fn a_running_aarch64_vm_behind_a_gdb_stub_is_traced_and_left_as_it_was() {
    let _alone = exclusive();
    let dir = scratch("trace_guest_aarch64_gdb");
    let guest = build_guest_image("aarch64", &dir, &[]);
    let elf = guest.join("uk-fp.elf");
    let serial = dir.join("serial");
    let stub = dir.join("gdb.sock");
    let socket = dir.join("qmp.sock");
    let command = qemu_aarch64(&elf, &serial);
    let _qemu = Qemu(
        Command::new(&command[0])
            .args(&command[1..])
            .arg("-gdb")
            .arg(format!("unix:{},server=on,wait=off", stub.display()))
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", socket.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let started = std::time::Instant::now();
    while rates(&serial) < 1 {
        assert!(started.elapsed().as_secs() < 60, "the guest did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let text = text_of(&elf, &dir);
    let recording = dir.join("gdb.glass");
    let trace_gdb = |seconds: &str| {
        let mut command = Command::new(GLASS);
        // The guest's RAM is 128 MiB from 0x4000_0000; its image and stacks take the
        // first few.
        command.args([
            "trace",
            "--gdb",
            stub.to_str().unwrap(),
            "--guest-scratch",
            "0x46000000,2M",
            "--symbols",
            elf.to_str().unwrap(),
            "-f",
            "dispatch,alpha,beta,gamma,descend,delta",
            "-d",
            seconds,
            "-o",
            recording.to_str().unwrap(),
        ]);
        command
    };
    for round in 0..2 {
        let output = trace_gdb("2").output().unwrap();
        let err = stderr(&output);
        assert!(output.status.success(), "{err}");
        assert!(err.contains("instrumented 6 functions, skipped 0"), "{err}");
        assert!(err.contains("the code reads as before"), "{err}");
        assert!(err.contains(" 0 lost"), "{err}");
        assert_eq!(
            err.contains("in glass's region of an earlier trace"),
            round == 1,
            "{err}"
        );
        let calls = calls_and_self(&recording);
        let count = |name: &str| calls.get(name).map_or(0, |c| c.0);
        assert!(count("dispatch") > 20, "{calls:?}");
        assert!(count("delta") > 20, "{calls:?}");
        // Calls under way when glass attached or detached are the only ones missing.
        for name in ["alpha", "beta", "gamma"] {
            assert!(
                count(name).abs_diff(count("dispatch")) <= 1,
                "{name}: {calls:?}"
            );
        }
        assert!(
            count("descend").abs_diff(80 * count("dispatch")) <= 160,
            "{calls:?}"
        );
        assert_guest_works(&serial);
        assert_eq!(left_as_found_with(&socket, &text, &dir, true), None);
    }
    // Killed while tracing: the guardian puts the code back through the stub.
    let log = dir.join("killed.log");
    let mut killed = trace_gdb("10")
        .env("GLASS_TEST_STOP_AT", "guest-tracing")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let said = |what: &str| {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(what)
    };
    let started = std::time::Instant::now();
    while !said("stopped at guest-tracing") {
        assert!(
            killed.try_wait().unwrap().is_none() && started.elapsed().as_secs() < 60,
            "{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _ = killed.kill();
    let _ = killed.wait();
    let started = std::time::Instant::now();
    while !said("its guardian") {
        assert!(
            started.elapsed().as_secs() < 20,
            "{}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        said("its guardian put back the 6 patched code ranges"),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert_guest_works(&serial);
    assert_eq!(left_as_found_with(&socket, &text, &dir, true), None);
    // Attached to an AArch64 guest through QMP: refused in one line (virt plugs no
    // memory for the region without ACPI).
    assert_clean_failure(
        &glass(&[
            "trace",
            "--qmp",
            socket.to_str().unwrap(),
            "--symbols",
            elf.to_str().unwrap(),
            "-f",
            "alpha",
            "-d",
            "1",
            "-o",
            "/dev/null",
        ]),
        2,
        "attach to an AArch64 guest with --gdb",
    );
}

#[test]
fn a_running_vm_is_traced_and_left_as_it_was() {
    let _alone = exclusive();
    let dir = scratch("trace_guest_qmp");
    let (_qemu, symbols, serial, socket) = running_vm(&dir);
    let text = text_of(&symbols, &dir);
    assert_eq!(left_as_found(&socket, &text, &dir), None);
    let recording = dir.join("qmp.glass");
    // Twice: the second trace uses the region the first one left.
    for (round, functions) in [
        "dispatch,alpha,beta,gamma_,checksum_blocks",
        "dispatch,alpha,beta,gamma_",
    ]
    .into_iter()
    .enumerate()
    {
        let output = trace_qmp(&socket, &symbols, functions, "2", &recording)
            .output()
            .unwrap();
        let count = check_attached_trace(&output, &recording, round == 1);
        assert_eq!(count("checksum_blocks") > 50, round == 0);
        // The guest runs on, its code as the image has it.
        assert_guest_works(&serial);
        assert_eq!(left_as_found(&socket, &text, &dir), None);
    }
    // Symbols of another build (without frame pointers: its functions elsewhere):
    // refused in one line, nothing written.
    let other = symbols.with_file_name("guest-nofp.elf");
    let output = trace_qmp(&socket, &other, "alpha,beta", "1", &recording)
        .output()
        .unwrap();
    assert_clean_failure(&output, 2, "is not the image the guest runs");
    assert_eq!(left_as_found(&socket, &text, &dir), None);
    // The refusal came once the VM was reached: the recording already at that path is
    // whole, the second trace's.
    let kept = calls_and_self(&recording);
    assert!(kept.get("dispatch").is_some_and(|c| c.0 > 50), "{kept:?}");
}

/// glass stopped at each step of an attach and a detach (the test hooks): killed by its
/// guardian for holding the VM stopped past the stop bound, or SIGKILLed while it runs:
/// the guardian puts back every patched byte, removes the stub, and the VM runs on,
/// its .text as the image has it; a trace after all that works.
#[test]
fn a_vm_is_left_as_found_whenever_glass_dies() {
    let _alone = exclusive();
    let dir = scratch("trace_guest_killed");
    let (_qemu, symbols, serial, socket) = running_vm(&dir);
    let text = text_of(&symbols, &dir);
    let recording = dir.join("killed.glass");
    for step in [
        "guest-attach-stopped",
        "guest-attach-patched",
        "guest-tracing",
        "guest-detach-stopped",
        "guest-detach-restored",
    ] {
        let log = dir.join(format!("{step}.log"));
        let mut glass = trace_qmp(
            &socket,
            &symbols,
            "dispatch,alpha,checksum_blocks",
            "1",
            &recording,
        )
        .env("GLASS_TEST_STOP_AT", step)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
        let said = |what: &str| {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains(what)
        };
        let started = std::time::Instant::now();
        while !said(&format!("stopped at {step}")) {
            assert!(
                glass.try_wait().unwrap().is_none() && started.elapsed().as_secs() < 60,
                "{step}: glass did not reach the step: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        if step == "guest-tracing" {
            let _ = glass.kill();
        }
        // Stopped holding the VM stopped (every other step): the guardian kills glass
        // once the stop outlives its bound.
        let status = glass.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{step}");
        // The guardian works on after glass is gone.
        let started = std::time::Instant::now();
        while let Some(why) = left_as_found(&socket, &text, &dir) {
            assert!(
                started.elapsed().as_secs() < 30,
                "{step}: the VM was not left as found: {why}; glass and its guardian said: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        // What the guardian says, once it has done it.
        let started = std::time::Instant::now();
        while !said("its guardian") && started.elapsed().as_secs() < 10 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let log_text = std::fs::read_to_string(&log).unwrap_or_default();
        if step != "guest-attach-stopped" {
            assert!(
                log_text.contains("its guardian put back the"),
                "{step}: {log_text}"
            );
        }
        if step != "guest-tracing" {
            assert!(
                log_text.contains("past the stop bound"),
                "{step}: {log_text}"
            );
        }
        let before = rates(&serial);
        let started = std::time::Instant::now();
        while rates(&serial) == before {
            assert!(
                started.elapsed().as_secs() < 20,
                "{step}: the guest stopped working"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    let output = trace_qmp(&socket, &symbols, "dispatch,alpha", "1", &recording)
        .output()
        .unwrap();
    let err = stderr(&output);
    assert!(output.status.success(), "{err}");
    let calls = calls_and_self(&recording);
    assert!(calls.get("dispatch").map_or(0, |c| c.0) > 20, "{calls:?}");
    assert_eq!(left_as_found(&socket, &text, &dir), None);
}

/// `glass trace --gdb`: a VM reached only through its GDB stub, glass's region in 2 MiB
/// of guest RAM the guest does not use (`--guest-scratch`), drained in short stops.
/// Traced twice (the second time in the region the first left, found by its mark), then
/// SIGKILLed while tracing: each time the VM runs on, its .text the image's; and bad
/// input refused in one line.
#[test]
fn a_vm_behind_a_gdb_stub_is_traced_in_ram_it_does_not_use() {
    let _alone = exclusive();
    let dir = scratch("trace_guest_gdb");
    let stub = dir.join("gdb.sock");
    let gdb_arg = format!("unix:{},server=on,wait=off", stub.display());
    let (_qemu, symbols, serial, socket) = running_vm_with(&dir, &["-gdb", &gdb_arg]);
    let text = text_of(&symbols, &dir);
    let recording = dir.join("gdb.glass");
    // The demo guest's RAM is 64 MiB, and it uses the first few: its last 2 MiB.
    let trace_gdb = |scratch: &str, seconds: &str| {
        let mut command = Command::new(GLASS);
        command.args([
            "trace",
            "--gdb",
            stub.to_str().unwrap(),
            "--guest-scratch",
            scratch,
            "--symbols",
            symbols.to_str().unwrap(),
            "-f",
            "dispatch,alpha,beta,gamma_,checksum_blocks",
            "-d",
            seconds,
            "-o",
            recording.to_str().unwrap(),
        ]);
        command
    };
    for round in 0..2 {
        let output = trace_gdb("0x3e00000,2M", "2").output().unwrap();
        let count = check_attached_trace(&output, &recording, round == 1);
        assert!(count("checksum_blocks") > 50);
        assert_guest_works(&serial);
        assert_eq!(left_as_found_with(&socket, &text, &dir, true), None);
    }

    // Killed while tracing: the guardian puts the code back through the stub.
    let log = dir.join("killed.log");
    let mut glass = trace_gdb("0x3e00000,2M", "10")
        .env("GLASS_TEST_STOP_AT", "guest-tracing")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let said = |what: &str| {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(what)
    };
    let started = std::time::Instant::now();
    while !said("stopped at guest-tracing") {
        assert!(
            glass.try_wait().unwrap().is_none() && started.elapsed().as_secs() < 60,
            "{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _ = glass.kill();
    let _ = glass.wait();
    let started = std::time::Instant::now();
    while !said("its guardian") {
        assert!(
            started.elapsed().as_secs() < 20,
            "{}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        said("its guardian put back the 5 patched code ranges"),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    let before = rates(&serial);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(
        rates(&serial) > before,
        "the guest stopped after glass died"
    );
    assert_eq!(left_as_found_with(&socket, &text, &dir, true), None);

    // Bad input: one line, exit 2.
    for (scratch, said) in [
        ("0x3e01000,2M", "2 MiB of guest RAM on a 2 MiB boundary"),
        ("0x3e00000,4K", "2 MiB of guest RAM on a 2 MiB boundary"),
        ("0x3e00000", "give GPA,SIZE"),
    ] {
        assert_clean_failure(&trace_gdb(scratch, "1").output().unwrap(), 2, said);
    }
    let output = Command::new(GLASS)
        .args(["trace", "--gdb", stub.to_str().unwrap(), "--symbols"])
        .arg(&symbols)
        .args(["-f", "alpha", "-o", "/dev/null"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("--guest-scratch"),
        "{}",
        stderr(&output)
    );
}

/// A VM whose only vCPU is still in its firmware's real mode (SeaBIOS, no bootable
/// device), and one started without a free memory slot: each refused in one line, exit
/// 2, the VM left running with no stub.
#[test]
fn a_guest_outside_long_mode_or_without_a_slot_is_refused() {
    let _alone = exclusive();
    let dir = scratch("trace_guest_real_mode");
    let guest = demo(&dir, 0);
    let symbols = guest.join("guest-fp.elf");
    for (memory, said) in [
        ("64,slots=1,maxmem=1G", "runs outside long mode"),
        ("64", "start the VM with a free memory slot"),
    ] {
        let socket = dir.join("qmp.sock");
        let _ = std::fs::remove_file(&socket);
        let _qemu = Qemu(
            Command::new("qemu-system-x86_64")
                .args(["-accel", "tcg", "-m", memory])
                .args(["-display", "none", "-nodefaults"])
                .arg("-qmp")
                .arg(format!("unix:{},server=on,wait=off", socket.display()))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let started = std::time::Instant::now();
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(started.elapsed().as_secs() < 30, "QEMU did not start");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let recording = dir.join("refused.glass");
        let output = trace_qmp(&socket, &symbols, "alpha", "1", &recording)
            .output()
            .unwrap();
        assert_clean_failure(&output, 2, said);
        let mut monitor = Monitor::connect(&socket);
        assert!(monitor.hmp("info status").contains("running"));
        assert!(!monitor
            .hmp("info chardev")
            .lines()
            .any(|l| l.trim().starts_with("gdb:")));
    }
}

/// The demo guest built to time its own calls (guests/demo/build.sh's third argument):
/// `ticks` calls of tick a round besides dispatch's, and a line a function before "done".
fn self_timed_demo(dir: &Path, rounds: u32, ticks: u32) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guests/demo/build.sh");
    let status = Command::new(script)
        .arg(dir)
        .arg(rounds.to_string())
        .arg(ticks.to_string())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "guests/demo/build.sh (self-timed)");
    dir.to_path_buf()
}

/// A count of cycles as `glass report --format calls` prints it (`52`, `480.0k`, `1.5M`).
fn cycles(text: &str) -> Option<f64> {
    let (number, scale) = match text.chars().last()? {
        'k' => (&text[..text.len() - 1], 1e3),
        'M' => (&text[..text.len() - 1], 1e6),
        'G' => (&text[..text.len() - 1], 1e9),
        _ => (text, 1.0),
    };
    Some(number.parse::<f64>().ok()? * scale)
}

#[test]
fn a_self_timed_guest_counts_what_glass_counts() {
    let _alone = exclusive();
    let dir = scratch("trace_guest_self");
    let (rounds, ticks) = (1000, 20);
    let guest = self_timed_demo(&dir, rounds, ticks);
    let serial = dir.join("serial");
    let recording = dir.join("self.glass");
    // tock is 3 bytes with tock_after right after it: too short for the entry jump, it
    // is traced at its call sites.
    let nm = Command::new("nm")
        .arg("-S")
        .arg(guest.join("guest-fp.elf"))
        .output()
        .unwrap();
    let symbol = |name: &str| -> (u64, u64) {
        String::from_utf8_lossy(&nm.stdout)
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 4 && f[3] == name).then(|| {
                    (
                        u64::from_str_radix(f[0], 16).unwrap(),
                        u64::from_str_radix(f[1], 16).unwrap(),
                    )
                })
            })
            .unwrap_or_else(|| panic!("{name} in nm -S"))
    };
    let (tock, tock_size) = symbol("tock");
    assert!(tock_size < 5 && symbol("tock_after").0 == tock + tock_size);
    // One vCPU: the other tests run two.
    let mut command = qemu(&guest, &serial);
    let smp = command.iter().position(|a| a == "-smp").unwrap();
    command[smp + 1] = "1".into();
    let output = trace_vm(
        &recording,
        "alpha,beta,gamma_,tick,tock",
        &guest.join("guest-fp.elf"),
        command,
    );
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(err.contains("instrumented 5 functions, skipped 0"), "{err}");
    assert!(err.contains(" 0 lost"), "{err}");

    let console = std::fs::read_to_string(&serial).unwrap();
    assert!(
        console.starts_with("glass demo guest: alpha 60% beta 30% gamma 10%\n")
            && console.ends_with("done\n"),
        "{console}"
    );
    assert_eq!(
        console.matches("rate rounds=200").count() as u32,
        rounds / 200,
        "{console}"
    );
    // `self NAME calls=N p50=CYCLES min=CYCLES`, the guest's own.
    let own: std::collections::BTreeMap<String, (u64, f64)> = console
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.strip_prefix("self ")?.split_whitespace().collect();
            let field = |name: &str| {
                f.iter()
                    .find_map(|w| w.strip_prefix(name)?.parse::<u64>().ok())
            };
            Some((f[0].to_string(), (field("calls=")?, field("p50=")? as f64)))
        })
        .collect();

    let report = glass(&["report", recording.to_str().unwrap(), "--format", "calls"]);
    assert!(report.status.success(), "{}", stderr(&report));
    // calls, total, self, self cycles, min, p50, p50 cycles, p99, max, the name.
    let theirs: std::collections::BTreeMap<String, (u64, f64)> = stdout(&report)
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            Some((
                f.get(15)?.to_string(),
                (f.first()?.parse().ok()?, cycles(f.get(10)?)?),
            ))
        })
        .collect();
    for (name, expected) in [
        ("alpha", rounds),
        ("beta", rounds),
        ("gamma_", rounds),
        ("tick", rounds * ticks),
        ("tock", rounds * ticks),
    ] {
        let (guest_calls, guest_p50) = own[name];
        let (glass_calls, glass_p50) = theirs[name];
        assert_eq!(guest_calls, u64::from(expected), "{name}: {console}");
        assert_eq!(glass_calls, guest_calls, "{name}: glass against the guest");
        // The guest's window holds the whole probe (both records); glass's lies inside
        // it, from the entry record's rdtsc to the exit's.
        eprintln!("{name}: median {guest_p50} cycles by the guest, {glass_p50} by glass");
        assert!(
            glass_p50 <= 2.0 * guest_p50 + 1000.0 && guest_p50 <= 2.0 * glass_p50 + 1000.0,
            "{name}: median {guest_p50} cycles by the guest, {glass_p50} by glass"
        );
    }
}

/// `--vm`: a glass stopped while it holds its VM stopped to patch is killed by its
/// guardian at the stop bound, and the VM, glass's own, ends with it: nothing is left
/// stopped or running.
#[test]
fn a_vm_glass_stopped_in_its_patch_stop_is_ended_with_its_vm() {
    let _alone = exclusive();
    let dir = scratch("trace_guest_vm_stopped");
    let guest = demo(&dir, 0);
    let serial = dir.join("serial");
    let recording = dir.join("stopped.glass");
    let mut args: Vec<String> = ["trace", "--vm", "-o"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(recording.display().to_string());
    args.extend(["-f".into(), "alpha,checkpoint".into(), "--symbols".into()]);
    args.push(guest.join("guest-fp.elf").display().to_string());
    args.push("--".into());
    args.extend(qemu(&guest, &serial));
    let output = Command::new(GLASS)
        .args(&args)
        .env("GLASS_TEST_STOP_AT", "guest-vm-patched")
        .output()
        .unwrap();
    let err = stderr(&output);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(output.status.signal(), Some(libc::SIGKILL), "{err}");
    assert!(err.contains("stopped at guest-vm-patched"), "{err}");
    // The guardian's line comes once it has ended QEMU (glass's stderr is its own).
    let qemu_pid = err
        .split("QEMU pid ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|pid| pid.parse::<i32>().ok());
    assert!(err.contains("past the stop bound"), "{err}");
    let pid = qemu_pid.unwrap_or_else(|| panic!("the guardian names QEMU's pid: {err}"));
    let started = std::time::Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z"))
    {
        assert!(started.elapsed().as_secs() < 10, "QEMU {pid} still runs");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
