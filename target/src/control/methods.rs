//! The one table of control methods: what the server dispatches, the verbs and flags of
//! `pollux ctl` (generated from it), `pollux ctl methods`, and the reference's list (a test
//! checks `conf/REFERENCE.md` against it).

use serde::Serialize;
use serde_json::{Map, Value};

/// How a param's text from the command line becomes JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A string.
    Str,
    /// A non-negative integer.
    Uint,
    /// A number.
    Float,
    /// `true`/`false` (also on/off, yes/no).
    Bool,
    /// A flag without a value: present means true.
    Switch,
    /// A size: bytes or `"64MiB"` (sent as given; the conf parses it).
    Size,
    /// A JSON value.
    Json,
    /// A list: the flag repeated, or values separated by commas.
    List,
    /// `POOL/IMAGE` (an rbd image), split in two.
    PoolImage,
    /// A namespace ID, or `default` (sent as null).
    NsidOrDefault,
}

/// One param of a method.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Param {
    /// Its name on the command line (`--name`, `-` for `_`) and, unless `at` is given, in
    /// the JSON params.
    pub name: &'static str,
    /// Where the value goes in the JSON params, dotted (`backend.ram.size`); empty: `name`.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub at: &'static str,
    /// Its kind.
    pub kind: Kind,
    /// Needed (clap refuses the command without it).
    pub required: bool,
    /// Given by position rather than as `--name` (the verbs that always took it so).
    pub positional: bool,
    /// One line of help.
    pub help: &'static str,
}

/// One method.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Method {
    /// The JSON-RPC method name (snake_case); the verb is the same with `-`.
    pub name: &'static str,
    /// One line: what it does.
    pub summary: &'static str,
    /// What it changes: a mutation of the running conf (`save` writes it), or not.
    pub mutation: bool,
    /// A verb of its own on the command line (false: `ctl` prints it its own way, or only
    /// `ctl call` reaches it).
    pub verb: bool,
    /// Its params.
    pub params: &'static [Param],
}

impl Method {
    /// The command-line verb: the name with `-` for `_`.
    pub fn verb_name(&self) -> String {
        self.name.replace('_', "-")
    }
}

const fn p(name: &'static str, kind: Kind, help: &'static str) -> Param {
    Param {
        name,
        at: "",
        kind,
        required: false,
        positional: false,
        help,
    }
}

const fn req(name: &'static str, kind: Kind, help: &'static str) -> Param {
    Param {
        required: true,
        ..p(name, kind, help)
    }
}

const fn pos(name: &'static str, kind: Kind, help: &'static str) -> Param {
    Param {
        required: true,
        positional: true,
        ..p(name, kind, help)
    }
}

const fn at(name: &'static str, at: &'static str, kind: Kind, help: &'static str) -> Param {
    Param {
        at,
        ..p(name, kind, help)
    }
}

const NQN: Param = req("nqn", Kind::Str, "the subsystem's NQN");
const NSID: Param = req("nsid", Kind::Uint, "the namespace ID");
const HOST: Param = req("host", Kind::Str, "the host's NQN");
const ADDRESS: Param = req("address", Kind::Str, "IP:PORT");
const KEYS: [Param; 9] = [
    p(
        "dhchap-key-file",
        Kind::Str,
        "a file (owner-only) holding the host's DH-HMAC-CHAP secret (DHHC-1:...)",
    ),
    p(
        "dhchap-ctrl-key-file",
        Kind::Str,
        "a file holding the controller's secret, for bidirectional authentication",
    ),
    p(
        "tls-key-file",
        Kind::Str,
        "a file holding the host's TLS PSK (NVMeTLSkey-1:...)",
    ),
    p(
        "dhchap-key",
        Kind::Str,
        "the host's secret inline (the conf then holds it: saved owner-only)",
    ),
    p("dhchap-ctrl-key", Kind::Str, "the controller's secret inline"),
    p("tls-key", Kind::Str, "the TLS PSK inline"),
    p(
        "tls-key-derivation",
        Kind::Str,
        "how the host derives from its TLS PSK: rfc8446 (libnvme 1.16+, the default) or libnvme-compat (older libnvme)",
    ),
    p(
        "dhchap-hashes",
        Kind::List,
        "this host's own DH-HMAC-CHAP hashes, most preferred first (sha256,sha384,sha512; needs a DH-HMAC-CHAP key)",
    ),
    p(
        "dhchap-dh-groups",
        Kind::List,
        "this host's own DH groups, most preferred first (null,ffdhe2048,...,ffdhe8192; needs a DH-HMAC-CHAP key)",
    ),
];
const HOST_PARAMS: [Param; 11] = [
    NQN, HOST, KEYS[0], KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8],
];

/// Every method the server dispatches.
pub const METHODS: &[Method] = &[
    Method {
        name: "methods",
        summary: "The methods, with their params (as SPDK's rpc_get_methods)",
        mutation: false,
        verb: false,
        params: &[],
    },
    Method {
        name: "version",
        summary: "Version, commit and uptime",
        mutation: false,
        verb: false,
        params: &[],
    },
    Method {
        name: "reactors",
        summary: "Per-reactor mode, CPU, load and latency",
        mutation: false,
        verb: false,
        params: &[],
    },
    Method {
        name: "subsystems",
        summary: "Subsystems, their listeners, namespaces and counters",
        mutation: false,
        verb: false,
        params: &[],
    },
    Method {
        name: "discovery",
        summary: "The discovery log's generation, listeners and referrals",
        mutation: false,
        verb: false,
        params: &[],
    },
    Method {
        name: "controllers",
        summary: "Connected controllers and where their queues live",
        mutation: false,
        verb: false,
        params: &[],
    },
    Method {
        name: "gateways",
        summary: "The members of this gateway's group: state, heartbeat age, ANA groups, client addresses",
        mutation: false,
        verb: false,
        params: &[],
    },
    Method {
        name: "group",
        summary: "This gateway group's configuration as kept in the cluster: its version, its document (keys sealed), what each gateway applied",
        mutation: false,
        verb: false,
        params: &[],
    },
    Method {
        name: "group_export",
        summary: "Write the group's configuration, keys in clear, to a file (owner-only): a backup, or a group to move",
        mutation: false,
        verb: false,
        params: &[req(
            "path",
            Kind::Str,
            "the file to write (absolute: the target writes it)",
        )],
    },
    Method {
        name: "group_import",
        summary: "Make a file's document (group export's) the group's configuration, as one change",
        mutation: false,
        verb: false,
        params: &[req(
            "path",
            Kind::Str,
            "the file to read (absolute: the target reads it)",
        )],
    },
    Method {
        name: "nvme_devices",
        summary: "The userspace-driven NVMe devices and their queues",
        mutation: false,
        verb: true,
        params: &[],
    },
    Method {
        name: "set_mode",
        summary: "Set a reactor's mode: poll, hybrid, interrupt or adaptive",
        mutation: false,
        verb: true,
        params: &[
            pos("reactor", Kind::Uint, "the reactor's index"),
            pos("mode", Kind::Str, "poll | hybrid | interrupt | adaptive"),
        ],
    },
    Method {
        name: "set_cpu_budget",
        summary: "Set a reactor's adaptive CPU budget (0 < B <= 1 core)",
        mutation: false,
        verb: true,
        params: &[
            pos("reactor", Kind::Uint, "the reactor's index"),
            pos("budget", Kind::Float, "the fraction of a core"),
        ],
    },
    Method {
        name: "log_level",
        summary: "Show the log filter, or set it (a level, or per module: `info,pollux_target::controller=debug`)",
        mutation: false,
        verb: true,
        params: &[Param {
            required: false,
            ..pos(
                "level",
                Kind::Str,
                "error | warn | info | debug | trace, or a tracing filter",
            )
        }],
    },
    Method {
        name: "nvme_fault",
        summary: "Inject faults into a userspace-driven NVMe device (testing)",
        mutation: false,
        verb: true,
        params: &[
            req("device", Kind::Str, "the device's name"),
            req("kind", Kind::Str, "the fault"),
            p("count", Kind::Uint, "how many commands it hits"),
            p("status", Kind::Uint, "the status to complete with (SCT << 8 | SC)"),
        ],
    },
    Method {
        name: "reload",
        summary: "Re-read the conf file and apply the difference (an invalid file changes nothing)",
        mutation: false,
        verb: false,
        params: &[],
    },
    Method {
        name: "upgrade",
        summary: "Hand the listeners and live connections to a new binary without downtime (default: the one this process was started from)",
        mutation: false,
        verb: true,
        params: &[p("binary", Kind::Str, "the new binary")],
    },
    Method {
        name: "save",
        summary: "Write the running conf to its file (comments kept, FILE.bak kept), or elsewhere",
        mutation: false,
        verb: false,
        params: &[
            at("to", "path", Kind::Str, "another file to write"),
            at(
                "spdk-config",
                "spdk_config",
                Kind::Str,
                "write an SPDK JSON config to this file instead",
            ),
        ],
    },
    Method {
        name: "export_nvmet",
        summary: "Write the running configuration as an nvmetcli config (Linux nvmet's config.json)",
        mutation: false,
        verb: true,
        params: &[Param {
            at: "path",
            ..pos("file", Kind::Str, "the file to write (absolute: the target writes it)")
        }],
    },
    Method {
        name: "add_subsystem",
        summary: "Add a subsystem (namespaces can follow with add-namespace)",
        mutation: true,
        verb: true,
        params: &[
            NQN,
            p("serial", Kind::Str, "its serial number (default: derived from the NQN)"),
            p("model", Kind::Str, "its model number"),
            p("allow-any-host", Kind::Switch, "admit any host NQN"),
            p("hosts", Kind::List, "the host NQNs admitted"),
            p(
                "listeners",
                Kind::List,
                "the listeners (as configured) that serve it (default: all)",
            ),
            p(
                "polling",
                Kind::Str,
                "its namespaces' default polling: auto | always | never",
            ),
            p("min-cntlid", Kind::Uint, "lowest controller ID"),
            p("max-cntlid", Kind::Uint, "highest controller ID"),
            p(
                "secure-concat",
                Kind::Switch,
                "allow secure channel concatenation (needs a tls = \"allowed\" listener)",
            ),
        ],
    },
    Method {
        name: "remove_subsystem",
        summary: "Remove a subsystem (its controllers are deleted)",
        mutation: true,
        verb: true,
        params: &[NQN],
    },
    Method {
        name: "add_namespace",
        summary: "Add a namespace: --ram SIZE, --null SIZE, --file PATH, --rbd POOL/IMAGE or --backend JSON",
        mutation: true,
        verb: true,
        params: &[
            NQN,
            NSID,
            at("ram", "backend.ram.size", Kind::Size, "a RAM namespace of this size"),
            at(
                "null",
                "backend.null.size",
                Kind::Size,
                "a null namespace of this size (discards writes, reads zeroes)",
            ),
            at("file", "backend.file.path", Kind::Str, "a file or block device"),
            at(
                "size",
                "backend.file.size",
                Kind::Size,
                "with --file: the size to create or extend it to",
            ),
            at("rbd", "backend.rbd", Kind::PoolImage, "a Ceph RBD image, POOL/IMAGE"),
            p("backend", Kind::Json, "the backend as JSON, as in the conf file"),
            p("block-size", Kind::Uint, "the logical block size"),
            p("uuid", Kind::Str, "its UUID (default: derived)"),
            p("nguid", Kind::Str, "its NGUID (default: derived)"),
            p("eui64", Kind::Str, "its EUI-64 (default: derived)"),
            p("ana-group", Kind::Uint, "its ANA group"),
            p("polling", Kind::Str, "auto | always | never"),
        ],
    },
    Method {
        name: "remove_namespace",
        summary: "Remove a namespace (its hosts get a Namespace Attribute Changed event)",
        mutation: true,
        verb: true,
        params: &[NQN, NSID],
    },
    Method {
        name: "resize_namespace",
        summary: "Grow a namespace's store (an rbd image) and serve the new size",
        mutation: false,
        verb: true,
        params: &[
            pos("nqn", Kind::Str, "the subsystem's NQN"),
            pos("nsid", Kind::Uint, "the namespace ID"),
            pos("size", Kind::Size, "the new size: bytes or e.g. 20GiB"),
        ],
    },
    Method {
        name: "set_polling",
        summary: "Set a namespace's polling policy (NSID `default`: the subsystem's, for its namespaces that set none)",
        mutation: true,
        verb: true,
        params: &[
            pos("nqn", Kind::Str, "the subsystem's NQN"),
            pos("nsid", Kind::NsidOrDefault, "the namespace ID, or `default`"),
            pos("polling", Kind::Str, "auto | always | never"),
        ],
    },
    Method {
        name: "set_ana_groups",
        summary: "In a gateway group: the ANA groups a gateway owns (serves optimized while it lives; a survivor takes them when it is fenced)",
        mutation: true,
        verb: true,
        params: &[
            p("gateway", Kind::Str, "the gateway (default: this one)"),
            req("groups", Kind::List, "the ANA groups (none: it owns none)"),
        ],
    },
    Method {
        name: "set_qos",
        summary: "Set a namespace's QoS limits, in place (those not given are kept; 0: no limit)",
        mutation: true,
        verb: true,
        params: &[
            NQN,
            NSID,
            p("iops", Kind::Uint, "commands per second (0: no limit)"),
            p(
                "mbps",
                Kind::Uint,
                "MiB/s read and written together (1 MiB = 1048576 bytes; 0: no limit)",
            ),
            p("read-mbps", Kind::Uint, "MiB/s read (0: no limit)"),
            p("write-mbps", Kind::Uint, "MiB/s written (0: no limit)"),
        ],
    },
    Method {
        name: "add_host",
        summary: "Admit a host to a subsystem, with its keys if it authenticates",
        mutation: true,
        verb: true,
        params: &HOST_PARAMS,
    },
    Method {
        name: "set_host_keys",
        summary: "Replace a host's keys and own DH-HMAC-CHAP lists (none given: it no longer authenticates)",
        mutation: true,
        verb: true,
        params: &HOST_PARAMS,
    },
    Method {
        name: "remove_host",
        summary: "Stop admitting a host (its controllers are deleted)",
        mutation: true,
        verb: true,
        params: &[NQN, HOST],
    },
    Method {
        name: "ns_add_host",
        summary: "Attach a namespace to a host the subsystem admits (its first host masks it from every other host)",
        mutation: true,
        verb: true,
        params: &[NQN, NSID, HOST],
    },
    Method {
        name: "ns_remove_host",
        summary: "Detach a namespace from a host: its commands in flight complete, new ones fail as for an inactive NSID",
        mutation: true,
        verb: true,
        params: &[NQN, NSID, HOST],
    },
    Method {
        name: "set_allow_any_host",
        summary: "Admit any host NQN to a subsystem, or only its hosts",
        mutation: true,
        verb: true,
        params: &[NQN, req("allow", Kind::Bool, "true | false")],
    },
    Method {
        name: "set_subsystem_secure_concat",
        summary: "Allow or refuse secure channel concatenation on a subsystem (from the next Negotiate)",
        mutation: true,
        verb: true,
        params: &[NQN, req("enable", Kind::Bool, "true | false")],
    },
    Method {
        name: "add_listener",
        summary: "Listen on another address",
        mutation: true,
        verb: true,
        params: &[
            ADDRESS,
            p("tls", Kind::Str, "none | allowed | required"),
            p(
                "gateway",
                Kind::Str,
                "in a gateway group: the gateway that binds it (default: this one)",
            ),
        ],
    },
    Method {
        name: "remove_listener",
        summary: "Stop listening on an address (as configured); its connections close",
        mutation: true,
        verb: true,
        params: &[
            ADDRESS,
            p(
                "gateway",
                Kind::Str,
                "in a gateway group: the gateway whose listener it is (default: this one)",
            ),
        ],
    },
    Method {
        name: "subsystem_add_listener",
        summary: "Serve a subsystem on one more of the listeners (SPDK's nvmf_subsystem_add_listener)",
        mutation: true,
        verb: true,
        params: &[NQN, ADDRESS],
    },
    Method {
        name: "subsystem_remove_listener",
        summary: "Stop serving a subsystem on a listener; its controllers there are deleted",
        mutation: true,
        verb: true,
        params: &[NQN, ADDRESS],
    },
    Method {
        name: "add_referral",
        summary: "Refer hosts to another target's discovery controller",
        mutation: true,
        verb: true,
        params: &[req(
            "address",
            Kind::Str,
            "the other target's discovery listener, IP:PORT",
        )],
    },
    Method {
        name: "remove_referral",
        summary: "Remove a referral",
        mutation: true,
        verb: true,
        params: &[ADDRESS],
    },
    Method {
        name: "set_ana_state",
        summary: "Set an ANA group's state on one listener (hosts get an ANA change event)",
        mutation: true,
        verb: true,
        params: &[
            pos("listener", Kind::Str, "the listener, as configured or as bound"),
            pos("group", Kind::Uint, "the ANA group, 1 to 128"),
            pos(
                "state",
                Kind::Str,
                "optimized | non-optimized | inaccessible | persistent-loss | change",
            ),
        ],
    },
];

/// The method named `name`.
pub fn find(name: &str) -> Option<&'static Method> {
    METHODS.iter().find(|m| m.name == name)
}

/// The nearest method names to an unknown `name`, best first (at most three).
pub fn nearest(name: &str) -> Vec<&'static str> {
    let mut scored: Vec<(f64, &'static str)> = METHODS
        .iter()
        .map(|m| (strsim::jaro_winkler(name, m.name), m.name))
        .filter(|(s, _)| *s > 0.8)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    // Only those about as near as the nearest: a typo has one answer.
    let best = scored.first().map_or(0.0, |s| s.0);
    scored
        .into_iter()
        .take_while(|(s, _)| *s >= best - 0.02)
        .take(3)
        .map(|(_, n)| n)
        .collect()
}

/// The JSON form of the table (`methods`).
pub fn to_json() -> Value {
    serde_json::to_value(METHODS).unwrap_or(Value::Null)
}

/// Put `v` at dotted path `path` of `obj`.
pub fn insert_at(obj: &mut Map<String, Value>, path: &str, v: Value) {
    let mut cur = obj;
    let mut parts = path.split('.').peekable();
    while let Some(k) = parts.next() {
        if parts.peek().is_none() {
            cur.insert(k.to_string(), v);
            return;
        }
        let next = cur.entry(k.to_string()).or_insert_with(|| Value::Object(Map::new()));
        if !next.is_object() {
            *next = Value::Object(Map::new());
        }
        let Value::Object(m) = next else { return };
        cur = m;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_lists_every_method_with_its_params() {
        // conf/REFERENCE.md's "`pollux ctl` verbs" table is written from this table:
        // regenerate it when a method or a param changes.
        let doc = include_str!("../../../conf/REFERENCE.md");
        for m in METHODS {
            let row = format!("| `{}` | `{}", m.name, m.verb_name());
            let line = doc
                .lines()
                .find(|l| l.starts_with(&row))
                .unwrap_or_else(|| panic!("conf/REFERENCE.md lacks the row of {}", m.name));
            for p in m.params {
                let shown = if p.positional {
                    p.name.to_uppercase()
                } else {
                    format!("--{}", p.name)
                };
                assert!(line.contains(&shown), "REFERENCE's {} row lacks {shown}", m.name);
            }
        }
    }

    #[test]
    fn names_are_unique_and_suggestions_find_typos() {
        let mut names: Vec<_> = METHODS.iter().map(|m| m.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), METHODS.len());
        assert_eq!(nearest("add_nammespace").first(), Some(&"add_namespace"));
        assert_eq!(nearest("subsytems").first(), Some(&"subsystems"));
        assert!(nearest("zzzz").is_empty());
    }

    #[test]
    fn dotted_params_nest() {
        let mut m = Map::new();
        insert_at(&mut m, "backend.ram.size", Value::from("1GiB"));
        insert_at(&mut m, "nsid", Value::from(2));
        assert_eq!(
            Value::Object(m),
            serde_json::json!({"backend": {"ram": {"size": "1GiB"}}, "nsid": 2})
        );
    }
}
