//! GDB remote serial protocol framing over a byte stream from a stub (any bytes the
//! socket delivers): the decoder yields events or errors, never a panic, overflow or
//! unbounded buffer. Round trips: every packet decoded, and the input itself taken as a
//! payload, is framed by `encode` and decoded back to the same payload; hex replies
//! decode to bytes that encode back to the same hex (up to case and `xx`).
#![no_main]

use glass_target::gdbstub::packet::{
    decode_payload, encode, hex_bytes, Decoder, Event, MAX_PACKET,
};
use libfuzzer_sys::fuzz_target;

fn decode_stream(bytes: &[u8]) -> Vec<Event> {
    let mut decoder = Decoder::new();
    bytes
        .iter()
        .filter_map(|&byte| decoder.push(byte).ok().flatten())
        .collect()
}

fn round_trips(payload: &[u8]) {
    let mut framed = Vec::new();
    encode(payload, &mut framed);
    assert_eq!(
        decode_stream(&framed),
        vec![Event::Packet(payload.to_vec())]
    );
}

fuzz_target!(|data: &[u8]| {
    for event in decode_stream(data) {
        if let Event::Packet(payload) = event {
            assert!(payload.len() <= MAX_PACKET + 126);
            round_trips(&payload);
        }
    }
    // Escapes at most double a payload.
    if data.len() <= MAX_PACKET / 2 {
        round_trips(data);
    }
    if let Ok(payload) = decode_payload(data) {
        assert!(payload.len() <= MAX_PACKET + 126);
    }
    if let Some(bytes) = hex_bytes(data) {
        assert_eq!(bytes.len() * 2, data.len());
        for pair in data.chunks(2) {
            assert!(pair == b"xx" || pair.iter().all(u8::is_ascii_hexdigit));
        }
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex_bytes(hex.as_bytes()), Some(bytes));
    }
});
