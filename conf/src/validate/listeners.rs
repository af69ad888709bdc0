//! The `[[listener]]` entries.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use super::cx::Cx;
use crate::error::ConfError;
use crate::raw::RawListener;
use crate::{ANAGRPMAX, AnaState, Listener, TlsMode};

pub(super) fn listeners(cx: &Cx<'_>, raw: Vec<RawListener>) -> Result<Vec<Listener>, ConfError> {
    if raw.is_empty() {
        return Err(cx.nowhere(
            "no [[listener]]: add at least one, e.g. `[[listener]]` with `address = \"127.0.0.1:4420\"`".into(),
        ));
    }
    let mut seen: HashMap<SocketAddr, usize> = HashMap::new();
    let mut out = Vec::with_capacity(raw.len());
    for l in raw {
        let text = l.address.get_ref();
        let address: SocketAddr = text.trim().parse().map_err(|_| {
            cx.at(
                l.address.span(),
                format!(
                    "listener address {text:?} is not of the form \"IPv4:port\" or \"[IPv6]:port\" (numeric, no host names)"
                ),
            )
        })?;
        let line = cx.line(&l.address.span());
        if let Some(first) = seen.insert(address, line) {
            return Err(cx.at(
                l.address.span(),
                format!("listener address {address} is already listed on line {first}"),
            ));
        }
        let tls = match &l.tls {
            Some(t) => t.get_ref().parse().map_err(|e| cx.at(t.span(), e))?,
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
        out.push(Listener { address, tls, ana });
    }
    Ok(out)
}
