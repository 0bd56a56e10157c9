//! Which process of a Linux guest each sample ran in (`--guest-btf`, issue 23 item 3), on
//! Debian 12's own kernels under QEMU TCG (guests/linux: kit.sh builds the kit, run.sh
//! boots it). The guest runs `userspin` (user space) and `dd` (read() of /dev/zero) on
//! vCPU 0, reniced to about 66:34, and prints each one's utime+stime from
//! /proc/PID/stat every second: the true split glass's per-process split is held to.
//! One boot per architecture (about a minute for both, the kit built once in ~1.5 min):
//! arm64 under `glass record --vm` (the whole run), x86-64
//! attached over QMP (`--qmp`, a BTF of the other architecture refused first, then a
//! recording of 5 s, judged against the guest's own counts over that window). Both
//! recordings take `--guest-root` (arm64: a root without busybox, whose code stays
//! `[user] dd`): userspin's user stacks are walked through its own page tables,
//! `_start;main;spin_outer;spin_inner`, and those of userspin-dyn (a PIE against glibc,
//! run beside them with `glass_dyn=1`) through libc.so.6 to its `_start`.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

#[test]
fn arm64_processes_under_vm() {
    let _lock = exclusive();
    let kit = linux_kit().join("aarch64");
    let out = scratch("guest-process-arm64");
    let recording = out.join("a.glass");
    // A copy of the guest's filesystem without busybox: userspin is walked, dd's user
    // code (busybox) stays `[user] dd`.
    let root = out.join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::copy(kit.join("root/userspin"), root.join("userspin")).unwrap();
    // userspin-dyn (a PIE against glibc), its binary, loader and libc in the root too.
    std::fs::copy(kit.join("root/userspin-dyn"), root.join("userspin-dyn")).unwrap();
    let libc = Path::new("lib/aarch64-linux-gnu");
    std::fs::create_dir_all(root.join(libc)).unwrap();
    for file in ["libc.so.6", "ld-linux-aarch64.so.1"] {
        std::fs::copy(
            kit.join("root").join(libc).join(file),
            root.join(libc).join(file),
        )
        .unwrap();
    }
    let status = Command::new(repo().join("guests/linux/run.sh"))
        .args(["--append", "glass_dyn=1"])
        .args(["--work", "8", "aarch64"])
        .arg(kit.parent().unwrap())
        .arg(&out)
        .arg("--")
        .arg(GLASS)
        // 197 Hz: at 497 glass held this guest stopped 25-30% of the time, and the
        // guest's own counts (its clock runs on while it is stopped) drifted 2-4 points
        // toward userspin (67.7, 67.8, 69.9% against 66%); at 197 (17% stopped) 66.1
        // and 65.4% against 66.0%.
        .args(["record", "--vm", "-F", "197", "-o"])
        .arg(&recording)
        .arg("--symbols")
        .arg(kit.join("kallsyms"))
        .arg("--guest-btf")
        .arg(kit.join("vmlinux.btf"))
        .arg("--guest-root")
        .arg(&root)
        .arg("--")
        .status()
        .expect("guests/linux/run.sh");
    assert!(status.success(), "run.sh under glass: {status}");
    let (spin_pid, dd_pid, spin, dd) =
        truth(&out.join("serial.log")).expect("the guest's glass-truth line");
    // 15 points: on this arm64 guest glass's share was 65.4, 66.1, 59.0 and 73.8% against
    // the guest's 66.0-66.1% in six runs, twice beyond 4 standard errors of independent
    // samples (6.4 points), and 51.7% against 66.1% in a fresh clone's `./x test` where
    // the x86-64 QMP guest of the same binary ran beside it on the 2 cores (the test
    // alone passed right after). Samples are not independent here: the scheduler gives
    // each process slices of several ms on a 4 ms tick, glass samples every 5 ms, and
    // each stop (0.4 ms, on a clock the guest keeps counting) is charged to the task it
    // caught. What this checks is that each sample names its process: one misnamed
    // would be off by 30 points or more.
    check_split(&recording, spin_pid, dd_pid, spin, dd, true, 15.0);
    check_dyn_walked(&recording);
    // dd reads /dev/zero into a buffer: 35-41% of its samples in its user code here
    // (219 of 537 alone, 106 of 304 beside userspin-dyn); a tenth is asked for.
    let split = per_process(
        &recording,
        &format!("userspin (pid {spin_pid})"),
        &format!("dd (pid {dd_pid})"),
    );
    eprintln!(
        "dd: {} of {} samples [user] dd, {} through busybox",
        split.dd_user, split.dd, split.dd_busybox
    );
    assert!(
        split.dd_user * 10 >= split.dd && split.dd_busybox == 0,
        "a binary not in --guest-root is not shown as [user] dd: {} of {} samples, {} through busybox",
        split.dd_user,
        split.dd,
        split.dd_busybox
    );
}

#[test]
fn x86_64_processes_over_qmp() {
    let _lock = exclusive();
    let kit_dir = linux_kit();
    let kit = kit_dir.join("x86_64");
    let out = scratch("guest-process-x86");
    let socket = out.join("qmp.sock");
    let serial = out.join("serial.log");
    let mut vm = Command::new(repo().join("guests/linux/run.sh"))
        .arg("--qmp")
        .arg(&socket)
        // userspin-dyn (a PIE against glibc) on vCPU 0 too: userspin's and dd's split
        // is judged between the two, and vCPU 1 stays idle.
        .args(["--append", "glass_dyn=1"])
        // 30 s: a loaded 2-core machine took over 20 s from the workload's start to the
        // end of `glass top` below once (QMP attaches, each recording's set-up).
        .args(["--work", "30", "x86_64"])
        .arg(kit_dir)
        .arg(&out)
        .stdout(Stdio::null())
        .spawn()
        .expect("guests/linux/run.sh");
    // The workload runs once the guest prints its first count.
    let deadline = Instant::now() + Duration::from_secs(120);
    while work_lines(&serial).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the guest's workload never started"
        );
        assert!(vm.try_wait().unwrap().is_none(), "the guest ended early");
        std::thread::sleep(Duration::from_millis(200));
    }
    let symbols = kit.join("kallsyms");
    let record = |btf: &Path, output: &str, options: &[&str]| {
        let mut args = vec![
            "record",
            "--qmp",
            socket.to_str().unwrap(),
            "--symbols",
            symbols.to_str().unwrap(),
            "--guest-btf",
            btf.to_str().unwrap(),
            "-o",
        ];
        let output = out.join(output);
        args.push(output.to_str().unwrap());
        args.extend_from_slice(options);
        (glass(&args), output)
    };
    // The other architecture's BTF does not fit the running kernel: one line, exit 2,
    // and the guest runs on.
    let (refused, _) = record(
        &kit_dir.join("aarch64/vmlinux.btf"),
        "refused.glass",
        &["-d", "2"],
    );
    assert_clean_failure(&refused, 2, "not the running kernel's BTF");
    let before = work_lines(&serial);
    let root = kit.join("root");
    let (recorded, recording) = record(
        &kit.join("vmlinux.btf"),
        "x.glass",
        &[
            "-F",
            "297",
            "-d",
            "5",
            "--guest-root",
            root.to_str().unwrap(),
        ],
    );
    let printed_when_glass_ended = work_lines(&serial).len();
    assert!(recorded.status.success(), "{}", stderr(&recorded));
    assert!(
        stderr(&recorded).contains("guest user stacks (--guest-root)"),
        "{}",
        stderr(&recorded)
    );
    assert!(
        stderr(&recorded).contains("guest tasks (--guest-btf)"),
        "{}",
        stderr(&recorded)
    );
    // The guest's counts from the line before glass attached to the first after it let
    // go (each a second apart).
    let first = *before.last().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let last = loop {
        let lines = work_lines(&serial);
        // (Not a fixed count of lines after `first`: glass's set-up and ending take
        // seconds of a debug build, and such a window missed part of the recording.)
        if lines.len() > printed_when_glass_ended {
            break lines[printed_when_glass_ended];
        }
        assert!(Instant::now() < deadline, "the guest stopped counting");
        std::thread::sleep(Duration::from_millis(200));
    };
    // glass top takes the same options: its thread rows are the guest's tasks, the
    // guest's kernel is named from its map (not from this machine's kallsyms), and
    // userspin's own functions from its binary in --guest-root.
    let top = glass(&[
        "top",
        "--qmp",
        socket.to_str().unwrap(),
        "--symbols",
        symbols.to_str().unwrap(),
        "--guest-btf",
        kit.join("vmlinux.btf").to_str().unwrap(),
        "--guest-root",
        root.to_str().unwrap(),
        "-F",
        "197",
        "-d",
        "2",
        "--batch",
        "--threads",
    ]);
    let shown = stdout(&top);
    assert!(top.status.success(), "{}", stderr(&top));
    assert!(
        shown.contains("vcpu0: userspin (pid ") && shown.contains("spin_inner"),
        "glass top shows no userspin row:\n{shown}"
    );
    assert!(!shown.contains("[kernel.kallsyms]"), "{shown}");
    let status = vm.wait().unwrap();
    assert!(
        status.success(),
        "the guest did not power off cleanly: {status}"
    );
    let (spin_pid, dd_pid, _, _) = truth(&serial).expect("the guest's glass-truth line");
    // A PIE and a shared library: userspin-dyn's stacks through libc.so.6 to its _start
    // (419 of 419 here; 676 of 830 in a --vm run when its mappings were read again only
    // after 1 s, the loader having mapped libc after the first read).
    check_dyn_walked(&recording);
    check_split(
        &recording,
        spin_pid,
        dd_pid,
        last.0 - first.0,
        last.1 - first.1,
        true,
        3.0,
    );
}

/// A BTF glass cannot use is one line and exit 2, before any VM is touched.
#[test]
fn bad_btf_is_refused() {
    let dir = scratch("guest-process-bad-btf");
    let symbols = dir.join("kallsyms");
    std::fs::write(
        &symbols,
        "ffffffff81000000 T _stext\nffffffff82a1aa40 D init_task\n",
    )
    .unwrap();
    let not_btf = dir.join("not-btf");
    std::fs::write(&not_btf, b"hello, not BTF\n").unwrap();
    // A well-formed BTF with no types at all: a header and an empty string table.
    let empty = dir.join("empty.btf");
    let mut header = Vec::new();
    header.extend_from_slice(&0xeb9f_u16.to_le_bytes());
    header.extend_from_slice(&[1, 0]);
    for value in [24u32, 0, 0, 0, 1] {
        header.extend_from_slice(&value.to_le_bytes());
    }
    header.push(0);
    std::fs::write(&empty, &header).unwrap();
    let cases = [
        (dir.join("absent.btf"), "absent.btf"),
        (not_btf, "not BTF"),
        (empty, "without struct task_struct"),
    ];
    // --guest-root wants --guest-btf, and a directory.
    let btf = dir.join("some.btf");
    std::fs::write(&btf, &header).unwrap();
    let output_path = dir.join("x.glass");
    let record_with = |extra: &[&str]| {
        let mut args = vec![
            "record",
            "--gdb",
            "127.0.0.1:9",
            "--symbols",
            symbols.to_str().unwrap(),
            "-o",
            output_path.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        glass(&args)
    };
    let output = record_with(&["--guest-root", dir.to_str().unwrap()]);
    assert_clean_failure(&output, 2, "--guest-root needs --guest-btf");
    let output = record_with(&[
        "--guest-btf",
        btf.to_str().unwrap(),
        "--guest-root",
        symbols.to_str().unwrap(),
    ]);
    assert_clean_failure(&output, 2, "not a directory");
    for (btf, needle) in cases {
        let output = glass(&[
            "record",
            "--gdb",
            "127.0.0.1:9",
            "--symbols",
            symbols.to_str().unwrap(),
            "--guest-btf",
            btf.to_str().unwrap(),
            "-o",
            dir.join("x.glass").to_str().unwrap(),
        ]);
        assert_clean_failure(&output, 2, needle);
    }
}
