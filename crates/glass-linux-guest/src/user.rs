//! The user space of a Linux guest's processes (`--guest-root DIR`): which files a
//! process has mapped, read from its `mm` in guest memory, and those files found in DIR
//! (a copy of the guest's filesystem), so that its user stacks unwind with the same
//! DwarfUnwinder (CFI, then frame pointers) as a host process's.
//!
//! The mappings are the kernel's own: the `mm_struct`'s maple tree of `vm_area_struct`s
//! (6.1 on; the `mmap` list of older kernels), each executable one's `vm_file` named by
//! walking its dentry's `d_parent` chain. No library reads a guest kernel's maple tree
//! from outside it (drgn does, with Python and a live or core-dump program), hence this
//! walk of a few node layouts. Offsets come from BTF; the node layouts are the 6.1
//! kernel's (`include/linux/maple_tree.h`, 64-bit). Every VMA read is checked (its
//! `vm_mm` is the process's, its range ordered), so a node read mid-update or a layout
//! that differs yields fewer mappings, never wrong ones.
//!
//! Mount points are not followed: a path is the one within the file's own mount (the
//! whole path for a root filesystem or an initramfs).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use glass_target::guest::VcpuRegs;
use glass_target::guest_os::{GuestMemory, UserSpace};
use glass_target::TargetError;

use crate::btf::{read_btf, struct_offsets};
use crate::kernel_data;
use crate::tasks::LinuxTasks;

/// Linux's VM_EXEC.
const VM_EXEC: u64 = 0x4;
/// The guest's page size for `vm_pgoff` (4 KiB on Debian's x86-64 and arm64 kernels).
const PAGE: u64 = 4096;
/// maple_tree.h: the node pointer's low bits hold its type.
const MAPLE_NODE_MASK: u64 = 255;
const MAPLE_NODE_TYPE_SHIFT: u64 = 3;
const MAPLE_NODE_TYPE_MASK: u64 = 0x0f;
const MAPLE_LEAF_64: u64 = 1;
const MAPLE_RANGE_64: u64 = 2;
const MAPLE_ARANGE_64: u64 = 3;
/// Slots per node, and where a node's pivots and slots are (after its parent pointer).
const RANGE64_SLOTS: usize = 16;
const ARANGE64_SLOTS: usize = 10;
const NODE_BYTES: usize = 256;
/// Bounds on one walk: nodes visited, VMAs kept, path components.
const MAX_NODES: usize = 4096;
const MAX_VMAS: usize = 65536;
const MAX_DEPTH: usize = 64;

/// Where the fields a process's mappings are read through are (byte offsets, BTF).
#[derive(Debug, Clone, Copy)]
pub struct MmLayout {
    task_mm: u64,
    /// `mm_struct.mm_mt.ma_root` (6.1 on), or `mm_struct.mmap` (older).
    maple_root: Option<u64>,
    mmap: Option<u64>,
    exe_file: Option<u64>,
    vm_start: u64,
    vm_end: u64,
    vm_mm: u64,
    vm_flags: u64,
    vm_pgoff: u64,
    vm_file: u64,
    vm_next: Option<u64>,
    /// `file.f_path.dentry`, `dentry.d_name.name`, `.len`, `dentry.d_parent`.
    file_dentry: u64,
    name: u64,
    name_len: u64,
    parent: u64,
}

impl MmLayout {
    /// From the guest kernel's BTF; a BTF without these structs is bad input.
    pub fn load(btf_path: &Path, task_mm: Option<u64>) -> Result<MmLayout, TargetError> {
        let bad = |what: &str| {
            TargetError::BadInput(format!(
                "{}: {what} (--guest-root reads a process's mappings through it)",
                btf_path.display()
            ))
        };
        let btf = read_btf(btf_path)?;
        let task_mm = task_mm.ok_or_else(|| bad("task_struct has no mm member"))?;
        let of = |name: &str| struct_offsets(&btf, name).unwrap_or_default();
        let (mm, vma, file, path, dentry, qstr, tree) = (
            of("mm_struct"),
            of("vm_area_struct"),
            of("file"),
            of("path"),
            of("dentry"),
            of("qstr"),
            of("maple_tree"),
        );
        let need = |map: &HashMap<String, u64>, owner: &str, name: &str| {
            map.get(name)
                .copied()
                .ok_or_else(|| bad(&format!("no {owner}.{name} in BTF")))
        };
        let maple_root = match (mm.get("mm_mt"), tree.get("ma_root")) {
            (Some(mt), Some(root)) => Some(mt + root),
            _ => None,
        };
        let mmap = mm.get("mmap").copied();
        if maple_root.is_none() && mmap.is_none() {
            return Err(bad("mm_struct has neither mm_mt nor mmap"));
        }
        Ok(MmLayout {
            task_mm,
            maple_root,
            mmap,
            exe_file: mm.get("exe_file").copied(),
            vm_start: need(&vma, "vm_area_struct", "vm_start")?,
            vm_end: need(&vma, "vm_area_struct", "vm_end")?,
            vm_mm: need(&vma, "vm_area_struct", "vm_mm")?,
            vm_flags: need(&vma, "vm_area_struct", "vm_flags")?,
            vm_pgoff: need(&vma, "vm_area_struct", "vm_pgoff")?,
            vm_file: need(&vma, "vm_area_struct", "vm_file")?,
            vm_next: vma.get("vm_next").copied(),
            file_dentry: need(&file, "file", "f_path")? + need(&path, "path", "dentry")?,
            name: need(&dentry, "dentry", "d_name")? + need(&qstr, "qstr", "name")?,
            name_len: need(&dentry, "dentry", "d_name")? + need(&qstr, "qstr", "len")?,
            parent: need(&dentry, "dentry", "d_parent")?,
        })
    }
}

/// One executable file mapping of a guest process, as its VMA says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserMapping {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    /// The file's path in the guest.
    pub path: String,
}

/// Reads guest-virtual memory of the kernel: true if all of the buffer was read.
pub type ReadKernel<'r> = dyn FnMut(u64, &mut [u8]) -> bool + 'r;

fn word(read: &mut ReadKernel, at: u64) -> Option<u64> {
    let mut bytes = [0u8; 8];
    read(at, &mut bytes).then(|| u64::from_le_bytes(bytes))
}

/// The executable file mappings of `task`'s address space; None when it has none
/// (a kernel thread) or its `mm` cannot be read.
pub fn mappings(layout: &MmLayout, task: u64, read: &mut ReadKernel) -> Option<Vec<UserMapping>> {
    let mm = word(read, task.wrapping_add(layout.task_mm)).filter(|&mm| kernel_data(mm))?;
    let mut vmas = Vec::new();
    if let Some(root_at) = layout.maple_root {
        let root = word(read, mm.wrapping_add(root_at))?;
        let mut nodes = 0;
        // The root is a node where it is marked as one (xa_is_node: MAPLE_ROOT_NODE, 2,
        // in the low bits), else the tree's one entry.
        if root & 3 == 2 && root > 4096 {
            maple_entries(read, root, u64::MAX, 0, &mut nodes, &mut vmas);
        } else if kernel_data(root) {
            vmas.push(root);
        }
    } else if let (Some(mmap), Some(next)) = (layout.mmap, layout.vm_next) {
        let mut vma = word(read, mm.wrapping_add(mmap))?;
        while kernel_data(vma) && vmas.len() < MAX_VMAS {
            vmas.push(vma);
            vma = word(read, vma.wrapping_add(next)).unwrap_or(0);
        }
    }
    let mut found = Vec::new();
    for vma in vmas {
        if let Some(mapping) = executable_mapping(layout, read, mm, vma) {
            if !found.contains(&mapping) {
                found.push(mapping);
            }
        }
    }
    found.sort_by_key(|m| m.start);
    Some(found)
}

/// The path of the process's executable (`mm->exe_file`), where no VMA could be read.
pub fn exe_path(layout: &MmLayout, task: u64, read: &mut ReadKernel) -> Option<String> {
    let mm = word(read, task.wrapping_add(layout.task_mm)).filter(|&mm| kernel_data(mm))?;
    let file = word(read, mm.wrapping_add(layout.exe_file?)).filter(|&f| kernel_data(f))?;
    file_path(layout, read, file)
}

/// A maple tree node's entries (the leaves' VMA pointers), depth first: each slot's
/// range ends at its pivot (the last at the node's own end), and a node's data ends at
/// the first zero pivot past the first or at a pivot that reaches the node's end. An
/// encoded node (`mt_mk_node`) is the node's address with its type in bits 3-6; an
/// internal node's slots are all nodes.
fn maple_entries(
    read: &mut ReadKernel,
    entry: u64,
    max: u64,
    depth: usize,
    nodes: &mut usize,
    into: &mut Vec<u64>,
) {
    if depth > MAX_DEPTH || *nodes >= MAX_NODES {
        return;
    }
    *nodes += 1;
    let node = entry & !MAPLE_NODE_MASK;
    let kind = (entry >> MAPLE_NODE_TYPE_SHIFT) & MAPLE_NODE_TYPE_MASK;
    let slots = match kind {
        MAPLE_LEAF_64 | MAPLE_RANGE_64 => RANGE64_SLOTS,
        MAPLE_ARANGE_64 => ARANGE64_SLOTS,
        _ => return,
    };
    let mut bytes = [0u8; NODE_BYTES];
    if !kernel_data(node) || !read(node, &mut bytes) {
        return;
    }
    let at = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
    // parent, pivot[slots - 1], slot[slots]
    let (pivots, slot0) = (1, slots);
    for i in 0..slots {
        let pivot = if i + 1 < slots { at(pivots + i) } else { max };
        if i > 0 && pivot == 0 {
            break;
        }
        let slot = at(slot0 + i);
        if kind == MAPLE_LEAF_64 {
            if kernel_data(slot) && into.len() < MAX_VMAS {
                into.push(slot);
            }
        } else if slot != 0 {
            maple_entries(read, slot, pivot, depth + 1, nodes, into);
        }
        if pivot >= max {
            break;
        }
    }
}

/// The VMA at `vma` of `mm`, if it is one and maps a file executable.
fn executable_mapping(
    layout: &MmLayout,
    read: &mut ReadKernel,
    mm: u64,
    vma: u64,
) -> Option<UserMapping> {
    let field = |read: &mut ReadKernel, at: u64| word(read, vma.wrapping_add(at));
    if field(read, layout.vm_mm)? != mm {
        return None;
    }
    let (start, end) = (field(read, layout.vm_start)?, field(read, layout.vm_end)?);
    let flags = field(read, layout.vm_flags)?;
    if start >= end || end >> 56 != 0 || flags & VM_EXEC == 0 {
        return None;
    }
    let file = field(read, layout.vm_file)?;
    if !kernel_data(file) {
        return None;
    }
    let pgoff = field(read, layout.vm_pgoff)?;
    Some(UserMapping {
        start,
        end,
        file_offset: pgoff.wrapping_mul(PAGE),
        path: file_path(layout, read, file)?,
    })
}

/// A `struct file`'s path: its dentry's names up the `d_parent` chain to the root
/// (whose parent is itself).
fn file_path(layout: &MmLayout, read: &mut ReadKernel, file: u64) -> Option<String> {
    let mut dentry = word(read, file.wrapping_add(layout.file_dentry))?;
    let mut names = Vec::new();
    for _ in 0..MAX_DEPTH {
        if !kernel_data(dentry) {
            return None;
        }
        let parent = word(read, dentry.wrapping_add(layout.parent))?;
        if parent == dentry {
            break;
        }
        let mut len = [0u8; 4];
        if !read(dentry.wrapping_add(layout.name_len), &mut len) {
            return None;
        }
        let len = (u32::from_le_bytes(len) as usize).min(255);
        let at = word(read, dentry.wrapping_add(layout.name))?;
        let mut name = vec![0u8; len];
        if !kernel_data(at) || !read(at, &mut name) {
            return None;
        }
        names.push(String::from_utf8_lossy(&name).into_owned());
        dentry = parent;
    }
    names.reverse();
    Some(format!("/{}", names.join("/")))
}

/// What is known of one guest process's user space.
#[derive(Default)]
struct Known {
    /// Its executable mappings' ranges (found in DIR or not).
    ranges: Vec<(u64, u64)>,
    /// Those of its binaries found in DIR.
    walkable: Vec<(u64, u64)>,
    reads: u32,
    /// When it was last read (ns since the recording's start).
    read_at_ns: u64,
}

/// The guest processes seen in user mode, and the figures said at the end.
pub struct GuestProcesses {
    layout: MmLayout,
    root: PathBuf,
    known: HashMap<u32, Known>,
    walked: u64,
    not_walked: u64,
    missing: Vec<String>,
    recorded: u64,
    unreadable: u64,
}

/// How often one process's mappings are read again for a pc outside them, or as time
/// passes.
const MAX_READS: u32 = 8;
/// A process's mappings are read again after this long, doubled at each read (while
/// [`MAX_READS`] allow: 0.1 s to 12.8 s): a process first seen in its dynamic loader
/// maps its libraries after that read, and only its callers' frames, not its pc, lie
/// in them (userspin-dyn's first second walked to `main` only, at 1 s fixed).
const REREAD_NS: u64 = 100_000_000;

impl GuestProcesses {
    pub fn new(layout: MmLayout, root: PathBuf) -> Self {
        GuestProcesses {
            layout,
            root,
            known: HashMap::new(),
            walked: 0,
            not_walked: 0,
            missing: Vec::new(),
            recorded: 0,
            unreadable: 0,
        }
    }

    /// Whether process `tgid`'s mappings are to be read for a sample at `pc` at
    /// `time_ns`: first seen, or (a few times) `pc` outside what is known or the last
    /// read a while ago (a library mapped since).
    pub fn wants_read(&self, tgid: u32, pc: u64, time_ns: u64) -> bool {
        match self.known.get(&tgid) {
            None => true,
            Some(known) => {
                known.reads < MAX_READS
                    && (!known.ranges.iter().any(|&(s, e)| (s..e).contains(&pc))
                        || time_ns.saturating_sub(known.read_at_ns)
                            >= REREAD_NS << known.reads.saturating_sub(1))
            }
        }
    }

    /// Takes a read of `tgid`'s mappings; returns those found in DIR, as the recorder's
    /// mappings (the file in DIR as the path), not yet recorded.
    pub fn learned(
        &mut self,
        tgid: u32,
        time_ns: u64,
        read: Option<Vec<UserMapping>>,
    ) -> Vec<glass_target::procfs::Mapping> {
        let known = self.known.entry(tgid).or_default();
        known.reads += 1;
        known.read_at_ns = time_ns;
        let Some(read) = read else {
            self.unreadable += 1;
            return Vec::new();
        };
        let mut new = Vec::new();
        for mapping in read {
            let range = (mapping.start, mapping.end);
            if known.ranges.contains(&range) {
                continue;
            }
            known.ranges.push(range);
            let in_root = self.root.join(mapping.path.trim_start_matches('/'));
            if !in_root.is_file() {
                if !self.missing.contains(&mapping.path) {
                    self.missing.push(mapping.path);
                }
                continue;
            }
            known.walkable.push(range);
            self.recorded += 1;
            new.push(glass_target::procfs::Mapping {
                start: mapping.start,
                end: mapping.end,
                file_offset: mapping.file_offset,
                path: in_root.to_string_lossy().into_owned(),
                deleted: false,
            });
        }
        new
    }

    /// Whether `pc` of process `tgid` is in a binary found in DIR.
    pub fn walkable(&self, tgid: u32, pc: u64) -> bool {
        self.known
            .get(&tgid)
            .is_some_and(|k| k.walkable.iter().any(|&(s, e)| (s..e).contains(&pc)))
    }

    /// The figures printed at the end.
    pub fn figures(&self) -> String {
        let missing = if self.missing.is_empty() {
            String::new()
        } else {
            let shown: Vec<&str> = self.missing.iter().take(3).map(String::as_str).collect();
            format!(
                "; not in {}: {}{}",
                self.root.display(),
                shown.join(", "),
                if self.missing.len() > 3 { ", ..." } else { "" }
            )
        };
        format!(
            "guest user stacks (--guest-root): {} read ({} unreadable), {} recorded; {} user samples walked, {} left as [user]{missing}",
            glass_format::count(self.known.len() as u64, "process"),
            self.unreadable,
            glass_format::count(self.recorded, "module"),
            self.walked,
            self.not_walked
        )
    }
}

/// Where no VMA could be read: the executable (`mm->exe_file`) alone, at the addresses
/// its executable segments name, which holds for a non-PIE binary only (a PIE's load
/// address is in the VMAs).
pub fn exe_mappings(guest_path: &str, file: &Path) -> Vec<UserMapping> {
    use object::{Object, ObjectSegment, SegmentFlags};
    let Ok(bytes) = std::fs::read(file) else {
        return Vec::new();
    };
    let Ok(elf) = object::File::parse(&*bytes) else {
        return Vec::new();
    };
    if elf.kind() != object::ObjectKind::Executable {
        return Vec::new();
    }
    elf.segments()
        .filter(|s| matches!(s.flags(), SegmentFlags::Elf { p_flags, .. } if p_flags.contains(object::elf::PF_X)))
        .map(|s| {
            let (offset, _) = s.file_range();
            let start = s.address() & !(PAGE - 1);
            UserMapping {
                start,
                end: (s.address() + s.size()).next_multiple_of(PAGE),
                file_offset: offset & !(PAGE - 1),
                path: guest_path.to_string(),
            }
        })
        .collect()
}

impl GuestProcesses {
    /// The file in DIR for a guest path.
    pub fn in_root(&self, guest_path: &str) -> PathBuf {
        self.root.join(guest_path.trim_start_matches('/'))
    }
}

/// A user-mode sample of vCPU `vcpu`, its user stack copied, once the VM runs again:
/// the process's mappings read from guest memory when it is first seen (only the copy
/// was taken while the VM was stopped), its binaries in DIR as the address space's
/// modules, and whether its stack is to be walked there. None when no user task was
/// read (the sample stays `[user] comm`).
pub fn user_space(
    tasks: &LinuxTasks,
    user: &mut GuestProcesses,
    vcpu: usize,
    r: &VcpuRegs,
    time_ns: u64,
    memory: &mut dyn GuestMemory,
) -> Option<UserSpace> {
    let Some((task, tgid, _comm)) = tasks.user_task(vcpu) else {
        user.not_walked += 1;
        return None;
    };
    let space = (glass_format::GUEST_PROCESS_PIDS | tgid) as i32;
    let mut new_mappings = Vec::new();
    if user.wants_read(tgid, r.ip(), time_ns) {
        // Page tables that map the kernel and stay valid while the VM runs: the
        // process's own (alive: it is the one read), or with PTI their kernel half (the
        // page below the user's: CR3 bit 12 clear), before the last vCPU's seen in the
        // kernel, whose process may have exited since (its tables freed).
        let mut tables = vec![*r];
        if let VcpuRegs::X86_64(mut x) = *r {
            if x.cr3 & (1 << 12) != 0 {
                x.cr3 &= !(1 << 12);
                tables.push(VcpuRegs::X86_64(x));
            }
        }
        tables.extend(tasks.kernel_regs());
        let has_ram = memory.has_ram();
        let mut read = |at: u64, buf: &mut [u8]| {
            has_ram
                && tables
                    .iter()
                    .any(|t| memory.read_mapped(t, at, buf) == buf.len())
        };
        let layout = user.layout;
        let mut found = mappings(&layout, task, &mut read);
        if found.as_ref().is_none_or(Vec::is_empty) {
            // The executable alone, where no VMA could be read.
            if let Some(exe) = exe_path(&layout, task, &mut read) {
                let file = user.in_root(&exe);
                found = Some(exe_mappings(&exe, &file)).filter(|m| !m.is_empty());
            }
        }
        new_mappings = user.learned(tgid, time_ns, found);
    }
    let walk = user.walkable(tgid, r.ip());
    if walk {
        user.walked += 1;
    } else {
        user.not_walked += 1;
    }
    Some(UserSpace {
        space,
        new_mappings,
        walk,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's own kernel BTF, where this machine has one: every offset the
    /// mappings are read through is found, and consistent with the kernel's structs.
    #[test]
    fn host_btf_mm_layout() {
        let path = Path::new("/sys/kernel/btf/vmlinux");
        if !path.exists() {
            eprintln!("no /sys/kernel/btf/vmlinux here");
            return;
        }
        let task = crate::tasks::task_layout(path).unwrap();
        let layout = MmLayout::load(path, task.mm).unwrap();
        // vm_start and vm_end are adjacent longs; a 6.1+ kernel has the maple tree.
        assert_eq!(layout.vm_end, layout.vm_start + 8);
        assert!(layout.maple_root.is_some() || layout.mmap.is_some());
        assert!(layout.name_len < layout.name, "{layout:?}");
        assert!(layout.exe_file.is_some());
    }

    /// The `exe_file` fallback on a real non-PIE binary (the kit's userspin, built
    /// here with the host's compiler): its text is inside the one range found; a PIE
    /// (this test's own binary) gives none.
    #[test]
    fn exe_mappings_of_a_static_binary() {
        use object::{Object, ObjectSymbol};
        let dir = std::env::temp_dir().join(format!("glass-exe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("userspin");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guests/linux/spin.c");
        let built = std::process::Command::new("cc")
            .args([
                "-static",
                "-nostdlib",
                "-ffreestanding",
                "-fno-pie",
                "-no-pie",
                "-O2",
            ])
            .arg("-o")
            .arg(&exe)
            .arg(&source)
            .status();
        if !built.is_ok_and(|s| s.success()) {
            eprintln!("no C compiler here");
            return;
        }
        let found = exe_mappings("/userspin", &exe);
        let bytes = std::fs::read(&exe).unwrap();
        let elf = object::File::parse(&*bytes).unwrap();
        let inner = elf
            .symbols()
            .find(|s| s.name() == Ok("spin_inner"))
            .unwrap()
            .address();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!((found[0].start..found[0].end).contains(&inner), "{found:?}");
        assert_eq!(found[0].path, "/userspin");
        let own = std::env::current_exe().unwrap();
        assert!(exe_mappings("/x", &own).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn guest_root_without_btf_structs_is_one_line() {
        let dir = std::env::temp_dir().join(format!("glass-mm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_btf = dir.join("not-btf");
        std::fs::write(&not_btf, b"hello").unwrap();
        let e = MmLayout::load(&not_btf, Some(0)).unwrap_err().to_string();
        assert!(e.contains("not BTF"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
