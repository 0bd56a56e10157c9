//! What a backend reports, as a stream: the [`Recorder`](crate::recorder::Recorder)
//! consumes each event after the target runs again — unwinding stacks, keeping module
//! maps, writing records to its [`Output`](crate::recorder::Output). Backends never
//! write records themselves, so a new consumer (a live view) sees every backend's
//! events the same way.

use glass_format::ProcessKind;
use glass_target::procfs::Mapping;
use glass_unwind::UnwindRegs;

pub enum Event<'s> {
    /// A process appears (attached, forked, or replaced by exec). `name: None` reads it
    /// from /proc; `read_maps` reads its mappings from /proc now.
    Process {
        pid: i32,
        parent: i32,
        kind: ProcessKind,
        time_ns: u64,
        name: Option<String>,
        read_maps: bool,
    },
    /// An executable mapping of a process (a guest's image segments, a perf MMAP2).
    Mapping {
        pid: i32,
        mapping: Mapping,
        time_ns: u64,
    },
    /// A thread appears or is renamed (`name: None` reads it from /proc).
    Thread {
        pid: i32,
        tid: i32,
        name: Option<String>,
    },
    ThreadExit {
        pid: i32,
        tid: i32,
        time_ns: u64,
    },
    /// A VM guest's vCPU (the task's `pid`, `tid`) runs another task of the guest's
    /// operating system from here on (the sample of its time and those after it).
    GuestTask(glass_format::GuestTask),
    /// A process is gone: its address space is forgotten.
    ProcessExit {
        pid: i32,
    },
    /// A sample already unwound (`frames[0]` the instruction pointer).
    Frames {
        pid: i32,
        tid: i32,
        time_ns: u64,
        stopped_ns: u32,
        flags: u8,
        frames: &'s [u64],
    },
    /// A sample of registers and a copy of the stack from `regs.sp`, to be unwound.
    Stack {
        pid: i32,
        tid: i32,
        time_ns: u64,
        stopped_ns: u32,
        flags: u8,
        regs: UnwindRegs,
        stack: &'s [u8],
        /// More stack ranges (each its address, its bytes) where the walk leaves the
        /// first for another stack (a Linux guest's IRQ stack back to the interrupted
        /// task's; an exception stack back to an IRQ stack, then the task's).
        other_stacks: &'s [(u64, &'s [u8])],
        /// The address space whose modules unwind it, where not `pid`'s: a Linux
        /// guest process's user stack (its binaries under a pid of its own,
        /// `glass_format::GUEST_PROCESS_PIDS`) sampled on a vCPU thread.
        space: Option<i32>,
    },
}

impl Event<'_> {
    /// A thread, named from /proc.
    pub fn thread(pid: i32, tid: i32) -> Self {
        Event::Thread {
            pid,
            tid,
            name: None,
        }
    }

    /// A process, named from /proc; `read_maps`: its mappings read from /proc now.
    pub fn process(
        pid: i32,
        parent: i32,
        kind: ProcessKind,
        time_ns: u64,
        read_maps: bool,
    ) -> Self {
        Event::Process {
            pid,
            parent,
            kind,
            time_ns,
            name: None,
            read_maps,
        }
    }
}
