//! `glass trace --gdb ADDRESS --guest-scratch GPA,SIZE --symbols ELF -f GLOBS -d SECONDS`:
//! a VM reached only through a GDB stub (QEMU's `-gdb`, `-s`), traced from outside.
//!
//! With no monitor glass cannot add memory to the VM, so the user names a 2 MiB range of
//! guest RAM the guest does not use (`--guest-scratch`: 2 MiB-aligned, at least 2 MiB),
//! and with no view of QEMU's memory glass reaches that range only through the stub,
//! whose packets are served with the VM stopped. So the ring is drained in batches, each
//! one short stop (every 20 ms, the stop mark set, the stop bound watching), where
//! `--qmp` reads QEMU's memory while the guest runs. Everything else is the attach of
//! `--qmp` (the parent's `attach` module): patch in one stop, put back in one stop, the
//! guardian holding the ledger, the region reused by the next trace (glass's region
//! carries a mark; a range without it has its ring zeroed first).

use std::cell::{Cell, RefCell};
use std::time::Duration;

use glass_target::gdbstub::client::{Client, StubError};
use glass_target::stop_mark::StopMark;

use super::attach::{trace_attached, Reached};
use super::choose;
use super::layout::{self, RegionAccess};
use crate::{Failure, Result, TraceNotes, TraceOptions, Traced};

/// How often the ring is drained through the stub (each drain stops the VM briefly).
const DRAIN_EVERY: Duration = Duration::from_millis(20);

/// How much of a new region's ring one stop zeroes.
const ZERO_PER_STOP: usize = 64 << 10;

/// `--guest-scratch GPA,SIZE` (`0x3e00000,2M`, sizes in bytes or with K/M/G): the
/// region's guest-physical address.
fn scratch_gpa(text: &str) -> Result<u64> {
    let bad = |why: &str| Failure::bad_input(format!("--guest-scratch {text}: {why}"));
    let (gpa, size) = text
        .split_once(',')
        .ok_or_else(|| bad("give GPA,SIZE (e.g. 0x3e00000,2M)"))?;
    let number = |word: &str| -> Option<u64> {
        let word = word.trim();
        let (digits, scale) = match word.char_indices().last()? {
            (i, 'K' | 'k') => (&word[..i], 1 << 10),
            (i, 'M' | 'm') => (&word[..i], 1 << 20),
            (i, 'G' | 'g') => (&word[..i], 1 << 30),
            _ => (word, 1),
        };
        let value = match digits.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok()?,
            None => digits.parse().ok()?,
        };
        value.checked_mul(scale)
    };
    let gpa = number(gpa).ok_or_else(|| bad("the address is not a number"))?;
    let size = number(size).ok_or_else(|| bad("the size is not a number"))?;
    if !gpa.is_multiple_of(layout::REGION_BYTES) || size < layout::REGION_BYTES {
        return Err(bad(
            "glass needs 2 MiB of guest RAM on a 2 MiB boundary (it maps the range as one large page)",
        ));
    }
    Ok(gpa)
}

pub(crate) fn run(
    args: &TraceOptions,
    notes: &mut dyn TraceNotes,
    address: &str,
) -> Result<Traced> {
    let symbols = args
        .symbols
        .clone()
        .ok_or_else(|| Failure::bad_input("--gdb needs --symbols: the guest's ELF image"))?;
    let gpa = scratch_gpa(args.guest_scratch.as_deref().ok_or_else(|| {
        Failure::bad_input(
            "--gdb needs --guest-scratch GPA,SIZE: 2 MiB of guest RAM the guest does not use, for glass's trampolines and ring (or attach with --qmp, where glass adds its own)",
        )
    })?)?;
    let (choice, skipped) = choose(&symbols, &args.functions)?;
    let file = glass_record::PendingOutput::open(&args.output)?;
    let mark = StopMark::create().map_err(|e| Failure::runtime(e.to_string()))?;
    // Before the first connection stops the VM: a glass that dies from here on has its
    // guardian put back what it patched and let the VM run.
    let mut guardian = glass_record::guardian::Guardian::start(
        address,
        false,
        false,
        &mark,
        glass_record::stop_bound()?,
    )
    .map_err(|e| Failure::runtime(e.to_string()))?;
    let traced = (|| {
        let client = Client::connect_marked(address, Some(&mark))
            .map_err(|e| Failure::bad_input(format!("--gdb {address}: {e}")))?;
        mark.end();
        let client = RefCell::new(client);
        let region = StubRegion {
            client: &client,
            gpa,
            mark: &mark,
            held: Cell::new(false),
            resume_at_end: Cell::new(false),
        };
        let mut header = vec![0u8; layout::HEADER_BYTES as usize];
        region.read(0, &mut header);
        let reused = layout::is_glass_region(&header);
        if !reused {
            // A range glass has not used: its ring starts zeroed. In pieces, each one
            // short stop: the guest does not look there before glass patches.
            let ring = layout::RING;
            let zeroes = vec![0u8; ZERO_PER_STOP];
            for at in (ring.start..ring.end).step_by(ZERO_PER_STOP) {
                let len = (ring.end - at).min(ZERO_PER_STOP as u64) as usize;
                region.write(at, &zeroes[..len]).map_err(|why| {
                    Failure::bad_input(format!(
                        "--guest-scratch {gpa:#x}: glass cannot write there ({why}): not guest RAM?"
                    ))
                })?;
            }
        }
        trace_attached(
            args,
            notes,
            Reached {
                target: &client,
                region: &region,
                region_gpa: gpa,
                reused,
                monitor: None,
                qemu: 0,
                named: format!("GDB stub {address}"),
                region_said: format!("the --guest-scratch range at guest-physical {gpa:#x}"),
            },
            (&mark, &mut guardian),
            (&symbols, choice, skipped),
            file,
        )
    })();
    guardian.done();
    traced
}

/// The region in guest RAM, reached through the stub: every access with the VM stopped
/// (stopped here for one access, or held stopped between `begin` and `end`), through
/// guest-physical addresses (QEMU's `Qqemu.PhyMemMode`).
struct StubRegion<'a> {
    client: &'a RefCell<Client>,
    gpa: u64,
    mark: &'a StopMark,
    /// Between `begin` and `end`: the VM stopped, physical mode on.
    held: Cell<bool>,
    /// `begin` stopped the VM: `end` lets it run.
    resume_at_end: Cell<bool>,
}

impl StubRegion<'_> {
    /// Runs `access` with the VM stopped and the stub in physical mode, as it found them
    /// after.
    fn with<T>(
        &self,
        access: impl FnOnce(&mut Client) -> std::result::Result<T, StubError>,
    ) -> std::result::Result<T, String> {
        let mut client = self.client.borrow_mut();
        if self.held.get() {
            return access(&mut client).map_err(|e| e.to_string());
        }
        let stopped_here = client.is_running();
        if stopped_here {
            self.mark.begin();
            client.stop().map_err(|e| e.to_string())?;
        }
        let done = client
            .physical_memory_mode(true)
            .and_then(|()| access(&mut client));
        let _ = client.physical_memory_mode(false);
        if stopped_here {
            let _ = client.resume();
            self.mark.end();
        }
        done.map_err(|e| e.to_string())
    }

    /// Reads `out.len()` bytes at `offset`, in the stub's largest reads.
    fn read_into(
        client: &mut Client,
        at: u64,
        out: &mut [u8],
    ) -> std::result::Result<(), StubError> {
        let most = client.max_memory_read();
        for (i, chunk) in out.chunks_mut(most).enumerate() {
            let bytes = client.read_memory(at + (i * most) as u64, chunk.len())?;
            if bytes.len() != chunk.len() {
                return Err(StubError::Protocol(format!(
                    "guest-physical {:#x} cannot be read",
                    at + (i * most) as u64
                )));
            }
            chunk.copy_from_slice(&bytes);
        }
        Ok(())
    }
}

impl RegionAccess for StubRegion<'_> {
    fn write(&self, offset: u64, bytes: &[u8]) -> std::result::Result<(), String> {
        let at = self.gpa + offset;
        self.with(|client| client.write_memory(at, bytes))
    }

    fn begin(&self) {
        let mut client = self.client.borrow_mut();
        let stopped_here = client.is_running();
        if stopped_here {
            self.mark.begin();
            if client.stop().is_err() {
                self.mark.end();
                return;
            }
        }
        if client.physical_memory_mode(true).is_ok() {
            self.held.set(true);
            self.resume_at_end.set(stopped_here);
        } else if stopped_here {
            let _ = client.resume();
            self.mark.end();
        }
    }

    fn end(&self) {
        if !self.held.replace(false) {
            return;
        }
        let mut client = self.client.borrow_mut();
        let _ = client.physical_memory_mode(false);
        if self.resume_at_end.replace(false) {
            let _ = client.resume();
            self.mark.end();
        }
    }

    fn drain_every(&self) -> Duration {
        DRAIN_EVERY
    }

    fn load(&self, offset: u64) -> u64 {
        let mut word = [0u8; 8];
        self.read(offset, &mut word);
        u64::from_le_bytes(word)
    }

    fn store(&self, offset: u64, value: u64) {
        let _ = self.write(offset, &value.to_le_bytes());
    }

    fn read(&self, offset: u64, out: &mut [u8]) {
        let at = self.gpa + offset;
        if self
            .with(|client| Self::read_into(client, at, out))
            .is_err()
        {
            out.fill(0);
        }
    }

    fn zero(&self, offset: u64, len: u64) {
        if len > 0 {
            let _ = self.write(offset, &vec![0; len as usize]);
        }
    }
}
