//! `pollux ctl ...`: one control-socket call, printed as a table (or as raw JSON).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{Value, json};

pub use super::format::{bytes, ns, table};
use super::format::{format_classes, format_controllers, format_discovery, format_reactors, format_subsystems};
use super::verbs::Verb;
use super::view::{CtrlList, DiscoveryView, ModeView, ReactorView, SubsystemView, VersionView};
use super::{Client, ControlError, DEFAULT_SOCKET};

/// Where to find the control socket (shared by `pollux ctl` and `pollux top`).
#[derive(Debug, Clone, clap::Args)]
pub struct SocketArgs {
    /// The control socket (default: `[control] socket` of --config, else /run/pollux.sock).
    #[arg(long, value_name = "PATH", global = true)]
    pub socket: Option<PathBuf>,
    /// A conf file whose `[control] socket` to use (nothing else of it is read: a conf
    /// that does not validate still names its socket).
    #[arg(short, long, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,
}

impl SocketArgs {
    /// The socket path: `--socket`, else the conf's, else [`DEFAULT_SOCKET`].
    pub fn resolve(&self) -> Result<PathBuf, ControlError> {
        if let Some(s) = &self.socket {
            return Ok(s.clone());
        }
        if let Some(c) = &self.config {
            return socket_of(c);
        }
        Ok(PathBuf::from(DEFAULT_SOCKET))
    }
}

/// The `[control] socket` of conf file `path`, resolved against its directory as the
/// target resolves it. Only that key is read: `ctl reload` must reach a target whose file
/// has just been broken, and a key file's mode is the server's business.
pub fn socket_of(path: &Path) -> Result<PathBuf, ControlError> {
    let conf = |m: String| ControlError::Conf(format!("{}: {m}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| conf(format!("cannot read: {e}")))?;
    let doc: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| conf(format!("not TOML, so no socket can be read from it: {}", e.message())))?;
    let sock = doc
        .get("control")
        .and_then(|c| c.get("socket"))
        .ok_or_else(|| conf("has no [control] socket; pass --socket PATH".into()))?
        .as_str()
        .ok_or_else(|| conf("[control] socket is not a string".into()))?;
    let sock = Path::new(sock);
    Ok(match path.parent() {
        Some(dir) if sock.is_relative() => dir.join(sock),
        _ => sock.to_path_buf(),
    })
}

/// `pollux ctl`: inspect and steer a running target over its control socket. Every verb
/// is a method of the control socket's JSON-RPC (`pollux ctl methods` lists them with
/// their params; `pollux ctl VERB --help` says more).
#[derive(Debug, clap::Args)]
pub struct CtlArgs {
    /// The socket to use.
    #[command(flatten)]
    pub socket: SocketArgs,
    /// Print the raw JSON result instead of a table or a summary.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// `pollux ctl` commands: the views, reload and save, and one verb per method of the
/// method table ([`super::methods::METHODS`]).
#[derive(Debug, Clone, clap::Subcommand)]
pub enum CtlCommand {
    /// Version, commit and uptime.
    Version,
    /// Per-reactor mode, CPU, load and latency.
    Reactors {
        /// All 23 columns (default: the essential ones, within 120 columns).
        #[arg(long)]
        wide: bool,
    },
    /// Per-reactor latency estimates behind PREDICTED: one per device channel, operation and
    /// size class, with its weight in the last policy window.
    Estimates,
    /// Subsystems, their namespaces and counters.
    Subsystems,
    /// Connected controllers and where their queues live.
    Controllers,
    /// The members of this gateway's group (`[gateway]`): state, heartbeat age, ANA groups.
    Gateways,
    /// The group's configuration kept in the cluster (`[gateway]`): its version, what each
    /// gateway applied, its document (keys sealed); `group export FILE` writes it (keys in
    /// clear, owner-only), `group import FILE` makes a file's the group's.
    Group {
        /// `export` or `import`.
        #[arg(value_parser = ["export", "import"])]
        action: Option<String>,
        /// The file to export to or import from.
        #[arg(value_name = "FILE", required_if_eq_any = [("action", "export"), ("action", "import")])]
        file: Option<String>,
    },
    /// The discovery log's generation counter, the listeners, and the referrals to other
    /// targets' discovery controllers.
    Discovery,
    /// Re-read the conf file and apply the difference (an invalid file changes nothing).
    Reload,
    /// Write the running configuration to its conf file, as edited in place (comments and
    /// order kept, the previous version kept as FILE.bak), or to another file.
    Save {
        /// Write to this file instead.
        #[arg(long, value_name = "FILE")]
        to: Option<String>,
        /// The same as --to (the older form).
        #[arg(value_name = "FILE", conflicts_with = "to", hide = true)]
        path: Option<String>,
        /// Write an SPDK JSON config instead (what `pollux --spdk-config` and nvmf_tgt -c read).
        #[arg(long, value_name = "FILE", conflicts_with_all = ["to", "path"])]
        spdk_config: Option<String>,
    },
    /// The methods, with their params (`pollux ctl methods NAME` for one).
    Methods {
        /// One method (or verb).
        name: Option<String>,
    },
    /// Any method with JSON params, for scripts: `call add_namespace
    /// '{"nqn":"nqn.2026-11.io.pollux:ram0","nsid":2,"backend":{"ram":{"size":"64MiB"}}}'`.
    Call {
        /// Method name (`pollux ctl methods` lists them).
        method: String,
        /// Params as a JSON object.
        params: Option<String>,
    },
    /// A verb of the method table.
    #[command(flatten)]
    Verb(Verb),
}

/// A command line that cannot become a request.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(String);

impl CtlCommand {
    /// The JSON-RPC method and params.
    pub fn request(&self) -> Result<(String, Value), BadRequest> {
        Ok(match self {
            CtlCommand::Version => ("version".into(), Value::Null),
            CtlCommand::Reactors { .. } | CtlCommand::Estimates => ("reactors".into(), Value::Null),
            CtlCommand::Subsystems => ("subsystems".into(), Value::Null),
            CtlCommand::Controllers => ("controllers".into(), Value::Null),
            CtlCommand::Gateways => ("gateways".into(), Value::Null),
            CtlCommand::Group { action, file } => {
                let abs = |p: &str| {
                    // The target reads or writes it: resolved here, where the name was typed.
                    std::path::absolute(p)
                        .map(|a| a.display().to_string())
                        .map_err(|e| BadRequest(format!("{p}: {e}")))
                };
                match (action.as_deref(), file.as_deref()) {
                    (Some("export"), Some(f)) => ("group_export".into(), json!({"path": abs(f)?})),
                    (Some("import"), Some(f)) => ("group_import".into(), json!({"path": abs(f)?})),
                    _ => ("group".into(), Value::Null),
                }
            }
            CtlCommand::Discovery => ("discovery".into(), Value::Null),
            CtlCommand::Reload => ("reload".into(), Value::Null),
            CtlCommand::Methods { .. } => ("methods".into(), Value::Null),
            CtlCommand::Save {
                spdk_config: Some(p), ..
            } => {
                // The target writes it: resolved here, where the name was typed.
                let abs = std::path::absolute(p).map_err(|e| BadRequest(format!("{p}: {e}")))?;
                ("save".into(), json!({"spdk_config": abs.display().to_string()}))
            }
            CtlCommand::Save { to, path, .. } => (
                "save".into(),
                to.as_ref().or(path.as_ref()).map_or(json!({}), |p| json!({"path": p})),
            ),
            CtlCommand::Call { method, params } => {
                let p = match params.as_deref() {
                    None => json!({}),
                    Some(t) => serde_json::from_str(t)
                        .map_err(|e| BadRequest(format!("params of '{method}' are not JSON: {e}: {t}")))?,
                };
                (method.clone(), p)
            }
            CtlCommand::Verb(v) => (v.method.name.to_string(), v.params.clone()),
        })
    }
}

/// Format a result of `cmd` for people.
pub fn format_result(cmd: &CtlCommand, v: Value) -> Result<String, ControlError> {
    let de = |e: serde_json::Error| ControlError::Protocol(format!("unexpected result: {e}"));
    Ok(match cmd {
        CtlCommand::Version => {
            let x: VersionView = serde_json::from_value(v).map_err(de)?;
            format!(
                "pollux {} (commit {})  uptime {:.0}s  reactors {}  pid {}\n",
                x.version, x.commit, x.uptime_s, x.reactors, x.pid
            )
        }
        CtlCommand::Reactors { wide } => {
            format_reactors(&serde_json::from_value::<Vec<ReactorView>>(v).map_err(de)?, *wide)
        }
        CtlCommand::Estimates => format_classes(&serde_json::from_value::<Vec<ReactorView>>(v).map_err(de)?),
        CtlCommand::Subsystems => format_subsystems(&serde_json::from_value::<Vec<SubsystemView>>(v).map_err(de)?),
        CtlCommand::Controllers => format_controllers(&serde_json::from_value::<CtrlList>(v).map_err(de)?),
        CtlCommand::Gateways => format_gateways(&v),
        CtlCommand::Group { action: None, .. } => format_group(&v),
        CtlCommand::Group { .. } => match v.get("path") {
            Some(p) => format!(
                "exported version {} to {} (mode {})\n",
                v["version"],
                p.as_str().unwrap_or("?"),
                v["mode"].as_str().unwrap_or("?")
            ),
            None => summary("group import", &v),
        },
        CtlCommand::Discovery => format_discovery(&serde_json::from_value::<DiscoveryView>(v).map_err(de)?),
        CtlCommand::Reload => summary("reload", &v),
        CtlCommand::Save { .. } => {
            let mut o = format!("saved {}", v["path"].as_str().unwrap_or("?"));
            if let Some(m) = v["mode"].as_str() {
                let _ = write!(o, " (mode {m})");
            }
            if let Some(b) = v["backup"].as_str() {
                let _ = write!(o, "; the previous version is {b}");
            }
            o.push('\n');
            o
        }
        CtlCommand::Methods { name } => format_methods(name.as_deref(), &v)?,
        CtlCommand::Call { method, .. } => match super::methods::find(method) {
            Some(m) if m.mutation => summary(method, &v),
            _ => pretty(&v)?,
        },
        CtlCommand::Verb(verb) => match verb.method.name {
            "set_mode" | "set_cpu_budget" => {
                let m: ModeView = serde_json::from_value(v).map_err(de)?;
                format!(
                    "reactor {}: mode {}, adaptive {}, cpu budget {:.2}\n",
                    m.reactor,
                    m.mode,
                    if m.adaptive { "on" } else { "off" },
                    m.cpu_budget
                )
            }
            "resize_namespace" => format!(
                "namespace {} of {}: {} ({} bytes)\n",
                v["nsid"],
                v["nqn"].as_str().unwrap_or("?"),
                bytes(v["size"].as_u64().unwrap_or(0)),
                v["size"]
            ),
            "log_level" => format!("log filter: {}\n", v["filter"].as_str().unwrap_or("?")),
            "upgrade" => {
                let mut o = format!(
                    "upgraded: pid {} ({}) serves {} queues; longest pause {:.1} ms, {:.1} ms in all\n",
                    v["pid"],
                    v["version"].as_str().unwrap_or("?"),
                    v["queues"],
                    v["pause_ms"].as_f64().unwrap_or(0.0),
                    v["total_ms"].as_f64().unwrap_or(0.0)
                );
                if v["devices"].as_u64().unwrap_or(0) > 0 {
                    let _ = writeln!(
                        o,
                        "  NVMe devices re-initialized: {}, let go of in {:.1} ms here, brought up in {:.1} ms by the new process (the hosts' queues waited meanwhile)",
                        v["devices"],
                        v["device_release_ms"].as_f64().unwrap_or(0.0),
                        v["device_init_ms"].as_f64().unwrap_or(0.0)
                    );
                }
                for s in v["stayed"].as_array().into_iter().flatten() {
                    let _ = writeln!(
                        o,
                        "  closed for the host to reconnect: {} ({})",
                        s[1],
                        s[0].as_str().unwrap_or("?")
                    );
                }
                o
            }
            name if verb.method.mutation => summary(name, &v),
            _ => pretty(&v)?,
        },
    })
}

fn pretty(v: &Value) -> Result<String, ControlError> {
    let mut o = serde_json::to_string_pretty(v).map_err(|e| ControlError::Protocol(e.to_string()))?;
    o.push('\n');
    Ok(o)
}

/// One line saying what a change did (the change set in full is `--json`).
pub fn summary(method: &str, v: &Value) -> String {
    let list = |k: &str| -> Vec<String> {
        v[k].as_array()
            .map(|a| {
                a.iter()
                    .map(|x| match x {
                        Value::String(s) => s.clone(),
                        Value::Array(t) => t
                            .iter()
                            .map(|y| y.as_str().map_or_else(|| y.to_string(), str::to_string))
                            .collect::<Vec<_>>()
                            .join(" "),
                        other => other.to_string(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut parts = Vec::new();
    for (k, what) in [
        ("added_subsystems", "added subsystem"),
        ("removed_subsystems", "removed subsystem"),
        ("changed_subsystems", "changed subsystem"),
        ("added_namespaces", "added namespace"),
        ("removed_namespaces", "removed namespace"),
        ("added_listeners", "added listener"),
        ("removed_listeners", "removed listener"),
        ("ana_changed", "ANA states changed on"),
        ("added_referrals", "added referral"),
        ("removed_referrals", "removed referral"),
        ("polling_changed", "polling"),
        ("hosts_changed", "changed the hosts of namespace"),
        ("qos_changed", "QoS limits of"),
        ("restart_needed", "needs a restart to take effect:"),
    ] {
        let mut items = list(k);
        if k == "changed_subsystems" {
            // A subsystem whose namespaces are listed is not named twice.
            let named: Vec<String> = [
                "added_namespaces",
                "removed_namespaces",
                "polling_changed",
                "hosts_changed",
                "qos_changed",
            ]
            .iter()
            .flat_map(|k| list(k))
            .collect();
            items.retain(|s| !named.iter().any(|n| n.starts_with(&format!("{s} "))));
        }
        if !items.is_empty() {
            parts.push(format!("{what} {}", items.join(", ")));
        }
    }
    if v["reactors_changed"].as_bool() == Some(true) {
        parts.push("reactor policy changed".into());
    }
    if parts.is_empty() {
        format!("{}: no change\n", method.replace('_', "-"))
    } else {
        format!("{}: {}\n", method.replace('_', "-"), parts.join("; "))
    }
}

/// `ctl methods`: the list, or one method with its params.
fn format_methods(name: Option<&str>, v: &Value) -> Result<String, ControlError> {
    let ms: Vec<Value> = v.as_array().cloned().unwrap_or_default();
    let verb_of = |m: &Value| m["name"].as_str().unwrap_or("").replace('_', "-");
    let flag = |p: &Value| {
        let n = p["name"].as_str().unwrap_or("");
        let shown = if p["positional"].as_bool() == Some(true) {
            n.to_uppercase()
        } else {
            format!("--{n}")
        };
        if p["required"].as_bool() == Some(true) {
            shown
        } else {
            format!("[{shown}]")
        }
    };
    let Some(name) = name else {
        let mut rows = vec![["METHOD", "VERB", "PARAMS", "WHAT IT DOES"].map(String::from).to_vec()];
        for m in &ms {
            let params: Vec<String> = m["params"]
                .as_array()
                .map(|a| a.iter().map(flag).collect())
                .unwrap_or_default();
            rows.push(vec![
                m["name"].as_str().unwrap_or("").to_string(),
                if m["verb"].as_bool() == Some(true) {
                    verb_of(m)
                } else {
                    verb_of(m) + "*"
                },
                params.join(" "),
                m["summary"].as_str().unwrap_or("").to_string(),
            ]);
        }
        let mut o = table(&rows);
        o.push_str("* its own command: `pollux ctl VERB` (see `pollux ctl --help`)\n");
        return Ok(o);
    };
    let want = name.replace('-', "_");
    let Some(m) = ms.iter().find(|m| m["name"].as_str() == Some(want.as_str())) else {
        let near = super::methods::nearest(&want);
        let hint = if near.is_empty() {
            String::new()
        } else {
            format!("; did you mean {}?", near.join(", "))
        };
        return Err(ControlError::Protocol(format!("no method '{name}'{hint}")));
    };
    let mut o = format!(
        "{} (pollux ctl {}): {}\n",
        want,
        verb_of(m),
        m["summary"].as_str().unwrap_or("")
    );
    for p in m["params"].as_array().into_iter().flatten() {
        let _ = writeln!(
            o,
            "  {:<24} {:<10} {}",
            flag(p),
            p["kind"].as_str().unwrap_or(""),
            p["help"].as_str().unwrap_or("")
        );
    }
    Ok(o)
}

/// Run one `ctl` command against the socket at `path`; the text to print.
pub fn run(path: &Path, cmd: &CtlCommand, json_out: bool) -> Result<String, ControlError> {
    let (method, params) = cmd.request().map_err(|e| ControlError::Protocol(e.to_string()))?;
    let v = match (Client::connect(path), cmd) {
        // The table is this binary's too: `methods` answers without a target.
        (Err(ControlError::Connect { .. }), CtlCommand::Methods { .. }) => super::methods::to_json(),
        (c, _) => {
            let mut c = c?;
            if method == "upgrade" {
                // The pause, the new process's start and each step's answer (up to 30 s
                // each) may outlast the usual 10 s.
                c.set_timeout(std::time::Duration::from_secs(180))?;
            }
            c.call(&method, params)?
        }
    };
    if json_out {
        let mut s = serde_json::to_string_pretty(&v).map_err(|e| ControlError::Protocol(e.to_string()))?;
        s.push('\n');
        Ok(s)
    } else {
        format_result(cmd, v)
    }
}

/// `pollux ctl`: 0 on success, 1 if the call failed, 2 for a bad request.
pub fn main(args: &CtlArgs) -> ExitCode {
    let result = args
        .socket
        .resolve()
        .and_then(|path| run(&path, &args.command, args.json));
    match result {
        Ok(text) => {
            let mut so = std::io::stdout().lock();
            let _ = so.write_all(text.as_bytes());
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "pollux ctl: {e}");
            match e {
                ControlError::Rpc { code, .. } if code == super::rpc::INVALID_PARAMS => ExitCode::from(2),
                _ => ExitCode::from(1),
            }
        }
    }
}

/// `ctl group`: the version, each gateway's slot and applied version, the document.
fn format_group(v: &Value) -> String {
    let mut o = format!(
        "group {}  version {}  (this gateway {} runs {}; last change {} by {})\n",
        v["group"].as_str().unwrap_or("?"),
        v["version"],
        v["name"].as_str().unwrap_or("?"),
        v["running"],
        v["change"].as_str().unwrap_or("-"),
        v["changed_by"].as_str().unwrap_or("-"),
    );
    if let Some(e) = v["error"].as_str() {
        let _ = writeln!(o, "error: {e}");
    }
    let _ = writeln!(
        o,
        "{:<20} {:>4} {:>13} {:>8}  ERROR",
        "GATEWAY", "SLOT", "CNTLID", "APPLIED"
    );
    for g in v["gateways"].as_array().into_iter().flatten() {
        let ids = format!("{}-{}", g["cntlid"][0], g["cntlid"][1]);
        let _ = writeln!(
            o,
            "{:<20} {:>4} {:>13} {:>8}  {}",
            g["name"].as_str().unwrap_or("?"),
            g["slot"],
            ids,
            g["applied"].as_u64().map_or_else(|| "-".into(), |x| x.to_string()),
            g["error"].as_str().unwrap_or(""),
        );
    }
    let _ = write!(o, "\n{}", v["conf"].as_str().unwrap_or(""));
    o
}

/// `ctl gateways`: one line per member of the group.
fn format_gateways(v: &Value) -> String {
    let mut o = format!(
        "group {}  this gateway {}{}\n",
        v["group"].as_str().unwrap_or("?"),
        v["name"].as_str().unwrap_or("?"),
        if v["fenced"].as_bool() == Some(true) {
            " (FENCED)"
        } else {
            ""
        }
    );
    if let Some(e) = v["error"].as_str() {
        let _ = writeln!(o, "last error: {e}");
    }
    let _ = writeln!(
        o,
        "{:<16} {:<10} {:>8}  {:<12} {:<10} ADDRS",
        "NAME", "STATE", "BEAT_MS", "ANA_GROUPS", "TAKEN_BY"
    );
    for m in v["members"].as_array().into_iter().flatten() {
        let list = |k: &str| {
            m[k].as_array()
                .map(|a| {
                    a.iter()
                        .map(|x| x.to_string().trim_matches('"').to_owned())
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default()
        };
        let age = m["heartbeat_age_ms"]
            .as_u64()
            .map_or_else(|| "-".to_owned(), |a| a.to_string());
        let _ = writeln!(
            o,
            "{:<16} {:<10} {:>8}  {:<12} {:<10} {}",
            format!(
                "{}{}",
                m["name"].as_str().unwrap_or("?"),
                if m["self"].as_bool() == Some(true) { "*" } else { "" }
            ),
            m["state"].as_str().unwrap_or("?"),
            age,
            list("ana_groups"),
            m["taken_by"].as_str().unwrap_or("-"),
            list("addrs")
        );
    }
    o
}
