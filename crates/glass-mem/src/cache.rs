//! The translation cache, for any architecture's walker.
//!
//! Keyed by (page-table root, virtual page at the walker's granule). A hit is verified
//! with one read: the cached leaf entry is read again and must hold the same value, so
//! a page the guest remapped is walked afresh instead of silently giving a wrong stack.

use std::collections::HashMap;

use crate::ram::PhysicalMemory;
use crate::walk::{PageWalk, Translation, WalkError};
use crate::x86_64::{PagingMode, X86Paging};

/// Remembers translations per (root, virtual page).
#[derive(Default)]
pub struct TranslationCache {
    entries: HashMap<(u64, u64), Translation>,
    /// Off: every translation walks the tables (to measure what the cache saves).
    disabled: bool,
    pub hits: u64,
    pub misses: u64,
    /// Hits whose leaf entry had changed: walked again.
    pub stale: u64,
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
        let page_shift = paging.page_granule().trailing_zeros();
        let key = (paging.cache_root(vaddr), vaddr >> page_shift);
        if let Some(cached) = self.entries.get(&key) {
            // Verify: the leaf entry must still say the same (nothing to verify when no
            // table was walked).
            let current = match cached.leaf {
                Some(leaf) => memory.read_u64(leaf.address) == Some(leaf.value),
                None => true,
            };
            if current {
                self.hits += 1;
                // The key's page lies within the cached page or block.
                let offset_mask = cached.page_size - 1;
                return Ok((cached.physical & !offset_mask) | (vaddr & offset_mask));
            }
            self.stale += 1;
            self.entries.remove(&key);
        }
        self.misses += 1;
        let translation = paging.walk(memory, vaddr)?;
        if self.disabled {
            return Ok(translation.physical);
        }
        if self.entries.len() >= CACHE_LIMIT {
            self.entries.clear();
        }
        self.entries.insert(key, translation);
        Ok(translation.physical)
    }

    /// Copies guest-virtual memory, a granule at a time; returns how many bytes from
    /// `vaddr` could be read (a short count stops at the first unmapped page).
    pub fn read_with(
        &mut self,
        memory: &dyn PhysicalMemory,
        paging: &(impl PageWalk + ?Sized),
        vaddr: u64,
        buf: &mut [u8],
    ) -> usize {
        let granule = paging.page_granule();
        let mut done = 0;
        while done < buf.len() {
            let address = vaddr.wrapping_add(done as u64);
            let in_page = granule - (address & (granule - 1));
            let n = usize::try_from(in_page)
                .map_or(buf.len() - done, |in_page| in_page.min(buf.len() - done));
            let Ok(physical) = self.translate_with(memory, paging, address) else {
                break;
            };
            if !memory.read_physical(physical, &mut buf[done..done + n]) {
                break;
            }
            done += n;
        }
        done
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
