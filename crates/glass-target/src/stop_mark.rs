//! The stop mark: one word in a page shared between glass and its guardian process that
//! says since when glass holds its target stopped (a VM through its GDB stub, a Xen
//! domain paused, threads of a process interrupted with ptrace), or that it holds
//! nothing.
//!
//! glass calls [`StopMark::begin`] just before the request that stops the target and
//! [`StopMark::end`] once the target runs again: stores of the monotonic clock (a vDSO
//! read, except where the clock source has none: Xen's, in a PV dom0) and of the calling
//! thread's id (whose state the guardian reads), then a store of
//! zero; nothing that can block. The guardian only reads the word,
//! every few milliseconds, from its own process: it sees a stop that has outlived its
//! bound (glass stopped by SIGSTOP, stalled, or spinning) and a glass that died holding
//! one. The clock is CLOCK_MONOTONIC, the same in both processes.
//!
//! The page is a memfd created close-on-exec, so nothing glass launches (a traced
//! program, QEMU) inherits it; the guardian is handed it across exec on purpose (see
//! `glass_record::guardian`).

use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// CLOCK_MONOTONIC in nanoseconds (never 0 on a running system).
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// The calling thread's id, asked of the kernel once per thread: `begin` runs at every
/// sample, and in a Xen PV dom0 each system call is a trap through the hypervisor. (No
/// thread of glass that begins a stop was forked from another that did.)
fn own_tid() -> i32 {
    thread_local! {
        static TID: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
    }
    TID.with(|tid| {
        if tid.get() == 0 {
            // SAFETY: gettid has no arguments.
            tid.set(unsafe { libc::gettid() });
        }
        tid.get()
    })
}

pub struct StopMark {
    fd: OwnedFd,
    word: *const AtomicU64,
}

// SAFETY: the word is only accessed atomically; the mapping lives as long as the mark.
unsafe impl Send for StopMark {}
// SAFETY: as above.
unsafe impl Sync for StopMark {}

impl StopMark {
    /// glass's side: a fresh mark (holding nothing), close-on-exec.
    pub fn create() -> std::io::Result<StopMark> {
        // SAFETY: a name and flags.
        let fd = unsafe { libc::memfd_create(c"glass-stop-mark".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sizing our own memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Self::map(fd)
    }

    /// The guardian's side: the mark inherited as descriptor `fd`.
    pub fn inherit(fd: RawFd) -> std::io::Result<StopMark> {
        // SAFETY: the caller passes the descriptor glass handed down.
        Self::map(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn map(fd: OwnedFd) -> std::io::Result<StopMark> {
        // SAFETY: mapping one shared page of a memfd we hold.
        let pointer = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if pointer == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(StopMark {
            fd,
            word: pointer as *const AtomicU64,
        })
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn word(&self) -> &AtomicU64 {
        // SAFETY: the mapping lives as long as self.
        unsafe { &*self.word }
    }

    /// The thread id word, after the time word.
    fn thread_word(&self) -> &AtomicU64 {
        // SAFETY: the second word of the mapped page.
        unsafe { &*self.word.add(1) }
    }

    /// glass is about to stop the target (or already holds it stopped from now on).
    pub fn begin(&self) {
        self.thread_word().store(own_tid() as u64, Ordering::SeqCst);
        self.word().store(monotonic_ns().max(1), Ordering::SeqCst);
    }

    /// The thread that began the last stop (0 before any).
    pub fn thread(&self) -> i32 {
        self.thread_word().load(Ordering::SeqCst) as i32
    }

    /// The target runs again (or glass no longer holds any of it).
    pub fn end(&self) {
        self.word().store(0, Ordering::SeqCst);
    }

    /// Since when (CLOCK_MONOTONIC ns) glass holds the target stopped, if it does.
    pub fn since_ns(&self) -> Option<u64> {
        match self.word().load(Ordering::SeqCst) {
            0 => None,
            since => Some(since),
        }
    }

    pub fn held(&self) -> bool {
        self.since_ns().is_some()
    }
}

impl Drop for StopMark {
    fn drop(&mut self) {
        // SAFETY: the page mapped in `map`.
        unsafe { libc::munmap(self.word as *mut c_void, 4096) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn begin_and_end_are_seen_through_a_second_mapping() {
        let mark = StopMark::create().unwrap();
        // SAFETY: a duplicate of our own descriptor.
        let other = StopMark::inherit(unsafe { libc::dup(mark.raw_fd()) }).unwrap();
        assert!(!other.held());
        let before = monotonic_ns();
        mark.begin();
        // SAFETY: gettid has no arguments.
        assert_eq!(other.thread(), unsafe { libc::gettid() });
        let since = other.since_ns().unwrap();
        assert!(since >= before && since <= monotonic_ns());
        mark.end();
        assert_eq!(other.since_ns(), None);
    }
}
