//! The guest's frames, mapped into glass through libxenforeignmemory, kept in a bounded
//! cache.
//!
//! For a PV guest the "physical" addresses its page tables hold are machine frames
//! (MFNs): CR3 and every table entry name machine frames, and privcmd maps a PV
//! domain's frames by MFN. So the page walk of glass-mem runs unchanged over this
//! memory (for an HVM/PVH guest the same code would map guest frames, GFNs).
//!
//! Mapping a frame is a hypercall and an mmap; reading a mapped one is a memory copy.
//! The cache keeps up to `capacity` frames mapped, keyed by frame number (which is what
//! a mapping is of: unlike uniprof's cache, keyed by guest-virtual page and never
//! invalidated, a frame's mapping cannot go stale; translations, which can, are verified
//! by glass-mem's translation cache re-reading the leaf entry). When full, the least
//! recently used frame is unmapped. A mapping holds a reference on the frame, so a
//! frame the guest gives back cannot be handed to another domain while glass maps it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

use glass_mem::PhysicalMemory;

use super::libs::XenLibs;

const PAGE: u64 = 4096;

pub struct ForeignFrames {
    libs: Arc<XenLibs>,
    handle: *mut c_void,
    domid: u32,
    cache: RefCell<FrameCache>,
}

struct FrameCache {
    capacity: usize,
    /// Frame number -> (mapping, last use). foldhash: looked up for every page a
    /// stack copy reads (and every leaf entry the translation cache verifies).
    mapped: HashMap<u64, (*mut u8, u64), foldhash::fast::RandomState>,
    clock: u64,
    pub maps: u64,
    pub unmaps: u64,
    pub failures: u64,
}

/// What the cache did, for the summary.
#[derive(Debug, Clone, Copy, Default)]
pub struct FrameFigures {
    pub mapped_now: usize,
    pub maps: u64,
    pub unmaps: u64,
    pub failures: u64,
}

impl ForeignFrames {
    pub fn open(libs: Arc<XenLibs>, domid: u32, capacity: usize) -> std::io::Result<Self> {
        // SAFETY: a logger that lives for the program, no flags.
        let handle = unsafe { (libs.fmem_open)(super::libs::quiet_logger(), 0) };
        if handle.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        Ok(ForeignFrames {
            libs,
            handle,
            domid,
            cache: RefCell::new(FrameCache {
                capacity: capacity.max(8),
                mapped: HashMap::with_capacity_and_hasher(capacity, Default::default()),
                clock: 0,
                maps: 0,
                unmaps: 0,
                failures: 0,
            }),
        })
    }

    pub fn figures(&self) -> FrameFigures {
        let cache = self.cache.borrow();
        FrameFigures {
            mapped_now: cache.mapped.len(),
            maps: cache.maps,
            unmaps: cache.unmaps,
            failures: cache.failures,
        }
    }

    /// The mapping of `frame`, mapped now if it is not yet.
    fn frame(&self, frame: u64) -> Option<*const u8> {
        let mut cache = self.cache.borrow_mut();
        cache.clock += 1;
        let now = cache.clock;
        if let Some((pointer, used)) = cache.mapped.get_mut(&frame) {
            *used = now;
            return Some(*pointer);
        }
        if cache.mapped.len() >= cache.capacity {
            let oldest = cache
                .mapped
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(frame, (pointer, _))| (*frame, *pointer));
            if let Some((old, pointer)) = oldest {
                cache.mapped.remove(&old);
                cache.unmaps += 1;
                // SAFETY: a one-page mapping made by fmem_map below.
                unsafe { (self.libs.fmem_unmap)(self.handle, pointer.cast(), 1) };
            }
        }
        let mut error: c_int = 0;
        // SAFETY: one frame number and one error slot.
        let pointer = unsafe {
            (self.libs.fmem_map)(
                self.handle,
                self.domid,
                libc::PROT_READ,
                1,
                &frame,
                &mut error,
            )
        };
        if pointer.is_null() || error != 0 {
            if !pointer.is_null() {
                // SAFETY: as above.
                unsafe { (self.libs.fmem_unmap)(self.handle, pointer, 1) };
            }
            cache.failures += 1;
            return None;
        }
        cache.maps += 1;
        cache.mapped.insert(frame, (pointer.cast(), now));
        Some(pointer.cast())
    }
}

impl PhysicalMemory for ForeignFrames {
    /// The frame's mapping: the cache unmaps the least recently used frame of at least 8
    /// (`open`), so a frame just used stays mapped while 7 others are.
    fn page_pointer(&self, physical: u64) -> Option<std::ptr::NonNull<u8>> {
        const _: () = assert!(glass_mem::ram::PAGE_POINTER_SPAN < 8);
        std::ptr::NonNull::new(self.frame(physical / PAGE)?.cast_mut())
    }

    /// A frame is unmapped only to make room (or when the cache goes): the unmaps so far.
    fn pointer_generation(&self) -> Option<u64> {
        Some(self.cache.borrow().unmaps)
    }

    fn read_physical(&self, address: u64, buf: &mut [u8]) -> bool {
        let mut done = 0usize;
        while done < buf.len() {
            let at = address + done as u64;
            let offset = (at % PAGE) as usize;
            let len = (PAGE as usize - offset).min(buf.len() - done);
            let Some(page) = self.frame(at / PAGE) else {
                return false;
            };
            // SAFETY: the page is mapped readable for PAGE bytes; offset + len <= PAGE.
            unsafe {
                std::ptr::copy_nonoverlapping(page.add(offset), buf[done..].as_mut_ptr(), len)
            };
            done += len;
        }
        true
    }
}

impl Drop for ForeignFrames {
    fn drop(&mut self) {
        let cache = self.cache.get_mut();
        for (pointer, _) in cache.mapped.values() {
            // SAFETY: mappings made by fmem_map.
            unsafe { (self.libs.fmem_unmap)(self.handle, pointer.cast(), 1) };
        }
        cache.mapped.clear();
        // SAFETY: the handle opened in `open`.
        unsafe { (self.libs.fmem_close)(self.handle) };
    }
}
