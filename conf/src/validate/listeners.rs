//! The `[[listener]]` entries.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use toml::Spanned;

use super::cx::Cx;
use crate::error::ConfError;
use crate::raw::RawListener;
use crate::{ANAGRPMAX, AnaState, Listener, MAX_CONNECTIONS, TlsMode, UnknownSpelling};

/// A numeric `IP:port` address (`what`: "listener", "referral", for the message).
pub(super) fn socket_addr(cx: &Cx<'_>, s: &Spanned<String>, what: &str) -> Result<SocketAddr, ConfError> {
    let text = s.get_ref();
    text.trim().parse().map_err(|_| {
        cx.at(
            s.span(),
            format!(
                "{what} address {text:?} is not of the form \"IPv4:port\" or \"[IPv6]:port\" (numeric, no host names)"
            ),
        )
    })
}

/// Refuse `address` if `seen` (address -> line) has it already; else record it.
pub(super) fn once(
    cx: &Cx<'_>,
    seen: &mut HashMap<SocketAddr, usize>,
    address: SocketAddr,
    s: &Spanned<String>,
    what: &str,
) -> Result<(), ConfError> {
    let line = cx.line(&s.span());
    match seen.insert(address, line) {
        Some(first) => Err(cx.at(
            s.span(),
            format!("{what} address {address} is already listed on line {first}"),
        )),
        None => Ok(()),
    }
}

/// The `[[listener]]` tables: at least one, unless the target is a gateway group's member
/// (`in_group`), whose listeners may all be the group's (`crate::group`).
pub(super) fn listeners(cx: &Cx<'_>, raw: Vec<RawListener>, in_group: bool) -> Result<Vec<Listener>, ConfError> {
    if raw.is_empty() && !in_group {
        return Err(cx.nowhere(
            "no [[listener]]: add at least one, e.g. `[[listener]]` with `address = \"127.0.0.1:4420\"`".into(),
        ));
    }
    let mut seen = HashMap::new();
    let mut out = Vec::with_capacity(raw.len());
    for l in raw {
        let address = socket_addr(cx, &l.address, "listener")?;
        once(cx, &mut seen, address, &l.address, "listener")?;
        let tls = match &l.tls {
            Some(t) => t
                .get_ref()
                .parse()
                .map_err(|e: UnknownSpelling| cx.at(t.span(), e.to_string()))?,
            None => TlsMode::None,
        };
        let mut ana = BTreeMap::new();
        if let Some(table) = &l.ana {
            for (grp, state) in table.get_ref() {
                let g = grp
                    .parse::<u32>()
                    .ok()
                    .filter(|g| (1..=ANAGRPMAX).contains(g))
                    .ok_or_else(|| {
                        cx.at(
                            table.span(),
                            format!("`ana` key {grp:?} is not an ANA group id: 1 to {ANAGRPMAX}"),
                        )
                    })?;
                let s = AnaState::from_name(state.get_ref()).ok_or_else(|| {
                    cx.at(
                        state.span(),
                        format!(
                            "unknown ANA state {:?}: optimized, non-optimized, inaccessible, persistent-loss or change",
                            state.get_ref()
                        ),
                    )
                })?;
                if s != AnaState::Optimized {
                    ana.insert(g, s);
                }
            }
        }
        let max_connections = match &l.max_connections {
            Some(_) => Some(cx.u32_or(&l.max_connections, "max_connections", 1, MAX_CONNECTIONS, 0)?),
            None => None,
        };
        out.push(Listener {
            address,
            tls,
            ana,
            max_connections,
        });
    }
    Ok(out)
}
