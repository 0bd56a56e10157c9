//! Ending a file whose writing failed (a full disk, an I/O error): cut back to its last
//! whole block and end it there, so what was written whole is kept and the file reads
//! as finished with what it holds, not as cut off mid-record.

use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;

use crate::stream::Stream;
use crate::{Record, Writer};

/// What [`seal`] kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sealed {
    /// The file's length now.
    pub bytes: u64,
    /// Records read back whole (the ones written here not counted).
    pub records: u64,
    /// Bytes that were cut off (a block written in part, or what follows it).
    pub cut: u64,
}

/// Reads back what `file` (open for writing, positioned anywhere) holds, cuts it after
/// its last whole block, and writes `last` and the End record in a block of their own:
/// a few hundred bytes, which the cut often frees on a full disk. A file that already
/// ends with its End record is left as it is. Fails when even the header is not
/// whole, or when the last block cannot be written (the cut then stands: the file holds
/// its whole blocks and reads as truncated).
pub fn seal(file: &File, last: &[Record]) -> io::Result<Sealed> {
    // The file was created write-only; /proc gives a reading descriptor of the same
    // file, even one removed from its directory.
    let reading = File::open(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    let file_len = reading.metadata()?.len();
    let mut stream = Stream::new(reading)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    let mut records = 0u64;
    let mut complete = false;
    for item in &mut stream {
        match item {
            Ok(crate::stream::Item::Record(Record::End)) => complete = true,
            Ok(_) => records += 1,
            Err(error) if error.ends_reading() => break,
            Err(_) => {}
        }
    }
    if complete {
        return Ok(Sealed {
            bytes: file_len,
            records,
            cut: 0,
        });
    }
    let (whole, sequence) = stream.whole_end();
    let whole = whole as u64;
    file.set_len(whole)?;
    let mut out = file;
    out.seek(SeekFrom::Start(whole))?;
    let mut writer = Writer::resume(out, sequence);
    for record in last {
        writer.write(record)?;
    }
    writer.end()?;
    let bytes = file.metadata()?.len();
    Ok(Sealed {
        bytes,
        records,
        cut: file_len.saturating_sub(whole),
    })
}
