//! DH-HMAC-CHAP messages (NVMe 2.0 §8.13.5) as a host or controller sends them in AUTH_Send:
//! parsing never panics, and whatever parses encodes back to bytes that parse the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pollux_nvme::auth::msg::Message;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Message::parse(data) {
        let again = Message::parse(&m.encode());
        assert_eq!(again.as_ref(), Ok(&m), "{m:?} does not survive its own encoding");
    }
});
