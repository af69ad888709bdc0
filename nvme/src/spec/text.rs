//! String fields of NVMe data structures: ASCII fields padded with spaces (Identify
//! Controller SN, MN, FR; NVMe 2.0 §5.17.2.1, and the Firmware Slot log's revisions), and
//! UTF-8 fields terminated by a NUL (NQNs, NVMe 2.0 §4.5; the discovery log's TRSVCID and
//! TRADDR, NVMe-oF 1.1 §5.3).

/// Write `s` into an ASCII field, left-justified and padded with spaces (cut to the field).
pub fn ascii_padded(dst: &mut [u8], s: &str) {
    dst.fill(b' ');
    for (d, c) in dst.iter_mut().zip(s.bytes()) {
        *d = c;
    }
}

/// Write `s` into a NUL-terminated field: at most the field's length less one byte, the rest
/// zeroes.
pub fn nul_terminated(dst: &mut [u8], s: &str) {
    dst.fill(0);
    let n = s.len().min(dst.len().saturating_sub(1));
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_padded_or_terminated() {
        let mut f = [0u8; 4];
        ascii_padded(&mut f, "ab");
        assert_eq!(&f, b"ab  ");
        ascii_padded(&mut f, "abcdef");
        assert_eq!(&f, b"abcd");
        nul_terminated(&mut f, "ab");
        assert_eq!(&f, b"ab\0\0");
        nul_terminated(&mut f, "abcdef");
        assert_eq!(&f, b"abc\0");
    }
}
