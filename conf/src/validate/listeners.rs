//! The `[[listener]]` entries.

use std::collections::HashMap;
use std::net::SocketAddr;

use super::cx::Cx;
use crate::error::ConfError;
use crate::raw::RawListener;
use crate::{Listener, TlsMode};

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
        out.push(Listener { address, tls });
    }
    Ok(out)
}
