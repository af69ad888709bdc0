//! Digests: CRC32C for NVMe/TCP header and data digests.

use super::PduError;

/// CRC32C (Castagnoli) of `data`, as used by NVMe/TCP header and data digests (hardware
/// SSE4.2 when available). The digest is sent little-endian.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Incremental CRC32C, for a data digest over several buffers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Crc32c(u32);

impl Crc32c {
    /// An empty digest.
    pub const fn new() -> Self {
        Self(0)
    }

    /// Feeds more bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.0 = crc32c::crc32c_append(self.0, data);
    }

    /// The digest of everything fed so far.
    pub const fn finish(&self) -> u32 {
        self.0
    }
}

/// Checks a data digest: `received` is the little-endian u32 that followed the data.
/// A mismatch is [`PduError::DataDigest`], which is not fatal.
pub fn check_data_digest(data: &[u8], received: u32) -> Result<(), PduError> {
    let computed = crc32c(data);
    if computed == received {
        Ok(())
    } else {
        Err(PduError::DataDigest { computed, received })
    }
}
