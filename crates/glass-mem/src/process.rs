//! Guest RAM read from the VMM's own address space: QEMU holds the guest's RAM in
//! ordinary mappings of its process, so a guest that was not started with a shared
//! memory backend can still be read without a round trip through its GDB stub. Each
//! read is one process_vm_readv (a few microseconds, no mapping kept), at the host
//! address the VMM reports for each guest-physical range (QEMU's `gpa2hva`).

use crate::ram::PhysicalMemory;

/// One guest-physical range and where it lies in the VMM's address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostRange {
    pub guest_physical: u64,
    pub len: u64,
    pub host_virtual: u64,
}

/// The guest's RAM in process `pid`'s memory.
pub struct ProcessRam {
    pid: i32,
    ranges: Vec<HostRange>,
}

impl ProcessRam {
    /// The RAM of the guest whose VMM is `pid`, laid out as `ranges` say. Reads one
    /// word of every range now, so that a VMM glass may not read (another user, no
    /// ptrace permission) is refused here with the system's error instead of failing
    /// every later read.
    pub fn open(pid: i32, ranges: Vec<HostRange>) -> std::io::Result<Self> {
        let ram = ProcessRam { pid, ranges };
        if ram.ranges.is_empty() {
            return Err(std::io::Error::other("no RAM ranges"));
        }
        for range in &ram.ranges {
            let mut word = [0u8; 8];
            ram.read_host(range.host_virtual, &mut word)?;
        }
        Ok(ram)
    }

    pub fn ranges(&self) -> &[HostRange] {
        &self.ranges
    }

    /// The guest's RAM in bytes.
    pub fn size(&self) -> u64 {
        self.ranges.iter().map(|r| r.len).sum()
    }

    fn read_host(&self, address: u64, buf: &mut [u8]) -> std::io::Result<()> {
        read_process(self.pid, address, buf)
    }
}

/// Reads all of `buf` from `address` in process `pid` (process_vm_readv): an error for a
/// failed or short read.
pub fn read_process(pid: i32, address: u64, buf: &mut [u8]) -> std::io::Result<()> {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: address as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: the local iovec covers `buf`, which we own mutably; the remote one is
    // only read by the kernel, in the other process.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if n as usize != buf.len() {
        return Err(std::io::Error::other("short read"));
    }
    Ok(())
}

/// Writes all of `buf` at `address` in process `pid` (process_vm_writev): an error for a
/// failed or short write. For data the guest reads (glass's own region in it), never
/// for code: QEMU's TCG would keep running what it translated before.
pub fn write_process(pid: i32, address: u64, buf: &[u8]) -> std::io::Result<()> {
    let local = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: address as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: the local iovec covers `buf`, which the kernel only reads; the remote one
    // is written in the other process.
    let n = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if n as usize != buf.len() {
        return Err(std::io::Error::other("short write"));
    }
    Ok(())
}

impl PhysicalMemory for ProcessRam {
    fn read_physical(&self, address: u64, buf: &mut [u8]) -> bool {
        let Some(end) = address.checked_add(buf.len() as u64) else {
            return false;
        };
        let Some(range) = self
            .ranges
            .iter()
            .find(|r| address >= r.guest_physical && end <= r.guest_physical + r.len)
        else {
            return false;
        };
        self.read_host(range.host_virtual + (address - range.guest_physical), buf)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_reach_the_other_process_memory() {
        let mut target = vec![0u8; 64];
        write_process(
            std::process::id() as i32,
            target.as_mut_ptr() as u64,
            &[7; 16],
        )
        .unwrap();
        assert_eq!(
            std::hint::black_box(&target)[..17],
            [[7u8; 16].as_slice(), &[0]].concat()
        );
    }

    #[test]
    fn reads_its_own_memory_through_the_ranges() {
        // This process stands for the VMM: "guest-physical" 0x1000.. is `backing`.
        let backing: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        let ram = ProcessRam::open(
            std::process::id() as i32,
            vec![HostRange {
                guest_physical: 0x1000,
                len: backing.len() as u64,
                host_virtual: backing.as_ptr() as u64,
            }],
        )
        .unwrap();
        let mut buf = [0u8; 16];
        assert!(ram.read_physical(0x1000 + 300, &mut buf));
        assert_eq!(&buf[..], &backing[300..316]);
        assert!(
            !ram.read_physical(0x1000 + 8190, &mut buf),
            "past the range"
        );
        assert!(!ram.read_physical(0, &mut buf), "below it");
        assert_eq!(
            ram.read_u64(0x1000),
            Some(u64::from_le_bytes(backing[..8].try_into().unwrap()))
        );
    }

    #[test]
    fn a_process_that_cannot_be_read_is_refused_at_once() {
        let ranges = vec![HostRange {
            guest_physical: 0,
            len: 4096,
            host_virtual: 8,
        }];
        assert!(ProcessRam::open(std::process::id() as i32, ranges).is_err());
    }
}
