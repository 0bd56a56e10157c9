//! What /proc says about a process: its threads, names and executable mappings.
//! Read outside the target's stopped window.

use std::fs;
use std::io;

/// One executable mapping from /proc/PID/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    /// The mapped file, a pseudo-name such as `[vdso]`, or `[anon]` for anonymous code.
    pub path: String,
    /// The file was deleted or replaced after it was mapped.
    pub deleted: bool,
}

/// The load bias of a file mapped at `mapping`, given its loadable segments as
/// (file offset, virtual address, file size): where the mapping starts, minus where the
/// file says that part goes. Segments need not start on a page (lld packs them): the
/// kernel maps from the page below, so the one whose page-aligned start is the last at
/// or before the mapping's offset is the one mapped there.
pub fn load_bias(mapping: &Mapping, segments: &[(u64, u64, u64)]) -> Option<u64> {
    const PAGE: u64 = 4096;
    let (offset, address, _) = segments
        .iter()
        .copied()
        .filter(|&(offset, _, size)| {
            offset & !(PAGE - 1) <= mapping.file_offset
                && mapping.file_offset < offset + size.max(1)
        })
        .max_by_key(|&(offset, _, _)| offset)?;
    let page_offset = offset & !(PAGE - 1);
    let page_address = address.wrapping_sub(offset - page_offset);
    Some(
        mapping
            .start
            .wrapping_sub(page_address + (mapping.file_offset - page_offset)),
    )
}

/// The executable mappings of a process, in address order.
pub fn executable_mappings(pid: i32) -> io::Result<Vec<Mapping>> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(text.lines().filter_map(parse_maps_line).collect())
}

fn parse_maps_line(line: &str) -> Option<Mapping> {
    // 7f0e1c000000-7f0e1c021000 r-xp 00001000 fd:01 1234   /usr/lib/x.so (deleted)
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let offset = fields.next()?;
    let _device = fields.next()?;
    let _inode = fields.next()?;
    let path = fields.next().unwrap_or("").trim_start();
    if perms.as_bytes().get(2) != Some(&b'x') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let (path, deleted) = match path.strip_suffix(" (deleted)") {
        Some(path) => (path, true),
        None => (path, false),
    };
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        file_offset: u64::from_str_radix(offset, 16).ok()?,
        path: if path.is_empty() {
            "[anon]".to_string()
        } else {
            path.to_string()
        },
        deleted,
    })
}

/// The thread ids of a process.
pub fn thread_ids(pid: i32) -> io::Result<Vec<i32>> {
    let mut tids: Vec<i32> = fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

/// A thread's name (its `comm`), or empty if it is gone.
pub fn thread_name(pid: i32, tid: i32) -> String {
    fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|name| name.trim_end_matches('\n').to_string())
        .unwrap_or_default()
}

/// The thread group (process) a thread belongs to.
pub fn thread_group_of(tid: i32) -> Option<i32> {
    let status = fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Tgid:"))
        .and_then(|value| value.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn load_bias_of_segments_packed_off_page() {
        // lld's layout: the code segment starts mid-page in the file and one page
        // further on in memory.
        let segments = [(0, 0, 0x17194), (0x17194, 0x18194, 0x3f19c)];
        let mapping = super::Mapping {
            start: 0x7f00_0001_8000,
            end: 0x7f00_0005_8000,
            file_offset: 0x17000,
            path: "/lib.so".into(),
            deleted: false,
        };
        assert_eq!(
            super::load_bias(&mapping, &segments),
            Some(0x7f00_0000_0000)
        );
    }

    use super::*;

    #[test]
    fn parses_maps_lines() {
        let line = "7f0e1c000000-7f0e1c021000 r-xp 00001000 fd:01 1234                       /usr/lib/x.so (deleted)";
        let mapping = parse_maps_line(line).unwrap();
        assert_eq!(mapping.start, 0x7f0e1c000000);
        assert_eq!(mapping.file_offset, 0x1000);
        assert_eq!(mapping.path, "/usr/lib/x.so");
        assert!(mapping.deleted);
        assert!(parse_maps_line("7f0e1c000000-7f0e1c021000 rw-p 00000000 00:00 0").is_none());
        let anon = parse_maps_line("7f0e1c000000-7f0e1c021000 r-xp 00000000 00:00 0 ").unwrap();
        assert_eq!(anon.path, "[anon]");
        let vdso = parse_maps_line(
            "7ffd1000-7ffd3000 r-xp 00000000 00:00 0                          [vdso]",
        )
        .unwrap();
        assert_eq!(vdso.path, "[vdso]");
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id() as i32;
        let maps = executable_mappings(me).unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert!(maps.iter().any(|m| m.path == exe.to_str().unwrap()));
        assert!(thread_ids(me).unwrap().contains(&me));
        assert_eq!(thread_group_of(me), Some(me));
    }
}
