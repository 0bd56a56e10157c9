//! x86-64 Linux guests: the kernel's own ORC unwind tables, read once from guest RAM, so
//! that kernel stacks are walked whole (Debian's kernel keeps no frame pointers), and
//! the per-CPU IRQ stack's way back to the interrupted task.
//!
//! The tables' places come from the `--symbols` map (`__start_orc_unwind_ip`,
//! `__stop_orc_unwind_ip`, `__start_orc_unwind`: a kallsyms lists them), moved by the
//! KASLR slide once glass knows it. They are read while the VM runs: they are read-only
//! kernel data. The IRQ stack is told while the VM is stopped, from the per-CPU
//! `hardirq_stack_ptr` at the kernel's GS base (it points at the IRQ stack's top word,
//! where `call_on_irq_stack` saves the task's stack pointer).
//! Modules' ORC (each module's own `.orc_unwind`) is not read: a module frame ends the
//! walk.

use std::path::Path;

use glass_format::Arch;
use glass_target::arch::x86_64::X86Regs;
use glass_unwind::orc::OrcTable;

use super::guest_image::GuestImage;
use super::linux_guest::symbol_addresses;

/// x86-64's IRQ stack size (`IRQ_STACK_SIZE`, 16 KiB in 6.1).
const IRQ_STACK_SIZE: u64 = 16 << 10;
/// The tables of a real kernel are a few MiB; a map that puts them further apart is not
/// one to read.
const MOST_TABLE_BYTES: u64 = 64 << 20;
/// Tries (samples in the kernel, inside the map) before the tables are given up on.
const LOAD_TRIES: u32 = 8;

const IP_START: &str = "__start_orc_unwind_ip";
const IP_STOP: &str = "__stop_orc_unwind_ip";
const ORC_START: &str = "__start_orc_unwind";
const HARDIRQ_STACK_PTR: &str = "hardirq_stack_ptr";
/// The kernel's own text (a kallsyms also lists modules', far above).
const TEXT_START: &str = "_stext";
const TEXT_END: &str = "_etext";
/// A symbol only an x86-64 Linux kernel's map has: the syscall entry.
const LINUX_X86: &str = "entry_SYSCALL_64";

pub struct LinuxOrc {
    /// The ip table's start and stop and the entries' start, in the map.
    ip_start: u64,
    ip_stop: u64,
    orc_start: u64,
    /// The kernel's text in the map, where a sampled pc tells that the map (slid) is
    /// where the kernel runs: a kallsyms spans modules too, where a KASLR kernel's pcs
    /// may fall before the slide is known.
    text: Option<(u64, u64)>,
    /// `hardirq_stack_ptr`'s per-CPU offset (zero-based in a kallsyms).
    hardirq_stack_ptr: Option<u64>,
    tries: u32,
    /// Per vCPU: (GS base, its IRQ stack's top word) once read.
    irq_tops: Vec<(u64, u64)>,
    /// The tables are in the recorder: the IRQ stack is worth copying.
    pub loaded: bool,
}

impl LinuxOrc {
    /// For an x86-64 Linux kernel's symbol map: its ORC tables' places, or why they
    /// cannot be used (the note to keep). None for anything else (an ELF image, another
    /// architecture, a map of no Linux kernel).
    pub fn find(
        arch: Arch,
        symbols: &Path,
        image: &GuestImage,
        vcpus: usize,
    ) -> Option<Result<LinuxOrc, String>> {
        if arch != Arch::X86_64 || image.arch.is_some() {
            return None;
        }
        let names = [
            IP_START,
            IP_STOP,
            ORC_START,
            HARDIRQ_STACK_PTR,
            LINUX_X86,
            TEXT_START,
            TEXT_END,
        ];
        let found = symbol_addresses(symbols, &names).ok()?;
        found.get(LINUX_X86)?;
        let (Some(&ip_start), Some(&ip_stop), Some(&orc_start)) = (
            found.get(IP_START),
            found.get(IP_STOP),
            found.get(ORC_START),
        ) else {
            return Some(Err(format!(
                "{} has no {IP_START}/{IP_STOP}/{ORC_START}: the kernel's ORC tables cannot be found, so its frames past the leaf are frame-pointer guesses",
                symbols.display()
            )));
        };
        let size = ip_stop.wrapping_sub(ip_start);
        if size == 0 || size % 4 != 0 || size > MOST_TABLE_BYTES {
            return Some(Err(format!(
                "{}: the kernel's ORC ip table is {size:#x} bytes long: not Linux 6.1's tables, so kernel frames past the leaf are frame-pointer guesses",
                symbols.display()
            )));
        }
        Some(Ok(LinuxOrc {
            ip_start,
            ip_stop,
            orc_start,
            text: found
                .get(TEXT_START)
                .zip(found.get(TEXT_END))
                .map(|(a, b)| (*a, *b)),
            hardirq_stack_ptr: found.get(HARDIRQ_STACK_PTR).copied(),
            tries: 0,
            irq_tops: vec![(0, 0); vcpus],
            loaded: false,
        }))
    }

    /// Whether the tables are still to be read.
    pub fn pending(&self) -> bool {
        !self.loaded && self.tries < LOAD_TRIES
    }

    /// Reads the tables through `read` (guest-virtual memory, the kernel mapped), the map
    /// moved by `slide`; `ip` is a pc sampled in the kernel, which they must cover. Err
    /// once the tries are spent (the note to keep), Ok(None) to try again later.
    pub fn load(
        &mut self,
        slide: u64,
        ip: u64,
        read: &mut dyn FnMut(u64, &mut [u8]) -> usize,
    ) -> Result<Option<OrcTable>, String> {
        if let Some((start, end)) = self.text {
            if !(start.wrapping_add(slide)..end.wrapping_add(slide)).contains(&ip) {
                return Ok(None);
            }
        }
        self.tries += 1;
        let size = (self.ip_stop - self.ip_start) as usize;
        let mut ips = vec![0u8; size];
        let mut entries = vec![0u8; size / 4 * glass_unwind::orc::OrcEntry::SIZE];
        let at = self.ip_start.wrapping_add(slide);
        let why = if read(at, &mut ips) < ips.len()
            || read(self.orc_start.wrapping_add(slide), &mut entries) < entries.len()
        {
            "could not be read from guest memory".to_string()
        } else {
            match OrcTable::parse(at, &ips, &entries) {
                Ok(table) if table.find(ip).is_some() => {
                    self.loaded = true;
                    return Ok(Some(table));
                }
                Ok(_) => "do not cover the kernel's code".to_string(),
                Err(error) => error.to_string(),
            }
        };
        if self.tries < LOAD_TRIES {
            return Ok(None);
        }
        Err(format!(
            "the guest kernel's ORC tables {why}: its frames past the leaf are frame-pointer guesses"
        ))
    }

    /// While the VM is stopped: where the interrupted task's stack pointer is when
    /// `vcpu` runs on its IRQ stack (the saved word and the IRQ stack's top word's
    /// address), read through `read_word`.
    pub fn irq_stack_switch(
        &mut self,
        vcpu: usize,
        r: &X86Regs,
        read_word: &mut dyn FnMut(u64) -> Option<u64>,
    ) -> Option<(u64, u64)> {
        let offset = self.hardirq_stack_ptr.filter(|_| self.loaded)?;
        // In the kernel its GS base is the per-CPU area (a kernel address).
        if r.gs_base >> 56 != 0xff || r.sp >> 63 == 0 {
            return None;
        }
        let slot = self.irq_tops.get_mut(vcpu)?;
        if slot.0 != r.gs_base {
            // Kept once set: early in the boot the pointer is still 0.
            let top = read_word(r.gs_base.wrapping_add(offset)).filter(|top| top >> 63 == 1)?;
            *slot = (r.gs_base, top);
        }
        let top = slot.1;
        if !(top.wrapping_sub(IRQ_STACK_SIZE) < r.sp && r.sp <= top) {
            return None;
        }
        let task_sp = read_word(top)?;
        // The task's stack, not the IRQ stack itself (a word not yet written).
        let on_irq_stack = top.wrapping_sub(IRQ_STACK_SIZE) < task_sp && task_sp <= top;
        (task_sp >> 63 == 1 && !on_irq_stack).then_some((task_sp, top))
    }
}
