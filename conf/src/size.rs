//! Byte sizes: an integer, or a string with an optional binary suffix.

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// Parses a size string: decimal digits, optional spaces, then an optional
/// binary suffix `K`, `M`, `G` or `T`, each optionally followed by `i` and/or
/// `B` (`"64K"`, `"64KiB"`, `"64kb"`), or a bare `B`. Case-insensitive. Every
/// suffix is a power of 1024: storage sizes here are always binary.
///
/// `Err` holds the reason; overflow of `u64` is an error, not a wrap.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    if num.is_empty() {
        return Err(SizeError::NotASize(s.to_owned()));
    }
    if suffix.starts_with(['.', ',']) {
        return Err(SizeError::Fraction(s.to_owned()));
    }
    let suffix = suffix.trim_start();
    let mult = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "ki" | "kib" => KIB,
        "m" | "mb" | "mi" | "mib" => MIB,
        "g" | "gb" | "gi" | "gib" => GIB,
        "t" | "tb" | "ti" | "tib" => TIB,
        _ => {
            return Err(SizeError::UnknownSuffix {
                text: s.to_owned(),
                suffix: suffix.to_owned(),
            });
        }
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| SizeError::TooLarge(s.to_owned()))
}

/// Why a size string is not a size; each names the text given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// No digits first.
    #[error("{0:?} is not a size: expected digits with an optional suffix such as \"64KiB\", \"512M\" or \"1GiB\"")]
    NotASize(String),
    /// A fraction (`1.5G`).
    #[error("{0:?} is not a size: fractions are not accepted; use a smaller unit (\"1536MiB\", not \"1.5GiB\")")]
    Fraction(String),
    /// A suffix other than K, M, G, T (with `i`/`B`) or B.
    #[error(
        "{text:?} has an unknown size suffix {suffix:?}: use K, M, G or T (optionally with \"iB\" or \"B\"; all are powers of 1024)"
    )]
    UnknownSuffix {
        /// The text given.
        text: String,
        /// Its suffix.
        suffix: String,
    },
    /// More bytes than a `u64` counts.
    #[error("{0:?} is too large for a 64-bit byte count")]
    TooLarge(String),
}

/// Formats a byte count in the largest binary unit that divides it exactly
/// (`"1GiB"`, `"96KiB"`), or as plain digits; [`parse_size`] reads it back.
pub fn format_size(bytes: u64) -> String {
    for (unit, name) in [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")] {
        if bytes != 0 && bytes.is_multiple_of(unit) {
            return format!("{}{name}", bytes / unit);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        for (s, v) in [
            ("4096", 4096),
            ("0", 0),
            ("64K", 64 * KIB),
            ("64k", 64 * KIB),
            ("64KiB", 64 * KIB),
            ("64kib", 64 * KIB),
            ("64KB", 64 * KIB),
            ("512M", 512 * MIB),
            ("512MiB", 512 * MIB),
            ("512 MiB", 512 * MIB),
            ("1G", GIB),
            ("1GiB", GIB),
            ("1gb", GIB),
            ("2T", 2 * TIB),
            ("2TiB", 2 * TIB),
            ("100B", 100),
            (" 8K ", 8 * KIB),
        ] {
            assert_eq!(parse_size(s), Ok(v), "{s}");
        }
    }

    #[test]
    fn rejects_bad_sizes() {
        for s in [
            "",
            "K",
            "-1",
            "1.5G",
            "1X",
            "1 G B",
            "1PiB",
            "0x10",
            "1e3",
            "18446744073709551616",
            "16777216T",
            "１G",
        ] {
            assert!(parse_size(s).is_err(), "{s:?} parsed");
        }
    }

    #[test]
    fn formats_sizes() {
        assert_eq!(format_size(GIB), "1GiB");
        assert_eq!(format_size(64 * MIB), "64MiB");
        assert_eq!(format_size(1536 * MIB), "1536MiB");
        assert_eq!(format_size(3 * TIB), "3TiB");
        assert_eq!(format_size(512), "512");
        assert_eq!(format_size(0), "0");
        for v in [0, 1, 512, 4096, 96 * KIB, GIB + 512, u64::MAX, 16 * TIB] {
            assert_eq!(parse_size(&format_size(v)), Ok(v));
        }
    }
}
