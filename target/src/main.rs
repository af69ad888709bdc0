//! The `pollux` binary.
fn main() {}
