//! x86-64 Linux guests: the kernel's own ORC unwind tables, read once from guest RAM, so
//! that kernel stacks are walked whole (Debian's kernel keeps no frame pointers), and
//! the per-CPU IRQ stack's way back to the interrupted task.
//!
//! The tables' places come from the `--symbols` map (`__start_orc_unwind_ip`,
//! `__stop_orc_unwind_ip`, `__start_orc_unwind`: a kallsyms lists them), moved by the
//! KASLR slide once glass knows it. They are read while the VM runs: they are read-only
//! kernel data. The IRQ stack is told while the VM is stopped, from the per-CPU
//! `hardirq_stack_ptr` at the kernel's GS base (it points at the IRQ stack's top word,
//! where `call_on_irq_stack` saves the task's stack pointer). The exception (IST) stacks
//! (#DF, NMI, #DB, #MC) are told from the per-CPU TSS's `ist[]` tops (`cpu_tss_rw`): the
//! CPU pushed the interrupted context's frame at the stack's top, and its stack pointer is
//! where the walk goes on.
//! Loadable modules' ORC (`struct module`'s `arch.orc_unwind_ip`/`orc_unwind`, on the
//! `modules` list, kept to the module's live text) is read with `--guest-btf`'s offsets,
//! again when the list changes (the guest loop's hook decides when); without BTF a module frame
//! ends the walk.

use std::path::Path;

use glass_format::Arch;
use glass_target::arch::x86_64::X86Regs;
use glass_unwind::orc::OrcTable;

use glass_target::guest_os::StackSwitch;

use crate::btf::{read_btf, struct_offsets};
use crate::kernel_map::symbol_addresses;

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
const CPU_TSS: &str = "cpu_tss_rw";
const MODULES: &str = "modules";
/// `struct x86_hw_tss`'s `ist[7]` (packed: u32 reserved1, u64 sp0..sp2, u64 reserved2).
const TSS_IST: u64 = 36;
/// The IST stacks in `ist[]`'s order (IST_INDEX_DF, _NMI, _DB, _MCE; #VC's is unused
/// without SEV), each below a guard page in the CPU entry area.
const IST_STACKS: usize = 4;
const PAGE: u64 = 4096;
/// Where module code lies (x86-64's MODULES_VADDR..MODULES_END).
const MODULES_AREA: std::ops::Range<u64> = 0xffff_ffff_a000_0000..0xffff_ffff_ff00_0000;
/// The most modules and ORC entries per module believed.
const MOST_MODULES: usize = 4096;
const MOST_MODULE_ORCS: u64 = 1 << 20;
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
    /// `cpu_tss_rw`'s per-CPU offset.
    cpu_tss: Option<u64>,
    /// Per vCPU: (GS base, its IST stacks' tops, their size) once read.
    ist_tops: Vec<(u64, [u64; IST_STACKS], u64)>,
    /// The `modules` list head in the map, and `struct module`'s offsets from BTF.
    modules: Option<u64>,
    pub module_layout: Option<ModuleLayout>,
    /// The tables are in the recorder: the IRQ stack is worth copying.
    pub loaded: bool,
}

impl LinuxOrc {
    /// For an x86-64 Linux kernel's symbol map: its ORC tables' places, or why they
    /// cannot be used (the note to keep). None for anything else (an ELF image, another
    /// architecture, a map of no Linux kernel); `symbol_table`: the image is a table.
    pub fn find(
        arch: Arch,
        symbols: &Path,
        symbol_table: bool,
        vcpus: usize,
        btf: Option<&Path>,
    ) -> Option<Result<LinuxOrc, String>> {
        if arch != Arch::X86_64 || !symbol_table {
            return None;
        }
        let names = [
            IP_START,
            IP_STOP,
            ORC_START,
            HARDIRQ_STACK_PTR,
            CPU_TSS,
            MODULES,
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
            cpu_tss: found.get(CPU_TSS).copied(),
            ist_tops: vec![(0, [0; IST_STACKS], 0); vcpus],
            modules: found.get(MODULES).copied(),
            module_layout: btf.and_then(ModuleLayout::from_btf),
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

    /// While the VM is stopped: where the interrupted stack pointer is when `vcpu` runs
    /// on its IRQ stack or one of its exception (IST) stacks, where the copy of the
    /// stack it runs on must reach (exclusive), and, when an exception interrupted the
    /// IRQ stack, the task's stack pointer saved on that one's top word (a third stack),
    /// read through `read_word`.
    pub fn stack_switch(
        &mut self,
        vcpu: usize,
        r: &X86Regs,
        read_word: &mut dyn FnMut(u64) -> Option<u64>,
    ) -> Option<StackSwitch> {
        // In the kernel its GS base is the per-CPU area (a kernel address).
        if !self.loaded || r.gs_base >> 56 != 0xff || r.sp >> 63 == 0 {
            return None;
        }
        if let Some((sp, top)) = self.ist_stack_switch(vcpu, r, read_word) {
            let then = self
                .irq_stack_switch(vcpu, r, sp, read_word)
                .map(|(task_sp, _)| task_sp);
            return Some(StackSwitch {
                copy_to: top,
                other: sp,
                then,
            });
        }
        self.irq_stack_switch(vcpu, r, r.sp, read_word)
            .map(|(task_sp, top)| StackSwitch {
                copy_to: top + 8,
                other: task_sp,
                then: None,
            })
    }

    /// On an IST stack, the CPU pushed the interrupted context's interrupt frame (ip,
    /// cs, flags, sp, ss) at its top: the NMI entry's copies of it ("nested NMI") and
    /// the handler's pt_regs lie below, on the same stack. Only a kernel context is
    /// another stack (from user mode the entry moves to the task's stack first).
    fn ist_stack_switch(
        &mut self,
        vcpu: usize,
        r: &X86Regs,
        read_word: &mut dyn FnMut(u64) -> Option<u64>,
    ) -> Option<(u64, u64)> {
        let offset = self.cpu_tss?;
        let slot = self.ist_tops.get_mut(vcpu)?;
        if slot.0 != r.gs_base {
            let ist = r.gs_base.wrapping_add(offset + TSS_IST);
            let mut tops = [0; IST_STACKS];
            for (i, top) in tops.iter_mut().enumerate() {
                *top = read_word(ist + 8 * i as u64).filter(|top| top >> 63 == 1)?;
            }
            // Equal steps, each a stack and its guard page (8 KiB stacks in 6.1 without
            // KASAN): anything else is not the layout known here.
            let step = tops[1].wrapping_sub(tops[0]);
            let size = step.wrapping_sub(PAGE);
            if !(PAGE..=64 << 10).contains(&size)
                || tops.windows(2).any(|w| w[1].wrapping_sub(w[0]) != step)
            {
                return None;
            }
            *slot = (r.gs_base, tops, size);
        }
        let (_, tops, size) = *slot;
        let top = *tops
            .iter()
            .find(|&&top| top.wrapping_sub(size) <= r.sp && r.sp < top)?;
        let (cs, sp) = (read_word(top - 32)?, read_word(top - 16)?);
        let same = top.wrapping_sub(size) <= sp && sp < top;
        (cs & 3 == 0 && sp >> 63 == 1 && !same).then_some((sp, top))
    }

    /// When `sp` lies on the IRQ stack: the task's stack pointer saved on its top word,
    /// and that word's address.
    fn irq_stack_switch(
        &mut self,
        vcpu: usize,
        r: &X86Regs,
        sp: u64,
        read_word: &mut dyn FnMut(u64) -> Option<u64>,
    ) -> Option<(u64, u64)> {
        let offset = self.hardirq_stack_ptr?;
        let slot = self.irq_tops.get_mut(vcpu)?;
        if slot.0 != r.gs_base {
            // Kept once set: early in the boot the pointer is still 0.
            let top = read_word(r.gs_base.wrapping_add(offset)).filter(|top| top >> 63 == 1)?;
            *slot = (r.gs_base, top);
        }
        let top = slot.1;
        if !(top.wrapping_sub(IRQ_STACK_SIZE) < sp && sp <= top) {
            return None;
        }
        let task_sp = read_word(top)?;
        // The task's stack, not the IRQ stack itself (a word not yet written).
        let on_irq_stack = top.wrapping_sub(IRQ_STACK_SIZE) < task_sp && task_sp <= top;
        (task_sp >> 63 == 1 && !on_irq_stack).then_some((task_sp, top))
    }
}

/// Where `struct module` keeps what the module walk needs (byte offsets, from BTF).
#[derive(Debug, Clone, Copy)]
pub struct ModuleLayout {
    /// `module.list` (on the `modules` list).
    list: u64,
    /// `module.arch` plus `mod_arch_specific`'s `num_orcs`, `orc_unwind_ip`, `orc_unwind`.
    num_orcs: u64,
    orc_unwind_ip: u64,
    orc_unwind: u64,
    /// `module.core_layout` and `module.init_layout` plus `module_layout`'s `base` and
    /// `text_size` (Linux 6.1; 6.4 has `mem[]` instead): the module's code now.
    core_base: u64,
    core_text_size: u64,
    init_base: u64,
    init_text_size: u64,
}

impl ModuleLayout {
    fn from_btf(path: &Path) -> Option<ModuleLayout> {
        let btf = read_btf(path).ok()?;
        let module = struct_offsets(&btf, "module")?;
        let arch = struct_offsets(&btf, "mod_arch_specific")?;
        let layout = struct_offsets(&btf, "module_layout")?;
        let base = *module.get("arch")?;
        let (core, init) = (*module.get("core_layout")?, *module.get("init_layout")?);
        let (text_base, text_size) = (*layout.get("base")?, *layout.get("text_size")?);
        Some(ModuleLayout {
            list: *module.get("list")?,
            num_orcs: base + arch.get("num_orcs")?,
            orc_unwind_ip: base + arch.get("orc_unwind_ip")?,
            orc_unwind: base + arch.get("orc_unwind")?,
            core_base: core + text_base,
            core_text_size: core + text_size,
            init_base: init + text_base,
            init_text_size: init + text_size,
        })
    }
}

impl LinuxOrc {
    /// Whether `ip` is module code (where a module table may be missing).
    pub fn in_modules(ip: u64) -> bool {
        MODULES_AREA.contains(&ip)
    }

    /// The `modules` list head's two words (a module loads at the head, `list_add_rcu`,
    /// and may go from anywhere): they move when a module comes or goes.
    pub fn modules_ends(
        &self,
        slide: u64,
        read: &mut dyn FnMut(u64, &mut [u8]) -> usize,
    ) -> Option<[u8; 16]> {
        let mut b = [0u8; 16];
        let head = self.modules?.wrapping_add(slide);
        (read(head, &mut b) == 16).then_some(b)
    }

    /// Each loaded module's ORC tables, read through `read` (guest-virtual memory) from
    /// the `modules` list (the map moved by `slide`), and how many modules the list
    /// held. Empty without BTF's offsets. Modules come and go while the VM runs: a list
    /// that ends badly ends the reading.
    pub fn read_modules(
        &self,
        slide: u64,
        read: &mut dyn FnMut(u64, &mut [u8]) -> usize,
    ) -> (Vec<OrcTable>, usize) {
        let (Some(layout), Some(head)) = (self.module_layout, self.modules) else {
            return (Vec::new(), 0);
        };
        let head = head.wrapping_add(slide);
        let mut word = |at: u64| {
            let mut b = [0u8; 8];
            (read(at, &mut b) == 8).then(|| u64::from_le_bytes(b))
        };
        let mut found = Vec::new();
        let mut listed = 0;
        let mut node = word(head);
        let mut tables = Vec::new();
        for _ in 0..MOST_MODULES {
            let Some(at) = node.filter(|&n| n != head && n >> 63 == 1) else {
                break;
            };
            listed += 1;
            let module = at.wrapping_sub(layout.list);
            let count = word(module + layout.num_orcs).map(|w| w & 0xffff_ffff);
            let ips = word(module + layout.orc_unwind_ip);
            let orcs = word(module + layout.orc_unwind);
            // Its code now: the init text is freed after init (base NULL) and its place
            // given to the next module's, while the table keeps the entries.
            let mut text = |base: u64, size: u64| {
                let base = word(module + base).filter(|&b| b >> 63 == 1)?;
                let size = word(module + size)? & 0xffff_ffff;
                Some(base..base + size + 1)
            };
            let code = [
                text(layout.core_base, layout.core_text_size),
                text(layout.init_base, layout.init_text_size),
            ];
            if let (Some(n @ 1..MOST_MODULE_ORCS), Some(ips), Some(orcs)) = (count, ips, orcs) {
                found.push((n as usize, ips, orcs, code));
            }
            node = word(at);
        }
        for (n, ips_at, orcs_at, code) in found {
            let mut ips = vec![0u8; n * 4];
            let mut orcs = vec![0u8; n * glass_unwind::orc::OrcEntry::SIZE];
            if read(ips_at, &mut ips) == ips.len() && read(orcs_at, &mut orcs) == orcs.len() {
                if let Ok(table) = OrcTable::parse(ips_at, &ips, &orcs) {
                    let table = table.within(&code.into_iter().flatten().collect::<Vec<_>>());
                    if !table.is_empty() {
                        tables.push(table);
                    }
                }
            }
        }
        (tables, listed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GS: u64 = 0xffff_8880_0f00_0000;
    const TSS: u64 = 0x6000;
    const HARDIRQ: u64 = 0x1fb48;
    /// Linux 6.1's CPU entry area: IST tops 12 KiB apart (8 KiB stacks, guard pages).
    const DF_TOP: u64 = 0xffff_fe00_0000_a000 + 0x3000;
    const NMI_TOP: u64 = DF_TOP + 0x3000;
    const IRQ_TOP: u64 = 0xffff_c900_0000_3ff8;
    const TASK_SP: u64 = 0xffff_c900_0040_3e00;

    fn orc() -> LinuxOrc {
        LinuxOrc {
            ip_start: 0,
            ip_stop: 4,
            orc_start: 0,
            text: None,
            hardirq_stack_ptr: Some(HARDIRQ),
            tries: 0,
            irq_tops: vec![(0, 0); 1],
            cpu_tss: Some(TSS),
            ist_tops: vec![(0, [0; IST_STACKS], 0); 1],
            modules: None,
            module_layout: None,
            loaded: true,
        }
    }

    /// The per-CPU words and the NMI's interrupt frame (kernel cs, `interrupted` sp).
    fn memory(interrupted: u64) -> std::collections::HashMap<u64, u64> {
        let mut m = std::collections::HashMap::new();
        for i in 0..IST_STACKS as u64 {
            m.insert(GS + TSS + TSS_IST + 8 * i, DF_TOP + 0x3000 * i);
        }
        m.insert(GS + HARDIRQ, IRQ_TOP);
        m.insert(IRQ_TOP, TASK_SP);
        m.insert(NMI_TOP - 32, 0x10);
        m.insert(NMI_TOP - 16, interrupted);
        m
    }

    fn regs(sp: u64) -> X86Regs {
        X86Regs {
            sp,
            gs_base: GS,
            ..Default::default()
        }
    }

    #[test]
    fn an_nmi_on_the_task_stack_and_on_the_irq_stack() {
        let mem = memory(TASK_SP);
        let s = orc()
            .stack_switch(0, &regs(NMI_TOP - 0x200), &mut |a| mem.get(&a).copied())
            .unwrap();
        assert_eq!((s.copy_to, s.other, s.then), (NMI_TOP, TASK_SP, None));
        // Interrupted on the IRQ stack: the task's stack is a third range.
        let mem = memory(IRQ_TOP - 0x100);
        let s = orc()
            .stack_switch(0, &regs(NMI_TOP - 0x200), &mut |a| mem.get(&a).copied())
            .unwrap();
        assert_eq!(
            (s.copy_to, s.other, s.then),
            (NMI_TOP, IRQ_TOP - 0x100, Some(TASK_SP))
        );
        // On the IRQ stack itself: as before.
        let s = orc()
            .stack_switch(0, &regs(IRQ_TOP - 0x80), &mut |a| mem.get(&a).copied())
            .unwrap();
        assert_eq!((s.copy_to, s.other, s.then), (IRQ_TOP + 8, TASK_SP, None));
    }

    #[test]
    fn user_mode_and_unknown_layouts_switch_nothing() {
        // From user mode (cs & 3) the entry left the IST stack: nothing to follow.
        let mut mem = memory(0x7fff_0000);
        mem.insert(NMI_TOP - 32, 0x33);
        let sp = regs(NMI_TOP - 0x200);
        assert!(orc()
            .stack_switch(0, &sp, &mut |a| mem.get(&a).copied())
            .is_none());
        // Tops that do not step evenly are not 6.1's entry area.
        let mut mem = memory(TASK_SP);
        mem.insert(GS + TSS + TSS_IST + 24, NMI_TOP + 0x10000);
        assert!(orc()
            .stack_switch(0, &sp, &mut |a| mem.get(&a).copied())
            .is_none());
    }
}
