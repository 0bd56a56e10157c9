//! Where the recorder's records go, as one trait: the `.glass` file's [`Writer`] for
//! `glass record`, or a live view (`glass top`) that shows them as they come. Kept apart
//! from the recorder so a new consumer implements this and nothing else.

use std::io;

use glass_format::{
    GuestRam, GuestTask, JitMap, KernelSymbols, Meta, Module, Process, PyCode, PyStack, Snapshot,
    Summary, Thread, ThreadExit, ThreadLost, Writer,
};

/// Where the recorder's records go: the `.glass` file ([`Writer`]) for `glass record`;
/// a live view can take them instead.
pub trait Output {
    fn meta(&mut self, meta: &Meta) -> io::Result<()>;
    fn process(&mut self, process: &Process) -> io::Result<()>;
    fn module(&mut self, module: &Module) -> io::Result<()>;
    fn thread(&mut self, thread: &Thread) -> io::Result<()>;
    fn thread_exit(&mut self, exit: &ThreadExit) -> io::Result<()>;
    /// An unwound sample: `frames[0]` is the instruction pointer.
    fn sample(
        &mut self,
        time_ns: u64,
        pid: u32,
        tid: u32,
        stopped_ns: u32,
        flags: u8,
        frames: &[u64],
    ) -> io::Result<()>;
    /// A raw sample (`--capture raw`), unwound by the report.
    fn snapshot(&mut self, snapshot: &Snapshot) -> io::Result<()>;
    fn summary(&mut self, summary: &Summary) -> io::Result<()>;
    /// A copy of a process's JIT description files.
    fn jit_map(&mut self, map: &JitMap) -> io::Result<()>;
    fn end(&mut self) -> io::Result<()>;
    fn flush(&mut self) -> io::Result<()>;
    /// The running counts, after every tick and flush: a live view shows the cost as
    /// it goes (the file has it once, in the summary).
    fn progress(&mut self, _progress: &Progress) {}
    /// Samples the kernel dropped for a thread (written at the end).
    fn thread_lost(&mut self, _lost: &ThreadLost) -> io::Result<()> {
        Ok(())
    }
    /// The names of the kernel functions the samples' kernel frames fall in.
    fn kernel_symbols(&mut self, _symbols: &KernelSymbols) -> io::Result<()> {
        Ok(())
    }
    /// A VM guest's vCPU runs another task of the guest from here on.
    fn guest_task(&mut self, _task: &GuestTask) -> io::Result<()> {
        Ok(())
    }

    /// A warning every report of the recording repeats.
    fn note(&mut self, _note: &str) -> io::Result<()> {
        Ok(())
    }
    /// A Python code object the Python frames name.
    fn py_code(&mut self, _code: &PyCode) -> io::Result<()> {
        Ok(())
    }
    /// Where a VM guest's RAM is read from (once, after the Meta record).
    fn guest_ram(&mut self, _ram: &GuestRam) -> io::Result<()> {
        Ok(())
    }
    /// The Python frames of the sample just written.
    fn py_stack(&mut self, _stack: &PyStack) -> io::Result<()> {
        Ok(())
    }
}

/// The recording's counts so far, for [`Output::progress`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Progress {
    pub time_ns: u64,
    /// How long the target was held stopped at this tick; None for a flush.
    pub tick_stopped_ns: Option<u64>,
    pub ticks: u64,
    pub lost: u64,
    pub missed_deadlines: u64,
}

impl<W: io::Write> Output for Writer<W> {
    fn meta(&mut self, meta: &Meta) -> io::Result<()> {
        Writer::meta(self, meta)
    }
    fn process(&mut self, process: &Process) -> io::Result<()> {
        Writer::process(self, process)
    }
    fn module(&mut self, module: &Module) -> io::Result<()> {
        Writer::module(self, module)
    }
    fn thread(&mut self, thread: &Thread) -> io::Result<()> {
        Writer::thread(self, thread)
    }
    fn thread_exit(&mut self, exit: &ThreadExit) -> io::Result<()> {
        Writer::thread_exit(self, exit)
    }
    fn sample(
        &mut self,
        time_ns: u64,
        pid: u32,
        tid: u32,
        stopped_ns: u32,
        flags: u8,
        frames: &[u64],
    ) -> io::Result<()> {
        Writer::sample(self, time_ns, pid, tid, stopped_ns, flags, frames)
    }
    fn snapshot(&mut self, snapshot: &Snapshot) -> io::Result<()> {
        Writer::snapshot(self, snapshot)
    }
    fn summary(&mut self, summary: &Summary) -> io::Result<()> {
        Writer::summary(self, summary)
    }
    fn jit_map(&mut self, map: &JitMap) -> io::Result<()> {
        Writer::jit_map(self, map)
    }
    fn end(&mut self) -> io::Result<()> {
        Writer::end(self)
    }
    fn flush(&mut self) -> io::Result<()> {
        Writer::flush(self)
    }
    fn thread_lost(&mut self, lost: &ThreadLost) -> io::Result<()> {
        Writer::thread_lost(self, lost)
    }
    fn py_code(&mut self, code: &PyCode) -> io::Result<()> {
        Writer::py_code(self, code)
    }
    fn py_stack(&mut self, stack: &PyStack) -> io::Result<()> {
        Writer::py_stack(self, stack)
    }
    fn kernel_symbols(&mut self, symbols: &KernelSymbols) -> io::Result<()> {
        Writer::kernel_symbols(self, symbols)
    }
    fn guest_task(&mut self, task: &GuestTask) -> io::Result<()> {
        Writer::guest_task(self, task)
    }
    fn note(&mut self, note: &str) -> io::Result<()> {
        Writer::note(self, note)
    }
    fn guest_ram(&mut self, ram: &GuestRam) -> io::Result<()> {
        Writer::guest_ram(self, ram)
    }
}
