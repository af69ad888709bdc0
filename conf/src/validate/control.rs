//! The `[control]` table: the control socket and the metrics endpoint.

use std::net::SocketAddr;

use super::cx::Cx;
use crate::error::ConfError;
use crate::raw::RawControl;
use crate::{Control, Listener};

/// The longest Unix socket path: `sun_path` in Linux's `sockaddr_un` holds
/// 108 bytes including the terminating NUL.
const UNIX_PATH_MAX: usize = 107;

pub(super) fn control(cx: &Cx<'_>, c: RawControl, listeners: &[Listener]) -> Result<Control, ConfError> {
    let socket = match &c.socket {
        None => Some(std::path::PathBuf::from(crate::DEFAULT_CONTROL_SOCKET)),
        Some(v) if v.get_ref() == "none" => None,
        Some(v) => {
            let path = cx.path(v, "socket")?;
            let len = path.as_os_str().len();
            if len > UNIX_PATH_MAX {
                return Err(cx.at(
                    v.span(),
                    format!(
                        "control `socket` {} is {len} bytes long; a Unix socket path holds at most {UNIX_PATH_MAX}",
                        path.display()
                    ),
                ));
            }
            Some(path)
        }
    };
    let metrics = match &c.metrics {
        None => None,
        Some(v) => {
            let text = v.get_ref();
            let address: SocketAddr = text.trim().parse().map_err(|_| {
                cx.at(
                    v.span(),
                    format!(
                        "`metrics` address {text:?} is not of the form \"127.0.0.1:port\" or \"[::1]:port\" (numeric, no host names)"
                    ),
                )
            })?;
            if !address.ip().is_loopback() {
                return Err(cx.at(
                    v.span(),
                    format!(
                        "`metrics` address {address} is not a loopback address: the metrics endpoint has no authentication, so it may only listen on 127.0.0.0/8 or [::1]"
                    ),
                ));
            }
            if address.port() != 0 && listeners.iter().any(|l| l.address == address) {
                return Err(cx.at(
                    v.span(),
                    format!("`metrics` address {address} is also a [[listener]] address; give it another port"),
                ));
            }
            Some(address)
        }
    };
    Ok(Control {
        socket,
        socket_is_default: c.socket.is_none(),
        metrics,
    })
}
