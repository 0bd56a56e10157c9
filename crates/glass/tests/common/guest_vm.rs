//! The demo guest (guests/demo) under QEMU TCG, for the tests that sample it: built
//! with its build script, started with a GDB stub on a unix socket, RAM shared through
//! a file, and the serial port in a file whose `rate` lines show the guest's progress.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn build_guest(dir: &Path) -> PathBuf {
    super::build_guest_image("demo", dir, &["0"])
}

pub struct Vm {
    pub child: Child,
    pub socket: PathBuf,
    pub ram: PathBuf,
    pub serial: PathBuf,
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.ram);
    }
}

impl Vm {
    pub fn start(dir: &Path, image: &str, name: &str) -> Vm {
        Self::start_with(dir, image, name, 2)
    }

    pub fn start_with(dir: &Path, image: &str, name: &str, vcpus: u32) -> Vm {
        let ram = PathBuf::from(format!("/dev/shm/glass-test-{name}-{}", std::process::id()));
        let mut qemu = Command::new("qemu-system-x86_64");
        qemu.args([
            "-accel",
            "tcg",
            "-smp",
            &vcpus.to_string(),
            "-display",
            "none",
            "-nodefaults",
            "-m",
            "64",
        ])
        .arg("-kernel")
        .arg(dir.join(image))
        .arg("-object")
        .arg(format!(
            "memory-backend-file,id=mem,size=64M,mem-path={},share=on",
            ram.display()
        ))
        .args(["-machine", "memory-backend=mem"]);
        Self::spawn(qemu, dir, name, ram)
    }

    /// Starts `qemu` (a QEMU command without `-serial` and `-gdb`) with its serial port
    /// in `DIR/NAME.serial` and a GDB stub on `DIR/NAME.sock`; `ram` is its RAM file, if
    /// any (removed when the VM is dropped).
    pub fn spawn(mut qemu: Command, dir: &Path, name: &str, ram: PathBuf) -> Vm {
        let socket = dir.join(format!("{name}.sock"));
        let serial = dir.join(format!("{name}.serial"));
        let _ = std::fs::remove_file(&socket);
        let child = qemu
            .arg("-serial")
            .arg(format!("file:{}", serial.display()))
            .arg("-gdb")
            .arg(format!("unix:{},server=on,wait=off", socket.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("QEMU is installed (./x test installs it)");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() || !serial.exists() {
            assert!(Instant::now() < deadline, "QEMU did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Vm {
            child,
            socket,
            ram,
            serial,
        }
    }

    /// Lines of work-rate output so far.
    pub fn progress(&self) -> usize {
        let mut text = String::new();
        let _ = std::fs::File::open(&self.serial).and_then(|mut f| f.read_to_string(&mut text));
        text.lines().filter(|l| l.starts_with("rate")).count()
    }

    pub fn assert_running(&self) {
        let before = self.progress();
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.progress() <= before {
            assert!(
                Instant::now() < deadline,
                "the guest stopped making progress"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// What follows `glass record --vm` in the tests: `-- qemu-system-x86_64` under TCG with
/// `vcpus` vCPUs and 64 MiB, no display or default devices, `extra` options, and the
/// multiboot `image` as `-kernel`.
pub fn qemu_command<'a>(vcpus: &'a str, extra: &[&'a str], image: &'a str) -> Vec<&'a str> {
    let mut command = vec![
        "--",
        "qemu-system-x86_64",
        "-accel",
        "tcg",
        "-smp",
        vcpus,
        "-m",
        "64",
        "-display",
        "none",
        "-nodefaults",
    ];
    command.extend_from_slice(extra);
    command.extend_from_slice(&["-kernel", image]);
    command
}

/// The guest's own last `split alpha=A% beta=B% gamma=G% halted=H%` line (guests/unikernel
/// and guests/aarch64 print it): the truth a profile is checked against.
pub fn guest_split(serial: &Path) -> [f64; 4] {
    let text = std::fs::read_to_string(serial).unwrap();
    let line = super::last_split_line(&text)
        .unwrap_or_else(|| panic!("no split line on the serial port: {text}"));
    let value = |key: &str| -> f64 {
        line.split_whitespace()
            .find_map(|field| field.strip_prefix(key))
            .and_then(|v| v.trim_end_matches('%').parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {line}"))
    };
    [
        value("alpha="),
        value("beta="),
        value("gamma="),
        value("halted="),
    ]
}

/// Samples of `thread` (folded with `--threads`: its `vcpuN/` frame) whose stack holds
/// `function`.
pub fn under(stacks: &[(Vec<String>, u64)], thread: &str, function: &str) -> u64 {
    stacks
        .iter()
        .filter(|(frames, _)| {
            frames.get(1).is_some_and(|t| t.starts_with(thread))
                && frames.iter().any(|f| f == function)
        })
        .map(|(_, n)| n)
        .sum()
}

/// guests/linux's kit (Debian 12's arm64 and x86-64 kernels, busybox initramfs, each
/// kernel's kallsyms and BTF), built once and kept across runs in the target's
/// temporary directory (guest_process.rs and linux_guest.rs share it).
pub fn linux_kit() -> &'static Path {
    static KIT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    KIT.get_or_init(|| {
        let kit = Path::new(env!("CARGO_TARGET_TMPDIR")).join("linux-kit");
        let status = std::process::Command::new(super::repo().join("guests/linux/kit.sh"))
            .arg(&kit)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("guests/linux/kit.sh runs");
        assert!(status.success(), "guests/linux/kit.sh failed");
        kit
    })
}

/// The stacks of the first profile of `recording`'s speedscope export (written to
/// `out`), each root first, in the order of the samples (time order).
pub fn speedscope_stacks(recording: &Path, out: &Path) -> Vec<Vec<String>> {
    let output = super::glass(&[
        "report",
        recording.to_str().unwrap(),
        "--format",
        "speedscope",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", super::stderr(&output));
    let json: glass_report::serde_json::Value =
        glass_report::serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap();
    let names = &json["shared"]["frames"];
    json["profiles"][0]["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|stack| {
            let frames = stack.as_array().unwrap().iter();
            frames
                .map(|i| {
                    names[i.as_u64().unwrap() as usize]["name"]
                        .as_str()
                        .unwrap()
                        .to_string()
                })
                .collect()
        })
        .collect()
}
