//! Turns the raw, spanned deserialization into the public [`Config`],
//! checking every semantic rule and reporting the position of the offending
//! value.

use std::path::Path;

use crate::error::ConfError;
use crate::raw::RawConfig;
use crate::{Config, Control, KeepAlive, Transport};

pub(crate) mod backend;
mod control;
mod cx;
mod gateway;
pub(crate) mod hosts;
mod listeners;
mod reactors;
mod referrals;
mod registry;
mod subsystems;
mod transport;

use control::control;
use cx::Cx;
use listeners::listeners;
use reactors::reactors;
use referrals::referrals;
use subsystems::subsystems;
use transport::{keep_alive, transport};

/// The highest valid NSID; 0xFFFFFFFF is the broadcast value (NVMe 2.0
/// §3.2.1.2) and 0 is never a namespace.
const MAX_NSID: i64 = 0xFFFF_FFFE;

/// What relative paths in the configuration are relative to.
pub(crate) enum Base<'a> {
    /// The current directory: the text did not come from a file.
    CurrentDir,
    /// The directory holding this configuration file.
    DirOf(&'a Path),
    /// The directory holding the file this text is to be saved to (a run-time change): as
    /// `DirOf`, but the file on disk is not this text, so its mode says nothing about it.
    SavedAs(&'a Path),
}

/// Parses and validates `text`.
pub(crate) fn build(text: &str, origin: &str, base: Base<'_>) -> Result<Config, ConfError> {
    let cx = Cx::new(text, origin, base);
    let raw: RawConfig = toml::from_str(text).map_err(|e| toml_error(&cx, &e))?;
    let state_dir = raw.state_dir.as_ref().map(|v| cx.path(v, "state_dir")).transpose()?;

    let reactors = match raw.reactors {
        Some(r) => reactors(&cx, r)?,
        None => {
            return Err(
                cx.nowhere("missing the [reactors] table; add one, e.g. `[reactors]` with `cores = [0]`".into())
            );
        }
    };
    let listeners = listeners(&cx, raw.listener.unwrap_or_default(), raw.gateway.is_some())?;
    let transport = match raw.transport {
        Some(t) => transport(&cx, t)?,
        None => Transport::default(),
    };
    let keep_alive = match raw.keep_alive {
        Some(k) => keep_alive(&cx, k)?,
        None => KeepAlive::default(),
    };
    let control = match raw.control {
        Some(c) => control(&cx, c, &listeners)?,
        None => Control::default(),
    };
    let subsystems = subsystems(&cx, raw.subsystem.unwrap_or_default(), reactors.cores.len(), &listeners)?;
    let referrals = referrals(&cx, raw.referral.unwrap_or_default(), &listeners)?;
    let discovery = match raw.discovery {
        Some(d) => hosts::discovery(&cx, d)?,
        None => crate::Discovery::default(),
    };
    let gateway = raw.gateway.map(|g| gateway::gateway(&cx, g, &subsystems)).transpose()?;
    let mut subsystems = subsystems;
    if let Some(g) = &gateway {
        // Every image this gateway serves is its group's (the backend marks it so, and
        // refuses one another group marked).
        for n in subsystems.iter_mut().flat_map(|s| s.namespaces.iter_mut()) {
            if let crate::Backend::Rbd(b) = &mut n.backend {
                b.gateway_group = Some(g.group.clone());
            }
        }
    }
    if subsystems.is_empty() {
        tracing::info!(origin, "configuration has no [[subsystem]]: only discovery is served");
    }
    tracing::debug!(
        origin,
        reactors = reactors.cores.len(),
        listeners = listeners.len(),
        subsystems = subsystems.len(),
        "configuration loaded"
    );
    Ok(Config {
        reactors,
        listeners,
        transport,
        keep_alive,
        subsystems,
        control,
        discovery,
        referrals,
        state_dir,
        gateway,
        group_peers: Vec::new(),
        origin: origin.to_owned(),
        document: text.into(),
    })
}

/// A toml syntax or deserialization error, with serde's vocabulary turned
/// into TOML's ("key", not "field") and multi-line messages joined.
fn toml_error(cx: &Cx<'_>, e: &toml::de::Error) -> ConfError {
    let message = e
        .message()
        .trim()
        .replace("unknown field", "unknown key")
        .replace("missing field", "missing key")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(": ");
    match e.span() {
        Some(span) => cx.at(span, message),
        None => cx.nowhere(message),
    }
}
