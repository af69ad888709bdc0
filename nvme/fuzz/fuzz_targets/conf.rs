//! The conf file parser and validator: any text gets a conf or an error with its place,
//! never a panic; a conf that parses writes back (`to_toml`) to text that parses the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pollux_conf::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(c) = Config::parse(text, "fuzz.toml") {
        let back = c.to_toml();
        let again = Config::parse(&back, "fuzz.toml").unwrap_or_else(|e| panic!("{e}\n{back}"));
        assert_eq!(again.subsystems.len(), c.subsystems.len());
        assert_eq!(again.listeners, c.listeners);
    }
});
