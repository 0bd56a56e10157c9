//! Target descriptions (`qXfer:features:read` annexes from a stub): any text yields
//! registers or none, never a panic or overflow, and the register layout built from them
//! (as the GDB client builds it, including QEMU 7.x's quirk) is consistent: registers
//! packed in order, each one found by name inside a `g` reply of the layout's length.
#![no_main]

use glass_target::gdbstub::target_xml::{parse, Layout};
use libfuzzer_sys::fuzz_target;

fn check(layout: &Layout) {
    let mut end = 0;
    for (name, offset, size) in layout.slots() {
        assert_eq!(*offset, end);
        end += size;
        let found = layout.find(name).expect("a slot's name is found");
        assert!(found.0 + found.1 <= layout.g_len);
        assert!(layout.regnum(name).is_some());
    }
    assert_eq!(end, layout.g_len);
    // A register description may claim gigabits; read only a bounded reply.
    if layout.g_len <= 1 << 16 {
        let g = vec![0xa5u8; layout.g_len];
        for (name, _, _) in layout.slots() {
            let (_, size) = layout.find(name).unwrap();
            let value = layout.value(&g, name).expect("inside the reply");
            assert_eq!(value == 0, size == 0);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut next_regnum = 0;
    let description = parse(&text, &mut next_regnum);
    for register in &description.registers {
        assert!(text.contains(register.name.as_str()));
    }
    // A second annex continues the numbering.
    let more = parse(&text, &mut next_regnum);
    assert_eq!(more.registers.len(), description.registers.len());
    let registers = description.registers;
    let layout = Layout::new(registers.clone());
    check(&layout);
    // As the client builds it: with a `g` reply as long as described, and 24 bytes
    // shorter (the QEMU quirk's case).
    check(&Layout::for_g_reply(registers.clone(), layout.g_len));
    check(&Layout::for_g_reply(
        registers,
        layout.g_len.saturating_sub(24),
    ));
});
