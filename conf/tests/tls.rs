//! TLS on listeners and hosts' TLS PSKs: `tls = "none" | "allowed" | "required"`, inline
//! `tls_key`s and owner-only `tls_key_file`s in `NVMeTLSkey-1:` form, what is refused (with
//! the position, never the secret), the `[discovery]` hosts that only have a TLS key, and
//! `to_toml` writing it all back.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use pollux_conf::{Config, ConfiguredPsk, TlsMode};
use pollux_nvme::tls::PskHash;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-4333-8444-555555555555";

fn psk(hash: PskHash, fill: u8) -> String {
    ConfiguredPsk::new(Some(hash), &vec![fill; hash.output_len()])
        .expect("psk")
        .encode()
        .to_string()
}

fn conf(listener: &str, hosts: &str) -> String {
    format!(
        "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n{listener}\n\
         [[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:a\"\nhosts = [{hosts}]\n"
    )
}

fn temp_file(name: &str, text: &str, mode: u32) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pollux-conf-tls-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    let p = d.join(name);
    std::fs::write(&p, text).expect("write");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    p
}

#[test]
fn listener_modes_and_host_psks_are_read_and_written_back() {
    let k256 = psk(PskHash::Sha256, 1);
    let file = temp_file("h2.psk", &format!("{}\n", psk(PskHash::Sha384, 2)), 0o600);
    for (line, mode) in [
        ("", TlsMode::None),
        ("tls = \"none\"", TlsMode::None),
        ("tls = \"allowed\"", TlsMode::Allowed),
        ("tls = \"required\"", TlsMode::Required),
    ] {
        let text = conf(
            line,
            &format!(
                "{{ nqn = \"{HOST}\", tls_key = \"{k256}\" }}, {{ nqn = \"nqn.2026-11.io.pollux:h2\", tls_key_file = \"{}\" }}",
                file.display()
            ),
        );
        let c = Config::parse(&text, "test.toml").expect("valid");
        assert_eq!(c.listeners[0].tls, mode);
        let s = &c.subsystems[0];
        assert_eq!(*s.tls_keys[HOST].key.encode(), k256);
        assert!(s.tls_keys[HOST].file.is_none());
        assert_eq!(s.tls_keys["nqn.2026-11.io.pollux:h2"].key.cipher(), PskHash::Sha384);
        assert!(s.host_keys.is_empty(), "a TLS key is not a DH-HMAC-CHAP key");
        let out = c.to_toml();
        assert!(out.contains(&format!("tls_key_file = \"{}\"", file.display())), "{out}");
        let back = Config::parse(&out, "test.toml").expect("round trip");
        assert_eq!(back.listeners, c.listeners);
        assert_eq!(back.subsystems, c.subsystems);
        assert!(!format!("{c:?}").contains(&k256[16..40]), "Debug shows the key");
    }
}

#[test]
fn discovery_hosts_may_have_only_a_tls_key() {
    let k = psk(PskHash::Sha256, 3);
    let text = format!(
        "{}[discovery]\nhosts = [{{ nqn = \"{HOST}\", tls_key = \"{k}\" }}]\n",
        conf("tls = \"required\"", &format!("\"{HOST}\""))
    );
    let c = Config::parse(&text, "test.toml").expect("valid");
    assert!(c.discovery.host_keys.is_empty());
    assert_eq!(*c.discovery.tls_keys[HOST].key.encode(), k);
    let back = Config::parse(&c.to_toml(), "test.toml").expect("round trip");
    assert_eq!(back.discovery, c.discovery);
}

#[test]
fn bad_modes_keys_and_key_files_are_refused_with_the_reason() {
    let k = psk(PskHash::Sha256, 4);
    let refused = |text: &str, line: usize, needle: &str| {
        let e = Config::parse(text, "test.toml").expect_err("parsed");
        assert_eq!(e.line(), Some(line), "{e}");
        assert!(e.message().contains(needle), "{e} lacks {needle:?}");
        assert!(!e.to_string().contains(&k[16..40]), "the error shows the secret: {e}");
    };
    refused(
        &conf("tls = \"yes\"", &format!("\"{HOST}\"")),
        5,
        "\"none\", \"allowed\" or \"required\"",
    );
    let host = |fields: &str| conf("", &format!("{{ nqn = \"{HOST}\", {fields} }}"));
    // A corrupted key (its CRC no longer matches), a DH-HMAC-CHAP secret, both forms.
    let mut bad = k.clone().into_bytes();
    bad[20] = if bad[20] == b'A' { b'B' } else { b'A' };
    let bad = String::from_utf8(bad).expect("utf8");
    refused(&host(&format!("tls_key = \"{bad}\"")), 8, "invalid `tls_key`");
    refused(&host("tls_key = \"DHHC-1:00:abcd:\""), 8, "NVMeTLSkey-1");
    refused(
        &host(&format!("tls_key = \"{k}\", tls_key_file = \"/x\"")),
        8,
        "not both",
    );
    let open = temp_file("open.psk", &k, 0o644);
    refused(
        &host(&format!("tls_key_file = \"{}\"", open.display())),
        8,
        "readable by its owner only",
    );
    refused(&host("tls_key_file = \"/nonexistent/k\""), 8, "cannot be read");
    // A [discovery] host with no key at all.
    let text = format!(
        "{}[discovery]\nhosts = [\"{HOST}\"]\n",
        conf("", &format!("\"{HOST}\""))
    );
    refused(&text, 10, "has no key");
}

#[test]
fn a_hosts_key_derivation_is_read_checked_and_written_back() {
    use pollux_nvme::tls::PskDerivation;
    let k = psk(PskHash::Sha256, 4);
    let with = |extra: &str| conf("", &format!("{{ nqn = \"{HOST}\", tls_key = \"{k}\"{extra} }}"));
    let c = Config::parse(&with(""), "test.toml").expect("valid");
    assert_eq!(c.subsystems[0].tls_keys[HOST].key.derivation(), PskDerivation::Rfc8446);
    assert!(
        !c.to_toml().contains("tls_key_derivation"),
        "the default is not written"
    );
    for (name, d) in [
        ("rfc8446", PskDerivation::Rfc8446),
        ("libnvme-compat", PskDerivation::LibnvmeCompat),
    ] {
        let c = Config::parse(&with(&format!(", tls_key_derivation = \"{name}\"")), "test.toml").expect("valid");
        let key = &c.subsystems[0].tls_keys[HOST].key;
        assert_eq!(key.derivation(), d);
        // Another derivation is another TLS PSK for the same configured key.
        let other = key.clone().with_derivation(match d {
            PskDerivation::Rfc8446 => PskDerivation::LibnvmeCompat,
            PskDerivation::LibnvmeCompat => PskDerivation::Rfc8446,
        });
        let sub = "nqn.2026-11.io.pollux:a";
        assert_ne!(
            *key.tls_psk(HOST, sub, 0).expect("tls psk").psk,
            *other.tls_psk(HOST, sub, 0).expect("tls psk").psk
        );
        let back = Config::parse(&c.to_toml(), "test.toml").expect("round trip");
        assert_eq!(back.subsystems, c.subsystems, "{}", c.to_toml());
    }
    let e = Config::parse(&with(", tls_key_derivation = \"compat\""), "test.toml").expect_err("refused");
    assert!(e.to_string().contains("libnvme-compat"), "{e}");
    let e = Config::parse(
        &conf(
            "",
            &format!("{{ nqn = \"{HOST}\", tls_key_derivation = \"libnvme-compat\" }}"),
        ),
        "test.toml",
    )
    .expect_err("refused");
    assert!(e.to_string().contains("without a `tls_key`"), "{e}");
}
