//! Deterministic identifiers derived from a subsystem NQN (and a namespace
//! ID).
//!
//! Hosts key multipath and persistent device names on the namespace
//! identifiers (NVMe 2.0 §4.7, "Namespace identification descriptors") and
//! on the controller serial number. When the configuration does not give
//! them, they must still be the same after a restart, on another machine and
//! across pollux versions, so they are a pure function of the configuration.
//! **Never change this derivation**: a change renames every host's devices.
//! A unit test pins one value to catch accidental changes.

/// Identifiers derived for one namespace; see [`derive_ids`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DerivedIds {
    /// An RFC 9562 version 8 (custom) UUID.
    pub uuid: [u8; 16],
    /// A 128-bit NGUID, never all zero.
    pub nguid: [u8; 16],
    /// An EUI-64 with the locally-administered bit set and the multicast bit
    /// clear (so never all zero, and never in an IEEE-assigned OUI's space).
    pub eui64: [u8; 8],
}

/// Derives the namespace identifiers for namespace `nsid` of subsystem `nqn`.
/// Distinct `(nqn, nsid)` pairs give distinct identifiers (up to 128-bit hash
/// collisions for the UUID and NGUID, 62-bit for the EUI-64).
pub fn derive_ids(nqn: &str, nsid: u32) -> DerivedIds {
    let mut uuid = hash128(b"uuid", nqn, nsid).to_be_bytes();
    // RFC 9562 §5.8: version 8 in the high nibble of octet 6, variant 0b10 in
    // the two high bits of octet 8.
    uuid[6] = (uuid[6] & 0x0f) | 0x80;
    uuid[8] = (uuid[8] & 0x3f) | 0x80;

    let mut nguid = hash128(b"nguid", nqn, nsid).to_be_bytes();
    if nguid == [0; 16] {
        // All zero means "not reported" (NVMe Base, Identify Namespace).
        nguid[15] = 1;
    }

    let mut eui64 = [0u8; 8];
    eui64.copy_from_slice(&hash128(b"eui64", nqn, nsid).to_be_bytes()[..8]);
    // IEEE EUI-64: bit 1 of the first octet marks a locally administered
    // identifier and bit 0 a group one; ours is a local, individual
    // identifier. Setting bit 1 also makes it non-zero.
    eui64[0] = (eui64[0] | 0x02) & !0x01;

    DerivedIds { uuid, nguid, eui64 }
}

/// Derives a controller serial number for subsystem `nqn`: 20 upper-case hex
/// digits, which fill the 20-byte Identify Controller SN field.
pub fn derive_serial(nqn: &str) -> String {
    let h = hash128(b"serial", nqn, 0).to_be_bytes();
    crate::nqn::hex(&h[..10]).to_ascii_uppercase()
}

/// A fixed 128-bit hash of an injective encoding of `(tag, nqn, nsid)`:
/// FNV-1a 128 (its published offset basis and prime) followed by a bijective
/// finaliser that spreads every input bit over the whole output, since plain
/// FNV leaves the last bytes' influence on the high bits weak.
fn hash128(tag: &[u8], nqn: &str, nsid: u32) -> u128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let mut h = OFFSET;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u128::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    };
    // Tags are from a fixed NUL-free set, and the NQN is length-prefixed, so
    // distinct inputs give distinct byte strings.
    eat(b"pollux-conf/ids/v1\0");
    eat(tag);
    eat(b"\0");
    eat(&(nqn.len() as u64).to_le_bytes());
    eat(nqn.as_bytes());
    eat(&nsid.to_le_bytes());

    // Both halves through murmur3's fmix64, each mixed with the other; every
    // step is invertible, so distinct FNV outputs stay distinct.
    let hi = (h >> 64) as u64;
    let lo = h as u64;
    let a = fmix64(lo ^ hi.rotate_left(32));
    let b = fmix64(hi ^ a);
    (u128::from(b) << 64) | u128::from(a)
}

fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nqn::{format_uuid, hex};
    use std::collections::HashSet;

    #[test]
    fn derivation_is_pinned() {
        // If this fails, the derivation changed: that would rename the
        // devices of every host that uses pollux. Don't.
        let ids = derive_ids("nqn.2026-11.io.pollux:ram0", 1);
        assert_eq!(format_uuid(&ids.uuid), "71b74281-cb6f-868c-91aa-488995cd8474");
        assert_eq!(hex(&ids.nguid), "2016f29b3a84cbb100c7385f15afe2f3");
        assert_eq!(hex(&ids.eui64), "aab9fd0b96f81ed5");
        assert_eq!(derive_serial("nqn.2026-11.io.pollux:ram0"), "D5004B669025D09A2055");
    }

    #[test]
    fn uuid_is_version_8_rfc_variant() {
        for nsid in 1..100 {
            let u = derive_ids("nqn.2026-11.io.pollux:x", nsid).uuid;
            assert_eq!(u[6] >> 4, 8);
            assert_eq!(u[8] >> 6, 0b10);
        }
    }

    #[test]
    fn ids_are_distinct() {
        let mut uuids = HashSet::new();
        let mut nguids = HashSet::new();
        let mut euis = HashSet::new();
        let mut serials = HashSet::new();
        let nqns = [
            "nqn.2026-11.io.pollux:ram0",
            "nqn.2026-11.io.pollux:ram1",
            "nqn.2026-11.io.pollux:ram",
            "nqn.2026-11.io.pollux:ram00",
            "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6",
        ];
        for nqn in nqns {
            assert!(serials.insert(derive_serial(nqn)));
            for nsid in (1..=256).chain([0xFFFF_FFFE, 0x100, 0x1_0000]) {
                let ids = derive_ids(nqn, nsid);
                assert_ne!(ids.eui64, [0; 8]);
                assert_eq!(ids.eui64[0] & 0x03, 0x02);
                // Duplicates among the chained nsids are expected; only new
                // (nqn, nsid) pairs must give new ids.
                let fresh = uuids.insert(ids.uuid);
                assert_eq!(nguids.insert(ids.nguid), fresh);
                assert_eq!(euis.insert(ids.eui64), fresh);
            }
        }
        assert_eq!(uuids.len(), nqns.len() * 258);
    }

    #[test]
    fn serial_form() {
        let s = derive_serial("nqn.2026-11.io.pollux:ram0");
        assert_eq!(s.len(), 20);
        assert!(s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_lowercase()));
        assert_eq!(s, derive_serial("nqn.2026-11.io.pollux:ram0"));
    }
}
