//! NVMe Qualified Names (NVMe 2.0 §4.5 "NVMe Qualified
//! Names") and UUID text forms.

/// The well-known NQN of a discovery subsystem (NVMe 2.0 §4.5 and NVMe over
/// Fabrics: "nqn.2014-08.org.nvmexpress.discovery"). Hosts connect to it to
/// read the discovery log page; it may not name a configured subsystem.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// The longest NQN allowed: the SUBNQN/HOSTNQN fields are 256 bytes, but
/// NVMe 2.0 §4.5 limits the name itself to 223 bytes (UTF-8, not counting the NUL).
pub const NQN_MAX_LEN: usize = 223;

/// NVMe 2.0 §4.5: the second NQN format, for entities without a domain name: this
/// prefix followed by a UUID in its 8-4-4-4-12 text form.
const UUID_NQN_PREFIX: &str = "nqn.2014-08.org.nvmexpress:uuid:";

/// The longest DNS label (RFC 1035 §2.3.4); the reverse domain of an NQN is a
/// domain name, so the same bound applies to each of its labels.
const MAX_LABEL_LEN: usize = 63;

/// Checks that `s` is a well-formed NQN (NVMe 2.0 §4.5); `Err` holds the
/// reason.
///
/// Accepted forms:
/// - [`DISCOVERY_NQN`] itself;
/// - `nqn.2014-08.org.nvmexpress:uuid:` followed by a UUID in
///   `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` hex form (either case);
/// - `nqn.yyyy-mm.reverse.domain:string`, where `yyyy-mm` is a year
///   (1970 or later) and month (01..12), the reverse domain is one or more
///   dot-separated non-empty labels of `[A-Za-z0-9-]`, and at least one
///   character follows the colon.
///
/// In every form the name is at most [`NQN_MAX_LEN`] bytes and holds no
/// control character (it travels NUL-terminated in Connect data).
pub fn validate_nqn(s: &str) -> Result<(), NqnError> {
    if s.is_empty() {
        return Err(NqnError::Empty);
    }
    if s.len() > NQN_MAX_LEN {
        return Err(NqnError::TooLong { len: s.len() });
    }
    if let Some(c) = s.chars().find(|c| c.is_control()) {
        return Err(NqnError::ControlCharacter(c));
    }
    if s == DISCOVERY_NQN {
        return Ok(());
    }
    // A name in the UUID namespace must be exactly that: falling through to
    // the domain form would accept "…:uuid:junk" since "org.nvmexpress" is a
    // valid domain.
    if let Some(uuid) = s.strip_prefix(UUID_NQN_PREFIX) {
        return parse_uuid(uuid).map(|_| ()).map_err(NqnError::Uuid);
    }
    let Some(rest) = s.strip_prefix("nqn.") else {
        return Err(NqnError::Prefix);
    };
    // NVMe 2.0 §4.5: "yyyy-mm" is the year and month the naming authority acquired
    // the domain; it is followed by a '.' and the reverse domain.
    let date = rest.as_bytes();
    let well_formed = date.len() >= 8
        && date[..4].iter().all(u8::is_ascii_digit)
        && date[4] == b'-'
        && date[5..7].iter().all(u8::is_ascii_digit)
        && date[7] == b'.';
    if !well_formed {
        return Err(NqnError::Form);
    }
    let year = digits(&date[..4]);
    let month = digits(&date[5..7]);
    if year < 1970 {
        return Err(NqnError::Year { year, month });
    }
    if !(1..=12).contains(&month) {
        return Err(NqnError::Month { year, month });
    }
    // The first eight bytes are ASCII, so slicing there is on a char boundary.
    let after_date = &rest[8..];
    let Some((domain, name)) = after_date.split_once(':') else {
        return Err(NqnError::Colon);
    };
    if domain.is_empty() {
        return Err(NqnError::EmptyDomain);
    }
    for label in domain.split('.') {
        if label.is_empty() {
            return Err(NqnError::EmptyLabel {
                domain: domain.to_owned(),
            });
        }
        if let Some(c) = label.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '-')) {
            return Err(NqnError::LabelCharacter {
                domain: domain.to_owned(),
                c,
            });
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(NqnError::LabelLength {
                label: label.to_owned(),
            });
        }
    }
    if name.is_empty() {
        return Err(NqnError::EmptyName);
    }
    Ok(())
}

/// Why a name is not an NQN (NVMe 2.0 §4.5).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NqnError {
    /// Nothing at all.
    #[error("NQN is empty")]
    Empty,
    /// Longer than [`NQN_MAX_LEN`] bytes.
    #[error("NQN is {len} bytes long; at most {max} are allowed (NVMe 2.0 §4.5)", max = NQN_MAX_LEN)]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// A control character (it travels NUL-terminated in Connect data).
    #[error("NQN contains the control character {0:?}")]
    ControlCharacter(char),
    /// The UUID form, without a UUID after its prefix.
    #[error("NQN in the {prefix} form must end in a UUID: {0}", prefix = UUID_NQN_PREFIX)]
    Uuid(UuidError),
    /// Not `nqn.` first.
    #[error("NQN must start with \"nqn.\" (NVMe 2.0 §4.5)")]
    Prefix,
    /// No `yyyy-mm.` after `nqn.`.
    #[error("NQN must have the form nqn.yyyy-mm.reverse.domain:name (NVMe 2.0 §4.5)")]
    Form,
    /// A year before 1970.
    #[error("NQN date {year:04}-{month:02} is implausible: the year must be 1970 or later")]
    Year {
        /// The year.
        year: u32,
        /// The month.
        month: u32,
    },
    /// A month outside 01..12.
    #[error("NQN date {year:04}-{month:02} has no month {month:02}: months are 01..12")]
    Month {
        /// The year.
        year: u32,
        /// The month.
        month: u32,
    },
    /// No `:` between the reverse domain and the name.
    #[error("NQN lacks the ':' that separates the reverse domain from the name (NVMe 2.0 §4.5)")]
    Colon,
    /// Nothing between the date and the `:`.
    #[error("NQN has an empty reverse domain after the date")]
    EmptyDomain,
    /// Two dots in a row in the reverse domain.
    #[error("NQN reverse domain {domain:?} has an empty label")]
    EmptyLabel {
        /// The reverse domain.
        domain: String,
    },
    /// A character other than a letter, digit or `-` in the reverse domain.
    #[error("NQN reverse domain {domain:?} contains {c:?}; labels hold only letters, digits and '-'")]
    LabelCharacter {
        /// The reverse domain.
        domain: String,
        /// The character.
        c: char,
    },
    /// A label longer than a DNS label may be (RFC 1035 §2.3.4).
    #[error("NQN reverse domain label {label:?} is longer than {max} characters", max = MAX_LABEL_LEN)]
    LabelLength {
        /// The label.
        label: String,
    },
    /// Nothing after the `:`.
    #[error("NQN must have at least one character after the ':'")]
    EmptyName,
}

/// The value of a run of ASCII digits (at most four here, so no overflow).
fn digits(b: &[u8]) -> u32 {
    b.iter().fold(0, |acc, d| acc * 10 + u32::from(d - b'0'))
}

/// Parses a UUID in its RFC 9562 (formerly RFC 4122) text form,
/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, hex digits in either case.
///
/// Only the hyphenated form, not the bare-hex, braced and URN forms that
/// `Uuid::parse_str` also takes: it is the form NVMe's `uuid:` NQNs use
/// (NVMe 2.0 §4.5) and the one the conf has always taken. The uuid crate's
/// own reason is left out of the message: it counts characters and groups
/// from 0, which reads wrong next to the conf's 1-based line and column.
pub(crate) fn parse_uuid(s: &str) -> Result<[u8; 16], UuidError> {
    s.parse::<uuid::fmt::Hyphenated>()
        .map(|u| u.into_uuid().into_bytes())
        .map_err(|_| UuidError(s.to_owned()))
}

/// Text that is not a UUID in its hyphenated form (the text given).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a UUID of the form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")]
pub struct UuidError(pub String);

/// Text that is not `digits` hex digits (the text given).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not {digits} hex digits")]
pub struct HexError {
    /// The text given.
    pub text: String,
    /// The digits expected.
    pub digits: usize,
}

/// Formats 16 bytes as a UUID in lower-case 8-4-4-4-12 text form.
pub(crate) fn format_uuid(u: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*u).hyphenated().to_string()
}

/// Parses exactly `2 * N` hex digits (either case) into `N` bytes.
pub(crate) fn parse_hex<const N: usize>(s: &str) -> Result<[u8; N], HexError> {
    let b = s.as_bytes();
    if b.len() != 2 * N || !b.iter().all(u8::is_ascii_hexdigit) {
        return Err(HexError {
            text: s.to_owned(),
            digits: 2 * N,
        });
    }
    let mut out = [0u8; N];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0]) << 4) | nibble(pair[1]);
    }
    Ok(out)
}

fn nibble(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => 0,
    }
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_nqns() {
        for ok in [
            "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6",
            "nqn.2014-08.org.nvmexpress:uuid:F81D4FAE-7DEC-11D0-A765-00A0C91E6BF6",
            "nqn.2026-11.io.pollux:ram0",
            "nqn.2014-08.com.example:nvme:nvm-subsystem-sn-d78432",
            "nqn.1988-11.com.dell:powerstore:00:a1b2",
            "nqn.2026-11.io.pollux:x",
            "nqn.2026-11.a:ünïcödé name",
            "nqn.2026-12.a-b.c1:x",
            DISCOVERY_NQN,
        ] {
            assert_eq!(validate_nqn(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn invalid_nqns() {
        for (bad, why) in [
            ("", "empty"),
            ("nqn.2026-11.io.pollux", "':'"),
            ("nqn.2026-11.io.pollux:", "after the ':'"),
            ("nqn.2026-13.io.pollux:x", "no month 13"),
            ("nqn.2026-00.io.pollux:x", "no month 00"),
            ("nqn.0000-01.io.pollux:x", "implausible"),
            ("nqn.2026-1.io.pollux:x", "form"),
            ("nqn.26-11.io.pollux:x", "form"),
            ("nqn.2026-11:x", "form"),
            ("nqn.2026-11.:x", "empty reverse domain"),
            ("nqn.2026-11.io..pollux:x", "empty label"),
            ("nqn.2026-11.io.pol_lux:x", "contains '_'"),
            ("iqn.2026-11.io.pollux:x", "start with"),
            ("nqn.2014-08.org.nvmexpress:uuid:nope", "UUID"),
            (
                "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf",
                "UUID",
            ),
            ("nqn.2026-11.io.pollux:a\0b", "control"),
        ] {
            let err = validate_nqn(bad).expect_err(bad).to_string();
            assert!(err.contains(why), "{bad:?}: {err:?} lacks {why:?}");
        }
    }

    #[test]
    fn length_limit() {
        let prefix = "nqn.2026-11.io.pollux:";
        let at = format!("{prefix}{}", "a".repeat(NQN_MAX_LEN - prefix.len()));
        assert_eq!(at.len(), 223);
        assert_eq!(validate_nqn(&at), Ok(()));
        let over = format!("{at}a");
        assert_eq!(over.len(), 224);
        let err = validate_nqn(&over).expect_err("224 bytes").to_string();
        assert!(err.contains("224 bytes"), "{err}");
        // Multi-byte characters count in bytes, not characters.
        let wide = format!("{prefix}{}", "é".repeat(101));
        assert_eq!(wide.len(), 224);
        assert!(validate_nqn(&wide).is_err());
    }

    #[test]
    fn uuid_text_round_trip() {
        let u = parse_uuid("F81D4FAE-7DEC-11D0-A765-00A0C91E6BF6").expect("uuid");
        assert_eq!(u[0], 0xf8);
        assert_eq!(u[15], 0xf6);
        assert_eq!(format_uuid(&u), "f81d4fae-7dec-11d0-a765-00a0c91e6bf6");
        assert!(parse_uuid("f81d4fae7dec11d0a76500a0c91e6bf6").is_err());
        assert!(parse_uuid("f81d4fae-7dec-11d0-a765-00a0c91e6bfg").is_err());
        // The other forms the uuid crate knows are not conf text.
        assert!(parse_uuid("{f81d4fae-7dec-11d0-a765-00a0c91e6bf6}").is_err());
        assert!(parse_uuid("urn:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6").is_err());
        let err = parse_uuid("not-a-uuid").expect_err("not a uuid").to_string();
        assert!(
            err.contains("\"not-a-uuid\" is not a UUID of the form xxxxxxxx-"),
            "{err}"
        );
        assert!(parse_hex::<2>("0a0B").is_ok());
        assert!(parse_hex::<2>("0a0").is_err());
        assert!(parse_hex::<1>("é").is_err());
    }
}
