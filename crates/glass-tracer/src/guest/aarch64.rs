//! `glass trace --vm -- qemu-system-aarch64 -M virt ...`: what differs from x86-64 guests.
//!
//! **The region.** `virt` plugs a `pc-dimm` only with an ACPI GED device, which it
//! creates only when firmware is loaded (QEMU 7.2: "memory hotplug is not enabled:
//! missing acpi-ged device" with `-kernel`). So glass backs the guest's RAM itself: one
//! memfd of the RAM rounded up to 2 MiB plus the region's 2 MiB, given to QEMU as the
//! machine's memory backend (`-M virt,memory-backend=`), and the region is its last 2
//! MiB, at guest-physical 0x4000_0000 + that rounded RAM. The guest is not told of it:
//! glass has QEMU dump the device tree it would give the guest (`dumpdtb`), sets the
//! memory node's size back to the RAM asked for (in place, the tree's layout unchanged)
//! and boots with that tree (`-dtb`). A guest that finds its RAM in the device tree
//! never uses the region; one that does not (the demo) uses only what it was built for.
//!
//! **Reach.** The entry patch is one `B` (±128 MiB): the fewest displaced instructions
//! (one), none refused for naming x16/x17, and no function too short for it. The region
//! is mapped by one 2 MiB block descriptor glass writes into an invalid entry of a
//! level-2 table the guest already has (4 KiB granule), at the nearest 2 MiB slot within
//! ±128 MiB of every patched function ([`super::layout::Layout::aarch64`]). A kernel's
//! image sits in a 1 GiB slot whose level-2 table maps it with blocks or pages; the rest
//! of that table is usually empty (the demo's is). Code spread over more than B's reach
//! takes far patches (`adrp, add, br x16`, select's far plans, as a process's does), and
//! so does code with no free entry within B's reach (`super::place_region` plans it
//! again): the slot is then looked for within ±2 GiB, and where none is free glass
//! refuses in one line.
//!
//! **Caches.** Under TCG there are none to maintain: the trampolines are written into the
//! memfd before any vCPU runs there (QEMU holds no translation of them), and the entry
//! branches through the GDB stub, which makes QEMU drop the translations of the written
//! bytes. Under KVM the guest's instruction caches would be the guest's to clean (glass
//! cannot run `ic ivau` in it), so glass refuses a KVM or HVF accelerator for AArch64.

use std::path::{Path, PathBuf};

use glass_target::arch::VcpuRegs;
use glass_target::guest_code::GuestCode;

use super::layout::{Layout, REGION_BYTES};
use crate::{Failure, Result};

/// Where `virt` puts RAM.
pub const RAM_BASE: u64 = 0x4000_0000;

const MIB: u64 = 1 << 20;

/// The region's offset in the RAM memfd (the RAM rounded up to 2 MiB), and the memfd's
/// size: RAM, rounding and the region.
pub fn ram_layout(ram_mib: u64) -> (u64, u64) {
    let region = super::layout::REGION_BYTES;
    let offset = (ram_mib * MIB).div_ceil(region) * region;
    (offset, offset + region)
}

/// Refuses what the AArch64 path does not handle: a machine other than `virt`, an
/// accelerator other than TCG, a device tree of the user's own.
pub fn check_command(command: &[String]) -> Result<()> {
    let values = |flags: &[&str]| -> Vec<String> {
        command
            .windows(2)
            .filter(|w| flags.contains(&w[0].as_str()))
            .map(|w| w[1].clone())
            .collect()
    };
    let machines = values(&["-M", "-machine"]);
    match machines.as_slice() {
        [machine] if machine.split(',').next() == Some("virt") => {}
        _ => {
            return Err(Failure::bad_input(
                "--vm traces qemu-system-aarch64 guests of the virt machine: give -M virt (once)",
            ))
        }
    }
    let kvm = command.iter().any(|a| a == "-enable-kvm")
        || values(&["-accel"])
            .iter()
            .chain(machines.iter())
            .any(|v| v.contains("kvm") || v.contains("hvf"));
    if kvm {
        return Err(Failure::bad_input(
            "--vm on AArch64 runs guests under TCG only: under KVM the guest's instruction caches are its own to clean after glass writes code, which glass cannot do from outside",
        ));
    }
    if !values(&["-dtb"]).is_empty() || machines[0].contains("memory-backend") {
        return Err(Failure::bad_input(
            "--vm on AArch64 gives the guest its own -dtb and memory backend (to keep its region out of the guest's RAM): leave them out",
        ));
    }
    Ok(())
}

/// QEMU's arguments (after the program) for an AArch64 guest: the user's, less `-m`,
/// with the RAM a memfd-backed backend (`/proc/self/fd/{fd}`, `total` bytes) and the
/// device tree at `dtb`, which [`write_device_tree`] makes.
pub fn arguments(command: &[String], fd: i32, total: u64, dtb: Option<&Path>) -> Vec<String> {
    let mut arguments = Vec::with_capacity(command.len() + 8);
    let mut rest = command[1..].iter();
    while let Some(argument) = rest.next() {
        match argument.as_str() {
            "-m" => {
                rest.next();
            }
            "-M" | "-machine" => {
                arguments.push(argument.clone());
                if let Some(machine) = rest.next() {
                    arguments.push(format!("{machine},memory-backend=glass-ram"));
                }
            }
            _ => arguments.push(argument.clone()),
        }
    }
    arguments.extend([
        "-m".to_string(),
        format!("{}M", total / MIB),
        "-object".to_string(),
        match dtb {
            Some(_) => format!(
                "memory-backend-file,id=glass-ram,size={}M,mem-path=/proc/self/fd/{fd},share=on",
                total / MIB
            ),
            // Only to dump the tree: no memory is used.
            None => format!("memory-backend-ram,id=glass-ram,size={}M", total / MIB),
        },
    ]);
    if let Some(dtb) = dtb {
        // Started stopped: glass sets its breakpoints before the first instruction (a
        // kernel QEMU loads itself reaches its first calls within milliseconds).
        arguments.extend(["-dtb".to_string(), dtb.display().to_string(), "-S".into()]);
    }
    arguments
}

/// Has QEMU dump the device tree of the machine `command` asks for (with `total`
/// bytes of RAM), sets its memory node back to `ram_mib`, and writes it to a file of
/// glass's; returns its path.
pub fn write_device_tree(command: &[String], ram_mib: u64, total: u64) -> Result<PathBuf> {
    let dir = std::env::temp_dir();
    let dumped = dir.join(format!("glass-vm-{}-qemu.dtb", std::process::id()));
    let edited = dir.join(format!("glass-vm-{}.dtb", std::process::id()));
    let mut arguments = arguments(command, -1, total, None);
    for pair in 0..arguments.len().saturating_sub(1) {
        if arguments[pair] == "-M" || arguments[pair] == "-machine" {
            arguments[pair + 1] = format!("{},dumpdtb={}", arguments[pair + 1], dumped.display());
        }
    }
    let output = std::process::Command::new(&command[0])
        .args(&arguments)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| Failure::bad_input(format!("{}: {e}", command[0])))?;
    let tree = std::fs::read(&dumped).map_err(|_| {
        Failure::bad_input(format!(
            "{} did not give its device tree (-M ...,dumpdtb): {}",
            command[0],
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    })?;
    let _ = std::fs::remove_file(&dumped);
    let mut tree = tree;
    set_memory_size(&mut tree, RAM_BASE, ram_mib * MIB).map_err(|why| {
        Failure::runtime(format!(
            "cannot keep glass's region out of the guest's device tree: {why}"
        ))
    })?;
    std::fs::write(&edited, &tree)
        .map_err(|e| Failure::runtime(format!("cannot write {}: {e}", edited.display())))?;
    Ok(edited)
}

/// Sets, in the flattened device tree `tree`, the size of the `reg` range at `base` of
/// its memory node to `size`, in place. The root's `#address-cells` and `#size-cells`
/// must be 2, as QEMU's `virt` sets them.
pub fn set_memory_size(tree: &mut [u8], base: u64, size: u64) -> std::result::Result<(), String> {
    const MAGIC: u32 = 0xd00d_feed;
    const BEGIN_NODE: u32 = 1;
    const END_NODE: u32 = 2;
    const PROP: u32 = 3;
    const NOP: u32 = 4;
    const END: u32 = 9;
    let be32 = |tree: &[u8], at: usize| -> std::result::Result<u32, String> {
        tree.get(at..at + 4)
            .map(|b| u32::from_be_bytes(b.try_into().unwrap_or_default()))
            .ok_or_else(|| "a truncated device tree".to_string())
    };
    if be32(tree, 0)? != MAGIC {
        return Err("not a flattened device tree".into());
    }
    let structure = be32(tree, 8)? as usize;
    let strings = be32(tree, 12)? as usize;
    let name_at = |tree: &[u8], at: usize| -> String {
        let bytes = &tree[at.min(tree.len())..];
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    };
    let mut at = structure;
    let mut depth = 0usize;
    let mut in_memory = false;
    let mut cells = (2u32, 2u32);
    loop {
        let token = be32(tree, at)?;
        at += 4;
        match token {
            BEGIN_NODE => {
                let name = name_at(tree, at);
                at += (name.len() + 1).div_ceil(4) * 4;
                depth += 1;
                in_memory = depth == 2 && (name == "memory" || name.starts_with("memory@"));
            }
            END_NODE => {
                depth = depth.saturating_sub(1);
                in_memory = false;
            }
            PROP => {
                let len = be32(tree, at)? as usize;
                let name = name_at(tree, strings + be32(tree, at + 4)? as usize);
                let value = at + 8;
                at = value + len.div_ceil(4) * 4;
                if depth == 1 && name == "#address-cells" {
                    cells.0 = be32(tree, value)?;
                } else if depth == 1 && name == "#size-cells" {
                    cells.1 = be32(tree, value)?;
                } else if in_memory && name == "reg" {
                    if cells != (2, 2) {
                        return Err(format!(
                            "its root has #address-cells {} and #size-cells {}, not 2 and 2",
                            cells.0, cells.1
                        ));
                    }
                    for range in (value..value + len).step_by(16) {
                        let word = |i: usize| be32(tree, range + 4 * i).map(u64::from);
                        if (word(0)? << 32 | word(1)?) == base {
                            tree[range + 8..range + 12]
                                .copy_from_slice(&((size >> 32) as u32).to_be_bytes());
                            tree[range + 12..range + 16]
                                .copy_from_slice(&(size as u32).to_be_bytes());
                            return Ok(());
                        }
                    }
                }
            }
            NOP => {}
            END => return Err(format!("no memory node has RAM at {base:#x}")),
            other => return Err(format!("an unknown token {other} in the device tree")),
        }
    }
}

/// Descriptor bits (VMSAv8-64 stage 1).
const VALID: u64 = 1;
const TABLE: u64 = 1 << 1;
/// Lower attributes kept from the code's own mapping: AttrIndx, NS, SH, nG.
const KEPT_ATTRIBUTES: u64 = 0x7 << 2 | 1 << 5 | 3 << 8 | 1 << 11;
const ACCESS_FLAG: u64 = 1 << 10;
/// Unprivileged execute-never: EL0 never runs the region.
const UXN: u64 = 1 << 54;
const OUTPUT: u64 = 0x0000_ffff_ffff_f000;
/// B's reach: ±128 MiB.
const REACH: i128 = 1 << 27;
/// What far patches (adrp, ±4 GiB by pages) are given: ±2 GiB, as x86-64's rel32.
const FAR_REACH: i128 = 1 << 31;

/// The region's place for code at `low..high` in the guest `target` reaches, stopped
/// with `regs`, the region being at guest-physical `gpa`: the nearest 2 MiB slot within
/// a `B` of all of it whose entry in an existing level-2 table of the guest's is
/// invalid (see the module comment); the block descriptor glass writes there takes the
/// memory attributes of the code's own mapping, writable and executable at EL1.
///
/// `far`: the entries take far patches (adrp), and the slot may be within ±2 GiB.
/// Ok(None): no free entry within reach (the caller may plan far patches and ask again).
pub fn choose_layout(
    target: &mut dyn GuestCode,
    regs: &[VcpuRegs],
    (low, high): (u64, u64),
    gpa: u64,
    far: bool,
) -> Result<Option<Layout>> {
    let paging = regs
        .iter()
        .find_map(|r| match r {
            VcpuRegs::Aarch64(a) if a.mmu_on() => Some(*a),
            _ => None,
        })
        .ok_or_else(|| {
            Failure::bad_input("no vCPU has its MMU on: glass traces guests that map their code")
        })?;
    let tables = Tables::of(&paging, low, high).map_err(Failure::bad_input)?;
    let mut read = |at: u64| -> std::result::Result<u64, String> {
        let bytes = target.read_physical(at, 8)?;
        Ok(u64::from_le_bytes(
            bytes[..8].try_into().unwrap_or_default(),
        ))
    };
    // A test hook: the guest as one with no free entry near its code.
    if !far && std::env::var_os("GLASS_TEST_AARCH64_REACH").is_some_and(|v| v == "no-near-slot") {
        return Ok(None);
    }
    let reach = if far { FAR_REACH } else { REACH };
    place(&tables, low, high, gpa, reach, &mut read).map_err(Failure::bad_input)
}

/// One half of an AArch64 guest's address space, with a 4 KiB granule.
#[derive(Debug, Clone, Copy)]
struct Tables {
    /// The start table (guest-physical).
    root: u64,
    /// Bits of the half's addresses: 64 - TxSZ.
    bits: u32,
}

impl Tables {
    /// The half that holds `low..high` (both in it), which must have a 4 KiB granule.
    fn of(
        paging: &glass_target::arch::Aarch64Regs,
        low: u64,
        high: u64,
    ) -> std::result::Result<Tables, String> {
        let upper = low >> 63 == 1;
        if (high >> 63 == 1) != upper {
            return Err(format!(
                "the code to trace spans both halves of the address space ({low:#x}..{high:#x})"
            ));
        }
        let (tsz, granule_4k, ttbr) = if upper {
            (
                (paging.tcr_el1 >> 16) & 0x3f,
                (paging.tcr_el1 >> 30) & 3 == 0b10,
                paging.ttbr1_el1,
            )
        } else {
            (
                paging.tcr_el1 & 0x3f,
                (paging.tcr_el1 >> 14) & 3 == 0b00,
                paging.ttbr0_el1,
            )
        };
        if !granule_4k {
            return Err(
                "the guest maps its code with a 16 KiB or 64 KiB granule: glass places its region in 4 KiB-granule tables only".into(),
            );
        }
        let bits = 64 - (tsz as u32).clamp(16, 48);
        if bits < 31 {
            return Err(format!(
                "the guest's {bits}-bit address space has no level-2 table of its own to place glass's region in"
            ));
        }
        Ok(Tables {
            root: ttbr & 0x0000_ffff_ffff_f000,
            bits,
        })
    }

    /// The level the walk starts at (0 for 48 bits, 1 for 39, 2 for 30).
    fn start_level(&self) -> u32 {
        4 - (self.bits - 12).div_ceil(9)
    }

    fn index(&self, va: u64, level: u32) -> u64 {
        let shift = 12 + 9 * (3 - level);
        let bits = if level == self.start_level() {
            self.bits - shift
        } else {
            9
        };
        (va >> shift) & ((1 << bits) - 1)
    }

    /// The descriptors of `va`'s walk, from the start level down to the leaf or the
    /// first invalid or block entry: (level, guest-physical address, value).
    fn walk(
        &self,
        va: u64,
        read: &mut dyn FnMut(u64) -> std::result::Result<u64, String>,
    ) -> std::result::Result<Vec<(u32, u64, u64)>, String> {
        let mut table = self.root;
        let mut walked = Vec::new();
        for level in self.start_level()..=3 {
            let at = table + 8 * self.index(va, level);
            let value = read(at)?;
            walked.push((level, at, value));
            if value & VALID == 0 || value & TABLE == 0 || level == 3 {
                break;
            }
            table = value & OUTPUT;
        }
        Ok(walked)
    }
}

fn place(
    tables: &Tables,
    low: u64,
    high: u64,
    gpa: u64,
    reach: i128,
    read: &mut dyn FnMut(u64) -> std::result::Result<u64, String>,
) -> std::result::Result<Option<Layout>, String> {
    let region = REGION_BYTES as i128;
    if !gpa.is_multiple_of(REGION_BYTES) {
        return Err(format!(
            "glass's region is at guest-physical {gpa:#x}, not on a 2 MiB boundary"
        ));
    }
    // The code's own mapping: its memory attributes are the region's.
    let leaf = tables
        .walk(low, read)?
        .last()
        .copied()
        .filter(|&(level, _, value)| value & VALID != 0 && (level == 3 || value & TABLE == 0))
        .ok_or_else(|| format!("the guest does not map the code to trace at {low:#x}"))?;
    let entry = gpa | (leaf.2 & KEPT_ATTRIBUTES) | ACCESS_FLAG | UXN | VALID;
    // Every slot whose 2 MiB lie within a branch of every function, and every function
    // within a branch back of the slot: nearest the code first.
    let (low_signed, high_signed) = (low as i64 as i128, high as i64 as i128);
    let lowest = high_signed + 4 - reach + 4096;
    let highest = low_signed + reach - region - 4096;
    let middle = (low_signed + high_signed) / 2;
    let first = (lowest + region - 1).div_euclid(region) * region;
    let mut slots: Vec<i128> = (0..)
        .map(|i| first + i * region)
        .take_while(|&slot| slot <= highest)
        .collect();
    if slots.is_empty() {
        return Ok(None);
    }
    slots.sort_by_key(|&slot| (slot - middle).abs());
    for slot in slots {
        let base = slot as i64 as u64;
        let walked = tables.walk(base, read)?;
        let Some(&(level, at, value)) = walked.last() else {
            continue;
        };
        // An invalid entry of an existing level-2 table: the 2 MiB are the guest's to
        // map, and it maps nothing there. (Glass's own block of an earlier trace counts
        // as free.)
        if level == 2 && (value == 0 || value == entry) {
            let table = at & !0xfff;
            return Ok(Some(Layout::aarch64(
                base,
                gpa,
                at,
                entry,
                format!(
                    "entry {} of the guest's level-2 table at guest-physical {table:#x}",
                    (at & 0xfff) / 8
                ),
            )));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_virt_under_tcg_is_taken() {
        let command = |extra: &[&str]| -> Vec<String> {
            ["qemu-system-aarch64", "-M", "virt", "-kernel", "k"]
                .iter()
                .chain(extra)
                .map(|s| s.to_string())
                .collect()
        };
        assert!(check_command(&command(&[])).is_ok());
        assert!(check_command(&command(&["-accel", "tcg,thread=multi"])).is_ok());
        assert!(check_command(&command(&["-enable-kvm"])).is_err());
        assert!(check_command(&command(&["-accel", "kvm"])).is_err());
        assert!(check_command(&command(&["-dtb", "x.dtb"])).is_err());
        let mut other = command(&[]);
        other[2] = "sbsa-ref".into();
        assert!(check_command(&other).is_err());
        let arguments = arguments(&command(&["-m", "128"]), 7, 130 * MIB, Some(Path::new("t")));
        assert!(arguments.contains(&"virt,memory-backend=glass-ram".to_string()));
        assert!(!arguments.contains(&"128".to_string()));
        assert!(arguments.contains(&"130M".to_string()));
        assert_eq!(ram_layout(128), (128 * MIB, 130 * MIB));
        assert_eq!(ram_layout(127), (128 * MIB, 130 * MIB));
    }

    /// A device tree with a root (#address-cells 2, #size-cells 2) and a memory node.
    fn tree(memory: &[(u64, u64)]) -> Vec<u8> {
        let mut strings = Vec::new();
        let mut string = |name: &str| {
            let at = strings.len() as u32;
            strings.extend_from_slice(name.as_bytes());
            strings.push(0);
            at
        };
        let (address_cells, size_cells, reg) = (
            string("#address-cells"),
            string("#size-cells"),
            string("reg"),
        );
        let mut structure = Vec::new();
        let word = |s: &mut Vec<u8>, w: u32| s.extend_from_slice(&w.to_be_bytes());
        let node = |s: &mut Vec<u8>, name: &str| {
            word(s, 1);
            let mut bytes = name.as_bytes().to_vec();
            bytes.push(0);
            bytes.resize(bytes.len().div_ceil(4) * 4, 0);
            s.extend_from_slice(&bytes);
        };
        node(&mut structure, "");
        for (name, value) in [(address_cells, 2u32), (size_cells, 2)] {
            word(&mut structure, 3);
            word(&mut structure, 4);
            word(&mut structure, name);
            word(&mut structure, value);
        }
        node(&mut structure, "memory@40000000");
        word(&mut structure, 3);
        word(&mut structure, 16 * memory.len() as u32);
        word(&mut structure, reg);
        for &(base, size) in memory {
            for value in [base, size] {
                word(&mut structure, (value >> 32) as u32);
                word(&mut structure, value as u32);
            }
        }
        word(&mut structure, 2);
        word(&mut structure, 2);
        word(&mut structure, 9);
        let mut tree = vec![0u8; 40];
        tree[0..4].copy_from_slice(&0xd00d_feedu32.to_be_bytes());
        tree[8..12].copy_from_slice(&40u32.to_be_bytes());
        let strings_at = 40 + structure.len() as u32;
        tree[12..16].copy_from_slice(&strings_at.to_be_bytes());
        tree.extend(structure);
        tree.extend(strings);
        tree
    }

    /// The demo's tables: 39-bit upper half, level-1 table at 0x1000 whose entry 1
    /// (0x4000_0000..) points to a level-2 table at 0x2000 mapping the image at
    /// 0x4020_0000 with one 2 MiB block (read-only, executable).
    #[test]
    fn the_region_takes_a_free_block_near_the_code_with_its_attributes() {
        let offset = 0xffff_ff80_0000_0000u64;
        let image_block = 0x4020_0000 | 1 << 10 | 3 << 8 | 2 << 6 | 1 << 2 | 1;
        let entries = [(0x1000 + 8, 0x2000 | 3), (0x2000 + 8, image_block)];
        let mut read = |at: u64| Ok(entries.iter().find(|e| e.0 == at).map_or(0, |e| e.1));
        let tables = Tables {
            root: 0x1000,
            bits: 39,
        };
        let (low, high) = (offset + 0x4020_1000, offset + 0x4020_3000);
        let gpa = 0x4800_0000;
        let layout = place(&tables, low, high, gpa, REACH, &mut read)
            .unwrap()
            .unwrap();
        // Next to the image's block: the slot after it.
        assert_eq!(layout.base(), offset + 0x4040_0000);
        let (at, entry) = layout.entry();
        assert_eq!(at, 0x2000 + 8 * 2);
        // Normal memory (AttrIndx 1), inner shareable, accessed, EL1 read-write,
        // executable at EL1 only.
        assert_eq!(entry, gpa | 1 << 2 | 3 << 8 | 1 << 10 | UXN | 1);
        assert!(layout.entry_is_free(0) && layout.entry_is_free(entry));
        for (from, to) in [(low, layout.base() + REGION_BYTES), (high, layout.base())] {
            assert!((to as i64 - from as i64).unsigned_abs() < 1 << 27);
        }
        // No level-2 table near the code: refused.
        let mut bare = |at: u64| Ok(if at == 0x1000 + 8 { image_block } else { 0 });
        let huge = Tables {
            root: 0x1000,
            bits: 39,
        };
        assert!(place(&huge, low, high, gpa, REACH, &mut bare)
            .unwrap()
            .is_none());
        // Code spread over more than a branch reaches: refused.
        assert!(
            place(&tables, low, low + (300 << 20), gpa, REACH, &mut read)
                .unwrap()
                .is_none()
        );
        // With far patches (adrp): placed, within their ±2 GiB.
        assert!(
            place(&tables, low, low + (300 << 20), gpa, FAR_REACH, &mut read)
                .unwrap()
                .is_some()
        );
        let starts = |bits| Tables { root: 0, bits }.start_level();
        assert_eq!((starts(48), starts(39), starts(30)), (0, 1, 2));
    }

    #[test]
    fn the_memory_node_is_set_back_in_place() {
        let mut dtb = tree(&[(RAM_BASE, 130 * MIB)]);
        let before = dtb.len();
        set_memory_size(&mut dtb, RAM_BASE, 128 * MIB).unwrap();
        assert_eq!(dtb, tree(&[(RAM_BASE, 128 * MIB)]));
        assert_eq!(dtb.len(), before);
        let mut other = tree(&[(0x8000_0000, MIB)]);
        assert!(set_memory_size(&mut other, RAM_BASE, MIB).is_err());
        assert!(set_memory_size(&mut [0u8; 8], RAM_BASE, MIB).is_err());
    }
}
