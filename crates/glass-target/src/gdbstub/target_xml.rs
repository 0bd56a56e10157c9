//! The register layout from a stub's target description (`qXfer:features:read`), so
//! that glass finds rip, rsp, rbp, cr3, cr4 and efer in a `g` reply by name instead of
//! trusting offsets that differ between QEMU versions.
//!
//! A scanner for the few elements that matter (`<reg>`, `<xi:include>`), not a general
//! XML parser: target descriptions are small and regular, and this keeps glass free of
//! an XML dependency. Unknown elements are skipped; malformed input yields no registers,
//! never a panic.

/// One register of the description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Register {
    pub name: String,
    pub bits: u32,
    pub regnum: u32,
}

/// What one annex says: its registers and the annexes it includes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Description {
    pub registers: Vec<Register>,
    pub includes: Vec<String>,
}

fn attribute<'a>(element: &'a str, name: &str) -> Option<&'a str> {
    let mut rest = element;
    loop {
        let at = rest.find(name)?;
        let before_ok = at == 0 || rest.as_bytes()[at - 1].is_ascii_whitespace();
        let after = rest[at + name.len()..].trim_start();
        if before_ok {
            if let Some(value) = after.strip_prefix('=') {
                let value = value.trim_start();
                let quote = value.chars().next()?;
                if quote == '"' || quote == '\'' {
                    let end = value[1..].find(quote)?;
                    return Some(&value[1..1 + end]);
                }
            }
        }
        rest = &rest[at + name.len()..];
    }
}

/// Parses one annex. `next_regnum` continues the numbering across annexes (registers
/// without `regnum` take the next number).
pub fn parse(xml: &str, next_regnum: &mut u32) -> Description {
    let mut description = Description::default();
    let mut rest = xml;
    while let Some(start) = rest.find('<') {
        rest = &rest[start + 1..];
        let Some(end) = rest.find('>') else { break };
        let element = &rest[..end];
        rest = &rest[end + 1..];
        if let Some(attributes) = element
            .strip_prefix("reg")
            .filter(|a| a.starts_with(char::is_whitespace))
        {
            let Some(name) = attribute(attributes, "name") else {
                continue;
            };
            let Some(bits) = attribute(attributes, "bitsize").and_then(|b| b.parse().ok()) else {
                continue;
            };
            let regnum = attribute(attributes, "regnum")
                .and_then(|r| r.parse().ok())
                .unwrap_or(*next_regnum);
            *next_regnum = regnum.saturating_add(1);
            description.registers.push(Register {
                name: name.to_string(),
                bits,
                regnum,
            });
        } else if let Some(attributes) = element.strip_prefix("xi:include") {
            if let Some(href) = attribute(attributes, "href") {
                description.includes.push(href.to_string());
            }
        }
    }
    description
}

/// Byte offsets and sizes of named registers in a `g` reply: registers in regnum order,
/// packed.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    slots: Vec<(String, usize, usize)>,
    regnums: Vec<u32>,
    pub g_len: usize,
}

impl Layout {
    pub fn new(mut registers: Vec<Register>) -> Self {
        registers.sort_by_key(|r| r.regnum);
        let mut offset = 0;
        let mut slots = Vec::new();
        let mut regnums = Vec::new();
        for register in registers {
            let size = (register.bits as usize).div_ceil(8);
            regnums.push(register.regnum);
            slots.push((register.name, offset, size));
            offset += size;
        }
        Layout {
            slots,
            regnums,
            g_len: offset,
        }
    }

    /// The layout of a stub whose `g` reply is `g_len` bytes long.
    pub fn for_g_reply(mut registers: Vec<Register>, g_len: usize) -> Self {
        let layout = Layout::new(registers.clone());
        if g_len.checked_add(24) == Some(layout.g_len) {
            // QEMU 7.x describes ss_base, ds_base and es_base but neither sends them in
            // `g` nor counts them in its register numbers: without them the description
            // matches what the stub does. Each register after them moves down by as many
            // as come before it (the numbers are the stub's: a crafted description may
            // put them anywhere, and once made this underflow).
            let quirk = ["ss_base", "ds_base", "es_base"];
            let mut removed: Vec<u32> = registers
                .iter()
                .filter(|r| quirk.contains(&r.name.as_str()))
                .map(|r| r.regnum)
                .collect();
            removed.sort_unstable();
            removed.dedup();
            registers.retain(|r| !quirk.contains(&r.name.as_str()));
            for register in &mut registers {
                // Distinct numbers below it: at most the register's own number.
                register.regnum -= removed.partition_point(|&n| n < register.regnum) as u32;
            }
        }
        Layout::new(registers)
    }

    /// Every register as (name, offset, size), in `g` order.
    pub fn slots(&self) -> &[(String, usize, usize)] {
        &self.slots
    }

    /// The register number of `name`, for a `p` packet.
    pub fn regnum(&self, name: &str) -> Option<u32> {
        let index = self.slots.iter().position(|(n, _, _)| n == name)?;
        self.regnums.get(index).copied()
    }

    /// (offset, size) of `name` in the `g` reply's bytes.
    pub fn find(&self, name: &str) -> Option<(usize, usize)> {
        self.slots
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|&(_, o, s)| (o, s))
    }

    /// The little-endian value of `name` in a decoded `g` reply.
    pub fn value(&self, g: &[u8], name: &str) -> Option<u64> {
        let (offset, size) = self.find(name)?;
        let bytes = g.get(offset..offset + size.min(8))?;
        let mut word = [0u8; 8];
        word[..bytes.len()].copy_from_slice(bytes);
        Some(u64::from_le_bytes(word))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_and_includes_in_order() {
        let target = r#"<?xml version="1.0"?><!DOCTYPE target SYSTEM "gdb-target.dtd">
            <target><architecture>i386:x86-64</architecture>
            <xi:include href="i386-64bit.xml"/></target>"#;
        let mut next = 0;
        let top = parse(target, &mut next);
        assert_eq!(top.includes, vec!["i386-64bit.xml"]);
        let core = r#"<feature name="org.gnu.gdb.i386.core">
            <reg name="rax" bitsize="64" type="int64"/>
            <reg name="rbx" bitsize="64"/>
            <reg name="rip" bitsize="64" type="code_ptr"/>
            <reg name="eflags" bitsize="32"/>
            <reg name="cr3" bitsize="64" regnum="40"/>
            <reg name="cr4" bitsize="64"/>
            <reg bitsize="64"/>
            </feature>"#;
        let description = parse(core, &mut next);
        let names: Vec<_> = description
            .registers
            .iter()
            .map(|r| (r.name.as_str(), r.regnum))
            .collect();
        assert_eq!(
            names,
            vec![
                ("rax", 0),
                ("rbx", 1),
                ("rip", 2),
                ("eflags", 3),
                ("cr3", 40),
                ("cr4", 41)
            ]
        );
        let layout = Layout::new(description.registers);
        assert_eq!(layout.find("rip"), Some((16, 8)));
        assert_eq!(layout.find("cr3"), Some((28, 8)));
        let mut g = vec![0u8; layout.g_len];
        g[16..24].copy_from_slice(&0xffff_8000_0010_2030u64.to_le_bytes());
        assert_eq!(layout.value(&g, "rip"), Some(0xffff_8000_0010_2030));
        assert_eq!(layout.value(&g, "r15"), None);
    }

    #[test]
    fn qemu_base_registers_are_dropped_when_the_g_reply_lacks_them() {
        let core = r#"<reg name="rip" bitsize="64"/><reg name="ss_base" bitsize="64"/>
            <reg name="ds_base" bitsize="64"/><reg name="es_base" bitsize="64"/>
            <reg name="fs_base" bitsize="64"/><reg name="cr3" bitsize="64"/>"#;
        let registers = parse(core, &mut 0).registers;
        let whole = Layout::for_g_reply(registers.clone(), 48);
        assert_eq!(whole.regnum("cr3"), Some(5));
        let layout = Layout::for_g_reply(registers, 24);
        assert_eq!(layout.g_len, 24);
        assert_eq!(layout.find("ss_base"), None);
        assert_eq!(layout.regnum("fs_base"), Some(1));
        assert_eq!(layout.find("cr3"), Some((16, 8)));
        assert_eq!(layout.regnum("cr3"), Some(2));
        // Found by fuzz/ (target target_xml): a base register numbered below 3 with a
        // register after it underflowed the renumbering.
        let crafted = r#"<reg name="es_base" bitsize="640"><reg name=" bitsize="0">"#;
        let registers = parse(crafted, &mut 0).registers;
        let layout = Layout::for_g_reply(registers, 56);
        assert_eq!(layout.g_len, 0);
        assert_eq!(layout.regnum(" bitsize="), Some(0));
    }

    #[test]
    fn garbage_yields_nothing() {
        let mut next = 0;
        for junk in [
            "",
            "<",
            "<reg",
            "<reg name=\"x\" bitsize=\"q\"/>",
            "<reg name='a' bitsize='8'",
            "<<<>>>\"\"",
            "<reg name=\"\u{1F600}\" bitsize=\"64\">",
        ] {
            let d = parse(junk, &mut next);
            assert!(d.registers.len() <= 1);
        }
    }
}
