//! Offline symbolization: module maps, ELF symbols and DWARF line info
