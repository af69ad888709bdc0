//! The `--verify` block pattern: every logical block carries its LBA and the generation of
//! the write that put it there, so a block read back from the wrong place, a stale block and
//! a corrupted one are each told apart.
//!
//! Block layout, little-endian u64 words: word 0 the LBA, word 1 `MAGIC << 32 | generation`,
//! word i >= 2 `seed(lba, gen) ^ i * K` (so every byte of the block is checked).

/// "plx!" in the upper half of word 1.
const MAGIC: u64 = 0x706C_7821;
const K_LBA: u64 = 0x9E37_79B9_7F4A_7C15;
const K_GEN: u64 = 0xC2B2_AE3D_27D4_EB4F;
const K_WORD: u64 = 0x1656_67B1_9E37_79F9;

fn seed(lba: u64, gen_: u32) -> u64 {
    lba.wrapping_mul(K_LBA) ^ u64::from(gen_).wrapping_mul(K_GEN)
}

/// Fills `buf` (whole blocks of `block` bytes, the first at `lba`) with generation `gen_`.
pub fn fill(buf: &mut [u8], lba: u64, block: usize, gen_: u32) {
    for (k, b) in buf.chunks_exact_mut(block).enumerate() {
        let l = lba + k as u64;
        let s = seed(l, gen_);
        let mut w = 0u64;
        for (i, word) in b.chunks_exact_mut(8).enumerate() {
            let v = match i {
                0 => l,
                1 => MAGIC << 32 | u64::from(gen_),
                _ => s ^ w,
            };
            word.copy_from_slice(&v.to_le_bytes());
            w = w.wrapping_add(K_WORD);
        }
    }
}

fn word(b: &[u8], i: usize) -> u64 {
    b.get(i * 8..i * 8 + 8)
        .and_then(|w| w.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// Whether block `b` is exactly the pattern of (`lba`, `gen_`).
fn matches(b: &[u8], lba: u64, gen_: u32) -> bool {
    let s = seed(lba, gen_);
    let mut w = 0u64;
    for (i, word) in b.chunks_exact(8).enumerate() {
        let v = u64::from_le_bytes([word[0], word[1], word[2], word[3], word[4], word[5], word[6], word[7]]);
        let want = match i {
            0 => lba,
            1 => MAGIC << 32 | u64::from(gen_),
            _ => s ^ w,
        };
        if v != want {
            return false;
        }
        w = w.wrapping_add(K_WORD);
    }
    true
}

/// A block that is not what it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// Its LBA.
    pub lba: u64,
    /// What it holds.
    pub found: String,
}

/// Checks the blocks of `buf` (the first at `lba`) against generation `gen_`. Generation 0
/// means "not written in this run": such a block may be all zeroes (a fresh namespace) or
/// any complete pattern for its own LBA (left by an earlier run).
pub fn check(buf: &[u8], lba: u64, block: usize, gen_: u32) -> Result<(), Mismatch> {
    for (k, b) in buf.chunks_exact(block).enumerate() {
        let l = lba + k as u64;
        if gen_ != 0 && matches(b, l, gen_) {
            continue;
        }
        let (w0, w1) = (word(b, 0), word(b, 1));
        if gen_ == 0 {
            if b.iter().all(|&x| x == 0) {
                continue;
            }
            if w0 == l && w1 >> 32 == MAGIC && matches(b, l, w1 as u32) {
                continue;
            }
        }
        let found = if w1 >> 32 != MAGIC {
            if b.iter().all(|&x| x == 0) {
                "zeroes".to_string()
            } else {
                format!("foreign data (first bytes {:02x?})", &b[..b.len().min(16)])
            }
        } else if w0 != l {
            format!("the block of LBA {w0} (generation {})", w1 as u32)
        } else if w1 as u32 != gen_ {
            format!("generation {} of this LBA", w1 as u32)
        } else {
            let mut probe = vec![0u8; b.len()];
            fill(&mut probe, l, b.len(), gen_);
            let bad = (2..b.len() / 8)
                .find(|&i| word(&probe, i) != word(b, i))
                .map_or(0, |i| i * 8);
            format!("its header but corrupted data from byte {bad}")
        };
        return Err(Mismatch { lba: l, found });
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_filled_buffer_checks_and_every_kind_of_damage_is_named() {
        let mut b = vec![0u8; 4 * 512];
        assert_eq!(check(&b, 10, 512, 0), Ok(()), "zeroes are fine when never written");
        assert!(check(&b, 10, 512, 1).is_err(), "zeroes after a write are not");
        fill(&mut b, 10, 512, 3);
        assert_eq!(check(&b, 10, 512, 3), Ok(()));
        assert_eq!(
            check(&b, 10, 512, 0),
            Ok(()),
            "an earlier run's pattern is fine when never written"
        );
        let e = check(&b, 10, 512, 4).unwrap_err();
        assert_eq!(e.lba, 10);
        assert!(e.found.contains("generation 3"), "{}", e.found);
        let e = check(&b, 11, 512, 3).unwrap_err();
        assert!(e.found.contains("block of LBA 10"), "{}", e.found);
        b[3 * 512 + 100] ^= 1;
        let e = check(&b, 10, 512, 3).unwrap_err();
        assert_eq!(e.lba, 13);
        assert!(e.found.contains("byte 96"), "{}", e.found);
        b[2 * 512] = 0xAA;
        b[2 * 512 + 15] = 0;
        let e = check(&b, 10, 512, 0).unwrap_err();
        assert_eq!(e.lba, 12);
        assert!(e.found.contains("foreign"), "{}", e.found);
    }
}
