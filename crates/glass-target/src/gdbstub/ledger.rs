//! The code glass patched in a guest, as it was before: what glass puts back when it
//! detaches, and what its guardian puts back if glass dies with the guest patched.
//!
//! One type for both so that the two paths cannot drift: glass hands the guardian the
//! same ledger (as lines on the guardian's pipe, [`CodeLedger::lines`]) before it writes
//! the first patched byte, and both put it back through QEMU's GDB stub with
//! [`CodeLedger::put_back`]: with the VM stopped, every patched range written back (the
//! stub's writes drop QEMU's translated code of those bytes), every vCPU stopped inside
//! a relocated copy moved back to the same instruction in the function, and the code
//! read again to check it. Putting back twice is harmless: the bytes are the same, and
//! no vCPU enters a relocated copy once the entry jumps are gone.

use std::time::Instant;

use super::client::reconnect;
use crate::guest_code::GuestCode;

/// Patched code and where a vCPU inside a relocated copy goes back to.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CodeLedger {
    /// Each patched range: its address and its bytes before the patch.
    pub code: Vec<(u64, Vec<u8>)>,
    /// (in a relocated copy, the same instruction in the function).
    pub back: Vec<(u64, u64)>,
}

impl CodeLedger {
    /// The ledger as lines for the guardian's pipe: `code ADDR HEX`, `back FROM TO`.
    pub fn lines(&self) -> String {
        let mut out = String::new();
        for (at, bytes) in &self.code {
            out.push_str(&format!("code {at:x} "));
            super::packet::push_hex(bytes, &mut out);
            out.push('\n');
        }
        for (from, to) in &self.back {
            out.push_str(&format!("back {from:x} {to:x}\n"));
        }
        out
    }

    /// Takes in one line of [`CodeLedger::lines`]; false if it is not one.
    pub fn take_line(&mut self, line: &str) -> bool {
        let mut words = line.split(' ');
        let hex = |word: Option<&str>| word.and_then(|w| u64::from_str_radix(w, 16).ok());
        match words.next() {
            Some("code") => {
                let (Some(at), Some(bytes)) = (
                    hex(words.next()),
                    words
                        .next()
                        .and_then(|w| super::packet::hex_bytes(w.as_bytes())),
                ) else {
                    return false;
                };
                self.code.push((at, bytes));
                true
            }
            Some("back") => match (hex(words.next()), hex(words.next())) {
                (Some(from), Some(to)) => {
                    self.back.push((from, to));
                    true
                }
                _ => false,
            },
            _ => false,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.code.is_empty()
    }

    /// With the guest stopped through `guest`: puts every patched byte back, sees to
    /// it that no vCPU is inside a relocated copy ([`GuestCode::move_vcpus`]: after the
    /// bytes are back, where letting a vCPU run on is harmless), and checks that the code
    /// reads as before. How many vCPUs were inside a copy.
    pub fn put_back(&self, guest: &mut dyn GuestCode) -> Result<usize, String> {
        for (at, bytes) in &self.code {
            guest
                .write_virtual(*at, bytes)
                .map_err(|e| format!("cannot put the guest's code back: {e}"))?;
        }
        let moved = guest
            .move_vcpus(&self.back)
            .map_err(|e| format!("cannot move a vCPU out of a trampoline: {e}"))?;
        for (at, bytes) in &self.code {
            let now = guest.read_virtual(*at, bytes.len())?;
            if &now != bytes {
                return Err(format!(
                    "the guest's code at {at:#x} does not read as before after it was put back"
                ));
            }
        }
        Ok(moved)
    }

    /// What the guardian does for a glass that died with the guest patched: connects to
    /// the stub (retrying until `until`: QEMU takes a new connection once it has seen
    /// the dead one close), stops the VM, puts the code back and lets the VM run.
    /// How many vCPUs it moved.
    pub fn put_back_through(&self, stub: &str, until: Instant) -> Result<usize, String> {
        reconnect(stub, until, &mut || false, &mut |client| {
            client
                .stop()
                .map_err(|e| format!("cannot stop the VM: {e}"))?;
            let moved = self.put_back(client);
            let detached = client.detach();
            let moved = moved?;
            detached.map_err(|e| format!("cannot let the VM run: {e}"))?;
            Ok(moved)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ledger_crosses_the_pipe_whole() {
        let ledger = CodeLedger {
            code: vec![
                (0x10_0040, vec![0x55, 0x48, 0x89, 0xe5, 0x41]),
                (0x2000, vec![0]),
            ],
            back: vec![(0xffff_ffff_ffe0_3005, 0x10_0041)],
        };
        let mut read = CodeLedger::default();
        for line in ledger.lines().lines() {
            assert!(read.take_line(line), "{line}");
        }
        assert_eq!(read, ledger);
        assert!(!read.take_line("code zz 00"));
        assert!(!read.take_line("back 1"));
        assert!(!read.take_line("vm 12"));
    }
}
