//! A Linux kernel's entry points, so that a vCPU stopped on one is sampled as the context
//! it interrupted: arm64's exception vector tables (VBAR_EL1 points at one) and x86-64's
//! interrupt and exception entries (`asm_exc_*`, `asm_sysvec_*`,
//! `asm_common_interrupt`), where the CPU's 64-bit frame on the stack holds the
//! interrupted registers. Known from a symbol table (a kallsyms, a System.map), and
//! moved with the kernel once its slide is known.

use std::path::Path;

use glass_target::guest::VcpuRegs;
use glass_target::guest_os::GuestMemory;

use crate::kernel_map::table_symbols;

/// The exception vector tables arm64 Linux points VBAR_EL1 at (KPTI's trampoline and
/// the Spectre-BHB variants besides the plain one).
pub const VECTOR_TABLES: &[&str] = &["vectors", "tramp_vectors", "__bp_harden_el1_vectors"];

/// Where the kernel's entries run.
#[derive(Debug, Default)]
pub struct Entries {
    /// The vector tables' addresses, in the table's order.
    tables: Vec<u64>,
    /// x86-64's interrupt and exception entry points, sorted.
    entries: Vec<u64>,
}

impl Entries {
    /// From a symbol table.
    pub fn from_table(path: &Path) -> Entries {
        let tables = table_symbols(path, VECTOR_TABLES)
            .into_iter()
            .map(|(_, address)| address)
            .collect();
        let entries = glass_symbols::nm_table(&path.to_string_lossy())
            .unwrap_or_default()
            .into_iter()
            .filter(|s| {
                s.2.starts_with("asm_exc_")
                    || s.2.starts_with("asm_sysvec_")
                    || s.2 == "asm_common_interrupt"
            })
            .map(|s| s.0)
            .collect();
        Entries { tables, entries }
    }

    /// Moves them to where the kernel runs.
    pub fn slide(&mut self, by: u64) {
        for at in self.tables.iter_mut().chain(&mut self.entries) {
            *at = at.wrapping_add(by);
        }
    }

    /// While the VM is stopped: `r` of vCPU `vcpu`, stopped on an entry, becomes the
    /// context the entry interrupted (a frame that cannot be read leaves it as it is).
    pub fn interrupted(&self, vcpu: usize, r: &mut VcpuRegs, memory: &mut dyn GuestMemory) {
        r.interrupted_in_tables(&self.tables);
        if let VcpuRegs::X86_64(x86) = r {
            // A 64-bit hardware frame.
            if self.entries.binary_search(&x86.ip).is_ok() && x86.long_mode() {
                let mut bytes = [0u8; 48];
                let (sp, regs) = (x86.sp, VcpuRegs::X86_64(*x86));
                let read = memory.read(vcpu, &regs, sp, &mut bytes);
                if read.unwrap_or(0) == 48 {
                    let word =
                        |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
                    x86.interrupted(&std::array::from_fn(word));
                }
            }
        }
    }
}
