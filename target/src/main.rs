//! The `pollux` binary: `pollux --config FILE` serves until SIGTERM/SIGINT; `pollux --check
//! FILE` validates a conf file; with neither, the embedded default (one RAM namespace).
//! SIGHUP reloads the conf file; SIGUSR2 upgrades to the binary at the path this process was
//! started from, without downtime (as `pollux ctl upgrade` does; see
//! [`pollux_target::upgrade`]).
//! `pollux perf ...` is the NVMe/TCP load generator ([`pollux_host::perf`]); `pollux ctl ...`
//! and `pollux top` talk to a running target's control socket ([`pollux_target::control`]).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pollux_conf::Config;
use pollux_target::{Options, Target};
use tracing::{error, info};

/// `pollux --version`: the version and the commit built.
const LONG_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("POLLUX_BUILD_COMMIT"), ")");

/// pollux: a polled-mode NVMe-over-TCP storage target.
#[derive(Debug, Parser)]
#[command(name = "pollux", version = LONG_VERSION, about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Conf file to serve (default: the embedded RAM example).
    #[arg(short, long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Validate a conf file and exit (0 if valid).
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    check: Option<PathBuf>,
    /// Serve an SPDK JSON config (what SPDK's save_config writes and nvmf_tgt -c reads).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["config", "check"])]
    spdk_config: Option<PathBuf>,
    /// Serve an nvmetcli config (Linux nvmet's /etc/nvmet/config.json).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["config", "check", "spdk_config"])]
    nvmet_config: Option<PathBuf>,
    /// The control socket, instead of the conf's (SPDK's nvmf_tgt -r): what an SPDK JSON
    /// config or an nvmetcli config has no place to say. "none": no control socket.
    #[arg(
        short = 'r',
        long,
        visible_alias = "rpc-socket",
        value_name = "PATH",
        conflicts_with = "check"
    )]
    control_socket: Option<PathBuf>,
    /// Take over from a running pollux at the other end of this descriptor (a hot upgrade
    /// starts the new binary so; not for people).
    #[arg(long, value_name = "FD", hide = true, conflicts_with_all = ["config", "check"])]
    takeover: Option<i32>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// NVMe/TCP load generator, like SPDK's spdk_nvme_perf (see ci/BENCHMARKS.md).
    Perf(Box<pollux_host::perf::cli::PerfArgs>),
    /// Inspect and steer a running target over its control socket.
    Ctl(pollux_target::control::cli::CtlArgs),
    /// A live terminal view of a running target (q quits).
    Top(pollux_target::control::top::TopArgs),
    /// Prepare NVMe PCI functions for the userspace driver (bind to vfio-pci, hugepages).
    Setup(pollux_target::setup::SetupArgs),
    /// Print the pollux conf equivalent to another target's configuration.
    Convert {
        /// Its format: nvmet (nvmetcli's config.json).
        #[arg(long, value_name = "FORMAT")]
        from: String,
        /// The file.
        file: PathBuf,
    },
}

/// Block the signals the main thread waits for, before any reactor thread exists (threads
/// inherit the mask, so only the supervisor ever sees them).
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it in place.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; the signal numbers are valid.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::sigaddset(&mut set, libc::SIGUSR2);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    set
}

fn wait_signal(set: &libc::sigset_t) -> i32 {
    let mut sig: libc::c_int = 0;
    // SAFETY: `set` is a valid, initialised sigset_t; `sig` is a valid out pointer.
    let rc = unsafe { libc::sigwait(set, &mut sig) };
    if rc == 0 { sig } else { libc::SIGTERM }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `--check` prints its verdict itself, `convert` its conf: only warnings are logged.
    let quiet = cli.check.is_some() || matches!(cli.command, Some(Command::Convert { .. }));
    pollux_target::log::init(if quiet { "warn" } else { "info" });
    if let Some(Command::Perf(args)) = &cli.command {
        return pollux_host::perf::cli::main::<Target>(args);
    }
    match &cli.command {
        Some(Command::Ctl(args)) => return pollux_target::control::cli::main(args),
        Some(Command::Top(args)) => return pollux_target::control::top::main(args),
        Some(Command::Setup(args)) => return pollux_target::setup::main(args),
        Some(Command::Convert { from, file }) => return convert(from, file),
        _ => {}
    }
    if let Some(path) = cli.check {
        // `FILE:LINE:COL: message` from the start of the line, no log prefix: editors and
        // CI read it as they read a compiler's.
        return match pollux_target::check::check(&path) {
            Ok(cfg) => {
                let _ = writeln!(
                    std::io::stdout(),
                    "{}: valid ({} reactors, {} listeners, {} subsystems)",
                    path.display(),
                    cfg.reactors.cores.len(),
                    cfg.listeners.len(),
                    cfg.subsystems.len()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "{e}");
                ExitCode::from(2)
            }
        };
    }
    pollux_target::upgrade::old::remember_own_binary();
    if let Some(p) = &cli.control_socket {
        // Kept for the process's life: a reload re-reads the conf file, a hot upgrade
        // passes it on to the successor.
        pollux_target::mutate::set_control_socket_arg(p);
    }
    if let Some(fd) = cli.takeover {
        let signals = block_signals();
        return match pollux_target::upgrade::new::takeover::<pollux_target::control::Bound>(fd) {
            Ok(t) => serve(t.target, t.control, &signals),
            Err(e) => {
                // Nothing of what was handed over may be shut down here: the old process
                // serves on with the same sockets. Exit without running destructors.
                error!("upgrade: taking over failed, the old process serves on: {e}");
                std::process::exit(1)
            }
        };
    }
    // The conf to serve: a conf file, one made from an SPDK JSON config (whose method calls
    // then run once the target does) or an nvmetcli config, or the embedded default.
    let (mut cfg, spdk_doc) = match start_conf(&cli) {
        Ok(c) => c,
        Err(e) => {
            error!("{e}");
            return ExitCode::from(2);
        }
    };
    pollux_target::mutate::apply_control_socket_arg(&mut cfg);
    let signals = block_signals();
    // Bound before the target starts: a second pollux on the same socket stops here.
    let bound = match pollux_target::control::Bound::bind(&cfg.control) {
        Ok(b) => b,
        Err(e) => {
            error!("cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    // An SPDK JSON config's subsystems come from its method calls, run once the target
    // does: its listeners accept no host before they have run (a host would find no
    // subsystem), as nvmf_tgt -c listens only once its config is loaded.
    let inherited = pollux_target::upgrade::new::Inherited {
        paused: spdk_doc.is_some(),
        ..Default::default()
    };
    let target = match Target::start_with(&cfg, Options::default(), inherited) {
        Ok(t) => t,
        Err(e) => {
            error!("cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    let control = match bound.serve(&target, &cfg.reactors) {
        Ok(c) => c,
        Err(e) => {
            error!("cannot start: {e}");
            let _ = target.shutdown();
            return ExitCode::from(1);
        }
    };
    if let (Some(doc), Some(path)) = (&spdk_doc, &cli.spdk_config) {
        if let Err(e) = control.ctx().spdk_load_config(doc) {
            error!("cannot serve {}: {}", path.display(), e.message);
            drop(control);
            let _ = target.shutdown();
            return ExitCode::from(2);
        }
        info!(file = %path.display(), "serving an SPDK JSON config");
        target.pause_listeners(false);
    }
    info!(origin = %cfg.origin, reactors = cfg.reactors.cores.len(), mode = %cfg.reactors.mode, "pollux running");
    serve(target, Some(control), &signals)
}

/// The pollux conf serving nvmetcli config `path`: its text, and the conf it validates as.
fn nvmet_conf_text(path: &std::path::Path) -> Result<(String, Config), StartConfError> {
    let p = || path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| StartConfError::Read { path: p(), source })?;
    let toml = pollux_conf::nvmet::to_toml(&text).map_err(|e| StartConfError::Refused {
        path: p(),
        message: e.to_string(),
    })?;
    let cfg = Config::parse(&toml, pollux_conf::EMBEDDED_ORIGIN).map_err(|e| StartConfError::Conf {
        path: p(),
        source: Box::new(e),
    })?;
    Ok((toml, cfg))
}

/// The conf `cli` asks to serve, and the SPDK JSON config whose calls follow, if one.
fn start_conf(cli: &Cli) -> Result<(Config, Option<serde_json::Value>), StartConfError> {
    if let Some(p) = &cli.spdk_config {
        let (doc, cfg) = spdk_config(p)?;
        return Ok((cfg, Some(doc)));
    }
    if let Some(p) = &cli.nvmet_config {
        return Ok((nvmet_conf_text(p)?.1, None));
    }
    match &cli.config {
        Some(p) => Config::from_path(p)
            .map(|c| (c, None))
            .map_err(|e| StartConfError::File(Box::new(e))),
        None => Ok((Config::embedded_default(), None)),
    }
}

/// `pollux convert --from FORMAT FILE`: the equivalent pollux conf on stdout.
fn convert(from: &str, file: &std::path::Path) -> ExitCode {
    let out = match from {
        // The converted text, with its comments, once it is known to validate.
        "nvmet" => nvmet_conf_text(file).map(|(text, _)| text),
        "spdk" => spdk_conf_text(file),
        other => {
            let _ = writeln!(
                std::io::stderr(),
                "pollux convert: unknown format {other:?} (nvmet, spdk)"
            );
            return ExitCode::from(2);
        }
    };
    match out {
        Ok(text) => {
            let _ = write!(std::io::stdout(), "{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "{e}");
            ExitCode::from(2)
        }
    }
}

/// Why the conf to serve cannot be had: a conf file, an SPDK JSON config or an nvmetcli
/// config.
#[derive(Debug, thiserror::Error)]
enum StartConfError {
    #[error("{0}")]
    File(Box<pollux_conf::ConfError>),
    #[error("{path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: not JSON: {source}")]
    Json { path: String, source: serde_json::Error },
    #[error("{path}: {message}")]
    Refused { path: String, message: String },
    #[error("{path}: {source}")]
    Conf {
        path: String,
        source: Box<pollux_conf::ConfError>,
    },
}

/// The pollux conf that serves SPDK JSON config `path`, as `pollux --spdk-config` would:
/// its calls replayed on a target of this process that serves no host (its listeners moved
/// to loopback ports of its own and paused: the SPDK target may still serve the real
/// ones), its running conf written as `pollux ctl save` would, the config's addresses put
/// back. Its stores are opened as when served (a malloc bdev's memory is taken, an rbd
/// image's cluster must answer), then let go.
fn spdk_conf_text(path: &std::path::Path) -> Result<String, StartConfError> {
    let p = || path.display().to_string();
    let mut doc = spdk_doc(path)?;
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
    };
    let refused = |e: pollux_target::control::rpc::RpcError| StartConfError::Refused {
        path: p(),
        message: e.message,
    };
    let moved = pollux_target::control::rpc::spdk_loopback_listeners(&mut doc, free_port).map_err(refused)?;
    let cfg = spdk_base(path, &doc)?;
    let inherited = pollux_target::upgrade::new::Inherited {
        paused: true,
        ..Default::default()
    };
    let start = |e: pollux_target::TargetError| StartConfError::Refused {
        path: p(),
        message: format!("cannot replay it: {e}"),
    };
    let target = Target::start_with(&cfg, Options { pin: false }, inherited).map_err(start)?;
    let ctx = pollux_target::control::rpc::Ctx::new(&target, &cfg.reactors);
    let replayed = ctx.spdk_load_config(&doc).map(|_| {
        target
            .shared()
            .config
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .to_toml()
    });
    drop(ctx);
    let _ = target.shutdown();
    let mut text = replayed.map_err(refused)?;
    for (replay, original) in &moved {
        text = text.replace(&format!("\"{replay}\""), &format!("\"{original}\""));
    }
    let tuning: Vec<&str> = pollux_target::control::rpc::spdk_tuning_calls(&doc);
    let mut head = format!("# pollux convert --from spdk {}\n", path.display());
    if !tuning.is_empty() {
        head.push_str(&format!(
            "# SPDK's tuning calls with no pollux key, taken as they are: {}\n",
            tuning.join(", ")
        ));
    }
    Ok(head + &text)
}

/// The SPDK JSON config at `path`.
fn spdk_doc(path: &std::path::Path) -> Result<serde_json::Value, StartConfError> {
    let p = || path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| StartConfError::Read { path: p(), source })?;
    serde_json::from_str(&text).map_err(|source| StartConfError::Json { path: p(), source })
}

/// An SPDK JSON config at `path` and the conf to start serving it from.
fn spdk_config(path: &std::path::Path) -> Result<(serde_json::Value, Config), StartConfError> {
    let doc = spdk_doc(path)?;
    let cfg = spdk_base(path, &doc)?;
    Ok((doc, cfg))
}

/// The conf a target serving SPDK JSON config `doc` (from `path`) starts from.
fn spdk_base(path: &std::path::Path, doc: &serde_json::Value) -> Result<Config, StartConfError> {
    let p = || path.display().to_string();
    let base = pollux_target::control::rpc::spdk_base_conf(doc).map_err(|e| StartConfError::Refused {
        path: p(),
        message: e.message,
    })?;
    Config::parse(&base, pollux_conf::EMBEDDED_ORIGIN).map_err(|e| StartConfError::Conf {
        path: p(),
        source: Box::new(e),
    })
}

/// Serve until SIGTERM or SIGINT (SIGHUP reloads, SIGUSR2 upgrades), then stop.
fn serve(target: Target, control: Option<pollux_target::control::ControlServer>, signals: &libc::sigset_t) -> ExitCode {
    loop {
        match wait_signal(signals) {
            libc::SIGHUP => match target.reload() {
                Ok(changes) => info!(?changes, "SIGHUP: configuration reloaded"),
                Err(e) => error!("SIGHUP: reload refused, nothing changed: {e}"),
            },
            libc::SIGUSR2 => {
                let Some(binary) = pollux_target::upgrade::old::default_binary() else {
                    error!("SIGUSR2: the binary this process runs is unknown; use `pollux ctl upgrade --binary`");
                    continue;
                };
                match target.upgrade(&binary) {
                    Ok(r) => {
                        info!(
                            pid = r.pid,
                            queues = r.queues,
                            pause_ms = r.pause_ms,
                            "SIGUSR2: upgraded"
                        );
                        pollux_target::upgrade::old::exit_upgraded();
                    }
                    Err(e) => error!("SIGUSR2: upgrade refused, serving on: {e}"),
                }
            }
            sig => {
                info!(signal = sig, "shutting down");
                break;
            }
        }
    }
    drop(control);
    match target.shutdown() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("shutdown: {e}");
            ExitCode::from(1)
        }
    }
}
