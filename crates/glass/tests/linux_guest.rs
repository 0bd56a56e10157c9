//! Real Linux guests: Debian 12's own arm64 and x86-64 kernels under QEMU TCG (guests/linux:
//! kit.sh builds the kit, run.sh boots it), sampled by `glass record --vm` with the guest's
//! own /proc/kallsyms as `--symbols`. The initramfs runs a known workload on vCPU 0 (a
//! user-space spinner and `dd if=/dev/zero of=/dev/null`, which lives in read() and
//! write()) and leaves vCPU 1 idle, and prints the processes' own CPU times.
//!
//! One boot per architecture and configuration, several checks per boot: pointer
//! authentication stripped (`-cpu max`: read()'s stacks named down to `el0t_64_sync`), no
//! frame repeated by the link-register rule, no vector entry as a leaf, IRQ samples rooted
//! in the interrupted task, idle vCPUs `[halted]` though the map has no code, and with
//! KASLR on (the map from a nokaslr boot) the slide found and the kernel named; x86-64's
//! kernel stacks walked whole with the kernel's own ORC tables read from guest RAM.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// One boot of `arch` under `glass record --vm` with the kit's kallsyms: the recording's
/// folded stacks per vCPU, glass's stderr, and the guest's console.
struct Boot {
    stacks: Vec<(Vec<String>, u64)>,
    err: String,
    console: String,
    /// `glass report`'s stderr and `glass info`'s output.
    report_err: String,
    info: String,
    /// NMIs injected over QMP during the recording ([`boot_injecting_nmis`]).
    nmis: u64,
}

fn boot(arch: &str, name: &str, run_options: &[&str]) -> Boot {
    boot_with(arch, name, run_options, None)
}

/// [`boot`] with another symbol table than the kit's kallsyms.
fn boot_with(arch: &str, name: &str, run_options: &[&str], symbols: Option<&Path>) -> Boot {
    boot_full(arch, name, run_options, symbols, &[], false)
}

/// [`boot`] with `glass_options` for `glass record`, and an NMI injected to every vCPU
/// over QMP (`inject-nmi`) every 4 ms for as long as the guest runs.
fn boot_injecting_nmis(
    arch: &str,
    name: &str,
    run_options: &[&str],
    glass_options: &[&str],
) -> Boot {
    boot_full(arch, name, run_options, None, glass_options, true)
}

/// Sends `inject-nmi` over the QMP socket at `socket` (retried until QEMU listens)
/// every `every` from when the guest's console (`serial`) says the workload began until
/// `stop`; how many QEMU took. (An NMI before the kernel set up its IDT resets the
/// guest.)
fn inject_nmis(
    serial: &Path,
    socket: &Path,
    every: std::time::Duration,
    stop: &std::sync::atomic::AtomicBool,
) -> u64 {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::atomic::Ordering;
    let stream = loop {
        if stop.load(Ordering::Relaxed) {
            return 0;
        }
        match std::os::unix::net::UnixStream::connect(socket) {
            Ok(stream) => break stream,
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    };
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let mut line = String::new();
    // The greeting, then capabilities: each command answers one line (events aside).
    let mut answer = |writer: &mut std::os::unix::net::UnixStream, command: &str| -> bool {
        if writer.write_all(command.as_bytes()).is_err() {
            return false;
        }
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return false,
                Ok(_) if line.contains("\"return\"") => return true,
                Ok(_) if line.contains("\"error\"") => return false,
                Ok(_) => {}
            }
        }
    };
    if !answer(&mut writer, "{\"execute\":\"qmp_capabilities\"}\n") {
        return 0;
    }
    while !std::fs::read_to_string(serial).is_ok_and(|s| s.contains("glass-init: workload")) {
        if stop.load(Ordering::Relaxed) {
            return 0;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut injected = 0;
    while !stop.load(Ordering::Relaxed) {
        if !answer(&mut writer, "{\"execute\":\"inject-nmi\"}\n") {
            break;
        }
        injected += 1;
        std::thread::sleep(every);
    }
    injected
}

fn boot_full(
    arch: &str,
    name: &str,
    run_options: &[&str],
    symbols: Option<&Path>,
    glass_options: &[&str],
    nmis: bool,
) -> Boot {
    let kit = linux_kit();
    // One guest at a time: two TCG guests on a 2-CPU host starve each other's sampling.
    let _one = exclusive();
    let out = scratch(&format!("linux-{name}"));
    let recording = out.join("guest.glass");
    let kallsyms = symbols.map_or_else(|| kit.join(arch).join("kallsyms"), Path::to_path_buf);
    let socket = out.join("qmp.sock");
    let mut command = Command::new(repo().join("guests/linux/run.sh"));
    // 6 s of the workload (about 3,000 samples of vCPU 0 at 497 Hz): every check below
    // asks for at most a few hundred of one kind (8 s before: 14 s more for the binary).
    command.args(["--work", "6"]);
    if nmis {
        let _ = std::fs::remove_file(&socket);
        command.arg("--qmp").arg(&socket);
    }
    command
        .args(run_options)
        .arg(arch)
        .arg(kit)
        .arg(&out)
        .args([
            "--",
            env!("CARGO_BIN_EXE_glass"),
            "record",
            "--vm",
            "-F",
            "497",
            "-o",
        ])
        .arg(&recording)
        .arg("--symbols")
        .arg(&kallsyms)
        .args(glass_options)
        .arg("--");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let serial = out.join("serial.log");
    let (output, nmis) = std::thread::scope(|scope| {
        let injector = nmis.then(|| {
            scope
                .spawn(|| inject_nmis(&serial, &socket, std::time::Duration::from_millis(4), &stop))
        });
        let output = command.output().expect("guests/linux/run.sh runs");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (output, injector.map_or(0, |t| t.join().unwrap()))
    });
    let err = stderr(&output);
    let console = std::fs::read_to_string(out.join("serial.log")).unwrap_or_default();
    assert!(
        output.status.success(),
        "{name}: glass record --vm failed: {err}\nconsole:\n{console}"
    );
    assert!(
        console.contains("glass-truth"),
        "{name}: the workload did not finish:\n{console}"
    );
    assert!(err.contains("guest powered off"), "{name}: {err}");
    let stacks = folded(&recording, &["--threads"]);
    let report_err = stderr(&glass(&[
        "report",
        recording.to_str().unwrap(),
        "--format",
        "folded",
    ]));
    let info = stdout(&glass(&["info", recording.to_str().unwrap()]));
    Boot {
        stacks,
        err,
        console,
        report_err,
        info,
        nmis,
    }
}

impl Boot {
    /// Samples of `vcpu` (frames from the root, without the process and thread).
    fn vcpu(&self, vcpu: u32) -> impl Iterator<Item = (&[String], u64)> {
        let prefix = format!("vcpu{vcpu}/");
        self.stacks
            .iter()
            .filter(move |(frames, _)| frames.get(1).is_some_and(|t| t.starts_with(&prefix)))
            .map(|(frames, count)| (&frames[2..], *count))
    }

    fn all(&self) -> impl Iterator<Item = (&[String], u64)> {
        self.stacks
            .iter()
            .map(|(frames, count)| (&frames[2..], *count))
    }
}

fn count(stacks: impl Iterator<Item = (impl AsRef<[String]>, u64)>) -> u64 {
    stacks.map(|(_, n)| n).sum()
}

fn has(frames: &[String], name: &str) -> bool {
    frames.iter().any(|f| f == name)
}

/// Stack lines for a failure message: the `most` largest of `stacks`.
fn show<'a>(stacks: impl Iterator<Item = (&'a [String], u64)>, most: usize) -> String {
    let mut all: Vec<_> = stacks.collect();
    all.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    all.iter()
        .take(most)
        .map(|(f, n)| format!("  {} {n}", f.join(";")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The checks every boot passes: an idle vCPU 1 shown `[halted]` from guest memory (the
/// map has no code), no vector entry as a leaf.
fn check_idle_and_vectors(boot: &Boot, name: &str) {
    // vCPU 1 runs nothing of the workload: idle but for the guest's boot and its ticks,
    // counted from when the kernel started it. Before that it waits in the boot firmware
    // for its start-up IPI for as long as the boot takes (a fresh machine's run: 3149 of
    // 9078 samples), which says how slow the host was, not how idle the kernel keeps it.
    let kernel = || {
        boot.vcpu(1)
            .filter(|(f, _)| !f.iter().any(|frame| frame == "[firmware]"))
    };
    let vcpu1 = count(kernel());
    let halted = count(kernel().filter(|(f, _)| f.last().is_some_and(|l| l == "[halted]")));
    assert!(
        vcpu1 > 500 && halted * 100 >= vcpu1 * 50,
        "{name}: vcpu1 {halted} of {vcpu1} samples halted:\n{}",
        show(boot.vcpu(1), 10)
    );
    eprintln!(
        "{name}: vcpu1 halted {halted} of {vcpu1} (and {} in the boot firmware)",
        count(boot.vcpu(1)) - vcpu1
    );
    // Named where it halted (with KASLR on, only once the slide is found).
    let named = count(kernel().filter(|(f, _)| {
        f.len() >= 2 && f[f.len() - 1] == "[halted]" && !f[f.len() - 2].starts_with('[')
    }));
    assert!(
        named * 100 >= halted * 90,
        "{name}: {named} of {halted} halted samples named:\n{}",
        show(boot.vcpu(1), 10)
    );
    let vectors = count(
        boot.all()
            .filter(|(f, _)| f.last().is_some_and(|l| l == "vectors")),
    );
    assert_eq!(
        vectors,
        0,
        "{name}: 'vectors' as a leaf:\n{}",
        show(boot.all(), 10)
    );
}

/// Of vCPU 0's stacks in dd's read() of /dev/zero (`read`), at least `percent`% reach the
/// user entry (`entry`: its name and the test), of at least 100.
fn check_reads_rooted(
    boot: &Boot,
    name: &str,
    read: impl Fn(&[String]) -> bool,
    entry: (&str, impl Fn(&[String]) -> bool),
    percent: u64,
) {
    let reads: Vec<_> = boot.vcpu(0).filter(|(f, _)| read(f)).collect();
    let read_total = count(reads.iter().map(|(f, n)| (*f, *n)));
    let rooted = count(
        reads
            .iter()
            .filter(|(f, _)| entry.1(f))
            .map(|(f, n)| (*f, *n)),
    );
    eprintln!(
        "{name}: read() stacks reaching {}: {rooted} of {read_total}",
        entry.0
    );
    assert!(
        read_total >= 100 && rooted * 100 >= read_total * percent,
        "{name}: {rooted} of {read_total} read() stacks reach {}:\n{}",
        entry.0,
        show(reads.iter().map(|(f, n)| (*f, *n)), 10)
    );
}

/// Of the IRQ samples (`irq`), at least `least.1`% are rooted in the interrupted task
/// (`task_roots`), of at least `least.0`; `part` names and counts a part of the rooted.
fn check_irqs_rooted(
    boot: &Boot,
    name: &str,
    irq: impl Fn(&[String]) -> bool,
    task_roots: &[&str],
    part: (&str, impl Fn(&[String]) -> bool),
    least: (u64, u64),
) {
    let rooted_in_task = |f: &[String]| irq(f) && task_roots.contains(&f[0].as_str());
    let irqs = count(boot.all().filter(|(f, _)| irq(f)));
    let rooted = count(boot.all().filter(|(f, _)| rooted_in_task(f)));
    let of_part = count(boot.all().filter(|(f, _)| rooted_in_task(f) && part.1(f)));
    eprintln!(
        "{name}: IRQ samples {irqs} ({:.1}% of all), rooted in the interrupted task {rooted}, of which {} {of_part}",
        irqs as f64 * 100.0 / count(boot.all()).max(1) as f64,
        part.0
    );
    assert!(
        irqs >= least.0 && rooted * 100 >= irqs * least.1,
        "{name}: {rooted} of {irqs} IRQ samples rooted in the task:\n{}",
        show(boot.all().filter(|(f, _)| irq(f) && !rooted_in_task(f)), 12)
    );
}

#[test]
fn arm64_pac_kernel_seen_whole() {
    // dd reads 64 KiB at a time: with 4 KiB reads under -cpu max, dd spent ~7% of its
    // time in read() (19-29 read() samples of ~5300 on vCPU 0 over 8 s, one CI run below
    // this test's 20), the rest in its own code and the system call's way in and out.
    let boot = boot(
        "aarch64",
        "arm64-pac",
        &["--cpu", "max", "--append", "glass_ddbs=64k"],
    );
    let name = "arm64 -cpu max";
    check_idle_and_vectors(&boot, name);

    // PAC: read() of /dev/zero named down to the user entry.
    check_reads_rooted(
        &boot,
        name,
        |f| has(f, "ksys_read") || has(f, "read_zero"),
        ("el0t_64_sync", |f| f[0] == "el0t_64_sync"),
        95,
    );
    let user_entries = count(boot.all().filter(|(f, _)| f[0].starts_with("el0t_64_")));
    assert!(
        user_entries >= 100,
        "{name}: {user_entries} stacks from user entries"
    );

    // The link-register rule repeats no frame: the workload's kernel stacks (read() and
    // write() of dd, interrupts of user code; no recursion in them) hold no frame twice
    // in a row (`read_zero;read_zero`, `__cond_resched;__cond_resched` before).
    let workload =
        |f: &[String]| f[0] == "el0t_64_irq" || has(f, "ksys_read") || has(f, "ksys_write");
    let repeated: Vec<_> = boot
        .all()
        .filter(|(f, _)| workload(f) && f.windows(2).any(|w| w[0] == w[1]))
        .collect();
    assert!(
        count(boot.all().filter(|(f, _)| workload(f))) >= 100,
        "{name}: few workload stacks"
    );
    assert!(
        repeated.is_empty(),
        "{name}: frames repeated:\n{}",
        show(repeated.into_iter(), 10)
    );

    // IRQs: rooted in the interrupted task, through call_on_irq_stack's record on it.
    let irq = |f: &[String]| has(f, "call_on_irq_stack") || has(f, "gic_handle_irq");
    let task_roots = [
        "el0t_64_irq",
        "el0t_64_sync",
        "ret_from_fork",
        "__primary_switched",
        "__secondary_switched",
    ];
    check_irqs_rooted(
        &boot,
        name,
        irq,
        &task_roots,
        ("under the user entry", |f| f[0] == "el0t_64_irq"),
        (50, 95),
    );
    assert!(
        boot.err
            .lines()
            .any(|l| l.contains("vcpu0:") && !l.contains(" 0 stacks continued on a second stack")),
        "{name}: {}",
        boot.err
    );
    // The workload's user-space samples: the truth's ticks say most of vCPU 0's work.
    assert!(boot.console.contains("glass-truth"), "{}", boot.console);
}

/// KASLR on: the kit's kallsyms (from a nokaslr boot) and the running kernel differ by
/// the slide, which glass finds and says.
fn check_kaslr(boot: &Boot, name: &str) {
    let line = boot
        .err
        .lines()
        .find(|l| l.contains("KASLR: the running kernel lies"))
        .unwrap_or_else(|| panic!("{name}: no slide found: {}", boot.err));
    eprintln!("{name}: {line}");
    assert!(!boot.err.contains("warning"), "{name}: {}", boot.err);
}

#[test]
fn arm64_kaslr_kernel_named() {
    let boot = boot(
        "aarch64",
        "arm64-kaslr",
        &["--kaslr", "--cpu", "cortex-a57"],
    );
    let name = "arm64 KASLR";
    check_kaslr(&boot, name);
    check_idle_and_vectors(&boot, name);
    let entries = count(boot.all().filter(|(f, _)| f[0].starts_with("el0t_64_")));
    assert!(entries >= 100, "{name}: {entries} stacks from user entries");
    assert!(
        !boot.report_err.contains("warning") && !boot.info.contains("warning:"),
        "{name}: {}{}",
        boot.report_err,
        boot.info
    );

    // A table without the symbols that tell the slide (no vector tables, no banner):
    // record, report and info each say why the kernel is not named, in one line.
    let stripped = scratch("linux-arm64-kaslr-table").join("kallsyms");
    let table = std::fs::read_to_string(linux_kit().join("aarch64/kallsyms")).unwrap();
    let kept: String = table
        .lines()
        .filter(|l| !l.ends_with("vectors") && !l.ends_with(" linux_banner"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&stripped, kept).unwrap();
    let boot = boot_with(
        "aarch64",
        "arm64-kaslr-unfound",
        &["--kaslr", "--work", "3"],
        Some(&stripped),
    );
    let why = "where it was moved (KASLR) could not be found";
    let said = |text: &str| text.lines().filter(|l| l.contains(why)).count();
    assert_eq!(said(&boot.err), 1, "record: {}", boot.err);
    assert_eq!(said(&boot.report_err), 1, "report: {}", boot.report_err);
    assert_eq!(said(&boot.info), 1, "info: {}", boot.info);
}

#[test]
fn x86_64_kaslr_kernel_idle_named() {
    let boot = boot("x86_64", "x86-64-kaslr", &["--kaslr"]);
    let name = "x86-64 KASLR";
    check_kaslr(&boot, name);
    check_idle_and_vectors(&boot, name);
}

/// A kernel moved by less than its own size still runs partly inside the symbol table,
/// where glass once took it for unmoved (a fresh-clone run's KASLR boot found no slide):
/// the kit's nokaslr kernel against its kallsyms moved 4 MiB down, so that the kernel
/// runs 4 MiB above the table.
#[test]
fn x86_64_a_kernel_moved_by_less_than_its_size_is_found() {
    let kit = linux_kit();
    let moved = scratch("linux-moved-map").join("kallsyms");
    let table = std::fs::read_to_string(kit.join("x86_64/kallsyms")).unwrap();
    let lines: Vec<String> = table
        .lines()
        .map(|line| {
            let (address, rest) = line.split_once(' ').unwrap_or((line, ""));
            match u64::from_str_radix(address, 16) {
                Ok(a) if a >> 63 == 1 => format!("{:016x} {rest}", a - (4 << 20)),
                _ => line.to_string(),
            }
        })
        .collect();
    std::fs::write(&moved, lines.join("\n") + "\n").unwrap();
    let boot = boot_with("x86_64", "x86-64-moved", &["--work", "3"], Some(&moved));
    let name = "x86-64 moved 4 MiB";
    check_kaslr(&boot, name);
    assert!(
        boot.err.contains("lies 0x400000 above the symbol table"),
        "{name}: {}",
        boot.err
    );
}

/// x86-64: Debian's kernel keeps no frame pointers; glass reads its ORC tables from guest
/// RAM and walks kernel stacks with them, through the IRQ stack back to the task.
/// An x86-64 task's kernel roots: its kernel entries from user space, kernel threads,
/// idle.
const X86_TASK_ROOTS: [&str; 11] = [
    "asm_sysvec_apic_timer_interrupt",
    "asm_exc_page_fault",
    "asm_sysvec_reschedule_ipi",
    "asm_sysvec_call_function_single",
    "asm_common_interrupt",
    "asm_exc_nmi",
    "entry_SYSCALL_64_after_hwframe",
    "entry_SYSCALL_64",
    "ret_from_fork",
    "secondary_startup_64_no_verify",
    "secondary_startup_64",
];

/// A frame of a loadable module's code (`func [module]`).
fn module_frame(frame: &str) -> bool {
    frame.ends_with(']') && frame.contains(" [") && !frame.starts_with('[')
}

/// x86-64 (ORC) with NMIs injected over QMP all along and, on vCPU 1, the dump disk read
/// in a loop (`glass_blk=1`: virtio_blk, virtio_ring and virtio_pci code runs) with the
/// kit's BTF: samples on the NMI's exception stack are walked through the CPU's frame at
/// its top into the interrupted context (the idle task, a syscall, an interrupt), and
/// samples in module code through the modules' own ORC to an entry.
#[test]
fn x86_64_exception_stacks_and_modules() {
    let kit = linux_kit();
    let btf = kit.join("x86_64/vmlinux.btf");
    let boot = boot_injecting_nmis(
        "x86_64",
        "x86-64-nmi-modules",
        &["--append", "glass_blk=1"],
        &["--guest-btf", btf.to_str().unwrap()],
    );
    let name = "x86-64 NMIs and modules";
    for line in boot
        .err
        .lines()
        .filter(|l| l.contains("vcpu") || l.contains("ORC"))
    {
        eprintln!("{name}: {line}");
    }
    assert!(
        boot.console.contains("glass-init: disk reader"),
        "{name}: {}",
        boot.console
    );
    let nmi = |f: &[String]| {
        ["asm_exc_nmi", "exc_nmi", "default_do_nmi"]
            .iter()
            .any(|n| has(f, n))
    };
    eprintln!("{name}: {} NMIs injected", boot.nmis);
    // NMI samples rooted in the interrupted context (an NMI from user mode ends at its
    // entry, `asm_exc_nmi`; from the kernel the walk goes on, off the NMI stack).
    // Measured: 498 of 504, 538 of 549, 396 of 404 (159-244 of them from the kernel: 0 without
    // the stack switch, which failed this at 335 of 605); 90% leaves room for the few
    // that land on entry code's edges on a loaded host.
    check_irqs_rooted(
        &boot,
        name,
        nmi,
        &X86_TASK_ROOTS,
        ("interrupted in the kernel (off the exception stack)", |f| {
            f[0] != "asm_exc_nmi"
        }),
        (20, 90),
    );
    let in_kernel = count(boot.all().filter(|(f, _)| {
        nmi(f) && f[0] != "asm_exc_nmi" && X86_TASK_ROOTS.contains(&f[0].as_str())
    }));
    assert!(
        in_kernel >= 10,
        "{name}: {in_kernel} NMI samples walked off the exception stack"
    );

    // Module frames walked through to an entry. Measured: 368 of 370 (330-642 such
    // samples in a boot: insmod's probing and the disk reader), 716 of 716.
    let in_module = |f: &[String]| f.iter().any(|frame| module_frame(frame));
    let modules = count(boot.all().filter(|(f, _)| in_module(f)));
    let rooted = count(
        boot.all()
            .filter(|(f, _)| in_module(f) && X86_TASK_ROOTS.contains(&f[0].as_str())),
    );
    eprintln!("{name}: samples in module code {modules}, walked to an entry {rooted}");
    assert!(
        boot.err
            .contains("loadable modules' ORC tables read: 6 modules"),
        "{name}: {}",
        boot.err
    );
    assert!(
        modules >= 20 && rooted * 100 >= modules * 90,
        "{name}: {rooted} of {modules} module samples walked to an entry:\n{}",
        show(
            boot.all()
                .filter(|(f, _)| in_module(f) && !X86_TASK_ROOTS.contains(&f[0].as_str())),
            12
        )
    );
}

#[test]
fn x86_64_kernel_seen_whole() {
    let boot = boot("x86_64", "x86-64-orc", &[]);
    let name = "x86-64 ORC";
    check_idle_and_vectors(&boot, name);
    assert!(
        boot.err
            .contains("walked with the guest kernel's ORC tables"),
        "{name}: {}",
        boot.err
    );
    // No --guest-btf: no modules' ORC, and the summary says what that costs.
    assert!(
        boot.err
            .contains("read only with --guest-btf: a module frame ends a walk"),
        "{name}: {}",
        boot.err
    );

    // dd's read() of /dev/zero: named down to the syscall entry.
    let dd_read =
        |f: &[String]| has(f, "read_zero") || f.last().is_some_and(|l| l.starts_with("clear_user"));
    let entry =
        |f: &[String]| has(f, "entry_SYSCALL_64_after_hwframe") || has(f, "entry_SYSCALL_64");
    // Measured: 949 of 949, 935 of 935, 852 of 852, 846 of 846 (without ORC: 0 of 315,
    // 0 of 379).
    check_reads_rooted(&boot, name, dd_read, ("entry_SYSCALL_64", entry), 90);

    // Timer interrupts: from user space the kernel stack ends at the entry (its pt_regs
    // say user mode); from the kernel the handler ran on the IRQ stack and the walk goes
    // back through its top word to the interrupted task's own roots. Interrupts of a
    // module's code (virtio_pci probing at boot: `func [module]`) are left out: modules'
    // ORC is not read, and how many there are follows the boot's length. Measured with
    // them: 340 of 361 and 235 of 247 rooted; without them, and with the roots below:
    // 287 of 287 and 296 of 297 (the one: an interrupted static-call trampoline, named
    // after the symbol before it).
    let irq = |f: &[String]| {
        (has(f, "asm_sysvec_apic_timer_interrupt") || has(f, "__sysvec_apic_timer_interrupt"))
            && !f
                .iter()
                .any(|frame| frame.ends_with(']') && frame.contains(" ["))
    };
    check_irqs_rooted(
        &boot,
        name,
        irq,
        &X86_TASK_ROOTS,
        ("interrupted in the kernel", |f| {
            f[0] != "asm_sysvec_apic_timer_interrupt"
        }),
        (20, 90),
    );
    for line in boot.err.lines().filter(|l| l.contains("vcpu")) {
        eprintln!("{name}: {line}");
    }

    // No frame twice in a row (a walk that stalls repeats its frame).
    let all = count(boot.all());
    let repeated: Vec<_> = boot
        .all()
        .filter(|(f, _)| f.windows(2).any(|w| w[0] == w[1] && !w[0].starts_with('[')))
        .collect();
    let repeated_count = count(repeated.iter().map(|(f, n)| (*f, *n)));
    eprintln!("{name}: stacks with a frame repeated: {repeated_count} of {all}");
    assert!(
        repeated_count * 100 <= all,
        "{name}: frames repeated:\n{}",
        show(repeated.into_iter(), 10)
    );

    // A map without the tables' symbols: the walk is as before, and record, report and
    // info each say why in one line.
    let stripped = scratch("linux-x86-64-no-orc-table").join("kallsyms");
    let table = std::fs::read_to_string(linux_kit().join("x86_64/kallsyms")).unwrap();
    let kept: String = table
        .lines()
        .filter(|l| !l.ends_with("_orc_unwind_ip"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&stripped, kept).unwrap();
    let before = boot_with("x86_64", "x86-64-no-orc", &["--work", "3"], Some(&stripped));
    let why = "the kernel's ORC tables cannot be found";
    let said = |text: &str| text.lines().filter(|l| l.contains(why)).count();
    assert_eq!(said(&before.err), 1, "record: {}", before.err);
    assert_eq!(said(&before.report_err), 1, "report: {}", before.report_err);
    assert_eq!(said(&before.info), 1, "info: {}", before.info);
    let reads = |b: &Boot| {
        let all: Vec<_> = b.vcpu(0).filter(|(f, _)| dd_read(f)).collect();
        let rooted = count(all.iter().filter(|(f, _)| entry(f)).map(|(f, n)| (*f, *n)));
        (rooted, count(all.into_iter()))
    };
    eprintln!(
        "{name}: without ORC, read() stacks reaching the syscall entry: {:?} (rooted, of)",
        reads(&before)
    );
}

/// x86-64 under `--capture raw`: a raw sample keeps one stack range and the report has no
/// ORC tables, so kernel frames past the leaf are frame-pointer guesses there: the
/// recording says so, and so does every report; the leaves are named all the same.
#[test]
fn x86_64_raw_capture_says_why_kernel_stacks_are_short() {
    let boot = boot_full(
        "x86_64",
        "x86-64-raw",
        &["--work", "3"],
        None,
        &["--capture", "raw"],
        false,
    );
    let said = "--capture raw keeps neither the guest kernel's ORC tables";
    assert!(boot.err.contains(said), "{}", boot.err);
    assert!(boot.report_err.contains(said), "{}", boot.report_err);
    let reads = count(boot.all().filter(|(f, _)| {
        f.last()
            .is_some_and(|l| l.starts_with("clear_user") || l == "read_zero")
    }));
    assert!(
        reads >= 20,
        "{reads} samples in dd's read():\n{}",
        show(boot.all(), 10)
    );
}
