//! The kernel's symbol map (`--symbols`) read for data symbols: where the current task,
//! the per-CPU IRQ stack pointer or the ORC tables are. Read here rather than with
//! `glass_symbols::nm_table`, which keeps text symbols only (frames are named from
//! those).

use std::collections::HashMap;
use std::path::Path;

use glass_target::TargetError;

/// The addresses of `names` in the kernel's symbol map: an ELF vmlinux's symbol table,
/// or a kallsyms / System.map / `nm` table (`ADDRESS TYPE NAME`, any type: per-CPU and
/// data symbols too).
pub fn symbol_addresses(path: &Path, names: &[&str]) -> Result<HashMap<String, u64>, TargetError> {
    use object::{Object, ObjectSymbol};
    let bytes = std::fs::read(path)
        .map_err(|e| TargetError::BadInput(format!("{}: {e}", path.display())))?;
    let mut found = HashMap::new();
    if bytes.starts_with(b"\x7fELF") {
        if let Ok(elf) = object::File::parse(&*bytes) {
            for symbol in elf.symbols() {
                if let Ok(name) = symbol.name() {
                    if names.contains(&name) {
                        found.insert(name.to_string(), symbol.address());
                    }
                }
            }
        }
        return Ok(found);
    }
    for line in String::from_utf8_lossy(&bytes).lines() {
        let mut fields = line.split_whitespace();
        let (Some(address), Some(_kind), Some(name)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if names.contains(&name) && !found.contains_key(name) {
            if let Ok(address) = u64::from_str_radix(address, 16) {
                found.insert(name.to_string(), address);
            }
        }
    }
    Ok(found)
}

/// Every line of a symbol table (`ADDRESS TYPE NAME`) whose name is one of `names`, in
/// the table's order (a name may stand more than once): (name, address). An unreadable
/// table has none (the image's own reading said so already).
pub fn table_symbols(path: &Path, names: &[&str]) -> Vec<(String, u64)> {
    let bytes = std::fs::read(path).unwrap_or_default();
    String::from_utf8_lossy(&bytes)
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let address = u64::from_str_radix(fields.next()?, 16).ok()?;
            let name = fields.nth(1)?;
            names.contains(&name).then(|| (name.to_string(), address))
        })
        .collect()
}
