//! How a target is stopped, read and resumed: one module per backend
