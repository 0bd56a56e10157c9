//! Prints each vCPU's registers as glass reads them from a GDB stub (a debugging aid).
//! Usage: stub_regs ADDRESS
fn main() {
    let address = std::env::args().nth(1).expect("usage: stub_regs ADDRESS");
    let mut client = glass_target::gdbstub::client::Client::connect(&address).expect("connect");
    client.stop().expect("stop");
    for vcpu in 0..client.vcpus.len() {
        let regs = client.registers(vcpu).expect("registers");
        println!("{} {regs:x?}", client.vcpus[vcpu]);
    }
    for name in [
        "rbp",
        "rsp",
        "rip",
        "eflags",
        "cs",
        "gs",
        "fs_base",
        "gs_base",
        "k_gs_base",
        "cr0",
        "cr2",
        "cr3",
        "cr4",
        "cr8",
        "efer",
    ] {
        println!("{name} at {:?}", client.layout.find(name));
    }
    for name in ["cr3", "cr4", "efer"] {
        println!(
            "p {name} (regnum {:?}) = {:x?}",
            client.layout.regnum(name),
            client.register(name)
        );
    }
    println!("g_len {}", client.layout.g_len);
    for (name, offset, size) in client.layout.slots() {
        print!("{name}@{offset}/{size} ");
    }
    println!();
    client.detach().expect("detach");
}
