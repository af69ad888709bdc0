//! What operators and hosts hand pollux as keys: TLS PSKs in the interchange format
//! (`NVMeTLSkey-1:`), PSK identities from a ClientHello (NVMe/TCP 1.0 §3.6.1.3), DH-HMAC-CHAP
//! secrets (`DHHC-1:`): never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pollux_nvme::auth::DhchapKey;
use pollux_nvme::tls::{ConfiguredPsk, PskIdentity};

fuzz_target!(|data: &[u8]| {
    let _ = PskIdentity::parse(data);
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(k) = ConfiguredPsk::parse(text) {
            assert!(
                ConfiguredPsk::parse(&k.encode()).is_ok(),
                "an encoded PSK does not parse"
            );
        }
        let _ = DhchapKey::parse(text);
    }
});
