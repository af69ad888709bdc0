//! The `[reactors]` table.

use super::cx::{Cx, positive};
use crate::error::ConfError;
use crate::raw::RawReactors;
use crate::{ModelKind, Placement, ReactorMode, Reactors, Turnaround, UnknownSpelling};

/// The highest core index accepted: Linux's `cpu_set_t`, which
/// `sched_setaffinity` takes, holds CPUs 0..1024.
const MAX_CORE: i64 = 1023;
/// The largest `hybrid_margin_us` accepted.
const MAX_MARGIN_US: f64 = 1_000_000.0;

pub(super) fn reactors(cx: &Cx<'_>, r: RawReactors) -> Result<Reactors, ConfError> {
    if r.cores.get_ref().is_empty() {
        return Err(cx.at(
            r.cores.span(),
            "`cores` is empty: list at least one CPU core, e.g. `cores = [0]`".into(),
        ));
    }
    let mut cores = Vec::with_capacity(r.cores.get_ref().len());
    for c in r.cores.get_ref() {
        let core = cx.int(c, "cores", 0, MAX_CORE)?;
        // In range 0..=1023, so the conversion cannot fail.
        let core = usize::try_from(core).unwrap_or_default();
        if cores.contains(&core) {
            return Err(cx.at(
                c.span(),
                format!("core {core} is listed twice in `cores`; each core runs one reactor"),
            ));
        }
        cores.push(core);
    }
    let mode = match &r.mode {
        None => ReactorMode::default(),
        Some(m) => m
            .get_ref()
            .parse()
            .map_err(|e: UnknownSpelling| cx.at(m.span(), e.to_string()))?,
    };
    let stall_threshold_us = match &r.stall_threshold_us {
        None => 2000,
        Some(v) => cx.int(v, "stall_threshold_us", 1, i64::MAX)?.unsigned_abs(),
    };
    let placement = match &r.placement {
        None => Placement::default(),
        Some(p) => p
            .get_ref()
            .parse()
            .map_err(|e: UnknownSpelling| cx.at(p.span(), e.to_string()))?,
    };
    let d = Reactors::default();
    let cpu_budget = cx.float_or(&r.cpu_budget, "cpu_budget", d.cpu_budget, |x| {
        (x <= 0.0 || x > 1.0).then_some("must be greater than 0 and at most 1 (a fraction of one core)")
    })?;
    let latency_target_us = match &r.latency_target_us {
        None => None,
        Some(v) => Some(cx.float(v, "latency_target_us", positive)?),
    };
    let policy = match &r.policy {
        None => ModelKind::default(),
        Some(p) => p
            .get_ref()
            .parse()
            .map_err(|e: UnknownSpelling| cx.at(p.span(), e.to_string()))?,
    };
    // A margin beyond a second is no wake margin but a typo (a sleep that could never be
    // taken before any device's completion).
    let hybrid_margin_us = match &r.hybrid_margin_us {
        None => None,
        Some(v) => Some(cx.float(v, "hybrid_margin_us", |x| {
            (!(0.0..=MAX_MARGIN_US).contains(&x)).then_some("must be at least 0 and at most 1000000 (one second)")
        })?),
    };
    let hybrid_turnaround = match &r.hybrid_turnaround {
        None => Turnaround::default(),
        Some(t) => t
            .get_ref()
            .parse()
            .map_err(|e: UnknownSpelling| cx.at(t.span(), e.to_string()))?,
    };
    Ok(Reactors {
        cores,
        mode,
        stall_threshold_us,
        placement,
        cpu_budget,
        latency_target_us,
        policy,
        hybrid_margin_us,
        hybrid_turnaround,
    })
}
