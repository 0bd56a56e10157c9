//! GDB remote serial protocol framing: `$payload#checksum`, acknowledgements, escapes
//! and run-length encoding.
//!
//! Written here rather than taken from a crate: glass needs only the client side of a
//! handful of packets, on the sample path, with no allocation beyond a reused buffer;
//! the gdbstub crates on crates.io implement the target (server) side.

/// Frames a payload: escapes `#`, `$`, `}` and `*`, appends the checksum.
pub fn encode(payload: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.push(b'$');
    let mut sum: u8 = 0;
    for &byte in payload {
        if matches!(byte, b'#' | b'$' | b'}' | b'*') {
            out.push(b'}');
            out.push(byte ^ 0x20);
            sum = sum.wrapping_add(b'}').wrapping_add(byte ^ 0x20);
        } else {
            out.push(byte);
            sum = sum.wrapping_add(byte);
        }
    }
    out.push(b'#');
    out.extend_from_slice(format!("{sum:02x}").as_bytes());
}

/// What the decoder found in the byte stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Ack,
    Nack,
    /// A complete packet with a good checksum, unescaped and run-length decoded.
    Packet(Vec<u8>),
    /// A complete packet whose checksum did not match (answer with a nack).
    BadChecksum,
}

/// Why a packet could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// A run-length marker with nothing before it or a count out of range.
    BadRunLength,
    /// An escape at the very end of the payload.
    BadEscape,
    TooLong,
}

/// Packets larger than this are refused (a stub that never sends `#`).
pub const MAX_PACKET: usize = 1 << 20;

/// Incremental decoder: feed it bytes as they arrive, take events out.
#[derive(Default)]
pub struct Decoder {
    state: State,
    raw: Vec<u8>,
    checksum: [u8; 2],
}

#[derive(Default, PartialEq, Eq)]
enum State {
    #[default]
    Idle,
    Payload,
    Checksum(u8),
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Consumes one byte; returns an event when one completes.
    pub fn push(&mut self, byte: u8) -> Result<Option<Event>, DecodeError> {
        match self.state {
            State::Idle => match byte {
                b'+' => Ok(Some(Event::Ack)),
                b'-' => Ok(Some(Event::Nack)),
                b'$' => {
                    self.raw.clear();
                    self.state = State::Payload;
                    Ok(None)
                }
                // Noise between packets (and '%' notifications, unused here) is skipped.
                _ => Ok(None),
            },
            State::Payload => {
                if byte == b'#' {
                    self.state = State::Checksum(0);
                } else if self.raw.len() >= MAX_PACKET {
                    self.state = State::Idle;
                    return Err(DecodeError::TooLong);
                } else {
                    self.raw.push(byte);
                }
                Ok(None)
            }
            State::Checksum(n) => {
                self.checksum[n as usize] = byte;
                if n == 0 {
                    self.state = State::Checksum(1);
                    return Ok(None);
                }
                self.state = State::Idle;
                let expected = hex_pair(&self.checksum);
                let sum = self.raw.iter().fold(0u8, |a, &b| a.wrapping_add(b));
                if expected != Some(sum) {
                    return Ok(Some(Event::BadChecksum));
                }
                decode_payload(&self.raw).map(|payload| Some(Event::Packet(payload)))
            }
        }
    }
}

/// Unescapes and expands run-length encoding (`c*N` repeats `c` N - 29 more times).
pub fn decode_payload(raw: &[u8]) -> Result<Vec<u8>, DecodeError> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'}' => {
                let next = *raw.get(i + 1).ok_or(DecodeError::BadEscape)?;
                out.push(next ^ 0x20);
                i += 2;
            }
            b'*' => {
                let previous = *out.last().ok_or(DecodeError::BadRunLength)?;
                let count = *raw.get(i + 1).ok_or(DecodeError::BadRunLength)?;
                if !(29 + 3..=126).contains(&count) {
                    return Err(DecodeError::BadRunLength);
                }
                out.extend(std::iter::repeat_n(previous, (count - 29) as usize));
                if out.len() > MAX_PACKET {
                    return Err(DecodeError::TooLong);
                }
                i += 2;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    Ok(out)
}

/// Decodes hex text into bytes (register and memory replies); `xx` (unavailable) reads
/// as zero.
pub fn hex_bytes(text: &[u8]) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks(2)
        .map(|pair| {
            if pair == b"xx" {
                Some(0)
            } else {
                hex_pair(pair)
            }
        })
        .collect()
}

/// Appends `bytes` as lower-case hex text (memory writes).
pub fn push_hex(bytes: &[u8], text: &mut String) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        text.push(DIGITS[usize::from(byte >> 4)] as char);
        text.push(DIGITS[usize::from(byte & 15)] as char);
    }
}

/// Two hex digits as a byte. Not `u8::from_str_radix`, which takes "+f" as well.
fn hex_pair(pair: &[u8]) -> Option<u8> {
    let digit = |byte: u8| (byte as char).to_digit(16);
    match *pair {
        [high, low] => Some((digit(high)? << 4 | digit(low)?) as u8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(bytes: &[u8]) -> Vec<Result<Option<Event>, DecodeError>> {
        let mut decoder = Decoder::new();
        bytes
            .iter()
            .map(|&b| decoder.push(b))
            .filter(|r| !matches!(r, Ok(None)))
            .collect()
    }

    #[test]
    fn round_trips_with_escapes() {
        let payload = b"X1000,4:#$}*";
        let mut framed = Vec::new();
        encode(payload, &mut framed);
        assert_eq!(
            decode_all(&framed),
            vec![Ok(Some(Event::Packet(payload.to_vec())))]
        );
    }

    #[test]
    fn acks_run_lengths_and_bad_checksums() {
        // "0* " is '0' repeated 3 more times (' ' is 32 = 29 + 3).
        let raw = b"0* ";
        let sum = raw.iter().fold(0u8, |a, &b| a.wrapping_add(b));
        let mut stream = b"+-noise".to_vec();
        stream.extend_from_slice(
            format!("${}#{sum:02x}", std::str::from_utf8(raw).unwrap()).as_bytes(),
        );
        stream.extend_from_slice(b"$OK#00");
        assert_eq!(
            decode_all(&stream),
            vec![
                Ok(Some(Event::Ack)),
                Ok(Some(Event::Nack)),
                Ok(Some(Event::Packet(b"0000".to_vec()))),
                Ok(Some(Event::BadChecksum))
            ]
        );
        assert_eq!(decode_payload(b"*!"), Err(DecodeError::BadRunLength));
        assert_eq!(decode_payload(b"a}"), Err(DecodeError::BadEscape));
        assert_eq!(hex_bytes(b"0a1Bxx"), Some(vec![10, 27, 0]));
        assert_eq!(hex_bytes(b"0g"), None);
    }

    #[test]
    fn hex_round_trips() {
        let bytes: Vec<u8> = (0..=255).collect();
        let mut text = String::new();
        push_hex(&bytes, &mut text);
        assert_eq!(hex_bytes(text.as_bytes()), Some(bytes));
    }

    #[test]
    fn hex_is_digits_only() {
        // Found by fuzz/ (target rsp): a sign passed for a digit.
        assert_eq!(hex_bytes(b"+f0f"), None);
        assert_eq!(hex_bytes(b"0F"), Some(vec![15]));
        assert_eq!(decode_all(b"$\x0f#+f"), vec![Ok(Some(Event::BadChecksum))]);
        assert_eq!(
            decode_all(b"$\x0f#0f"),
            vec![Ok(Some(Event::Packet(vec![15])))]
        );
    }
}
