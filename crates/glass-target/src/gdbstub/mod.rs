//! The GDB remote serial protocol backend (VM guests through a VMM's GDB stub): packet
//! framing and the target description. The connection and the sample loop build on
//! these.

pub mod backend;
pub mod client;
pub mod code;
pub mod ledger;
pub mod packet;
pub mod target_xml;
