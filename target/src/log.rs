//! The process's logging: `tracing` to stderr through a filter that `pollux ctl log-level`
//! changes at run time (as SPDK's `log_set_level`), globally or per module.

use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Registry, fmt, reload};

static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// Why the log filter was not changed.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Not a filter (`info`, `warn,pollux_target::controller=debug`, ...).
    #[error(
        "invalid log filter {filter:?}: {why} (a level: error, warn, info, debug, trace; or per module: info,pollux_target::controller=debug)"
    )]
    Invalid {
        /// The filter given.
        filter: String,
        /// tracing-subscriber's reason.
        why: String,
    },
    /// This process logs through no reloadable filter ([`init`] was not called).
    #[error("this process's log filter cannot be changed at run time")]
    NotReloadable,
}

/// Log to stderr through a reloadable filter: `RUST_LOG` if set and valid, else `default`.
pub fn init(default: &str) {
    let env = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let (filter, handle) = reload::Layer::new(env);
    let fmt = fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if tracing_subscriber::registry().with(filter).with(fmt).try_init().is_ok() {
        let _ = FILTER.set(handle);
    }
}

/// Replace the filter.
pub fn set_filter(spec: &str) -> Result<(), LogError> {
    // A bare word is a level: tracing would read `loud` as "everything of module loud",
    // which is never what an operator typing a level meant.
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    if let Some(bad) = spec
        .split(',')
        .map(str::trim)
        .find(|d| !d.contains('=') && !LEVELS.contains(&d.to_ascii_lowercase().as_str()))
    {
        return Err(LogError::Invalid {
            filter: spec.to_string(),
            why: format!("{bad:?} is not a level (a module's level is MODULE=LEVEL)"),
        });
    }
    let f = EnvFilter::try_new(spec).map_err(|e| LogError::Invalid {
        filter: spec.to_string(),
        why: e.to_string(),
    })?;
    FILTER
        .get()
        .ok_or(LogError::NotReloadable)?
        .reload(f)
        .map_err(|_| LogError::NotReloadable)
}

/// The filter in force.
pub fn filter() -> Result<String, LogError> {
    FILTER
        .get()
        .ok_or(LogError::NotReloadable)?
        .with_current(ToString::to_string)
        .map_err(|_| LogError::NotReloadable)
}
