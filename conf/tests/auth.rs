//! Hosts with DH-HMAC-CHAP keys: inline secrets and owner-only key files, what is refused
//! (with the position, never the secret), the hash and group lists (a subsystem's, and a
//! host's own), and `to_toml` writing key files back as files.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use pollux_conf::{Config, DhGroup, DhchapKey, HashId};

const BASE: &str = "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-4333-8444-555555555555";

fn sub(hosts: &str, extra: &str) -> String {
    format!("{BASE}[[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:a\"\nhosts = [{hosts}]\n{extra}")
}

fn key(hash: Option<HashId>) -> String {
    let len = hash.map_or(32, HashId::output_len);
    DhchapKey::generate(hash, len).expect("random").encode().to_string()
}

fn temp_file(name: &str, text: &str, mode: u32) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pollux-conf-auth-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    let p = d.join(name);
    std::fs::write(&p, text).expect("write");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    p
}

#[track_caller]
fn refused(text: &str, line: usize, needle: &str, secret: Option<&str>) {
    let e = Config::parse(text, "test.toml").expect_err("parsed");
    assert_eq!(e.line(), Some(line), "{e}");
    assert!(e.message().contains(needle), "{e} lacks {needle:?}");
    if let Some(s) = secret {
        assert!(!e.to_string().contains(&s[10..20]), "the error shows the secret: {e}");
    }
}

#[test]
fn inline_and_file_keys_are_read_and_written_back_as_given() {
    let (hk, ck) = (key(Some(HashId::Sha256)), key(None));
    let file = temp_file("host2.key", &format!("{}\n", key(Some(HashId::Sha512))), 0o600);
    let text = sub(
        &format!(
            "\"nqn.2026-11.io.pollux:plain\", {{ nqn = \"{HOST}\", dhchap_key = \"{hk}\", dhchap_ctrl_key = \"{ck}\" }},\n \
             {{ nqn = \"nqn.2026-11.io.pollux:h2\", dhchap_key_file = \"{}\" }}",
            file.display()
        ),
        "dhchap_hashes = [\"sha512\", \"sha256\"]\ndhchap_dh_groups = [\"null\"]\n",
    );
    let c = Config::parse(&text, "test.toml").expect("valid");
    let s = &c.subsystems[0];
    assert_eq!(s.hosts.len(), 3);
    assert!(!s.host_keys.contains_key("nqn.2026-11.io.pollux:plain"));
    let k = &s.host_keys[HOST];
    assert_eq!(*k.host.key.encode(), hk);
    assert_eq!(k.ctrl.as_ref().map(|c| c.key.encode().to_string()), Some(ck));
    assert_eq!(
        s.host_keys["nqn.2026-11.io.pollux:h2"].host.file.as_deref(),
        Some(file.as_path())
    );
    assert_eq!(s.dhchap.hashes, [HashId::Sha512, HashId::Sha256]);
    assert_eq!(s.dhchap.dh_groups, [DhGroup::Null]);
    // Written back: the file as a file (no secret of it in the text), inline keys inline.
    let out = c.to_toml();
    assert!(
        out.contains(&format!("dhchap_key_file = \"{}\"", file.display())),
        "{out}"
    );
    let file_secret = std::fs::read_to_string(&file).expect("read");
    assert!(!out.contains(file_secret.trim()), "{out}");
    assert_eq!(
        Config::parse(&out, "test.toml").expect("round trip").subsystems,
        c.subsystems
    );
    // Debug never shows key material.
    assert!(!format!("{c:?}").contains(&hk[10..30]));
}

#[test]
fn bad_keys_and_key_files_are_refused_with_the_reason() {
    let hk = key(Some(HashId::Sha256));
    // A mistyped secret: position, reason, not the secret.
    let mut bad = hk.clone();
    bad.replace_range(14..15, if &hk[14..15] == "A" { "B" } else { "A" });
    refused(
        &sub(&format!("{{ nqn = \"{HOST}\", dhchap_key = \"{bad}\" }}"), ""),
        7,
        "CRC-32",
        Some(&bad),
    );
    refused(
        &sub(&format!("{{ nqn = \"{HOST}\", dhchap_key = \"secret\" }}"), ""),
        7,
        "DHHC-1",
        None,
    );
    // Both forms, or a controller key alone.
    refused(
        &sub(
            &format!("{{ nqn = \"{HOST}\", dhchap_key = \"{hk}\", dhchap_key_file = \"/x\" }}"),
            "",
        ),
        7,
        "not both",
        None,
    );
    refused(
        &sub(&format!("{{ nqn = \"{HOST}\", dhchap_ctrl_key = \"{hk}\" }}"), ""),
        7,
        "needs a host key",
        None,
    );
    // A key file others may read; one that does not exist; one that holds no secret.
    let open = temp_file("open.key", &hk, 0o644);
    refused(
        &sub(
            &format!("{{ nqn = \"{HOST}\", dhchap_key_file = \"{}\" }}", open.display()),
            "",
        ),
        7,
        "mode 0644",
        None,
    );
    refused(
        &sub(
            &format!("{{ nqn = \"{HOST}\", dhchap_key_file = \"/nonexistent/k\" }}"),
            "",
        ),
        7,
        "cannot be read",
        None,
    );
    let junk = temp_file("junk.key", "hello\n", 0o600);
    refused(
        &sub(
            &format!("{{ nqn = \"{HOST}\", dhchap_key_file = \"{}\" }}", junk.display()),
            "",
        ),
        7,
        "DHHC-1",
        None,
    );
    // Unknown fields of a host, hash and group names, empty and repeated lists.
    refused(
        &sub(&format!("{{ nqn = \"{HOST}\", key = \"x\" }}"), ""),
        7,
        "key",
        None,
    );
    refused(
        &sub(&format!("\"{HOST}\""), "dhchap_hashes = [\"md5\"]\n"),
        8,
        "sha256, sha384 or sha512",
        None,
    );
    refused(
        &sub(&format!("\"{HOST}\""), "dhchap_dh_groups = []\n"),
        8,
        "must not be empty",
        None,
    );
    refused(
        &sub(&format!("\"{HOST}\""), "dhchap_dh_groups = [\"null\", \"null\"]\n"),
        8,
        "listed twice",
        None,
    );
}

#[test]
fn a_conf_file_holding_an_inline_key_must_be_owner_only() {
    // Issue 35: `--check` accepted a 0644 conf with inline keys while refusing a 0644 key
    // file. A conf holding a secret is a key file.
    let hk = key(Some(HashId::Sha256));
    let text = sub(&format!("{{ nqn = \"{HOST}\", dhchap_key = \"{hk}\" }}"), "");
    let open = temp_file("inline-open.toml", &text, 0o644);
    let e = Config::from_path(&open).expect_err("a 0644 conf holding a key was accepted");
    assert_eq!(e.line(), Some(7), "{e}");
    assert!(e.message().contains("mode 0644"), "{e}");
    assert!(e.message().contains("dhchap_key_file"), "{e}");
    assert!(!e.to_string().contains(&hk[10..20]), "the error shows the secret: {e}");
    let closed = temp_file("inline-closed.toml", &text, 0o600);
    let c = Config::from_path(&closed).expect("an owner-only conf holding a key");
    assert!(c.has_inline_secrets());
    // Keys in key files: the conf itself is no secret, any mode will do.
    let kf = temp_file("k.key", &format!("{hk}\n"), 0o600);
    let text = sub(
        &format!("{{ nqn = \"{HOST}\", dhchap_key_file = \"{}\" }}", kf.display()),
        "",
    );
    let c = Config::from_path(&temp_file("files.toml", &text, 0o644)).expect("keys in key files");
    assert!(!c.has_inline_secrets());
}

#[test]
fn a_host_may_have_its_own_hashes_and_groups() {
    // NVMe 2.0 §8.13.5.1: as Linux nvmet's per-host dhchap_hash and dhchap_dhgroup.
    let (hk, h2k) = (key(Some(HashId::Sha256)), key(None));
    let h2 = "nqn.2026-11.io.pollux:h2";
    let h3 = "nqn.2026-11.io.pollux:h3";
    let text = sub(
        &format!(
            "{{ nqn = \"{HOST}\", dhchap_key = \"{hk}\", dhchap_hashes = [\"sha512\"], dhchap_dh_groups = [\"ffdhe3072\"] }},\n \
             {{ nqn = \"{h2}\", dhchap_key = \"{h2k}\", dhchap_hashes = [\"sha384\", \"sha256\"] }},\n \
             {{ nqn = \"{h3}\", dhchap_key = \"{h2k}\" }}"
        ),
        "dhchap_hashes = [\"sha256\"]\ndhchap_dh_groups = [\"ffdhe2048\", \"null\"]\n",
    );
    let c = Config::parse(&text, "test.toml").expect("valid");
    let s = &c.subsystems[0];
    let own = s.host_keys[HOST].dhchap.as_ref().expect("own lists");
    assert_eq!(own.hashes, [HashId::Sha512]);
    assert_eq!(own.dh_groups, [DhGroup::Ffdhe3072]);
    assert_eq!(s.host_keys[HOST].policy(&s.dhchap), own);
    // A list not given is the subsystem's.
    let own2 = s.host_keys[h2].dhchap.as_ref().expect("own lists");
    assert_eq!(own2.hashes, [HashId::Sha384, HashId::Sha256]);
    assert_eq!(own2.dh_groups, [DhGroup::Ffdhe2048, DhGroup::Null]);
    // None given: the subsystem's.
    assert_eq!(s.host_keys[h3].dhchap, None);
    assert_eq!(s.host_keys[h3].policy(&s.dhchap), &s.dhchap);
    // Written back only where given, and read back the same.
    let out = c.to_toml();
    assert!(
        out.contains("dhchap_hashes = [\"sha512\"], dhchap_dh_groups = [\"ffdhe3072\"]"),
        "{out}"
    );
    assert_eq!(out.matches("dhchap_hashes").count(), 3, "{out}");
    assert_eq!(Config::parse(&out, "test.toml").expect("round trip"), c);

    // The discovery controller's hosts too.
    let text = format!(
        "{BASE}[discovery]\nhosts = [{{ nqn = \"{HOST}\", dhchap_key = \"{hk}\", dhchap_dh_groups = [\"null\"] }}]\n"
    );
    let c = Config::parse(&text, "test.toml").expect("valid");
    let own = c.discovery.host_keys[HOST].dhchap.as_ref().expect("own lists");
    assert_eq!(own.hashes, HashId::ALL);
    assert_eq!(own.dh_groups, [DhGroup::Null]);
    assert_eq!(Config::parse(&c.to_toml(), "test.toml").expect("round trip"), c);
}

#[test]
fn a_hosts_own_lists_are_checked_as_the_subsystems_and_need_its_key() {
    let hk = key(Some(HashId::Sha256));
    let entry = |extra: &str| sub(&format!("{{ nqn = \"{HOST}\", dhchap_key = \"{hk}\", {extra} }}"), "");
    refused(
        &entry("dhchap_hashes = [\"md5\"]"),
        7,
        "sha256, sha384 or sha512",
        Some(&hk),
    );
    refused(&entry("dhchap_dh_groups = [\"ffdhe1024\"]"), 7, "ffdhe8192", Some(&hk));
    refused(&entry("dhchap_hashes = []"), 7, "must not be empty", Some(&hk));
    refused(
        &entry("dhchap_dh_groups = [\"null\", \"null\"]"),
        7,
        "listed twice",
        Some(&hk),
    );
    refused(&entry("dhchap_hashes = \"sha256\""), 7, "sequence", Some(&hk));
    // Without a DH-HMAC-CHAP key (a TLS key is not one), naming the list and the key.
    refused(
        &sub(&format!("{{ nqn = \"{HOST}\", dhchap_hashes = [\"sha512\"] }}"), ""),
        7,
        "`dhchap_hashes` without a `dhchap_key` or `dhchap_key_file`",
        None,
    );
    let psk = pollux_conf::ConfiguredPsk::new(Some(pollux_nvme::tls::PskHash::Sha256), &[7u8; 32])
        .expect("psk")
        .encode()
        .to_string();
    refused(
        &sub(
            &format!("{{ nqn = \"{HOST}\", tls_key = \"{psk}\", dhchap_dh_groups = [\"null\"] }}"),
            "",
        ),
        7,
        "`dhchap_dh_groups` without a `dhchap_key` or `dhchap_key_file`",
        None,
    );
}
