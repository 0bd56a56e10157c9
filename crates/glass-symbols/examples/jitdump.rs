//! Prints a jitdump or perf map's code entries: `cargo run -p glass-symbols --example
//! jitdump -- FILE [ADDRESS...]` (addresses in hex look up the name).
fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: jitdump FILE [ADDRESS...]");
    let bytes = std::fs::read(&path).expect("readable file");
    if glass_symbols::jit::is_jitdump(&bytes) {
        let dump = glass_symbols::jit::parse_jitdump(&bytes).expect("a valid jitdump");
        println!(
            "jitdump v{} pid {} elf_mach {} records {}{}",
            dump.version,
            dump.pid,
            dump.elf_mach,
            dump.records.len(),
            if dump.truncated { " (cut short)" } else { "" }
        );
        for record in &dump.records {
            if let glass_symbols::jit::JitRecord::CodeLoad(load) = record {
                println!("{:x} {:x} {}", load.code_address, load.code_size, load.name);
            }
        }
    }
    let mut symbols = glass_symbols::jit::JitSymbols::new();
    symbols
        .add_file(std::path::Path::new(&path))
        .expect("readable");
    for address in args {
        let address = u64::from_str_radix(address.trim_start_matches("0x"), 16).unwrap();
        println!("{address:x}: {:?}", symbols.lookup(address));
    }
}
