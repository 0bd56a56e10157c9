//! Linux guests: which task each vCPU ran at a sample (`--guest-btf`).
//!
//! The guest kernel's BTF (a copy of its `/sys/kernel/btf/vmlinux`), read with btf-rs,
//! gives the offsets of `task_struct`'s `pid`, `tgid`, `comm` and `flags`; the kernel's
//! symbol map (`--symbols`) gives where the current task is kept:
//! - AArch64: `sp_el0` holds the current task while the kernel runs (EL1); in user mode
//!   (EL0) it holds the user's stack pointer, and the task is the per-CPU
//!   `__entry_task` (the kernel's copy for its next entry), at the symbol's address plus
//!   the CPU's per-CPU offset in TPIDR_EL1.
//! - x86-64 (6.1): the per-CPU `current_task` (6.2 on: `pcpu_hot`, whose first member
//!   is the current task), at the GS base plus the symbol's (zero-based) per-CPU offset;
//!   in user mode the kernel's GS base is in KERNEL_GS_BASE (swapped on entry).
//!
//! While the VM is stopped, a task costs four small reads of guest memory through the
//! translation cache the stack copy uses (task pointer, flags, pid and tgid, comm). A
//! vCPU in user mode reads kernel memory through the page tables of the last vCPU seen
//! in the kernel, since a kernel that unmaps itself from user space (PTI, KPTI) leaves
//! the user's tables without it.

use std::collections::HashMap;
use std::path::Path;

use glass_format::{Arch, GuestTask, GUEST_TASK_KERNEL_THREAD, GUEST_TASK_UNKNOWN};
use glass_mem::TranslationCache;
use glass_target::guest::{GuestBackend, VcpuRegs};
use glass_target::guest_os::{BackendMemory, GuestMemory};
use glass_target::stop_mark::StopMark;
use glass_target::TargetError;

use crate::btf::{read_btf, struct_offsets};
use crate::kernel_data;
use crate::kernel_map::symbol_addresses;

/// Linux's TASK_COMM_LEN.
const COMM_LEN: usize = 16;
/// Linux's PF_KTHREAD.
const PF_KTHREAD: u32 = 0x0020_0000;
/// The first address of x86-64's kernel half (with 4-level paging), where its code is.
const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;

/// Where `task_struct`'s fields are (byte offsets, from BTF).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLayout {
    pub pid: u64,
    pub tgid: u64,
    pub comm: u64,
    pub flags: u64,
    /// `task_struct.mm` and `mm_struct.pgd`: a user task's page tables, to check which
    /// task an arm64 user address space belongs to.
    pub mm: Option<u64>,
    pub pgd: Option<u64>,
}

/// What one vCPU ran at this sample, as read while the VM was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct TaskRead {
    read: bool,
    /// The `task_struct`'s address.
    task: u64,
    pid: u32,
    tgid: u32,
    flags: u32,
    comm: [u8; COMM_LEN],
}

/// The current task of each vCPU of a Linux guest, read at every sample.
pub struct LinuxTasks {
    layout: TaskLayout,
    symbols: HashMap<String, u64>,
    /// x86-64: the per-CPU offset of the current task; AArch64: `__entry_task`'s address
    /// where the map has it (0: not).
    current: u64,
    /// `init_task`'s address where the map has data symbols (Debian's arm64 kallsyms
    /// has none).
    init_task: Option<u64>,
    /// AArch64 without `__entry_task`: the task last seen in the kernel with each user
    /// address space (TTBR0_EL1's table address), learned from samples in the kernel,
    /// where `sp_el0` names the task. A process's threads share one: its last one seen
    /// stands for all.
    by_user_table: HashMap<u64, u64>,
    /// Per vCPU: this sample's read, and what was last written for it.
    now: Vec<TaskRead>,
    written: Vec<Option<TaskRead>>,
    /// The registers of the last vCPU seen in the kernel: its page tables map the kernel.
    kernel_regs: Option<VcpuRegs>,
    /// Figures: tasks read, reads that failed, and the time reading took (ns).
    reads: u64,
    failed: u64,
    read_ns: Vec<u64>,
    last_read_ns: u64,
    /// The BTF's offsets were found to fit the running kernel.
    checked: bool,
    /// Why tasks are no longer read (a kernel that does not match), said at the end.
    disabled: Option<String>,
    btf: std::path::PathBuf,
}

/// Linux's PID_MAX_LIMIT: no pid is larger.
const PID_MAX_LIMIT: u32 = 4 << 20;
/// TTBR0_EL1's table address (BADDR; the ASID and CnP bits left out).
const TTBR_BADDR: u64 = 0x0000_ffff_ffff_fffe;

impl LinuxTasks {
    /// Reads the BTF and finds the kernel's symbols in the map; every failure is bad
    /// input (one line). Checked before the VM is touched.
    pub fn load(btf: &Path, symbols: &Path) -> Result<LinuxTasks, TargetError> {
        let layout = task_layout(btf)?;
        let wanted = ["init_task", "current_task", "pcpu_hot", "__entry_task"];
        let found = symbol_addresses(symbols, &wanted)?;
        Ok(LinuxTasks {
            layout,
            init_task: found.get("init_task").copied(),
            symbols: found,
            current: 0,
            by_user_table: HashMap::new(),
            now: Vec::new(),
            written: Vec::new(),
            kernel_regs: None,
            reads: 0,
            failed: 0,
            read_ns: Vec::new(),
            last_read_ns: 0,
            checked: false,
            disabled: None,
            btf: btf.to_path_buf(),
        })
    }

    /// Once connected: where this guest keeps its current task, and (with the VM
    /// stopped for it, marked for the guardian) whether the BTF and the map are of the
    /// running kernel. A guest still booting is judged at its first sample in the
    /// kernel instead.
    pub fn prepare(
        &mut self,
        backend: &mut dyn GuestBackend,
        arch: Arch,
        symbols: &Path,
        btf: &Path,
        mark: &StopMark,
    ) -> Result<(), TargetError> {
        let vcpus = backend.vcpu_count();
        self.for_guest(arch, vcpus, symbols)?;
        let mut regs = vec![VcpuRegs::zeroed(arch); vcpus];
        let mut cache = TranslationCache::new();
        mark.begin();
        let judged = match backend.stop_with_registers(&mut regs) {
            Ok(()) => {
                let mut memory = BackendMemory {
                    backend: &mut *backend,
                    cache: &mut cache,
                };
                regs.iter()
                    .enumerate()
                    .find_map(|(vcpu, r)| self.check(&mut memory, vcpu, r))
            }
            Err(_) => None,
        };
        let _ = backend.resume();
        mark.end();
        match judged {
            Some(Err(what)) => Err(TargetError::BadInput(mismatch(btf, &what))),
            Some(Ok(())) => {
                self.checked = true;
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// What the user should hear at the end.
    pub fn notes(&self) -> Vec<String> {
        self.disabled.iter().cloned().collect()
    }

    /// Once the guest's architecture and vCPUs are known: where its current task is.
    fn for_guest(&mut self, arch: Arch, vcpus: usize, symbols: &Path) -> Result<(), TargetError> {
        let names: &[&str] = match arch {
            Arch::X86_64 => &["current_task", "pcpu_hot"],
            Arch::Aarch64 => &["__entry_task"],
        };
        let found = names
            .iter()
            .find_map(|name| self.symbols.get(*name).copied());
        self.current = match (found, arch) {
            (Some(address), _) => address,
            // Learned from samples in the kernel instead (`by_user_table`).
            (None, Arch::Aarch64) => 0,
            (None, Arch::X86_64) => {
                return Err(TargetError::BadInput(format!(
                    "{}: no current_task or pcpu_hot symbol: --guest-btf on an x86-64 Linux guest needs its kernel's map with data symbols (its /proc/kallsyms) as --symbols",
                    symbols.display()
                )))
            }
        };
        self.now = vec![TaskRead::default(); vcpus];
        self.written = vec![None; vcpus];
        Ok(())
    }

    /// With the VM stopped, a vCPU in the kernel: whether the BTF's offsets fit the
    /// running kernel — the vCPU's current task must look like one (a pid and tgid
    /// Linux can give, a printable name, `swapper/N` for pid 0), or `init_task`'s name
    /// be the idle task's (`swapper`) where the map has `init_task`. `Err(what was read)`
    /// when neither; `None` when nothing could be read here.
    fn check(
        &mut self,
        memory: &mut dyn GuestMemory,
        vcpu: usize,
        r: &VcpuRegs,
    ) -> Option<Result<(), String>> {
        if !r.paging_on() || !in_kernel(r) {
            return None;
        }
        // The current task first: it needs no address from the map, which a KASLR
        // kernel's slide would make wrong (`init_task`; x86-64's per-CPU offsets do not
        // slide).
        let current = self.task_pointer(memory, vcpu, r, r).and_then(|task| {
            let got = self.fields(memory, vcpu, r, task);
            got.read.then(|| {
                let name = comm_string(&got.comm);
                let printable = !name.is_empty()
                    && got.comm.contains(&0)
                    && name.bytes().all(|b| (0x20..0x7f).contains(&b));
                let plausible = printable
                    && got.pid <= PID_MAX_LIMIT
                    && got.tgid <= PID_MAX_LIMIT
                    && (got.pid != 0 || name.starts_with("swapper"));
                if plausible {
                    Ok(())
                } else {
                    Err(format!(
                        "the current task read as pid {}, tgid {}, name \"{}\"",
                        got.pid,
                        got.tgid,
                        shown(&got.comm)
                    ))
                }
            })
        });
        if matches!(current, Some(Ok(()))) {
            return current;
        }
        let init = self.init_task.and_then(|init_task| {
            let mut comm = [0u8; COMM_LEN];
            let at = init_task.wrapping_add(self.layout.comm);
            read(memory, vcpu, r, at, &mut comm).then(|| {
                if comm_string(&comm).starts_with("swapper") {
                    Ok(())
                } else {
                    Err(format!(
                        "init_task's name read as \"{}\", not swapper",
                        shown(&comm)
                    ))
                }
            })
        });
        match (current, init) {
            (_, Some(Ok(()))) => Some(Ok(())),
            (Some(Err(what)), _) | (None, Some(Err(what))) => Some(Err(what)),
            (None, None) => None,
            (Some(Ok(())), _) => Some(Ok(())),
        }
    }

    /// Where vCPU `vcpu`'s current task is (`kernel_regs`: page tables that map the
    /// kernel).
    fn task_pointer(
        &self,
        memory: &mut dyn GuestMemory,
        vcpu: usize,
        r: &VcpuRegs,
        kernel_regs: &VcpuRegs,
    ) -> Option<u64> {
        let mut word = [0u8; 8];
        let task = match *r {
            VcpuRegs::Aarch64(a) if in_kernel(r) => a.sp_el0,
            VcpuRegs::Aarch64(a) if self.current != 0 => {
                let at = self.current.wrapping_add(a.tpidr_el1);
                read(memory, vcpu, kernel_regs, at, &mut word).then(|| u64::from_le_bytes(word))?
            }
            VcpuRegs::Aarch64(a) => {
                let task = *self.by_user_table.get(&(a.ttbr0_el1 & TTBR_BADDR))?;
                if !self.owns_tables(memory, vcpu, kernel_regs, task, a.ttbr0_el1) {
                    return None;
                }
                task
            }
            VcpuRegs::X86_64(x) => {
                // The kernel's per-CPU base is GS in the kernel, KERNEL_GS_BASE in user
                // mode; told apart by which one is a kernel address (the entry code
                // swaps them a few instructions after the mode changes).
                let base = if kernel_data(x.gs_base) {
                    x.gs_base
                } else {
                    x.k_gs_base
                };
                if !kernel_data(base) {
                    return None;
                }
                let at = base.wrapping_add(self.current);
                read(memory, vcpu, kernel_regs, at, &mut word).then(|| u64::from_le_bytes(word))?
            }
        };
        kernel_data(task).then_some(task)
    }

    /// Whether `task`'s page tables are those at `ttbr0` (its `mm->pgd`, translated):
    /// a user address space's task learned once may have exited since, its tables and
    /// its `task_struct` reused by others. Unknown (no RAM mapped, no offsets): true.
    fn owns_tables(
        &self,
        memory: &mut dyn GuestMemory,
        vcpu: usize,
        kernel_regs: &VcpuRegs,
        task: u64,
        ttbr0: u64,
    ) -> bool {
        let (Some(mm_at), Some(pgd_at)) = (self.layout.mm, self.layout.pgd) else {
            return true;
        };
        let word_at = |at: u64, memory: &mut dyn GuestMemory| {
            let mut word = [0u8; 8];
            read(memory, vcpu, kernel_regs, at, &mut word).then(|| u64::from_le_bytes(word))
        };
        let Some(mm) = word_at(task.wrapping_add(mm_at), memory).filter(|&mm| kernel_data(mm))
        else {
            return false;
        };
        let Some(pgd) = word_at(mm.wrapping_add(pgd_at), memory) else {
            return false;
        };
        let Some(physical) = memory.translate(kernel_regs, pgd) else {
            return true;
        };
        physical == Some(ttbr0 & TTBR_BADDR)
    }

    /// The task's flags, pid, tgid and name: four small reads.
    fn fields(
        &self,
        memory: &mut dyn GuestMemory,
        vcpu: usize,
        kernel_regs: &VcpuRegs,
        task: u64,
    ) -> TaskRead {
        let layout = self.layout;
        let mut got = TaskRead {
            task,
            ..TaskRead::default()
        };
        let word = |at: u64, ok: &mut bool, memory: &mut dyn GuestMemory| {
            let mut four = [0u8; 4];
            *ok = *ok && read(memory, vcpu, kernel_regs, task.wrapping_add(at), &mut four);
            u32::from_le_bytes(four)
        };
        let mut ok = true;
        got.flags = word(layout.flags, &mut ok, memory);
        got.pid = word(layout.pid, &mut ok, memory);
        got.tgid = word(layout.tgid, &mut ok, memory);
        got.read = ok
            && read(
                memory,
                vcpu,
                kernel_regs,
                task.wrapping_add(layout.comm),
                &mut got.comm,
            );
        got
    }

    /// While the VM is stopped: reads vCPU `vcpu`'s current task.
    pub fn read_task(&mut self, memory: &mut dyn GuestMemory, vcpu: usize, r: &VcpuRegs) {
        let started = std::time::Instant::now();
        let Some(slot) = self.now.get_mut(vcpu) else {
            return;
        };
        *slot = TaskRead::default();
        if !r.paging_on() || self.disabled.is_some() {
            return;
        }
        if !self.checked {
            match self.check(memory, vcpu, r) {
                Some(Ok(())) => self.checked = true,
                Some(Err(what)) => {
                    self.disabled = Some(format!(
                        "{}; no guest tasks recorded",
                        mismatch(&self.btf, &what)
                    ));
                    return;
                }
                None => {}
            }
        }
        let in_kernel = in_kernel(r);
        if in_kernel {
            self.kernel_regs = Some(*r);
        }
        // The kernel's page tables: the vCPU's own in the kernel, else the last seen
        // in the kernel (a user's may not map the kernel: PTI, KPTI), else its own.
        let kernel_regs = if in_kernel {
            *r
        } else {
            self.kernel_regs.unwrap_or(*r)
        };
        let got = match self.task_pointer(memory, vcpu, r, &kernel_regs) {
            Some(task) => {
                let got = self.fields(memory, vcpu, &kernel_regs, task);
                if let VcpuRegs::Aarch64(a) = r {
                    // A user task in the kernel: its address space is in TTBR0 (a
                    // kernel thread keeps the last user's there).
                    // Checked against the task's own tables: in a context switch TTBR0 is
                    // the next task's before sp_el0 is.
                    let learn = in_kernel
                        && got.read
                        && got.flags & PF_KTHREAD == 0
                        && got.pid != 0
                        && self.by_user_table.get(&(a.ttbr0_el1 & TTBR_BADDR)) != Some(&task);
                    if learn && self.owns_tables(memory, vcpu, &kernel_regs, task, a.ttbr0_el1) {
                        self.by_user_table.insert(a.ttbr0_el1 & TTBR_BADDR, task);
                    }
                }
                got
            }
            None => TaskRead::default(),
        };
        self.now[vcpu] = got;
        self.last_read_ns = started.elapsed().as_nanos() as u64;
    }

    /// After the VM runs again: the record to write before vCPU `vcpu`'s sample, if its
    /// task changed since the last one written (`pid`, `tid`: the vCPU's thread).
    pub fn changed(&mut self, vcpu: usize, time_ns: u64, pid: u32, tid: u32) -> Option<GuestTask> {
        let now = *self.now.get(vcpu)?;
        self.reads += 1;
        self.failed += u64::from(!now.read);
        if self.last_read_ns > 0 {
            self.read_ns.push(self.last_read_ns);
        }
        // A failed read after one that worked says the task is unknown; a run of them
        // says it once.
        let unknown_again = !now.read && self.written[vcpu].is_some_and(|w| !w.read);
        if self.written[vcpu] == Some(now)
            || unknown_again
            || (!now.read && self.written[vcpu].is_none())
        {
            return None;
        }
        self.written[vcpu] = Some(now);
        let mut flags = 0;
        if !now.read {
            flags |= GUEST_TASK_UNKNOWN;
        } else if now.flags & PF_KTHREAD != 0 || now.pid == 0 {
            flags |= GUEST_TASK_KERNEL_THREAD;
        }
        Some(GuestTask {
            time_ns,
            pid,
            tid,
            task_pid: now.pid,
            task_tgid: now.tgid,
            flags,
            comm: if now.read {
                comm_string(&now.comm)
            } else {
                String::new()
            },
        })
    }

    /// The user task vCPU `vcpu` ran at this sample, as read: its `task_struct`'s
    /// address, its tgid and name. None for a kernel thread or a task not read.
    pub fn user_task(&self, vcpu: usize) -> Option<(u64, u32, String)> {
        let now = self.now.get(vcpu)?;
        (now.read && now.flags & PF_KTHREAD == 0 && now.pid != 0)
            .then(|| (now.task, now.tgid, comm_string(&now.comm)))
    }

    /// Page tables that map the guest's kernel: the last vCPU's seen in the kernel.
    pub fn kernel_regs(&self) -> Option<VcpuRegs> {
        self.kernel_regs
    }

    /// `task_struct.mm`'s offset, where BTF has it.
    pub fn mm_offset(&self) -> Option<u64> {
        self.layout.mm
    }

    /// The vCPU is in user mode at this sample (a Linux user process runs).
    pub fn in_user_mode(r: &VcpuRegs) -> bool {
        r.paging_on() && !in_kernel(r)
    }

    /// The figures printed at the end.
    pub fn figures(&mut self) -> String {
        self.read_ns.sort_unstable();
        let at = |p: f64| {
            self.read_ns
                .get(((self.read_ns.len().max(1) - 1) as f64 * p) as usize)
                .copied()
                .unwrap_or(0) as f64
                / 1000.0
        };
        format!(
            "guest tasks (--guest-btf): {} read, {} unreadable; reading a task took p50 {:.1} us, p99 {:.1} us of the stopped time",
            self.reads - self.failed,
            self.failed,
            at(0.5),
            at(0.99)
        )
    }
}

fn mismatch(btf: &Path, what: &str) -> String {
    format!(
        "{}: not the running kernel's BTF, or --symbols not its map ({what})",
        btf.display()
    )
}

fn in_kernel(r: &VcpuRegs) -> bool {
    match r {
        VcpuRegs::Aarch64(a) => a.exception_level() >= 1,
        VcpuRegs::X86_64(x) => x.ip >= KERNEL_HALF,
    }
}

/// Reads guest-virtual `at` through `r`'s page tables (the stack copy's read); true if
/// all of `buf` was read.
fn read(memory: &mut dyn GuestMemory, vcpu: usize, r: &VcpuRegs, at: u64, buf: &mut [u8]) -> bool {
    memory.read(vcpu, r, at, buf).is_ok_and(|n| n == buf.len())
}

/// A name read from memory that may not be one, printable in one line.
fn shown(comm: &[u8]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    comm[..end].escape_ascii().to_string()
}

fn comm_string(comm: &[u8]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

/// `task_struct`'s field offsets from a BTF file.
pub fn task_layout(path: &Path) -> Result<TaskLayout, TargetError> {
    let bad = |what: String| TargetError::BadInput(format!("{}: {what}", path.display()));
    let btf = read_btf(path)?;
    let task = struct_offsets(&btf, "task_struct").ok_or_else(|| {
        bad("BTF without struct task_struct (is it a Linux kernel's vmlinux BTF?)".into())
    })?;
    let field = |name: &str| {
        task.get(name)
            .copied()
            .ok_or_else(|| bad(format!("task_struct has no {name} member")))
    };
    let mm_offsets = struct_offsets(&btf, "mm_struct").unwrap_or_default();
    Ok(TaskLayout {
        pid: field("pid")?,
        tgid: field("tgid")?,
        comm: field("comm")?,
        flags: field("flags")?,
        mm: task.get("mm").copied(),
        pgd: mm_offsets.get("pgd").copied(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's own kernel BTF, where this machine has one: the offsets are where
    /// BTF says, and consistent (pid and tgid adjacent ints, comm past them).
    #[test]
    fn host_btf_layout() {
        let path = Path::new("/sys/kernel/btf/vmlinux");
        if !path.exists() {
            eprintln!("no /sys/kernel/btf/vmlinux here");
            return;
        }
        let layout = task_layout(path).unwrap();
        assert_eq!(layout.tgid, layout.pid + 4);
        assert!(layout.comm > layout.tgid);
        assert!(layout.flags < layout.pid);
    }

    #[test]
    fn bad_btf_is_one_line() {
        let dir = std::env::temp_dir().join(format!("glass-btf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_btf = dir.join("not-btf");
        std::fs::write(&not_btf, b"hello").unwrap();
        let e = task_layout(&not_btf).unwrap_err().to_string();
        assert!(e.contains("not BTF"), "{e}");
        let broken = dir.join("broken");
        std::fs::write(&broken, [0x9f, 0xeb, 1, 0, 24, 0, 0, 0, 0xff, 0xff]).unwrap();
        let e = task_layout(&broken).unwrap_err().to_string();
        assert!(e.contains("BTF"), "{e}");
        assert!(task_layout(&dir.join("absent")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
