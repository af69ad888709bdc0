//! pollux nvme crate.
