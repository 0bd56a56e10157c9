//! The translation cache, for any architecture's walker.
//!
//! Keyed by (page-table root, virtual page at the walker's granule). A hit is verified
//! with one read: the cached leaf entry is read again and must hold the same value, so
//! a page the guest remapped is walked afresh instead of silently giving a wrong stack.
//!
//! Hashed with foldhash (randomly seeded): a stack copy looks up every page it reads,
//! and SipHash's cost showed in glass's own profile in a Xen dom0.

use std::collections::HashMap;

use crate::ram::PhysicalMemory;
use crate::walk::{LeafEntry, PageWalk, Translation, WalkError};
use crate::x86_64::{PagingMode, X86Paging};

/// Remembers translations per (root, virtual page).
#[derive(Default)]
pub struct TranslationCache {
    entries: HashMap<(u64, u64), Translation, foldhash::fast::RandomState>,
    /// Off: every translation walks the tables (to measure what the cache saves).
    disabled: bool,
    pub hits: u64,
    pub misses: u64,
    /// Hits whose leaf entry had changed: walked again.
    pub stale: u64,
    /// The last pages [`WordReader`]s read, with pointers to them and to their leaf
    /// entries, kept across stops where the memory says its pointers stay valid
    /// ([`PhysicalMemory::pointer_generation`]).
    remembered: Vec<RememberedPage>,
}

/// A page a [`WordReader`] read, remembered across stops: a stack walk starts on the page
/// the last one did, and looking it up in the cache and the memory's own map of mappings
/// (three hash lookups, in a Xen dom0 under TCG a good part of a walk that reads ten
/// words) comes down to one read of its leaf entry through a pointer.
#[derive(Clone, Copy)]
struct RememberedPage {
    /// The memory read through (its address: one cache serves one memory).
    memory: usize,
    /// (cache root, 4 KiB virtual page).
    key: (u64, u64),
    generation: u64,
    physical_page: u64,
    page: std::ptr::NonNull<u8>,
    /// The leaf entry and a pointer to it (None: no table was walked).
    leaf: Option<(LeafEntry, std::ptr::NonNull<u8>)>,
}

/// Pages remembered: one stack per vCPU, for a few vCPUs.
const PAGES_REMEMBERED: usize = 8;

fn memory_id(memory: &dyn PhysicalMemory) -> usize {
    (memory as *const dyn PhysicalMemory).cast::<u8>() as usize
}

/// Entries kept before the cache is cleared (guests touch few stack pages; this only
/// bounds memory when a guest switches among many address spaces).
const CACHE_LIMIT: usize = 65_536;

impl TranslationCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// A cache that never remembers: every translation is a full walk.
    pub fn disabled() -> Self {
        TranslationCache {
            disabled: true,
            ..Self::default()
        }
    }

    /// Translates `vaddr` with any architecture's walker.
    pub fn translate_with(
        &mut self,
        memory: &dyn PhysicalMemory,
        paging: &(impl PageWalk + ?Sized),
        vaddr: u64,
    ) -> Result<u64, WalkError> {
        self.translate_in(memory, paging, vaddr, &mut None)
    }

    /// [`TranslationCache::translate_with`] within one read of a stopped guest:
    /// `verified` is the leaf entry last read (verified, or just walked) in it, which a
    /// hit through the same entry (the next page of a 2M block) needs not read again.
    fn translate_in(
        &mut self,
        memory: &dyn PhysicalMemory,
        paging: &(impl PageWalk + ?Sized),
        vaddr: u64,
        verified: &mut Option<LeafEntry>,
    ) -> Result<u64, WalkError> {
        let page_shift = paging.page_granule().trailing_zeros();
        let key = (paging.cache_root(vaddr), vaddr >> page_shift);
        if let Some(cached) = self.entries.get(&key) {
            // Verify: the leaf entry must still say the same (nothing to verify when no
            // table was walked).
            let current = match cached.leaf {
                Some(leaf) if *verified == Some(leaf) => true,
                Some(leaf) => memory.read_u64(leaf.address) == Some(leaf.value),
                None => true,
            };
            if current {
                self.hits += 1;
                *verified = cached.leaf;
                // The key's page lies within the cached page or block.
                let offset_mask = cached.page_size - 1;
                return Ok((cached.physical & !offset_mask) | (vaddr & offset_mask));
            }
            self.stale += 1;
            self.entries.remove(&key);
        }
        self.misses += 1;
        let translation = paging.walk(memory, vaddr)?;
        *verified = translation.leaf;
        if self.disabled {
            return Ok(translation.physical);
        }
        if self.entries.len() >= CACHE_LIMIT {
            self.entries.clear();
        }
        self.entries.insert(key, translation);
        Ok(translation.physical)
    }

    /// [`WordReader`]'s page `virtual_page` (4 KiB) as remembered from an earlier read,
    /// its leaf entry read again and unchanged: its physical page and a pointer to it.
    fn remembered_page(
        &mut self,
        memory: &dyn PhysicalMemory,
        paging: &(impl PageWalk + ?Sized),
        virtual_page: u64,
    ) -> Option<(u64, std::ptr::NonNull<u8>)> {
        let generation = memory.pointer_generation()?;
        let key = (paging.cache_root(virtual_page), virtual_page);
        let id = memory_id(memory);
        let index = self
            .remembered
            .iter()
            .position(|r| r.key == key && r.memory == id && r.generation == generation)?;
        let remembered = self.remembered[index];
        if let Some((leaf, pointer)) = remembered.leaf {
            // SAFETY: a pointer into a page the memory keeps mapped while its generation
            // is unchanged (checked above); leaf entries are 8-byte aligned.
            let value = u64::from_le(unsafe { pointer.as_ptr().cast::<u64>().read_volatile() });
            if value != leaf.value {
                self.remembered.swap_remove(index);
                return None;
            }
        }
        self.hits += 1;
        Some((remembered.physical_page, remembered.page))
    }

    /// Remembers `virtual_page` (4 KiB), just translated to `physical_page`, where the
    /// memory keeps its pointers; returns the page's pointer (None: not remembered).
    fn remember_page(
        &mut self,
        memory: &dyn PhysicalMemory,
        paging: &(impl PageWalk + ?Sized),
        virtual_page: u64,
        physical_page: u64,
    ) -> Option<std::ptr::NonNull<u8>> {
        memory.pointer_generation()?;
        let root = paging.cache_root(virtual_page);
        let page_shift = paging.page_granule().trailing_zeros();
        let cache_key = (root, virtual_page >> page_shift);
        let leaf = match self.entries.get(&cache_key)?.leaf {
            Some(leaf) => {
                // The leaf entry's page first: the data page's, asked for last, is then
                // the most recently used, and neither is unmapped by the other's mapping.
                let table = memory.page_pointer(leaf.address & !4095)?;
                // SAFETY: within the 4096 bytes of that page (leaf entries are aligned).
                let entry = unsafe { table.add((leaf.address & 4095 & !7) as usize) };
                Some((leaf, entry))
            }
            None => None,
        };
        let page = memory.page_pointer(physical_page)?;
        if self.remembered.len() >= PAGES_REMEMBERED {
            self.remembered.remove(0);
        }
        self.remembered.push(RememberedPage {
            memory: memory_id(memory),
            key: (root, virtual_page),
            generation: memory.pointer_generation()?,
            physical_page,
            page,
            leaf,
        });
        Some(page)
    }

    /// Copies guest-virtual memory; returns how many bytes from `vaddr` could be read (a
    /// short count stops at the first unmapped page). Pages are translated one granule
    /// at a time, and those that follow each other in physical memory are read at once:
    /// where each read is a system call (QEMU's memory read with process_vm_readv), a
    /// 60 KiB stack in one 2M block costs two reads instead of thirty.
    pub fn read_with(
        &mut self,
        memory: &dyn PhysicalMemory,
        paging: &(impl PageWalk + ?Sized),
        vaddr: u64,
        buf: &mut [u8],
    ) -> usize {
        let granule = paging.page_granule();
        let mut done = 0;
        let mut verified = None;
        // (physical start, offset in buf, length) of the pages not read yet.
        let mut run: Option<(u64, usize, usize)> = None;
        while done < buf.len() {
            let address = vaddr.wrapping_add(done as u64);
            let in_page = granule - (address & (granule - 1));
            let n = usize::try_from(in_page)
                .map_or(buf.len() - done, |in_page| in_page.min(buf.len() - done));
            let Ok(physical) = self.translate_in(memory, paging, address, &mut verified) else {
                break;
            };
            match &mut run {
                Some((start, _, len)) if start.wrapping_add(*len as u64) == physical => *len += n,
                _ => {
                    if let Some(pending) = run.take() {
                        let read = read_run(memory, granule, vaddr, buf, pending);
                        if read < pending.2 {
                            return pending.1 + read;
                        }
                    }
                    run = Some((physical, done, n));
                }
            }
            done += n;
        }
        match run {
            Some(pending) => pending.1 + read_run(memory, granule, vaddr, buf, pending),
            None => done,
        }
    }
    /// x86-64: translates `vaddr` under `cr3` (kept for callers that hold CR3 and CR4).
    pub fn translate(
        &mut self,
        memory: &dyn PhysicalMemory,
        cr3: u64,
        mode: PagingMode,
        vaddr: u64,
    ) -> Result<u64, WalkError> {
        self.translate_with(memory, &X86Paging { cr3, mode }, vaddr)
    }

    /// x86-64: `read_with` under `cr3`.
    pub fn read_virtual(
        &mut self,
        memory: &dyn PhysicalMemory,
        cr3: u64,
        mode: PagingMode,
        vaddr: u64,
        buf: &mut [u8],
    ) -> usize {
        self.read_with(memory, &X86Paging { cr3, mode }, vaddr, buf)
    }
}

/// Reads guest-virtual memory a word at a time, for a walk made while the guest is
/// stopped: each 4 KiB page is translated (and its cached translation verified) once per
/// reader, which lives for one stop, and each word is read from physical memory alone,
/// straight from the page's mapping where the memory keeps one
/// ([`PhysicalMemory::page_pointer`]: a Xen guest's frames; looking the frame up for each
/// word cost a walk of 20 frames 10-50 us in a dom0 under TCG). A stack walk reads two
/// words a frame, a few frames a page, upwards: one page remembered is enough.
pub struct WordReader<'a, P: PageWalk + ?Sized> {
    memory: &'a dyn PhysicalMemory,
    cache: &'a mut TranslationCache,
    paging: &'a P,
    /// The page last translated: (virtual page, physical page, its mapping if any). The
    /// mapping is asked for again with every translation, so it is held only while no
    /// other page is read (the span [`PhysicalMemory::page_pointer`] allows).
    page: Option<(u64, u64, Option<std::ptr::NonNull<u8>>)>,
    /// Words read, for the summary.
    pub words: u64,
}

impl<'a, P: PageWalk + ?Sized> WordReader<'a, P> {
    const PAGE: u64 = 4096;

    pub fn new(
        memory: &'a dyn PhysicalMemory,
        cache: &'a mut TranslationCache,
        paging: &'a P,
    ) -> Self {
        WordReader {
            memory,
            cache,
            paging,
            page: None,
            words: 0,
        }
    }

    /// The little-endian 8-byte word at `vaddr`, None where any byte is unmapped.
    pub fn word(&mut self, vaddr: u64) -> Option<u64> {
        self.words += 1;
        let offset = vaddr & (Self::PAGE - 1);
        if offset > Self::PAGE - 8 {
            // Across two pages (an unaligned word): the copying read handles both.
            let mut buf = [0u8; 8];
            let read = self
                .cache
                .read_with(self.memory, self.paging, vaddr, &mut buf);
            return (read == 8).then(|| u64::from_le_bytes(buf));
        }
        let virtual_page = vaddr - offset;
        let (physical_page, mapping) = match self.page {
            Some((page, physical, mapping)) if page == virtual_page => (physical, mapping),
            _ => {
                self.page = None;
                let (physical, mapping) =
                    match self
                        .cache
                        .remembered_page(self.memory, self.paging, virtual_page)
                    {
                        Some((physical, page)) => (physical, Some(page)),
                        None => {
                            let physical = self
                                .cache
                                .translate_with(self.memory, self.paging, virtual_page)
                                .ok()?;
                            let mapping = self
                                .cache
                                .remember_page(self.memory, self.paging, virtual_page, physical)
                                .or_else(|| self.memory.page_pointer(physical));
                            (physical, mapping)
                        }
                    };
                self.page = Some((virtual_page, physical, mapping));
                (physical, mapping)
            }
        };
        match mapping {
            // SAFETY: the page's mapping, readable for 4096 bytes, asked for after the
            // last read elsewhere; offset + 8 <= 4096 (checked above).
            Some(page) => Some(u64::from_le(unsafe {
                page.as_ptr()
                    .add(offset as usize)
                    .cast::<u64>()
                    .read_unaligned()
            })),
            None => self.memory.read_u64(physical_page + offset),
        }
    }
}

/// Reads one run of physically contiguous pages into `buf[at..at + len]`; where the
/// whole run cannot be read, page by page (of the virtual address's granule) up to the
/// first that cannot. Returns the bytes read.
fn read_run(
    memory: &dyn PhysicalMemory,
    granule: u64,
    vaddr: u64,
    buf: &mut [u8],
    (physical, at, len): (u64, usize, usize),
) -> usize {
    if memory.read_physical(physical, &mut buf[at..at + len]) {
        return len;
    }
    let mut read = 0;
    while read < len {
        let address = vaddr.wrapping_add((at + read) as u64);
        let in_page = (granule - (address & (granule - 1))) as usize;
        let n = in_page.min(len - read);
        let from = physical.wrapping_add(read as u64);
        if !memory.read_physical(from, &mut buf[at + read..at + read + n]) {
            break;
        }
        read += n;
    }
    read
}
