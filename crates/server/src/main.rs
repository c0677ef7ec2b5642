//! The `pagoda` binary.

fn main() {}
