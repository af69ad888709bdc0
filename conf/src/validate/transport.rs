//! The `[transport]` and `[keep_alive]` tables.

use toml::Spanned;

use super::cx::Cx;
use crate::error::ConfError;
use crate::raw::{RawKeepAlive, RawTransport};
use crate::{KeepAlive, MAX_CONNECTIONS, Transport};

pub(super) fn transport(cx: &Cx<'_>, t: RawTransport) -> Result<Transport, ConfError> {
    let d = Transport::default();
    Ok(Transport {
        io_queue_depth: cx.u32_or(&t.io_queue_depth, "io_queue_depth", 2, 65536, d.io_queue_depth)?,
        max_io_queues: cx.u32_opt(&t.max_io_queues, "max_io_queues", 1, 65535)?,
        // ICDOFF/IOCCSZ are in 16-byte units (NVMe/TCP 1.0 §3.6.2.3, ICResp).
        in_capsule_data_size: cx.transport_bytes(
            &t.in_capsule_data_size,
            "in_capsule_data_size",
            d.in_capsule_data_size,
            |n| {
                if !(4096..=131_072).contains(&n) {
                    Some("must be between 4096 and 131072 bytes".into())
                } else if n % 16 != 0 {
                    Some("must be a multiple of 16".into())
                } else {
                    None
                }
            },
        )?,
        // MDTS is a power of two in pages, so only powers of two map exactly.
        max_io_size: cx.transport_bytes(&t.max_io_size, "max_io_size", d.max_io_size, |n| {
            if n < 4096 || !n.is_power_of_two() {
                Some("must be a power of two and at least 4096 bytes".into())
            } else {
                None
            }
        })?,
        // MAXH2CDATA must be a multiple of 4 bytes and at least 4 KiB
        // (NVMe/TCP, ICResp PDU).
        max_h2c_data: cx.transport_bytes(&t.max_h2c_data, "max_h2c_data", d.max_h2c_data, |n| {
            if n < 4096 || n % 4 != 0 {
                Some("must be a multiple of 4 and at least 4096 bytes".into())
            } else {
                None
            }
        })?,
        max_connections: cx.u32_or(
            &t.max_connections,
            "max_connections",
            1,
            MAX_CONNECTIONS,
            d.max_connections,
        )?,
        setup_timeout_ms: cx.u32_or(
            &t.setup_timeout_ms,
            "setup_timeout_ms",
            100,
            600_000,
            d.setup_timeout_ms,
        )?,
    })
}

pub(super) fn keep_alive(cx: &Cx<'_>, k: RawKeepAlive) -> Result<KeepAlive, ConfError> {
    let d = KeepAlive::default();
    let min_ms = cx.u32_or(&k.min_ms, "min_ms", 0, i64::from(u32::MAX), d.min_ms)?;
    let max_ms = cx.u32_or(&k.max_ms, "max_ms", 1, i64::from(u32::MAX), d.max_ms)?;
    if min_ms > max_ms {
        // Point at whichever of the two was written (min_ms if both were).
        let span = k.min_ms.as_ref().or(k.max_ms.as_ref()).map(Spanned::span);
        let message = format!("keep_alive `min_ms` ({min_ms}) is greater than `max_ms` ({max_ms})");
        return Err(match span {
            Some(span) => cx.at(span, message),
            None => cx.nowhere(message),
        });
    }
    Ok(KeepAlive { min_ms, max_ms })
}
