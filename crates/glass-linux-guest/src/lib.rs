//! What a Linux guest kernel's memory means, for the guest sampling loop: the loop asks
//! through glass-target's [`GuestOs`] hook, and [`LinuxGuest`] answers from the kernel's
//! BTF (`--guest-btf`), its symbol map (`--symbols`) and reads of guest memory.
//!
//! - [`tasks`]: which task each vCPU runs (`task_struct` offsets from BTF).
//! - [`user`]: a guest process's executable mappings and user stack (`--guest-root`).
//! - [`orc`]: the x86-64 kernel's and loadable modules' ORC tables, and where a kernel
//!   stack continues on another (IRQ and exception stacks).
//! - [`kaslr`]: where a relocated kernel runs; [`entries`]: its entry points, where a
//!   vCPU stopped on one is taken as the context it interrupted.
//! - [`btf`], [`kernel_map`]: the kernel's BTF and its map's data symbols.

pub mod btf;
pub mod entries;
pub mod kaslr;
pub mod kernel_map;
pub mod orc;
pub mod tasks;
pub mod user;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

use glass_format::{Arch, GuestTask};
use glass_target::guest::{GuestBackend, VcpuRegs};
use glass_target::guest_os::{
    GuestMemory, GuestOs, Said, Slide, StackSwitch, TaskAtStop, UserSpace, VcpuAt,
};
use glass_target::stop_mark::StopMark;
use glass_target::TargetError;
use glass_unwind::orc::OrcTable;

use entries::Entries;
use kaslr::Kaslr;
use orc::LinuxOrc;
use tasks::LinuxTasks;
use user::{GuestProcesses, MmLayout};

/// A kernel data address: top byte all ones. Not the kernel half's start: AArch64's
/// linear map, where tasks live (all but `init_task`), starts at 0xffff000000000000 with
/// 48-bit VAs, and x86-64's with 5-level paging at 0xff11000000000000.
pub fn kernel_data(address: u64) -> bool {
    address >> 56 == 0xff
}

/// A Linux guest as the guest loop sees it: its tasks (`--guest-btf`), its processes'
/// user space (`--guest-root`), its kernel's ORC tables and slide (a symbol table).
pub struct LinuxGuest {
    symbols: PathBuf,
    btf: Option<PathBuf>,
    /// The image is a symbol table (a kallsyms, a System.map), not an ELF.
    symbol_table: bool,
    tasks: Option<LinuxTasks>,
    user: Option<GuestProcesses>,
    kaslr: Kaslr,
    /// The kernel's entry points, from a symbol table.
    entries: Entries,
    /// An x86-64 Linux kernel's ORC tables, to read once, and its IRQ stacks.
    orc: Option<LinuxOrc>,
    modules: ModuleTables,
}

/// The loadable modules' ORC: the kernel's own table once read, the modules' (their
/// code's spans) merged with it, and when the modules list was last read.
#[derive(Default)]
struct ModuleTables {
    kernel: Option<OrcTable>,
    spans: Vec<(u64, u64)>,
    read_at: Option<Instant>,
    /// The `modules` list head's words at the last reading, and whether a module on it
    /// had no ORC yet.
    ends: Option<[u8; 16]>,
    incomplete: bool,
    incomplete_readings: u32,
    /// Readings of the list, and the modules and entries the last that changed found.
    readings: u32,
    found: Option<(usize, usize)>,
}

impl LinuxGuest {
    /// Reads what the guest is described by before the VM is touched: every failure is
    /// one line of bad input. `symbol_table`: `symbols` is a table, not an ELF image.
    pub fn load(
        symbols: &Path,
        symbol_table: bool,
        btf: Option<&Path>,
        root: Option<&Path>,
    ) -> Result<LinuxGuest, TargetError> {
        let tasks = match btf {
            Some(btf) => Some(LinuxTasks::load(btf, symbols)?),
            None => None,
        };
        let user = match (root, btf, &tasks) {
            (Some(root), Some(btf), Some(tasks)) => Some(GuestProcesses::new(
                MmLayout::load(btf, tasks.mm_offset())?,
                root.to_path_buf(),
            )),
            _ => None,
        };
        Ok(LinuxGuest {
            symbols: symbols.to_path_buf(),
            btf: btf.map(Path::to_path_buf),
            symbol_table,
            tasks,
            user,
            kaslr: match symbol_table {
                true => Kaslr::from_table(symbols),
                false => Kaslr::default(),
            },
            entries: match symbol_table {
                true => Entries::from_table(symbols),
                false => Entries::default(),
            },
            orc: None,
            modules: ModuleTables::default(),
        })
    }

    /// Reads the kernel's ORC tables once a vCPU is in the kernel where the map (slid,
    /// with KASLR) puts it: while the VM runs, they are read-only.
    fn load_orc(
        &mut self,
        vcpus: &[VcpuAt],
        text: &Range<u64>,
        memory: &mut dyn GuestMemory,
        said: &mut Vec<Said>,
    ) {
        let Some(r) = vcpus
            .iter()
            .map(|v| v.regs)
            .find(|r| r.paging_on() && r.ip() >> 63 == 1 && text.contains(&r.ip()))
        else {
            return;
        };
        let Some(orc) = self.orc.as_mut() else {
            return;
        };
        if !memory.has_ram() {
            // Megabytes through m packets, which QEMU answers only while the VM is
            // stopped: not worth the stopped time.
            self.orc = None;
            said.push(Said::Kept(
                "the guest kernel's ORC tables are read from guest RAM, which glass reaches only through the GDB stub here: kernel frames past the leaf are frame-pointer guesses (--guest-memory gives the RAM)".into(),
            ));
            return;
        }
        let slide = self.kaslr.slide.unwrap_or(0);
        let loaded = orc.load(slide, r.ip(), &mut |address, buf| {
            memory.read_mapped(&r, address, buf)
        });
        match loaded {
            Ok(Some(table)) => {
                let modules = match (&orc.module_layout, self.btf.is_some()) {
                    (Some(_), _) => "; loadable modules' ORC read from the modules list",
                    (None, true) => {
                        "; the BTF has no Linux 6.1 `struct module` (`core_layout`, `arch.orc_unwind`): a module frame ends a walk"
                    }
                    (None, false) => {
                        "; loadable modules' ORC is read only with --guest-btf: a module frame ends a walk"
                    }
                };
                said.push(Said::Figure(format!(
                    "kernel stacks walked with the guest kernel's ORC tables ({} entries{modules})",
                    table.len()
                )));
                self.modules.kernel = Some(table.clone());
                said.push(Said::KernelUnwind(table));
                self.load_module_orc(vcpus, memory, said);
            }
            Ok(None) => {}
            Err(note) => said.push(Said::Kept(note)),
        }
    }

    /// Whether the modules' tables are to be read again: the `modules` list's head moved
    /// (a module loaded or gone), the last reading found a module whose ORC was not set
    /// up yet (it is on the list before: at every tick for 64, then as below), or, at
    /// most every 100 ms, a vCPU runs module code no table covers (code there that no
    /// module's ORC covers, a BPF program's, is tried again only that often).
    fn modules_to_read(&mut self, vcpus: &[VcpuAt], memory: &mut dyn GuestMemory) -> bool {
        const AGAIN: std::time::Duration = std::time::Duration::from_millis(100);
        let Some(orc) = self
            .orc
            .as_ref()
            .filter(|o| o.loaded && o.module_layout.is_some())
        else {
            return false;
        };
        let Some(r) = kernel_regs(vcpus) else {
            return false;
        };
        let ends = orc.modules_ends(self.kaslr.slide.unwrap_or(0), &mut |address, buf| {
            memory.read_mapped(&r, address, buf)
        });
        let modules = &self.modules;
        // A module on the list before its ORC is set up runs its init right after:
        // read again at every tick for a while.
        if (ends.is_some() && ends != modules.ends)
            || (modules.incomplete && modules.incomplete_readings < 64)
        {
            return true;
        }
        if modules.read_at.is_some_and(|at| at.elapsed() < AGAIN) {
            return false;
        }
        modules.incomplete
            || vcpus.iter().any(|v| {
                let ip = v.regs.ip();
                LinuxOrc::in_modules(ip)
                    && !v.in_firmware
                    && !modules.spans.iter().any(|(a, b)| (*a..=*b).contains(&ip))
            })
    }

    /// Reads the loaded modules' ORC tables while the VM runs, and walks with the
    /// kernel's and theirs from the next sample on.
    fn load_module_orc(
        &mut self,
        vcpus: &[VcpuAt],
        memory: &mut dyn GuestMemory,
        said: &mut Vec<Said>,
    ) {
        let modules = &mut self.modules;
        modules.read_at = Some(Instant::now());
        modules.readings += 1;
        let (Some(orc), Some(kernel)) = (self.orc.as_ref(), modules.kernel.as_ref()) else {
            return;
        };
        if orc.module_layout.is_none() {
            return;
        }
        let Some(r) = kernel_regs(vcpus) else {
            return;
        };
        let slide = self.kaslr.slide.unwrap_or(0);
        let mut read = |address, buf: &mut [u8]| memory.read_mapped(&r, address, buf);
        modules.ends = orc.modules_ends(slide, &mut read);
        let (tables, listed) = orc.read_modules(slide, &mut read);
        modules.incomplete = tables.len() < listed;
        modules.incomplete_readings = if modules.incomplete {
            modules.incomplete_readings + 1
        } else {
            0
        };
        let spans: Vec<(u64, u64)> = tables.iter().filter_map(|t| t.span()).collect();
        if spans == modules.spans {
            return;
        }
        modules.found = Some((tables.len(), tables.iter().map(|t| t.len()).sum()));
        modules.spans = spans;
        said.push(Said::KernelUnwind(kernel.merged(&tables)));
    }
}

/// A vCPU stopped in the kernel (its page tables map the kernel's data), for reads of
/// kernel memory while the VM runs.
fn kernel_regs(vcpus: &[VcpuAt]) -> Option<VcpuRegs> {
    vcpus
        .iter()
        .map(|v| v.regs)
        .find(|r| r.paging_on() && r.ip() >> 63 == 1)
}

impl GuestOs for LinuxGuest {
    /// The current task's registers with `--guest-btf`; an x86-64 kernel's symbol table
    /// keeps its GS base for the IRQ stack's way back ([`orc`]).
    fn wants_task_registers(&self, arch: Arch) -> bool {
        self.tasks.is_some() || (arch == Arch::X86_64 && self.symbol_table)
    }

    fn prepare(
        &mut self,
        backend: &mut dyn GuestBackend,
        mark: &StopMark,
    ) -> Result<Vec<Said>, TargetError> {
        if let (Some(tasks), Some(btf)) = (self.tasks.as_mut(), self.btf.as_deref()) {
            let arch = backend.arch();
            tasks.prepare(backend, arch, &self.symbols, btf, mark)?;
        }
        let mut said = Vec::new();
        if self.user.is_some() && backend.physical_memory().is_none() {
            said.push(Said::Warning(
                "--guest-root: a process's mappings are read from guest RAM glass maps (--vm, --guest-memory, --qmp, --libvirt), not through the stub: user samples stay [user] comm".into(),
            ));
        }
        Ok(said)
    }

    fn begin(&mut self, arch: Arch, vcpus: usize, raw_capture: bool) -> Vec<Said> {
        let found = LinuxOrc::find(
            arch,
            &self.symbols,
            self.symbol_table,
            vcpus,
            self.btf.as_deref(),
        );
        self.orc = match found {
            Some(Ok(_)) if raw_capture => {
                // A raw sample keeps one stack range and the report has no ORC tables.
                return vec![Said::Kept(
                    "--capture raw keeps neither the guest kernel's ORC tables nor its IRQ and exception stacks: the report walks kernel frames past the leaf by frame pointers (--capture frames walks them whole)".into(),
                )];
            }
            Some(Ok(orc)) => Some(orc),
            Some(Err(note)) => return vec![Said::Kept(note)],
            None => None,
        };
        Vec::new()
    }

    fn interrupted(&mut self, vcpu: usize, regs: &mut VcpuRegs, memory: &mut dyn GuestMemory) {
        self.entries.interrupted(vcpu, regs, memory);
    }

    fn task_at_stop(
        &mut self,
        vcpu: usize,
        at: VcpuAt,
        memory: &mut dyn GuestMemory,
    ) -> TaskAtStop {
        let Some(tasks) = self.tasks.as_mut() else {
            return TaskAtStop::default();
        };
        tasks.read_task(memory, vcpu, &at.regs);
        TaskAtStop {
            user_mode: !at.in_firmware && LinuxTasks::in_user_mode(&at.regs),
            walk_user_stack: self.user.is_some(),
        }
    }

    /// On an x86-64 Linux IRQ stack: the task's stack pointer saved on its top word; on
    /// an exception (IST) stack: the interrupted one in the frame at its top.
    fn stack_switch(
        &mut self,
        vcpu: usize,
        regs: &VcpuRegs,
        memory: &mut dyn GuestMemory,
    ) -> Option<StackSwitch> {
        match (self.orc.as_mut(), regs) {
            (Some(orc), VcpuRegs::X86_64(x)) if orc.loaded => {
                let mut word = [0u8; 8];
                orc.stack_switch(vcpu, x, &mut |at| {
                    (memory.read(vcpu, regs, at, &mut word).ok()? == 8)
                        .then(|| u64::from_le_bytes(word))
                })
            }
            _ => None,
        }
    }

    /// With ORC an x86-64 kernel's stacks hold no frame records to follow.
    fn walks_kernel_by_tables(&self) -> bool {
        self.orc.as_ref().is_some_and(|o| o.loaded)
    }

    fn task_changed(&mut self, vcpu: usize, time_ns: u64, pid: u32, tid: u32) -> Option<GuestTask> {
        self.tasks.as_mut()?.changed(vcpu, time_ns, pid, tid)
    }

    fn user_space(
        &mut self,
        vcpu: usize,
        regs: &VcpuRegs,
        time_ns: u64,
        memory: &mut dyn GuestMemory,
    ) -> Option<UserSpace> {
        let (Some(tasks), Some(user)) = (self.tasks.as_ref(), self.user.as_mut()) else {
            return None;
        };
        user::user_space(tasks, user, vcpu, regs, time_ns, memory)
    }

    /// A symbol table and a kernel that runs elsewhere (KASLR): the slide, from a vCPU
    /// stopped in the kernel outside the table (its registers, or the kernel's banner
    /// read from guest RAM: kernel data that does not change while the guest runs).
    fn find_slide(
        &mut self,
        arch: Arch,
        vcpus: &[VcpuAt],
        text: Range<u64>,
        memory: &mut dyn GuestMemory,
    ) -> Result<Option<Slide>, String> {
        if !self.kaslr.searching() {
            return Ok(None);
        }
        let found = vcpus.iter().find_map(|vcpu| {
            let r = vcpu.regs;
            if vcpu.in_firmware || !r.paging_on() {
                return None;
            }
            self.kaslr.find(
                arch,
                r.ip(),
                r.vector_base(),
                text.clone(),
                &mut |address, buf| memory.read_mapped(&r, address, buf),
            )
        });
        let outside = vcpus
            .iter()
            .any(|v| v.regs.paging_on() && v.regs.ip() >> 63 == 1 && !text.contains(&v.regs.ip()));
        let settled = self.kaslr.settle(found, outside)?;
        if let Some((by, _)) = settled {
            self.entries.slide(by);
        }
        Ok(settled.map(|(by, how)| Slide { by, how }))
    }

    fn after_sample(
        &mut self,
        vcpus: &[VcpuAt],
        text: Range<u64>,
        memory: &mut dyn GuestMemory,
    ) -> Vec<Said> {
        let mut said = Vec::new();
        if self.orc.as_ref().is_some_and(LinuxOrc::pending) {
            self.load_orc(vcpus, &text, memory, &mut said);
        } else if self.modules_to_read(vcpus, memory) {
            self.load_module_orc(vcpus, memory, &mut said);
        }
        said
    }

    fn ended(&mut self) -> Vec<Said> {
        let mut said = Vec::new();
        if let Some(tasks) = self.tasks.as_mut() {
            said.extend(tasks.notes().into_iter().map(Said::Warning));
            said.push(Said::Figure(tasks.figures()));
        }
        if let Some(user) = &self.user {
            said.push(Said::Figure(user.figures()));
        }
        if let Some((modules, entries)) = self.modules.found {
            said.push(Said::Figure(format!(
                "loadable modules' ORC tables read: {}, {entries} entries (the modules list read {} times)",
                glass_format::count(modules as u64, "module"),
                self.modules.readings
            )));
        }
        said
    }
}
