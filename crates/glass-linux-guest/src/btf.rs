//! A Linux kernel's BTF (a copy of its `/sys/kernel/btf/vmlinux`), read with btf-rs: the
//! byte offsets of the structs' members the guest readers need (`task_struct`,
//! `mm_struct`, `struct module`...), looked for by name so that a kernel whose layout
//! moved (another version, a randomized `task_struct`) is read where it keeps them.

use std::collections::HashMap;
use std::path::Path;

use btf_rs::{Btf, Type};
use glass_target::TargetError;

/// The named members' byte offsets of BTF's struct `name` (the one with members, not a
/// forward declaration), anonymous structs and unions looked into.
pub fn struct_offsets(btf: &Btf, name: &str) -> Option<HashMap<String, u64>> {
    let found = btf
        .resolve_types_by_name(name)
        .unwrap_or_default()
        .into_iter()
        .find_map(|t| match t {
            Type::Struct(s) if !s.members.is_empty() => Some(s),
            _ => None,
        })?;
    let mut offsets = HashMap::new();
    members(btf, &found, 0, 0, &mut offsets);
    Some(offsets)
}

/// A BTF file, parsed; every failure is one line of bad input.
pub fn read_btf(path: &Path) -> Result<Btf, TargetError> {
    let bad = |what: String| TargetError::BadInput(format!("{}: {what}", path.display()));
    let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    // BTF's magic 0xeB9F, little- or big-endian.
    if !(bytes.starts_with(&[0x9f, 0xeb]) || bytes.starts_with(&[0xeb, 0x9f])) {
        return Err(bad(
            "not BTF (--guest-btf wants a copy of the guest's /sys/kernel/btf/vmlinux)".into(),
        ));
    }
    // btf-rs checks what it reads; a parser of a file glass does not control is kept
    // from taking glass down with it all the same.
    let parsed = std::panic::catch_unwind(|| Btf::from_bytes(&bytes));
    let btf = match parsed {
        Ok(Ok(btf)) => btf,
        Ok(Err(e)) => return Err(bad(format!("not readable BTF ({e})"))),
        Err(_) => return Err(bad("not readable BTF".into())),
    };
    Ok(btf)
}

/// The byte offsets of a struct's named members, looking into anonymous structs and
/// unions (a randomized or grouped `task_struct` keeps fields in them).
fn members(
    btf: &Btf,
    s: &btf_rs::Struct,
    base_bits: u64,
    depth: u32,
    into: &mut HashMap<String, u64>,
) {
    if depth > 8 {
        return;
    }
    for member in &s.members {
        let bits = base_bits + u64::from(member.bit_offset());
        let name = btf.resolve_name(member).unwrap_or_default();
        if !name.is_empty() {
            into.entry(name).or_insert(bits / 8);
            continue;
        }
        if let Ok(Type::Struct(inner) | Type::Union(inner)) = btf.resolve_chained_type(member) {
            members(btf, &inner, bits, depth + 1, into);
        }
    }
}
