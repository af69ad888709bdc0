//! pollux conf crate.
