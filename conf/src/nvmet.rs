//! nvmetcli's configuration (`/etc/nvmet/config.json`, linux-nvme/nvmetcli `nvmet/nvme.py`:
//! Linux nvmet's configfs tree as JSON, attribute values as configfs strings), to a pollux
//! conf and back. What pollux cannot express is refused, naming the port, subsystem,
//! namespace or attribute; nothing is dropped without a word (a disabled namespace or
//! referral, which nvmet would not serve either, becomes a comment).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::{Map, Value, json};

use crate::{Backend, Config};

/// Why an nvmetcli config cannot be served by pollux, or a pollux conf written as one.
#[derive(Debug, thiserror::Error)]
pub enum NvmetError {
    /// Not JSON, or not shaped as nvmetcli writes.
    #[error("not an nvmetcli config: {0}")]
    Shape(String),
    /// Something pollux has no equivalent for.
    #[error("{what}: {why}")]
    Unsupported {
        /// The port, subsystem, namespace or attribute.
        what: String,
        /// What pollux lacks.
        why: String,
    },
}

fn shape(why: impl Into<String>) -> NvmetError {
    NvmetError::Shape(why.into())
}

fn unsupported(what: impl Into<String>, why: impl Into<String>) -> NvmetError {
    NvmetError::Unsupported {
        what: what.into(),
        why: why.into(),
    }
}

/// A TOML string literal.
fn q(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// A configfs attribute as text (nvmetcli writes strings; numbers are taken too).
fn attr(group: Option<&Value>, key: &str) -> Option<String> {
    match group?.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn arr<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

/// `IP:PORT` (`[IP]:PORT` for IPv6) of a port's or referral's `addr` group.
fn address(addr: Option<&Value>, what: &str) -> Result<String, NvmetError> {
    let trtype = attr(addr, "trtype").unwrap_or_default();
    if trtype != "tcp" {
        return Err(unsupported(
            what,
            format!("trtype {trtype:?}: pollux serves NVMe/TCP only"),
        ));
    }
    let traddr = attr(addr, "traddr").ok_or_else(|| shape(format!("{what}: no addr.traddr")))?;
    let trsvcid = attr(addr, "trsvcid").ok_or_else(|| shape(format!("{what}: no addr.trsvcid")))?;
    Ok(
        if attr(addr, "adrfam").as_deref() == Some("ipv6") || traddr.contains(':') {
            format!("[{traddr}]:{trsvcid}")
        } else {
            format!("{traddr}:{trsvcid}")
        },
    )
}

/// The logical block size nvmet serves a device or file with: a block device's own, a
/// file's 4096 (nvmet-file takes the file system's block size, at most 4 KiB).
fn block_size_of(path: &str) -> u32 {
    use std::os::unix::fs::FileTypeExt;
    let is_block = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
    if !is_block {
        return 4096;
    }
    let name = Path::new(path).file_name().and_then(|n| n.to_str()).unwrap_or_default();
    std::fs::read_to_string(format!("/sys/class/block/{name}/queue/logical_block_size"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(512)
}

/// The pollux conf (TOML text) serving nvmetcli config `text`: a listener per port, its
/// ANA groups' states and referrals; each subsystem on the ports that link it, with its
/// allowed hosts (and their DH-HMAC-CHAP keys, which nvmet keeps in its host entries) and
/// its namespaces on their block devices or files.
pub fn to_toml(text: &str) -> Result<String, NvmetError> {
    let doc: Value = serde_json::from_str(text).map_err(|e| shape(format!("not JSON: {e}")))?;
    if !doc.is_object() {
        return Err(shape("the top level is not an object"));
    }
    let mut o = String::from(
        "# Made from an nvmetcli config (pollux --nvmet-config / pollux convert --from nvmet).\n[reactors]\ncores = [0]\n",
    );
    // nvmet's discovery log lists the subsystems of the port a host discovers through.
    o.push_str("\n[discovery]\nfilter = \"address,svcid\"\n");
    let mut served_on: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut referrals = Vec::new();
    // The ANA group of each subsystem's namespaces: nvmet reports a group a port does not
    // list as inaccessible there (every group but 1 starts so on a new port), where a
    // pollux listener reports a group it does not list as optimized.
    let mut groups_of: BTreeMap<String, std::collections::BTreeSet<u64>> = BTreeMap::new();
    for s in arr(&doc, "subsystems") {
        let nqn = s.get("nqn").and_then(Value::as_str).unwrap_or_default().to_string();
        for n in arr(s, "namespaces") {
            let g = n.get("ana_grpid").and_then(Value::as_u64).unwrap_or(1);
            groups_of.entry(nqn.clone()).or_default().insert(g);
        }
    }
    for port in arr(&doc, "ports") {
        let id = port.get("portid").map_or("?".into(), Value::to_string);
        let what = format!("port {id}");
        let addr = port.get("addr");
        let a = address(addr, &what)?;
        let _ = write!(o, "\n# nvmet port {id}\n[[listener]]\naddress = {}\n", q(&a));
        match attr(addr, "tsas").as_deref() {
            None | Some("" | "none") => {}
            Some(t) => {
                return Err(unsupported(
                    format!("{what}: addr.tsas"),
                    format!("{t:?}: nvmet's TLS keys live in the kernel keyring; give pollux the hosts' tls_key_file"),
                ));
            }
        }
        let mut ana = Vec::new();
        let mut listed = std::collections::BTreeSet::new();
        for g in arr(port, "ana_groups") {
            let grpid = g
                .get("grpid")
                .and_then(Value::as_u64)
                .ok_or_else(|| shape(format!("{what}: an ANA group without grpid")))?;
            listed.insert(grpid);
            let state = attr(g.get("ana"), "state").unwrap_or_else(|| "optimized".into());
            if state != "optimized" {
                ana.push(format!("{grpid} = {}", q(&state)));
            }
        }
        let used: std::collections::BTreeSet<u64> = arr(port, "subsystems")
            .iter()
            .filter_map(|s| s.as_str())
            .filter_map(|nqn| groups_of.get(nqn))
            .flatten()
            .copied()
            .collect();
        for g in used.difference(&listed).filter(|g| **g != 1) {
            ana.push(format!("{g} = \"inaccessible\""));
        }
        if !ana.is_empty() {
            let _ = writeln!(o, "ana = {{ {} }}", ana.join(", "));
        }
        for s in arr(port, "subsystems") {
            if let Some(nqn) = s.as_str() {
                served_on.entry(nqn.to_string()).or_default().push(a.clone());
            }
        }
        for r in arr(port, "referrals") {
            let name = r.get("name").and_then(Value::as_str).unwrap_or("?");
            let ra = address(r.get("addr"), &format!("{what} referral {name}"))?;
            let enabled = r.get("enable").is_none_or(|e| e.as_u64() != Some(0));
            referrals.push((ra, enabled, format!("{what} referral {name}")));
        }
    }
    referrals.sort();
    referrals.dedup_by(|a, b| a.0 == b.0);
    for (a, enabled, what) in referrals {
        if enabled {
            let _ = write!(o, "\n# nvmet {what}\n[[referral]]\naddress = {}\n", q(&a));
        } else {
            let _ = write!(o, "\n# nvmet {what} ({a}) is disabled: not served\n");
        }
    }
    // nvmet keeps DH-HMAC-CHAP keys with the host, pollux with the host's entry in a subsystem.
    let mut host_keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for h in arr(&doc, "hosts") {
        let Some(nqn) = h.get("nqn").and_then(Value::as_str) else {
            return Err(shape("a host without nqn"));
        };
        let mut keys = Vec::new();
        let d = h.get("dhchap");
        for (ours, theirs) in [("dhchap_key", "key"), ("dhchap_ctrl_key", "ctrl_key")] {
            if let Some(k) = attr(d, theirs).filter(|k| !k.is_empty()) {
                keys.push(format!("{ours} = {}", q(&k)));
            }
        }
        if let Some(hash) = attr(d, "hash").filter(|s| !s.is_empty()) {
            keys.push(format!(
                "dhchap_hashes = [{}]",
                q(&hash.replace("hmac(", "").replace(')', ""))
            ));
        }
        if let Some(g) = attr(d, "dhgroup").filter(|s| !s.is_empty()) {
            keys.push(format!("dhchap_dh_groups = [{}]", q(&g)));
        }
        host_keys.insert(nqn.to_string(), keys);
    }
    for s in arr(&doc, "subsystems") {
        let nqn = s
            .get("nqn")
            .and_then(Value::as_str)
            .ok_or_else(|| shape("a subsystem without nqn"))?;
        let what = format!("subsystem {nqn}");
        if s.get("passthru")
            .is_some_and(|p| !p.is_null() && p.as_array().is_none_or(|a| !a.is_empty()))
        {
            return Err(unsupported(
                format!("{what}: passthru"),
                "pollux has no passthrough controller",
            ));
        }
        let a = s.get("attr");
        let _ = write!(o, "\n[[subsystem]]\nnqn = {}\n", q(nqn));
        let any = attr(a, "allow_any_host").as_deref() == Some("1");
        let _ = writeln!(o, "allow_any_host = {any}");
        let hosts: Vec<String> = arr(s, "allowed_hosts")
            .iter()
            .filter_map(Value::as_str)
            .map(|h| match host_keys.get(h).filter(|k| !k.is_empty()) {
                Some(k) => format!("{{ nqn = {}, {} }}", q(h), k.join(", ")),
                None => q(h),
            })
            .collect();
        let _ = writeln!(o, "hosts = [{}]", hosts.join(", "));
        if let Some(sn) = attr(a, "serial") {
            let _ = writeln!(o, "serial = {}", q(&sn));
        }
        if let Some(m) = attr(a, "model") {
            let _ = writeln!(o, "model = {}", q(&m));
        }
        for (k, ours) in [("cntlid_min", "min_cntlid"), ("cntlid_max", "max_cntlid")] {
            if let Some(v) = attr(a, k) {
                let n: u16 = v
                    .trim()
                    .parse()
                    .map_err(|_| shape(format!("{what}: attr.{k} {v:?} is not a controller ID")))?;
                let _ = writeln!(o, "{ours} = {n}");
            }
        }
        if attr(a, "pi_enable").as_deref() == Some("1") {
            return Err(unsupported(
                format!("{what}: attr.pi_enable"),
                "pollux serves no protection information",
            ));
        }
        // version (pollux reports its own, NVMe 2.0), ieee_oui, firmware and qid_max (a
        // `[transport] max_io_queues` of the whole target) have no per-subsystem key.
        let listeners: Vec<String> = served_on.remove(nqn).unwrap_or_default().iter().map(|l| q(l)).collect();
        let _ = writeln!(o, "listeners = [{}]", listeners.join(", "));
        for n in arr(s, "namespaces") {
            let nsid = n
                .get("nsid")
                .and_then(Value::as_u64)
                .ok_or_else(|| shape(format!("{what}: a namespace without nsid")))?;
            let d = n.get("device");
            let path = attr(d, "path").ok_or_else(|| shape(format!("{what} namespace {nsid}: no device.path")))?;
            if n.get("enable").and_then(Value::as_u64) == Some(0) {
                let _ = write!(o, "\n# nvmet namespace {nsid} ({path}) is disabled: not served\n");
                continue;
            }
            let _ = write!(
                o,
                "\n[[subsystem.namespace]]\nnsid = {nsid}\nblock_size = {}\n",
                block_size_of(&path)
            );
            // nvmet shows both in UUID form; pollux's nguid is 32 hex digits. All zero: none.
            for k in ["uuid", "nguid"] {
                if let Some(v) = attr(d, k).filter(|v| v.chars().any(|c| c != '0' && c != '-')) {
                    let v = if k == "nguid" { v.replace('-', "") } else { v };
                    let _ = writeln!(o, "{k} = {}", q(&v.to_lowercase()));
                }
            }
            let grp = n.get("ana_grpid").and_then(Value::as_u64).unwrap_or(1);
            let _ = writeln!(o, "ana_group = {grp}");
            let _ = writeln!(o, "backend = {{ file = {{ path = {} }} }}", q(&path));
        }
    }
    if let Some(nqn) = served_on.keys().next() {
        return Err(unsupported(
            format!("a port links subsystem {nqn}"),
            "the config has no such subsystem",
        ));
    }
    Ok(o)
}

/// Conf `c` as an nvmetcli config: each listener a port (its ANA states, the subsystems it
/// serves, the referrals), each subsystem with its allowed hosts and namespaces. nvmet
/// serves files and block devices: a RAM, null, sim, nvme or rbd namespace refuses the
/// export, naming it, and so does a host whose keys are in files (nvmet keeps the key).
pub fn from_config(c: &Config) -> Result<Value, NvmetError> {
    let mut ports = Vec::new();
    for (i, l) in c.listeners.iter().enumerate() {
        let a = l.address;
        let subsystems: Vec<&str> = c
            .subsystems
            .iter()
            .filter(|s| s.served_on(a))
            .map(|s| s.nqn.as_str())
            .collect();
        // Every group of the namespaces served here, optimized ones too: nvmet reports a
        // group a port does not list as inaccessible there.
        let mut groups: std::collections::BTreeSet<u32> = c
            .subsystems
            .iter()
            .filter(|s| s.served_on(a))
            .flat_map(|s| s.namespaces.iter().map(|n| n.ana_group))
            .collect();
        groups.insert(1);
        groups.extend(l.ana.keys().copied());
        let ana: Vec<Value> = groups
            .iter()
            .map(|g| json!({"grpid": g, "ana": {"state": l.ana.get(g).map_or("optimized", |s| s.name())}}))
            .collect();
        let referrals: Vec<Value> = c
            .referrals
            .iter()
            .enumerate()
            .map(|(j, r)| {
                json!({"name": format!("r{j}"), "enable": 1, "addr": {
                    "trtype": "tcp", "adrfam": if r.address.is_ipv4() { "ipv4" } else { "ipv6" },
                    "traddr": r.address.ip().to_string(), "trsvcid": r.address.port().to_string(),
                    "treq": "not specified", "portid": "0"}})
            })
            .collect();
        ports.push(json!({
            "portid": i + 1,
            "addr": {"trtype": "tcp", "adrfam": if a.is_ipv4() { "ipv4" } else { "ipv6" },
                     "traddr": a.ip().to_string(), "trsvcid": a.port().to_string(), "treq": "not specified"},
            "subsystems": subsystems,
            "ana_groups": ana,
            "referrals": referrals,
        }));
    }
    let mut hosts: BTreeMap<String, Value> = BTreeMap::new();
    let mut subsystems = Vec::new();
    for s in &c.subsystems {
        for h in &s.hosts {
            let mut entry = Map::new();
            entry.insert("nqn".into(), h.clone().into());
            if s.host_keys.contains_key(h) || s.tls_keys.contains_key(h) {
                return Err(unsupported(
                    format!("host {h} of subsystem {}", s.nqn),
                    "its keys are pollux key files; nvmet keeps a host's key in its configfs entry (give it there)",
                ));
            }
            hosts.insert(h.clone(), Value::Object(entry));
        }
        let mut namespaces = Vec::new();
        for n in &s.namespaces {
            let Backend::File(f) = &n.backend else {
                return Err(unsupported(
                    format!("namespace {} of subsystem {}", n.nsid, s.nqn),
                    format!("a {} namespace: nvmet serves block devices and files", n.backend.kind()),
                ));
            };
            namespaces.push(json!({
                "nsid": n.nsid,
                "enable": 1,
                "ana_grpid": n.ana_group,
                "device": {
                    "path": f.path.display().to_string(),
                    "uuid": uuid::Uuid::from_bytes(n.uuid).hyphenated().to_string(),
                    "nguid": uuid::Uuid::from_bytes(n.nguid).hyphenated().to_string(),
                },
            }));
        }
        subsystems.push(json!({
            "nqn": s.nqn,
            "attr": {"allow_any_host": if s.allow_any_host { "1" } else { "0" }, "serial": s.serial, "model": s.model,
                     "cntlid_min": s.min_cntlid.to_string(), "cntlid_max": s.max_cntlid.to_string()},
            "allowed_hosts": s.hosts,
            "namespaces": namespaces,
        }));
    }
    Ok(json!({"hosts": hosts.into_values().collect::<Vec<_>>(), "ports": ports, "subsystems": subsystems}))
}
