//! The `[[referral]]` entries: other targets' discovery controllers.

use std::collections::HashMap;
use std::net::SocketAddr;

use super::cx::Cx;
use super::listeners::{once, socket_addr};
use crate::error::ConfError;
use crate::raw::RawReferral;
use crate::{Listener, Referral};

pub(super) fn referrals(
    cx: &Cx<'_>,
    raw: Vec<RawReferral>,
    listeners: &[Listener],
) -> Result<Vec<Referral>, ConfError> {
    let mut seen = HashMap::new();
    let mut out = Vec::with_capacity(raw.len());
    for r in raw {
        let span = r.address.span();
        let address = socket_addr(cx, &r.address, "referral")?;
        // A host connects to the address as written (NVMe-oF 1.1 §5.3: TRADDR, TRSVCID), so
        // it must name one machine and a real port.
        if address.port() == 0 {
            return Err(cx.at(
                span,
                format!("referral address {address} has port 0: give the other target's discovery port, e.g. 8009"),
            ));
        }
        if address.ip().is_unspecified() || address.ip().is_multicast() {
            return Err(cx.at(
                span,
                format!(
                    "referral address {address} is not the address of one machine: give the other target's listener address"
                ),
            ));
        }
        if let Some(l) = listeners.iter().find(|l| refers_to(address, l.address)) {
            return Err(cx.at(
                span,
                format!(
                    "referral address {address} is this target's own listener {}: a referral points hosts at another target's discovery controller",
                    l.address
                ),
            ));
        }
        once(cx, &mut seen, address, &r.address, "referral")?;
        out.push(Referral { address });
    }
    Ok(out)
}

/// Whether a referral to `referral` would lead back to a listener on `listener`: the same
/// address, or the same port of a listener on the unspecified address reached through
/// loopback. (The target checks again once its listeners are bound, against its local
/// addresses too.)
fn refers_to(referral: SocketAddr, listener: SocketAddr) -> bool {
    if referral == listener {
        return true;
    }
    listener.port() != 0
        && listener.port() == referral.port()
        && listener.ip().is_unspecified()
        && referral.ip().is_loopback()
}
