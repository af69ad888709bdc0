//! `pollux ctl ...`: one control-socket call, printed as a table (or as raw JSON).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{Value, json};

pub use super::format::{bytes, ns, table};
use super::format::{format_classes, format_controllers, format_discovery, format_reactors, format_subsystems};
use super::view::{CtrlList, DiscoveryView, ModeView, ReactorView, SubsystemView, VersionView};
use super::{Client, ControlError, DEFAULT_SOCKET};

/// Where to find the control socket (shared by `pollux ctl` and `pollux top`).
#[derive(Debug, Clone, clap::Args)]
pub struct SocketArgs {
    /// The control socket (default: `[control] socket` of --config, else /run/pollux.sock).
    #[arg(long, value_name = "PATH", global = true)]
    pub socket: Option<PathBuf>,
    /// A conf file whose `[control] socket` to use.
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
            let cfg = pollux_conf::Config::from_path(c).map_err(|e| ControlError::Conf(e.to_string()))?;
            return cfg.control.socket.ok_or_else(|| {
                ControlError::Conf(format!("{} has no [control] socket; pass --socket PATH", c.display()))
            });
        }
        Ok(PathBuf::from(DEFAULT_SOCKET))
    }
}

/// `pollux ctl`: inspect and steer a running target over its control socket.
#[derive(Debug, clap::Args)]
pub struct CtlArgs {
    /// The socket to use.
    #[command(flatten)]
    pub socket: SocketArgs,
    /// Print the raw JSON result instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// `pollux ctl` commands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum CtlCommand {
    /// Version and uptime.
    Version,
    /// Per-reactor mode, CPU, load and latency.
    Reactors {
        /// All 22 columns (default: the essential ones, within 120 columns).
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
    /// The discovery log's generation counter, the listeners, and the referrals to other
    /// targets' discovery controllers.
    Discovery,
    /// Set a reactor's mode: poll, hybrid, interrupt or adaptive.
    SetMode {
        /// Reactor index.
        reactor: u64,
        /// poll | hybrid | interrupt | adaptive.
        mode: String,
    },
    /// Set a reactor's adaptive CPU budget (0 < B <= 1).
    SetCpuBudget {
        /// Reactor index.
        reactor: u64,
        /// Fraction of a core.
        budget: f64,
    },
    /// Set the ANA state of an ANA group on one listener's path (NVMe 2.0 §8.1.3): its
    /// controllers get an ANA change event and I/O follows the state.
    SetAnaState {
        /// The listener's address (as configured or as bound).
        listener: String,
        /// ANA group id (1 to 128).
        group: u32,
        /// optimized | non-optimized | inaccessible | persistent-loss | change.
        state: String,
    },
    /// Set a namespace's polling policy at run time (auto, always or never; see the conf
    /// reference, "Per-namespace polling"): NSID `default` sets the subsystem's, for its
    /// namespaces that set none. It is a change of the running conf (`save` writes it).
    SetPolling {
        /// Subsystem NQN.
        nqn: String,
        /// Namespace id, or `default`.
        nsid: String,
        /// auto | always | never.
        polling: String,
    },
    /// Resize a namespace's store (an rbd image; shrinking is refused) and serve the new
    /// size; its hosts get a Namespace Attribute Changed event.
    ResizeNamespace {
        /// Subsystem NQN.
        nqn: String,
        /// Namespace id.
        nsid: u32,
        /// The new size: bytes, or a size such as "20GiB".
        size: String,
    },
    /// Re-read the conf file and apply the difference (an invalid file changes nothing).
    Reload,
    /// Write the running configuration as TOML (to the conf file, or PATH).
    Save {
        /// Where to write it.
        path: Option<String>,
    },
    /// Any method with JSON params, e.g. `call add_namespace
    /// '{"nqn":"nqn.2026-11.io.pollux:ram0","nsid":2,"backend":{"ram":{"size":"64MiB"}}}'`
    /// (also remove_namespace, add_subsystem, remove_subsystem, add_host, remove_host,
    /// set_host_keys (dhchap_key[_file], dhchap_ctrl_key[_file], tls_key[_file]),
    /// set_allow_any_host, add_listener (address, tls), remove_listener, add_referral
    /// (address: another target's discovery listener, e.g. `'{"address":"10.0.0.2:8009"}'`),
    /// remove_referral, nvme_devices, nvme_fault).
    Call {
        /// Method name.
        method: String,
        /// Params as a JSON object.
        params: Option<String>,
    },
}

impl CtlCommand {
    /// The JSON-RPC method and params.
    pub fn request(&self) -> (&'static str, Value) {
        match self {
            CtlCommand::Version => ("version", Value::Null),
            CtlCommand::Reactors { .. } | CtlCommand::Estimates => ("reactors", Value::Null),
            CtlCommand::Subsystems => ("subsystems", Value::Null),
            CtlCommand::Controllers => ("controllers", Value::Null),
            CtlCommand::Discovery => ("discovery", Value::Null),
            CtlCommand::SetMode { reactor, mode } => ("set_mode", json!({"reactor": reactor, "mode": mode})),
            CtlCommand::SetCpuBudget { reactor, budget } => {
                ("set_cpu_budget", json!({"reactor": reactor, "budget": budget}))
            }
            CtlCommand::SetAnaState { listener, group, state } => (
                "set_ana_state",
                json!({"listener": listener, "group": group, "state": state}),
            ),
            CtlCommand::SetPolling { nqn, nsid, polling } => {
                let nsid = match nsid.as_str() {
                    "default" => Value::Null,
                    n => n
                        .parse::<u64>()
                        .map_or_else(|_| Value::String(n.to_string()), Value::from),
                };
                ("set_polling", json!({"nqn": nqn, "nsid": nsid, "polling": polling}))
            }
            CtlCommand::ResizeNamespace { nqn, nsid, size } => {
                ("resize_namespace", json!({"nqn": nqn, "nsid": nsid, "size": size}))
            }
            CtlCommand::Reload => ("reload", Value::Null),
            CtlCommand::Save { path } => ("save", path.as_ref().map_or(json!({}), |p| json!({"path": p}))),
            CtlCommand::Call { method, params } => {
                let p = params
                    .as_deref()
                    .map_or(Ok(json!({})), serde_json::from_str)
                    .unwrap_or_else(|e| json!({"__invalid_params__": format!("params are not JSON: {e}")}));
                (method_name(method), p)
            }
        }
    }
}

/// The static name of a method given on the command line (unknown ones map to a name the
/// server refuses with "method not found").
fn method_name(m: &str) -> &'static str {
    super::rpc::METHODS
        .iter()
        .find(|k| **k == m)
        .copied()
        .unwrap_or("unknown_method")
}

/// Format a result of `cmd` for people.
pub fn format_result(cmd: &CtlCommand, v: Value) -> Result<String, ControlError> {
    let de = |e: serde_json::Error| ControlError::Protocol(format!("unexpected result: {e}"));
    Ok(match cmd {
        CtlCommand::Version => {
            let x: VersionView = serde_json::from_value(v).map_err(de)?;
            format!(
                "pollux {}  uptime {:.0}s  reactors {}  pid {}\n",
                x.version, x.uptime_s, x.reactors, x.pid
            )
        }
        CtlCommand::Reactors { wide } => {
            format_reactors(&serde_json::from_value::<Vec<ReactorView>>(v).map_err(de)?, *wide)
        }
        CtlCommand::Estimates => format_classes(&serde_json::from_value::<Vec<ReactorView>>(v).map_err(de)?),
        CtlCommand::Subsystems => format_subsystems(&serde_json::from_value::<Vec<SubsystemView>>(v).map_err(de)?),
        CtlCommand::Controllers => format_controllers(&serde_json::from_value::<CtrlList>(v).map_err(de)?),
        CtlCommand::Discovery => format_discovery(&serde_json::from_value::<DiscoveryView>(v).map_err(de)?),
        CtlCommand::Reload
        | CtlCommand::Call { .. }
        | CtlCommand::Save { .. }
        | CtlCommand::SetAnaState { .. }
        | CtlCommand::ResizeNamespace { .. }
        | CtlCommand::SetPolling { .. } => {
            let mut o = serde_json::to_string_pretty(&v).map_err(de)?;
            o.push('\n');
            o
        }
        CtlCommand::SetMode { .. } | CtlCommand::SetCpuBudget { .. } => {
            let m: ModeView = serde_json::from_value(v).map_err(de)?;
            format!(
                "reactor {}: mode {}, adaptive {}, cpu budget {:.2}\n",
                m.reactor,
                m.mode,
                if m.adaptive { "on" } else { "off" },
                m.cpu_budget
            )
        }
    })
}

/// Run one `ctl` command against the socket at `path`; the text to print.
pub fn run(path: &Path, cmd: &CtlCommand, json_out: bool) -> Result<String, ControlError> {
    let mut c = Client::connect(path)?;
    let (method, params) = cmd.request();
    let v = c.call(method, params)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_reaches_every_method() {
        // Every method the server dispatches (rpc::METHODS, checked against the dispatch in
        // tests/control.rs) must survive `ctl call NAME`: an unknown name becomes
        // "unknown_method", which the server refuses.
        for m in super::super::rpc::METHODS {
            let c = CtlCommand::Call {
                method: m.into(),
                params: None,
            };
            assert_eq!(c.request().0, m);
        }
        let c = CtlCommand::Call {
            method: "no_such".into(),
            params: None,
        };
        assert_eq!(c.request().0, "unknown_method");
    }
}
