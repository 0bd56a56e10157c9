//! Stack unwinders: frame-pointer walk over copied stack windows
