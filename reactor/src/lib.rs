//! pollux reactor crate.
