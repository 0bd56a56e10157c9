//! The packet decoder and the target-description parser take bytes from a stub glass
//! does not control: random and mutated input gives errors or nothing, never a panic.

use glass_target::gdbstub::packet::{decode_payload, encode, hex_bytes, Decoder, Event};
use glass_target::gdbstub::target_xml::{parse, Layout};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn random_streams_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let mut decoder = Decoder::new();
        for &b in &bytes {
            let _ = decoder.push(b);
        }
        let _ = decode_payload(&bytes);
        let _ = hex_bytes(&bytes);
    }

    #[test]
    fn every_payload_round_trips(payload in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut framed = Vec::new();
        encode(&payload, &mut framed);
        let mut decoder = Decoder::new();
        let mut events = Vec::new();
        for &b in &framed {
            if let Ok(Some(event)) = decoder.push(b) {
                events.push(event);
            }
        }
        prop_assert_eq!(events, vec![Event::Packet(payload)]);
    }

    #[test]
    fn mutated_descriptions_never_panic(text in "[<>/=\"' a-z0-9:._-]{0,400}") {
        let mut next = 0;
        let description = parse(&text, &mut next);
        let layout = Layout::new(description.registers);
        let _ = layout.value(&[0u8; 16], "rip");
    }
}
