//! The pollux NVMe-oF target.
