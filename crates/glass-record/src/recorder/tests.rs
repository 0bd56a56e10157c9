//! The recorder fed a fixed script of events, its records and notes kept as text: what
//! a recording writes for given events must not change when the recorder's insides do
//! (the transcript beside this file is what it wrote when the script was made). Values
//! read from clocks, the host's name and /proc/kallsyms are left out: they differ per
//! run or machine.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::rc::Rc;

use glass_format::{
    Arch, Backend, GuestRam, GuestTask, JitMap, KernelSymbols, Meta, Module, Process, ProcessKind,
    PyCode, PyFrame, PyStack, Snapshot, Summary, Thread, ThreadExit, ThreadLost,
};
use glass_target::procfs::Mapping;
use glass_unwind::orc::OrcTable;
use glass_unwind::UnwindRegs;

use super::{Output, Progress, Recorder};
use crate::event::Event;
use crate::{BackendChoice, CaptureMode, Notes, RecordOptions, UnwindMode};

/// No process has these pids (above the kernel's largest pid_max): nothing of them is
/// found in /proc, so the script's processes are what the events say.
const APP: i32 = 9_000_001;
const CHILD: i32 = 9_000_002;
const GUEST: i32 = 9_000_003;
const GUEST_USER: i32 = glass_format::GUEST_PROCESS_PIDS as i32 + 7;

#[derive(Clone, Default)]
struct Transcript(Rc<RefCell<String>>);

impl Transcript {
    fn line(&self, line: std::fmt::Arguments) {
        let mut text = self.0.borrow_mut();
        let _ = text.write_fmt(line);
        text.push('\n');
    }
}

impl Notes for Transcript {
    fn warn(&mut self, text: &str) {
        self.line(format_args!("warn: {text}"));
    }
    fn figure(&mut self, text: &str) {
        self.line(format_args!("figure: {text}"));
    }
}

/// An [`Output`] method that writes its record as it is.
macro_rules! as_is {
    ($($method:ident: $record:ty),* $(,)?) => {
        $(fn $method(&mut self, record: &$record) -> std::io::Result<()> {
            self.line(format_args!("{record:?}"));
            Ok(())
        })*
    };
}

impl Output for Transcript {
    as_is!(
        process: Process,
        module: Module,
        thread_exit: ThreadExit,
        jit_map: JitMap,
        thread_lost: ThreadLost,
        guest_task: GuestTask,
        py_code: PyCode,
        guest_ram: GuestRam,
        py_stack: PyStack,
    );
    fn meta(&mut self, meta: &Meta) -> std::io::Result<()> {
        let meta = Meta {
            start_unix_ns: 0,
            hostname: String::new(),
            ..meta.clone()
        };
        self.line(format_args!("{meta:?}"));
        Ok(())
    }
    fn thread(&mut self, thread: &Thread) -> std::io::Result<()> {
        let thread = Thread {
            time_ns: 0,
            ..thread.clone()
        };
        self.line(format_args!("{thread:?}"));
        Ok(())
    }
    fn sample(
        &mut self,
        time_ns: u64,
        pid: u32,
        tid: u32,
        stopped_ns: u32,
        flags: u8,
        frames: &[u64],
    ) -> std::io::Result<()> {
        self.line(format_args!(
            "sample {time_ns} {pid}/{tid} stopped {stopped_ns} flags {flags:#x} {frames:x?}"
        ));
        Ok(())
    }
    fn snapshot(&mut self, snapshot: &Snapshot) -> std::io::Result<()> {
        self.line(format_args!("{snapshot:x?}"));
        Ok(())
    }
    fn summary(&mut self, summary: &Summary) -> std::io::Result<()> {
        let summary = Summary {
            duration_ns: 0,
            ..summary.clone()
        };
        self.line(format_args!("{summary:?}"));
        Ok(())
    }
    fn end(&mut self) -> std::io::Result<()> {
        self.line(format_args!("end"));
        Ok(())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.line(format_args!("flush"));
        Ok(())
    }
    fn progress(&mut self, progress: &Progress) {
        self.line(format_args!(
            "progress tick {:?} ticks {} lost {} missed {}",
            progress.tick_stopped_ns, progress.ticks, progress.lost, progress.missed_deadlines
        ));
    }
    fn kernel_symbols(&mut self, _symbols: &KernelSymbols) -> std::io::Result<()> {
        self.line(format_args!(
            "kernel symbols (from this machine's kallsyms)"
        ));
        Ok(())
    }
    fn note(&mut self, note: &str) -> std::io::Result<()> {
        self.line(format_args!("note: {note}"));
        Ok(())
    }
}

fn options(unwind: UnwindMode, capture: CaptureMode) -> RecordOptions {
    RecordOptions {
        output: "script.glass".into(),
        frequency: 997,
        duration: None,
        max_depth: 6,
        pid: None,
        gdb: None,
        qmp: None,
        libvirt: None,
        xen: None,
        symbols: None,
        guest_memory: None,
        guest_btf: None,
        guest_root: None,
        vm: false,
        keep_vm: false,
        no_translation_cache: false,
        max_stopped: None,
        clock: None,
        sampler_cpu: None,
        backend: BackendChoice::Auto,
        unwind,
        capture,
        stack_size: None,
        ring_kib: None,
        kernel: None,
        off_cpu: false,
        no_idle: false,
        no_python: false,
        command: vec!["app".into(), "--work".into()],
    }
}

fn mapping(start: u64, end: u64, path: &str) -> Mapping {
    Mapping {
        start,
        end,
        file_offset: 0x1000,
        path: path.into(),
        deleted: false,
    }
}

/// A stack copy from `sp`: `words` (address, value) set, zeros elsewhere.
fn stack(sp: u64, len: usize, words: &[(u64, u64)]) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    for &(address, value) in words {
        let at = (address - sp) as usize;
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }
    bytes
}

/// Writes what the recorder says of itself at the end (what `glass record` prints).
fn said(log: &Transcript, sink: &Recorder) {
    log.line(format_args!(
        "threads sampled {}, lost by thread {:?}, kernel samples {}, off-CPU {} samples {} ns, python {:?}, kernel stacks {:?}, walks outside copies {}, sampling {:?}",
        sink.threads_sampled(),
        sink.lost_by_thread(),
        sink.kernel_samples(),
        sink.off_cpu().0,
        sink.off_cpu().1,
        sink.python_outcome(),
        sink.kernel_stacks(),
        sink.walks_outside_copies(),
        sink.sampling_window().0.is_some(),
    ));
}

/// A host process under the frame-pointer walk: processes, modules (a kallsyms-style
/// symbol table among them), threads, samples unwound from copies (whole, cut, and a
/// leaf without a frame), kernel frames, off-CPU time, lost samples, Python frames, and
/// the JIT files kept at the end.
fn host_process(log: &Transcript, dir: &std::path::Path) {
    let args = options(UnwindMode::Fp, CaptureMode::Frames);
    let mut notes = log.clone();
    let mut sink = Recorder::new(
        &args,
        Box::new(log.clone()),
        &mut notes,
        crate::DEFAULT_STOP_BOUND,
    );
    sink.write_meta(Backend::Perf, Arch::X86_64, "fp", APP)
        .unwrap();
    let symbols = dir.join("symbols.txt");
    std::fs::write(
        &symbols,
        "0000000000600000 T first\n0000000000600100 T second\n0000000000600200 t third\n",
    )
    .unwrap();
    let jit_map = format!("/tmp/perf-{APP}.map");
    std::fs::write(&jit_map, "700000 40 jitted_one\n700040 40 jitted_two\n").unwrap();
    let events: Vec<Event> = vec![
        Event::Process {
            pid: APP,
            parent: 1,
            kind: ProcessKind::Attached,
            time_ns: 10,
            name: Some("app".into()),
            read_maps: true,
        },
        Event::Mapping {
            pid: APP,
            mapping: mapping(0x40_0000, 0x50_0000, "/nonexistent/app"),
            time_ns: 11,
        },
        Event::Mapping {
            pid: APP,
            mapping: mapping(0x60_0000, 0x60_1000, symbols.to_str().unwrap()),
            time_ns: 12,
        },
        Event::Mapping {
            pid: APP,
            mapping: mapping(0x70_0000, 0x70_1000, "/tmp/jit-9000001.dump"),
            time_ns: 13,
        },
        Event::Mapping {
            pid: APP,
            mapping: mapping(0x40_0000, 0x50_0000, "/nonexistent/app"),
            time_ns: 14,
        },
        Event::Thread {
            pid: APP,
            tid: APP,
            name: Some("app".into()),
        },
        Event::Thread {
            pid: APP,
            tid: APP + 10,
            name: Some("worker".into()),
        },
        Event::thread(APP, APP + 11),
        Event::Thread {
            pid: APP,
            tid: APP + 10,
            name: Some("worker".into()),
        },
    ];
    for event in events {
        log.line(format_args!("-> {}", sink.handle(event).unwrap()));
    }
    sink.sampling_began();
    sink.tick_at(1500, 1_000_000);
    sink.deadlines_missed(2);
    sink.samples_lost(3);
    sink.lost_by(APP, APP + 10, 4);
    sink.lost_by(APP, APP, 1);
    sink.lost_by(APP, APP + 10, 2);
    // A whole chain: leaf at 0x401000, callers 0x402000 and 0x403000.
    let sp = 0x7fff_0000u64;
    let whole = stack(
        sp,
        0x100,
        &[
            (sp + 0x20, sp + 0x40),
            (sp + 0x28, 0x40_2000),
            (sp + 0x40, 0),
            (sp + 0x48, 0x40_3000),
        ],
    );
    let samples = [
        (UnwindRegs::new(0x40_1000, sp, sp + 0x20), &whole[..]),
        // Cut: the chain leads past the copy.
        (UnwindRegs::new(0x40_1000, sp, sp + 0x20), &whole[..0x30]),
        // A leaf without a frame: its caller from the return address at sp.
        (
            UnwindRegs::new(0x40_1100, sp, sp + 0x20),
            &stack(
                sp,
                0x100,
                &[
                    (sp, 0x40_1800),
                    (sp + 0x20, sp + 0x40),
                    (sp + 0x28, 0x40_2000),
                ],
            )[..],
        ),
        // An address outside every mapping (the map is re-read from /proc, in vain).
        (UnwindRegs::new(0x90_0000, sp, sp + 0x20), &whole[..]),
    ];
    for (n, (regs, bytes)) in samples.into_iter().enumerate() {
        let wanted = sink
            .handle(Event::Stack {
                pid: APP,
                tid: APP + 10,
                time_ns: 2_000_000 + n as u64,
                stopped_ns: 700,
                flags: glass_format::SAMPLE_IN_SYSCALL,
                regs,
                stack: bytes,
                other_stacks: &[],
                space: None,
            })
            .unwrap();
        log.line(format_args!("-> wanted {wanted}"));
    }
    let kernel = [0xffff_ffff_8100_0010u64, 0xffff_ffff_8100_0200];
    let wanted = sink
        .stack_sample_with_kernel(
            APP,
            APP,
            3_000_000,
            800,
            0,
            UnwindRegs::new(0x40_1000, sp, sp + 0x20),
            &whole,
            &kernel,
        )
        .unwrap();
    log.line(format_args!("-> wanted {wanted}"));
    let mut frames = vec![0x40_1100, 0x40_2000];
    sink.recover_leaf_caller(
        APP,
        UnwindRegs::new(0x40_1100, sp, sp + 0x20),
        [Some(0x40_1900), None],
        &mut frames,
    )
    .unwrap();
    log.line(format_args!("recovered {frames:x?}"));
    let mut frames = Vec::new();
    let flags = sink.unwind_blocked(
        APP,
        UnwindRegs::new(0x40_1000, sp, sp + 0x20),
        &whole,
        &kernel[1..],
        &mut frames,
    );
    log.line(format_args!("blocked {flags:#x} {frames:x?}"));
    sink.off_cpu_sample(APP, APP + 10, 4_000_000, 9_000_000_000, flags, &frames)
        .unwrap();
    sink.py_code(&PyCode {
        pid: APP as u32,
        id: 1,
        name: "main".into(),
        file: "app.py".into(),
        first_line: 3,
    })
    .unwrap();
    sink.py_stack(&PyStack {
        time_ns: 3_000_000,
        pid: APP as u32,
        tid: APP as u32,
        frames: vec![PyFrame {
            code: 1,
            line: 4,
            entry: true,
        }],
    })
    .unwrap();
    sink.tick(900);
    sink.tick_at(1100, 5_000_000);
    log.line(format_args!("ticks {}", sink.ticks()));
    // Late samples: the file is flushed when a flush period has passed by their time.
    for n in 0..2 {
        sink.handle(Event::Frames {
            pid: APP,
            tid: APP,
            time_ns: 100_000_000_000 + n,
            stopped_ns: 500,
            flags: 0,
            frames: &[0x40_1000, 0x40_2000],
        })
        .unwrap();
    }
    // A fork inherits the parent's modules; an exec starts afresh.
    let events: Vec<Event> = vec![
        Event::Process {
            pid: CHILD,
            parent: APP,
            kind: ProcessKind::Forked,
            time_ns: 20,
            name: Some("app".into()),
            read_maps: false,
        },
        Event::Frames {
            pid: CHILD,
            tid: CHILD,
            time_ns: 6_000_000,
            stopped_ns: 300,
            flags: 0,
            frames: &[0x40_1000, 0x60_0150],
        },
        Event::Process {
            pid: CHILD,
            parent: APP,
            kind: ProcessKind::Exec,
            time_ns: 21,
            name: Some("other".into()),
            read_maps: true,
        },
        Event::Thread {
            pid: CHILD,
            tid: CHILD,
            name: Some("other".into()),
        },
        Event::ThreadExit {
            pid: APP,
            tid: APP + 10,
            time_ns: 7_000_000,
        },
        Event::ProcessExit { pid: CHILD },
    ];
    for event in events {
        log.line(format_args!("-> {}", sink.handle(event).unwrap()));
    }
    sink.refresh_thread_names(&[(APP, APP + 12)]).unwrap();
    log.line(format_args!(
        "knows {} {}",
        sink.knows_thread(APP + 10),
        sink.knows_thread(APP + 12)
    ));
    sink.warn_kept("something to repeat").unwrap();
    sink.kernel_stacks_recorded(Err("not permitted".into()));
    sink.python_frames_outcome(Some("Python 3.12: frames read".into()));
    sink.sampling_ended();
    sink.flush().unwrap();
    let summary = sink.summary(Some(3));
    sink.finish(&summary).unwrap();
    said(log, &sink);
    let _ = std::fs::remove_file(jit_map);
}

/// `--capture raw` under the automatic unwinder: stacks compacted and stored.
fn raw_capture(log: &Transcript) {
    let args = options(UnwindMode::Auto, CaptureMode::Raw);
    let mut notes = log.clone();
    let mut sink = Recorder::new(
        &args,
        Box::new(log.clone()),
        &mut notes,
        crate::DEFAULT_STOP_BOUND,
    );
    sink.write_meta(Backend::Ptrace, Arch::X86_64, "auto", APP)
        .unwrap();
    sink.handle(Event::Process {
        pid: APP,
        parent: 0,
        kind: ProcessKind::Attached,
        time_ns: 0,
        name: Some("raw".into()),
        read_maps: false,
    })
    .unwrap();
    sink.handle(Event::Mapping {
        pid: APP,
        mapping: mapping(0x40_0000, 0x50_0000, "/nonexistent/raw"),
        time_ns: 1,
    })
    .unwrap();
    let sp = 0x7ffe_0000u64;
    let bytes = stack(
        sp,
        0x80,
        &[
            (sp + 0x8, 0x1234_5678),
            (sp + 0x10, sp + 0x30),
            (sp + 0x18, 0x40_2000),
            (sp + 0x30, 0),
            (sp + 0x38, 0x40_3000),
            (sp + 0x40, 0x40_4000),
        ],
    );
    for kernel in [&[][..], &[0xffff_ffff_8100_0010][..]] {
        let wanted = sink
            .stack_sample_with_kernel(
                APP,
                APP,
                1_000,
                200,
                glass_format::SAMPLE_IN_SYSCALL,
                UnwindRegs::new(0x40_1000, sp, sp + 0x10),
                &bytes,
                kernel,
            )
            .unwrap();
        log.line(format_args!("-> wanted {wanted}"));
    }
    sink.tick_at(200, 2_000);
    let summary = sink.summary(None);
    sink.finish(&summary).unwrap();
    said(log, &sink);
}

/// One `struct orc_entry`'s bytes.
fn orc_entry(sp_reg: u8, sp_offset: i16, kind: u8, end: bool) -> [u8; 6] {
    let [s0, s1] = sp_offset.to_le_bytes();
    [s0, s1, 0, 0, sp_reg, kind | (u8::from(end) << 2)]
}

/// A Linux guest: no /proc, kernel stacks walked with the guest's ORC tables (across
/// another stack, and out of every copy), a guest process's user stack in its own
/// address space.
fn guest(log: &Transcript) {
    const REG_SP: u8 = 5;
    const REG_SP_INDIRECT: u8 = 9;
    const REG_UNDEFINED: u8 = 0;
    let args = options(UnwindMode::Auto, CaptureMode::Frames);
    let mut notes = log.clone();
    let mut sink = Recorder::new(
        &args,
        Box::new(log.clone()),
        &mut notes,
        crate::DEFAULT_STOP_BOUND,
    );
    sink.without_proc();
    sink.write_meta(Backend::GdbStub, Arch::X86_64, "auto", GUEST)
        .unwrap();
    sink.guest_ram(&GuestRam::File {
        path: "/dev/shm/ram".into(),
        bytes: 1 << 30,
    })
    .unwrap();
    let base = 0xffff_ffff_8100_0000u64;
    let entries = [
        (base, orc_entry(REG_SP, 8, 0, false)),
        (base + 0x100, orc_entry(REG_SP_INDIRECT, 8, 0, false)),
        (base + 0x200, orc_entry(REG_SP, 8, 0, false)),
        (base + 0x300, orc_entry(REG_UNDEFINED, 0, 0, true)),
        (base + 0x400, orc_entry(REG_UNDEFINED, 0, 0, false)),
    ];
    let ip_at = base - 0x1000;
    let mut ips = Vec::new();
    let mut orcs = Vec::new();
    for (i, (at, entry)) in entries.iter().enumerate() {
        let offset = at.wrapping_sub(ip_at + 4 * i as u64) as i32;
        ips.extend_from_slice(&offset.to_le_bytes());
        orcs.extend_from_slice(entry);
    }
    sink.walk_guest_kernel_with(OrcTable::parse(ip_at, &ips, &orcs).unwrap());
    let events: Vec<Event> = vec![
        Event::Process {
            pid: GUEST,
            parent: 0,
            kind: ProcessKind::Attached,
            time_ns: 0,
            name: Some("vmlinux".into()),
            read_maps: true,
        },
        Event::Mapping {
            pid: GUEST,
            mapping: mapping(base, base + 0x10_0000, "/nonexistent/vmlinux"),
            time_ns: 0,
        },
        Event::Mapping {
            pid: GUEST,
            mapping: mapping(0x1000, 0x2000, "[vdso]"),
            time_ns: 0,
        },
        Event::Thread {
            pid: GUEST,
            tid: 1,
            name: Some("vCPU 0".into()),
        },
        Event::GuestTask(GuestTask {
            time_ns: 5,
            pid: GUEST as u32,
            tid: 1,
            task_pid: 42,
            task_tgid: 42,
            flags: 0,
            comm: "worker".into(),
        }),
        Event::Process {
            pid: GUEST_USER,
            parent: GUEST,
            kind: ProcessKind::Attached,
            time_ns: 5,
            name: Some("worker".into()),
            read_maps: false,
        },
        Event::Mapping {
            pid: GUEST_USER,
            mapping: mapping(0x55_0000, 0x56_0000, "/nonexistent/worker"),
            time_ns: 5,
        },
    ];
    for event in events {
        log.line(format_args!("-> {}", sink.handle(event).unwrap()));
    }
    let irq_sp = 0xffff_c900_0000_0000u64;
    let task_sp = 0xffff_c900_0010_0000u64;
    // The handler returns into a function that switched stacks (its top word: the
    // task's stack pointer), which returns on the task's stack.
    let irq = stack(
        irq_sp,
        0x40,
        &[(irq_sp, base + 0x110), (irq_sp + 8, task_sp)],
    );
    let task = stack(
        task_sp,
        0x40,
        &[(task_sp, base + 0x210), (task_sp + 8, base + 0x310)],
    );
    let with_task: &[(u64, &[u8])] = &[(task_sp, &task)];
    // The second without the task's stack: the walk wanted memory outside every copy.
    let sampled = [(with_task, 1), (&[], 2), (with_task, 3)];
    for (others, n) in sampled {
        let before = sink.walks_outside_copies();
        let wanted = sink
            .handle(Event::Stack {
                pid: GUEST,
                tid: 1,
                time_ns: 1_000 * n,
                stopped_ns: 50,
                flags: 0,
                regs: UnwindRegs::new(base + 0x10, irq_sp, 0),
                stack: &irq,
                other_stacks: others,
                space: None,
            })
            .unwrap();
        log.line(format_args!(
            "-> wanted {wanted}, outside {}",
            sink.walks_outside_copies() - before
        ));
    }
    // A guest process's user stack: the walk stops at its outermost frame in its own
    // code (past it, whatever the kernel put there).
    let sp = 0x7ff0_0000u64;
    let user = stack(
        sp,
        0x60,
        &[
            (sp + 0x10, sp + 0x30),
            (sp + 0x18, 0x55_1000),
            (sp + 0x30, sp + 0x50),
            (sp + 0x38, 0x3),
        ],
    );
    let wanted = sink
        .handle(Event::Stack {
            pid: GUEST,
            tid: 1,
            time_ns: 4_000,
            stopped_ns: 60,
            flags: 0,
            regs: UnwindRegs::new(0x55_0100, sp, sp + 0x10),
            stack: &user,
            other_stacks: &[],
            space: Some(GUEST_USER),
        })
        .unwrap();
    log.line(format_args!("-> wanted {wanted}"));
    sink.deadlines_missed(1);
    sink.tick_at(50, 1_000);
    sink.tick_at(60, 4_000);
    let summary = sink.summary(None);
    sink.finish(&summary).unwrap();
    said(log, &sink);
}

#[test]
fn a_fixed_script_records_the_same() {
    let dir = std::env::temp_dir().join(format!("glass-recorder-script-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = Transcript::default();
    log.line(format_args!("# host process, frame pointers"));
    host_process(&log, &dir);
    log.line(format_args!("# raw capture"));
    raw_capture(&log);
    log.line(format_args!("# guest"));
    guest(&log);
    let _ = std::fs::remove_dir_all(&dir);
    let written = log.0.borrow().replace(dir.to_str().unwrap(), "DIR");
    let expected = include_str!("transcript.txt");
    if written != expected {
        let actual = std::env::temp_dir().join("glass-recorder-transcript.txt");
        std::fs::write(&actual, &written).unwrap();
        panic!(
            "the recorder wrote other records for the script: see {} (diff it with src/recorder/transcript.txt)",
            actual.display()
        );
    }
}

/// A process's vDSO is no file the report could read: its functions are kept as a
/// perf map read from the process's memory (here, this test's own).
#[test]
fn the_vdso_is_kept_as_a_perf_map() {
    let pid = std::process::id() as i32;
    let Some(vdso) = glass_target::procfs::executable_mappings(pid)
        .unwrap()
        .into_iter()
        .find(|m| glass_symbols::vdso::is_vdso(&m.path))
    else {
        return;
    };
    let mut image = vec![0u8; (vdso.end - vdso.start) as usize];
    let mem = std::fs::File::open("/proc/self/mem").unwrap();
    std::os::unix::fs::FileExt::read_exact_at(&mem, &mut image, vdso.start).unwrap();
    let expected = glass_symbols::vdso::perf_map(&image, vdso.start);
    let args = options(UnwindMode::Fp, CaptureMode::Frames);
    let log = Transcript::default();
    let mut notes = log.clone();
    let mut sink = Recorder::new(
        &args,
        Box::new(log.clone()),
        &mut notes,
        crate::DEFAULT_STOP_BOUND,
    );
    sink.write_meta(Backend::Perf, Arch::host(), "fp", pid)
        .unwrap();
    sink.handle(Event::Mapping {
        pid,
        mapping: vdso,
        time_ns: 0,
    })
    .unwrap();
    let summary = sink.summary(None);
    sink.finish(&summary).unwrap();
    let kept = format!(
        "{:?}",
        JitMap {
            pid: pid as u32,
            name: glass_symbols::vdso::MODULE.into(),
            text: expected.unwrap(),
        }
    );
    assert!(log.0.borrow().lines().any(|line| line == kept));
}
