//! nvmetcli's config.json (linux-nvme/nvmetcli `nvmet/nvme.py`) to a pollux conf and back.
#![allow(clippy::unwrap_used)]

use pollux_conf::nvmet::{NvmetError, from_config, to_toml};
use pollux_conf::{AnaState, Backend, Config};

/// A config as nvmetcli's `saveconfig` writes it (keys sorted, configfs values as strings):
/// two TCP ports, the second with ANA group 2 non-optimized and a referral, one subsystem
/// on both with an allowed host (its DH-HMAC-CHAP key in the host entry, as nvmet keeps
/// it), a namespace on a file and a disabled one.
fn config(file: &str) -> String {
    format!(
        r#"{{
  "hosts": [
    {{
      "dhchap": {{
        "ctrl_key": "",
        "dhgroup": "null",
        "hash": "hmac(sha256)",
        "key": "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:"
      }},
      "nqn": "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-0000000000c1"
    }}
  ],
  "ports": [
    {{
      "addr": {{"adrfam": "ipv4", "traddr": "127.0.0.1", "treq": "not specified", "trsvcid": "4420", "trtype": "tcp", "tsas": "none"}},
      "ana_groups": [{{"ana": {{"state": "optimized"}}, "grpid": 1}}],
      "param": {{"inline_data_size": "16384", "pi_enable": "0"}},
      "portid": 1,
      "referrals": [],
      "subsystems": ["nqn.2026-12.io.pollux:nvmet1"]
    }},
    {{
      "addr": {{"adrfam": "ipv4", "traddr": "127.0.0.1", "treq": "not specified", "trsvcid": "4421", "trtype": "tcp"}},
      "ana_groups": [{{"ana": {{"state": "optimized"}}, "grpid": 1}}, {{"ana": {{"state": "non-optimized"}}, "grpid": 2}}],
      "portid": 2,
      "referrals": [{{"addr": {{"adrfam": "ipv4", "portid": "0", "traddr": "127.0.0.2", "treq": "not specified", "trsvcid": "8009", "trtype": "tcp"}}, "enable": 1, "name": "r1"}}],
      "subsystems": ["nqn.2026-12.io.pollux:nvmet1"]
    }}
  ],
  "subsystems": [
    {{
      "allowed_hosts": ["nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-0000000000c1"],
      "attr": {{"allow_any_host": "0", "cntlid_max": "65519", "cntlid_min": "1", "firmware": "6.1.0", "ieee_oui": "0x000000", "model": "Linux", "pi_enable": "0", "qid_max": "128", "serial": "5e3f9a3c1b2d4e6f", "version": "1.3"}},
      "namespaces": [
        {{"ana": {{"grpid": "2"}}, "ana_grpid": 2, "device": {{"nguid": "6b1a3f34-7e9a-4d3b-9c0e-1f2a3b4c5d6e", "p2pmem": "", "path": "{file}", "uuid": "0e9d3c2b-1a2b-4c3d-8e4f-5a6b7c8d9e0f"}}, "enable": 1, "nsid": 1}},
        {{"ana_grpid": 1, "device": {{"nguid": "00000000-0000-0000-0000-000000000000", "path": "/dev/nonexistent", "uuid": "00000000-0000-0000-0000-000000000000"}}, "enable": 0, "nsid": 2}}
      ],
      "nqn": "nqn.2026-12.io.pollux:nvmet1"
    }}
  ]
}}"#
    )
}

#[test]
fn an_nvmetcli_config_serves_the_same_subsystems() {
    let file = std::env::temp_dir().join(format!("pollux-nvmet-{}.img", std::process::id()));
    std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
    let text = to_toml(&config(&file.display().to_string())).unwrap();
    let c = Config::parse(&text, "nvmet.toml").unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(c.listeners.len(), 2);
    assert_eq!(c.listeners[1].ana.get(&2), Some(&AnaState::NonOptimized), "{text}");
    // Port 1 lists group 1 only: nvmet reports group 2 (its namespace's) inaccessible there
    // (every group but 1 starts so on a port), and so must pollux (a group a listener does
    // not list is optimized on it).
    assert_eq!(c.listeners[0].ana.get(&2), Some(&AnaState::Inaccessible), "{text}");
    // nvmet's discovery log lists the subsystems of the host's own port.
    assert_eq!(c.discovery.filter.name(), "address,svcid");
    assert_eq!(c.referrals.len(), 1);
    let s = &c.subsystems[0];
    assert_eq!(
        (s.serial.as_str(), s.model.as_str(), s.allow_any_host),
        ("5e3f9a3c1b2d4e6f", "Linux", false)
    );
    assert_eq!(
        s.hosts,
        ["nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-0000000000c1"]
    );
    assert!(
        s.host_keys.contains_key(&s.hosts[0]),
        "the host's DH-HMAC-CHAP key came along"
    );
    assert_eq!(s.listeners.as_ref().map(Vec::len), Some(2));
    assert_eq!(s.namespaces.len(), 1, "the disabled namespace is not served");
    assert!(
        text.contains("namespace 2 (/dev/nonexistent) is disabled"),
        "and said so: {text}"
    );
    let n = &s.namespaces[0];
    assert_eq!((n.nsid, n.ana_group, n.block_size), (1, 2, 4096));
    assert_eq!(
        uuid::Uuid::from_bytes(n.uuid).to_string(),
        "0e9d3c2b-1a2b-4c3d-8e4f-5a6b7c8d9e0f"
    );
    assert!(matches!(&n.backend, Backend::File(f) if f.path == file));
    // And back: nvmetcli's shape, which converts to the same conf again (but the host key,
    // which pollux keeps inline here and nvmet in its host entry).
    let mut keyless = c.clone();
    keyless.subsystems[0].host_keys.clear();
    let back = from_config(&keyless).unwrap();
    let again = Config::parse(&to_toml(&back.to_string()).unwrap(), "again.toml").unwrap();
    assert_eq!(again.subsystems[0].namespaces, keyless.subsystems[0].namespaces);
    assert_eq!(again.listeners, keyless.listeners);
    assert_eq!(again.referrals, keyless.referrals);
    assert_eq!(again.subsystems[0].listeners, keyless.subsystems[0].listeners);
    // A group pollux reports optimized by default is listed so for nvmet, which would
    // report it inaccessible otherwise.
    let mut open = keyless.clone();
    open.listeners[0].ana.clear();
    let port = &from_config(&open).unwrap()["ports"][0]["ana_groups"];
    assert!(
        port.as_array()
            .unwrap()
            .iter()
            .any(|g| g["grpid"] == 2 && g["ana"]["state"] == "optimized"),
        "{port}"
    );
    let _ = std::fs::remove_file(&file);
}

#[test]
fn what_pollux_cannot_serve_is_refused_by_name() {
    let base = config("/tmp/x.img");
    let rdma = base.replacen("\"trtype\": \"tcp\", \"tsas\": \"none\"", "\"trtype\": \"rdma\"", 1);
    match to_toml(&rdma) {
        Err(NvmetError::Unsupported { what, .. }) => assert_eq!(what, "port 1"),
        other => panic!("{other:?}"),
    }
    let pi = base.replacen(
        "\"pi_enable\": \"0\", \"qid_max\"",
        "\"pi_enable\": \"1\", \"qid_max\"",
        1,
    );
    assert!(matches!(to_toml(&pi), Err(NvmetError::Unsupported { what, .. }) if what.contains("pi_enable")));
    assert!(matches!(to_toml("[1, 2]"), Err(NvmetError::Shape(_))));
    // A value is data, never conf text: a controller ID that is not a number is refused.
    let sneaky = base.replacen("\"cntlid_min\": \"1\"", "\"cntlid_min\": \"1\\n[[subsystem]]\"", 1);
    assert!(matches!(to_toml(&sneaky), Err(NvmetError::Shape(w)) if w.contains("cntlid_min")));
    assert!(matches!(to_toml("not json"), Err(NvmetError::Shape(_))));
    // A RAM namespace has no nvmet equivalent.
    let ram = Config::embedded_default();
    match from_config(&ram) {
        Err(NvmetError::Unsupported { what, why }) => {
            assert!(what.contains("namespace 1") && why.contains("ram"), "{what}: {why}")
        }
        other => panic!("{other:?}"),
    }
}
