//! The ledger `glass trace --pid` leaves in the process it attached to: every byte it
//! replaced (with the original), its trampoline regions, the session's address there and
//! who wrote it. If glass dies while attached, the patches stay (the process runs on,
//! its probes dropping records); a later glass reads the ledger, finds its writer gone,
//! and takes everything out before attaching afresh. The runtime holds the ledger's
//! address (`glass_probe_ledger`) but never reads it.
//!
//! Layout, little-endian u64 words: magic, version, writer pid, writer start time (clock
//! ticks after boot, /proc/PID/stat field 22: tells a reused pid apart), session address,
//! trap page address, region count, (start, length) per region, restore count, then per
//! restore: address, length, the original bytes padded to whole words; then (version 2)
//! the count of moves and per move its (original, trampoline) addresses, with which a
//! thread found in a trampoline is taken back to the original code, and how many of the
//! last restores are the unwinder's GOT slots (put back only with the hijacked return
//! addresses).

use std::io;

use glass_target::inject::StoppedProcess;

const MAGIC: u64 = u64::from_le_bytes(*b"GLASSLDG");
const VERSION: u64 = 2;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    pub writer_pid: u64,
    pub writer_start: u64,
    pub session: u64,
    pub trap: u64,
    pub regions: Vec<(u64, u64)>,
    pub restore: Vec<(u64, Vec<u8>)>,
    pub moves: Vec<(u64, u64)>,
    pub unwinder_hooks: u64,
}

/// A process's start time (clock ticks after boot), if it exists.
pub fn start_time(pid: u64) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces), field 3 first.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

impl Ledger {
    pub fn encode(&self) -> Vec<u8> {
        let mut words = vec![
            MAGIC,
            VERSION,
            self.writer_pid,
            self.writer_start,
            self.session,
            self.trap,
            self.regions.len() as u64,
        ];
        for &(start, len) in &self.regions {
            words.extend([start, len]);
        }
        words.push(self.restore.len() as u64);
        for (address, bytes) in &self.restore {
            words.extend([*address, bytes.len() as u64]);
            for chunk in bytes.chunks(8) {
                let mut word = [0u8; 8];
                word[..chunk.len()].copy_from_slice(chunk);
                words.push(u64::from_le_bytes(word));
            }
        }
        words.push(self.moves.len() as u64);
        for &(from, to) in &self.moves {
            words.extend([from, to]);
        }
        words.push(self.unwinder_hooks);
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// Reads the ledger at `address` in the process, and its mapping's length (None: not
    /// a ledger).
    pub fn read(process: &StoppedProcess, address: u64) -> io::Result<Option<(Ledger, u64)>> {
        let at = std::cell::Cell::new(address);
        let word = || -> io::Result<u64> {
            let value = process.read_u64(at.get())?;
            at.set(at.get() + 8);
            Ok(value)
        };
        if word()? != MAGIC {
            return Ok(None);
        }
        let version = word()?;
        if !(1..=VERSION).contains(&version) {
            return Ok(None);
        }
        let mut ledger = Ledger {
            writer_pid: word()?,
            writer_start: word()?,
            session: word()?,
            trap: word()?,
            ..Ledger::default()
        };
        let regions = word()?;
        for _ in 0..regions.min(1 << 16) {
            ledger.regions.push((word()?, word()?));
        }
        let restores = word()?;
        for _ in 0..restores.min(1 << 24) {
            let address = word()?;
            let len = word()?.min(64) as usize;
            let mut bytes = Vec::with_capacity(len.next_multiple_of(8));
            for _ in 0..len.div_ceil(8) {
                bytes.extend(word()?.to_le_bytes());
            }
            bytes.truncate(len);
            ledger.restore.push((address, bytes));
        }
        if version >= 2 {
            let moves = word()?;
            for _ in 0..moves.min(1 << 24) {
                ledger.moves.push((word()?, word()?));
            }
            ledger.unwinder_hooks = word()?;
        }
        let len = (at.get() - address).next_multiple_of(4096);
        Ok(Some((ledger, len)))
    }

    /// Whether the glass that wrote it is still running.
    /// The glass that wrote the ledger still runs (a zombie does not: it is dead and
    /// only waits to be reaped).
    pub fn writer_alive(&self) -> bool {
        let state = std::fs::read_to_string(format!("/proc/{}/stat", self.writer_pid))
            .ok()
            .and_then(|stat| {
                let rest = stat.rsplit_once(')')?.1.to_string();
                rest.split_whitespace().next().map(str::to_string)
            });
        start_time(self.writer_pid) == Some(self.writer_start)
            && !matches!(state.as_deref(), Some("Z" | "X"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_start_time_is_found() {
        let me = std::process::id() as u64;
        assert!(start_time(me).is_some());
        assert_eq!(start_time(u32::MAX as u64), None);
    }

    #[test]
    fn reads_back_what_it_wrote() {
        let ledger = Ledger {
            writer_pid: 1,
            writer_start: 2,
            session: 3,
            trap: 4,
            regions: vec![(5, 6), (7, 8)],
            restore: vec![
                (9, vec![0xe9, 1, 2, 3, 4]),
                (10, vec![7; 8]),
                (11, vec![1; 9]),
            ],
            moves: vec![(12, 13)],
            unwinder_hooks: 1,
        };
        let bytes = ledger.encode();
        // This process's own memory stands in for the target's.
        let me = std::process::id() as i32;
        let process = StoppedProcess::for_thread(me, me).unwrap();
        let (back, len) = Ledger::read(&process, bytes.as_ptr() as u64)
            .unwrap()
            .unwrap();
        assert_eq!(back, ledger);
        assert_eq!(len, 4096);
        assert!(Ledger::read(&process, [0u64; 4].as_ptr() as u64)
            .unwrap()
            .is_none());
    }

    #[test]
    fn encodes_whole_words() {
        let ledger = Ledger {
            writer_pid: 7,
            writer_start: 9,
            session: 0x1000,
            trap: 0x2000,
            regions: vec![(0x3000, 4096)],
            restore: vec![(0x4001, vec![1, 2, 3, 4, 5]), (0x5000, vec![9; 8])],
            moves: vec![(0x4001, 0x3010)],
            unwinder_hooks: 0,
        };
        let bytes = ledger.encode();
        assert_eq!(bytes.len() % 8, 0);
        // magic..region count (7) + region (2) + count (1) + (2 + 1) + (2 + 1) + count
        // (1) + move (2) + unwinder hooks (1)
        assert_eq!(bytes.len(), 8 * (7 + 2 + 1 + 3 + 3 + 1 + 2 + 1));
    }
}
