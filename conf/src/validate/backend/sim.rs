//! The `sim` backend and its latency distributions.

use std::ops::Range;

use toml::Spanned;

use super::capacity;
use crate::error::ConfError;
use crate::raw::{RawLatency, RawSim};
use crate::validate::cx::{Cx, non_negative, positive};
use crate::{Latency, SimBackend};

/// A simulated backend's read latency when `read` is not given.
const DEFAULT_SIM_READ: Latency = Latency::LogNormal {
    median_us: 80.0,
    sigma: 0.2,
};

/// A simulated backend's write latency when `write` is not given.
const DEFAULT_SIM_WRITE: Latency = Latency::LogNormal {
    median_us: 20.0,
    sigma: 0.2,
};

/// The largest lognormal `sigma` accepted: beyond it the distribution's tail
/// is so long that a simulation is dominated by rare, absurd latencies.
const MAX_SIGMA: f64 = 3.0;

pub(super) fn sim_backend(
    cx: &Cx<'_>,
    s: &RawSim,
    nsid: u32,
    nsid_span: Range<usize>,
    block_size: u32,
) -> Result<SimBackend, ConfError> {
    let size = capacity(cx, &s.size, "sim", block_size)?;
    let read = latency(cx, &s.read, "read", DEFAULT_SIM_READ, nsid, nsid_span.clone())?;
    let write = latency(cx, &s.write, "write", DEFAULT_SIM_WRITE, nsid, nsid_span)?;
    let per_kib_us = cx.float_or(&s.per_kib_us, "per_kib_us", 0.0, non_negative)?;
    let parallelism = cx.u32_or(&s.parallelism, "parallelism", 1, 65536, 128)?;
    let bandwidth = match &s.bandwidth {
        None => None,
        Some(v) => match cx.size(v, "bandwidth")? {
            0 => {
                return Err(cx.at(
                    v.span(),
                    "`bandwidth` must be greater than 0 bytes per second; leave it out for unlimited".into(),
                ));
            }
            n => Some(n),
        },
    };
    let interrupt_delay_us = cx.float_or(&s.interrupt_delay_us, "interrupt_delay_us", 0.0, non_negative)?;
    let coalesce_count = cx.u32_or(&s.coalesce_count, "coalesce_count", 1, i64::from(u32::MAX), 1)?;
    let coalesce_us = cx.float_or(&s.coalesce_us, "coalesce_us", 0.0, non_negative)?;
    let seed = match &s.seed {
        None => 1,
        // 0..=i64::MAX fits u64.
        Some(v) => cx.int(v, "seed", 0, i64::MAX)?.unsigned_abs(),
    };
    Ok(SimBackend {
        size,
        read,
        write,
        per_kib_us,
        parallelism,
        bandwidth,
        interrupt_delay_us,
        coalesce_count,
        coalesce_us,
        seed,
    })
}

/// The latency distributions, by the keys that select them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dist {
    Fixed,
    Uniform,
    LogNormal,
    Bimodal,
}

impl Dist {
    fn name(self) -> &'static str {
        match self {
            Dist::Fixed => "fixed",
            Dist::Uniform => "uniform",
            Dist::LogNormal => "lognormal",
            Dist::Bimodal => "bimodal",
        }
    }
}

/// How to write each distribution, for messages.
const DISTRIBUTIONS: &str = "`{ fixed_us = X }`, `{ min_us = A, max_us = B }`, `{ median_us = M, sigma = S }` or `{ fast_us = F, slow_us = L, slow_fraction = P }`";

/// The `read` or `write` latency of a sim backend (`key` names it), or
/// `default` when absent.
fn latency(
    cx: &Cx<'_>,
    l: &Option<RawLatency>,
    key: &str,
    default: Latency,
    nsid: u32,
    nsid_span: Range<usize>,
) -> Result<Latency, ConfError> {
    let Some(l) = l else { return Ok(default) };
    let all: [(&str, &Option<Spanned<f64>>, Dist); 8] = [
        ("fixed_us", &l.fixed_us, Dist::Fixed),
        ("min_us", &l.min_us, Dist::Uniform),
        ("max_us", &l.max_us, Dist::Uniform),
        ("median_us", &l.median_us, Dist::LogNormal),
        ("sigma", &l.sigma, Dist::LogNormal),
        ("fast_us", &l.fast_us, Dist::Bimodal),
        ("slow_us", &l.slow_us, Dist::Bimodal),
        ("slow_fraction", &l.slow_fraction, Dist::Bimodal),
    ];
    let mut given: Vec<(&str, Range<usize>, Dist)> = all
        .iter()
        .filter_map(|(name, v, dist)| v.as_ref().map(|v| (*name, v.span(), *dist)))
        .collect();
    given.sort_by_key(|(_, span, _)| span.start);
    let Some((first, first_span, dist)) = given.first().cloned() else {
        // An empty table has no span of its own (see raw.rs).
        return Err(cx.at(
            nsid_span,
            format!("namespace {nsid} has an empty `{key}` latency: give one of {DISTRIBUTIONS}"),
        ));
    };
    if let Some((other, span, other_dist)) = given.iter().find(|(_, _, d)| *d != dist) {
        return Err(cx.at(
            span.clone(),
            format!(
                "`{key}` mixes two latency distributions: `{other}` is {} but `{first}` is {}; give exactly one of {DISTRIBUTIONS}",
                other_dist.name(),
                dist.name()
            ),
        ));
    }
    // Every key of `dist`, or an error at the first key given.
    let need = |v: &Option<Spanned<f64>>, name: &str| -> Result<Spanned<f64>, ConfError> {
        v.clone().ok_or_else(|| {
            cx.at(
                first_span.clone(),
                format!(
                    "`{first}` makes `{key}` a {} latency, which also needs `{name}`",
                    dist.name()
                ),
            )
        })
    };
    let k = |name: &str| format!("{key}.{name}");
    Ok(match dist {
        Dist::Fixed => {
            let us = cx.float(&need(&l.fixed_us, "fixed_us")?, &k("fixed_us"), non_negative)?;
            Latency::Fixed { us }
        }
        Dist::Uniform => {
            let (min, max) = (need(&l.min_us, "min_us")?, need(&l.max_us, "max_us")?);
            let min_us = cx.float(&min, &k("min_us"), non_negative)?;
            let max_us = cx.float(&max, &k("max_us"), non_negative)?;
            if min_us > max_us {
                return Err(cx.at(
                    min.span(),
                    format!("`{key}.min_us` ({min_us}) is greater than `{key}.max_us` ({max_us})"),
                ));
            }
            Latency::Uniform { min_us, max_us }
        }
        Dist::LogNormal => {
            let (median, sigma) = (need(&l.median_us, "median_us")?, need(&l.sigma, "sigma")?);
            let median_us = cx.float(&median, &k("median_us"), positive)?;
            let sigma = cx.float(&sigma, &k("sigma"), |x| {
                (!(0.0..=MAX_SIGMA).contains(&x)).then_some("must be between 0 and 3")
            })?;
            Latency::LogNormal { median_us, sigma }
        }
        Dist::Bimodal => {
            let fast = need(&l.fast_us, "fast_us")?;
            let slow = need(&l.slow_us, "slow_us")?;
            let fraction = need(&l.slow_fraction, "slow_fraction")?;
            let fast_us = cx.float(&fast, &k("fast_us"), non_negative)?;
            let slow_us = cx.float(&slow, &k("slow_us"), non_negative)?;
            let slow_fraction = cx.float(&fraction, &k("slow_fraction"), |x| {
                (!(0.0..=1.0).contains(&x)).then_some("must be between 0 and 1")
            })?;
            if fast_us > slow_us {
                return Err(cx.at(
                    fast.span(),
                    format!("`{key}.fast_us` ({fast_us}) is greater than `{key}.slow_us` ({slow_us})"),
                ));
            }
            Latency::Bimodal {
                fast_us,
                slow_us,
                slow_fraction,
            }
        }
    })
}
