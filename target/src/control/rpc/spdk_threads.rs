//! SPDK's views of reactors and threads on pollux ([`super::spdk`]): `framework_get_reactors`,
//! `thread_get_stats`, `thread_get_pollers` and `framework_get_scheduler`, in the shapes SPDK
//! v26.05 writes (`lib/event/app_rpc.c`) and `spdk_top` decodes (strictly: no key it does not
//! know), so that `spdk_top` shows pollux's reactors.
//!
//! Each pollux reactor is one SPDK reactor running one lightweight thread, named as SPDK
//! names an nvmf poll group's thread. Ticks are nanoseconds (`tick_rate` 10^9). A reactor's
//! mode shows as SPDK shows a reactor's: `in_interrupt` when it sleeps in the kernel between
//! events (interrupt mode) or on a timer (hybrid), and as its poller: busy-poll and interrupt
//! mode run one active poller (`running` while it polls, `waiting` while it waits for an
//! event), hybrid mode one timed poller whose period is the completion time it sleeps for.

use pollux_reactor::{Mode, ReactorStats};
use serde_json::{Value, json};

use super::spdk::invalid;
use super::{Ctx, RpcError};

/// Ticks per second in every figure here: nanoseconds.
const TICK_RATE: u64 = 1_000_000_000;

/// SPDK's name of reactor `i`'s thread (as its nvmf poll groups' threads are named).
fn thread_name(i: usize) -> String {
    format!("nvmf_tgt_poll_group_{i:03}")
}

/// SPDK's thread id of reactor `i`'s thread (SPDK counts threads from 1).
fn thread_id(i: usize) -> u64 {
    i as u64 + 1
}

/// The CPU mask SPDK prints for a thread (`spdk_cpuset_fmt`: hex, no prefix): its core's
/// bit, or every CPU of this machine for an unpinned reactor.
fn cpumask(core: Option<usize>) -> String {
    let bits: Vec<usize> = match core {
        Some(c) => vec![c],
        None => (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect(),
    };
    let mut nibbles = vec![0u8; bits.iter().max().map_or(1, |m| m / 4 + 1)];
    for b in bits {
        nibbles[b / 4] |= 1 << (b % 4);
    }
    nibbles.iter().rev().map(|n| format!("{n:x}")).collect::<String>()
}

/// The NUMA node of `core` (-1, SPDK's "any", where unknown or unpinned).
fn numa_id(core: Option<usize>) -> i64 {
    let Some(c) = core else { return -1 };
    std::fs::read_dir(format!("/sys/devices/system/cpu/cpu{c}"))
        .ok()
        .and_then(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
                .next()
        })
        .unwrap_or(-1)
}

/// The reactor thread's user and system time, in the kernel's clock ticks
/// (`/proc/self/task/TID/stat`, fields 14 and 15). SPDK reports its core's since start; a
/// pollux reactor's thread is what runs there.
fn thread_times(tid: u64) -> (u64, u64) {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else {
        return (0, 0);
    };
    // The command name (field 2) may hold spaces: count from the ')' that ends it.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
    // `rest` starts at field 3: utime is field 14, stime 15.
    (f.get(11).copied().unwrap_or(0), f.get(12).copied().unwrap_or(0))
}

/// Wall time since the reactor started, ns.
fn elapsed(st: &ReactorStats) -> u64 {
    st.mode_ns.iter().sum()
}

/// Whether its poller is a timed one (hybrid mode sleeps on a timer), else active.
fn timed(st: &ReactorStats) -> bool {
    st.mode == Mode::Hybrid
}

/// Its poller, as SPDK would list it.
fn poller(st: &ReactorStats) -> Value {
    let mut p = json!({
        "name": format!("pollux_reactor_{}", st.mode.as_str()),
        "id": 1,
        "state": if st.mode == Mode::Poll { "running" } else { "waiting" },
        "run_count": st.iterations,
        "busy_count": st.busy_iterations,
    });
    if timed(st) {
        p["period_ticks"] = json!(st.predicted_ns);
    }
    p
}

fn no_params(method: &str, p: &Value) -> Result<(), RpcError> {
    match p {
        Value::Null => Ok(()),
        Value::Object(o) if o.is_empty() => Ok(()),
        _ => Err(invalid(format!("'{method}' requires no arguments"))),
    }
}

impl Ctx {
    /// `framework_get_reactors`: each reactor with its busy and idle time, mode and thread.
    pub(super) fn spdk_get_reactors(&self, p: &Value) -> Result<Value, RpcError> {
        no_params("framework_get_reactors", p)?;
        let reactors: Vec<Value> = self
            .stats()
            .iter()
            .map(|st| {
                let (usr, sys) = thread_times(st.tid);
                json!({
                    "lcore": st.core.unwrap_or(st.id),
                    "numa_id": numa_id(st.core),
                    "tid": st.tid,
                    "busy": st.busy_ns,
                    "idle": st.idle_ns,
                    "in_interrupt": st.mode != Mode::Poll,
                    "irq": 0,
                    "sys": sys,
                    "usr": usr,
                    "lw_threads": [{
                        "name": thread_name(st.id),
                        "id": thread_id(st.id),
                        "cpumask": cpumask(st.core),
                        "elapsed": elapsed(st),
                    }],
                })
            })
            .collect();
        Ok(json!({"tick_rate": TICK_RATE, "pid": std::process::id(), "reactors": reactors}))
    }

    /// `thread_get_stats`: each reactor's thread, its busy and idle time and pollers.
    pub(super) fn spdk_thread_stats(&self, p: &Value) -> Result<Value, RpcError> {
        no_params("thread_get_stats", p)?;
        let threads: Vec<Value> = self
            .stats()
            .iter()
            .map(|st| {
                let timed = timed(st);
                json!({
                    "name": thread_name(st.id),
                    "id": thread_id(st.id),
                    "cpumask": cpumask(st.core),
                    "busy": st.busy_ns,
                    "idle": st.idle_ns,
                    "active_pollers_count": u64::from(!timed),
                    "timed_pollers_count": u64::from(timed),
                    "paused_pollers_count": 0,
                })
            })
            .collect();
        Ok(json!({"tick_rate": TICK_RATE, "threads": threads}))
    }

    /// `thread_get_pollers`: each reactor's thread with its poller.
    pub(super) fn spdk_thread_pollers(&self, p: &Value) -> Result<Value, RpcError> {
        no_params("thread_get_pollers", p)?;
        let threads: Vec<Value> = self
            .stats()
            .iter()
            .map(|st| {
                let p = poller(st);
                let (a, t): (Vec<Value>, Vec<Value>) = if timed(st) {
                    (vec![], vec![p])
                } else {
                    (vec![p], vec![])
                };
                json!({
                    "name": thread_name(st.id),
                    "id": thread_id(st.id),
                    "active_pollers": a,
                    "timed_pollers": t,
                    "paused_pollers": [],
                })
            })
            .collect();
        Ok(json!({"tick_rate": TICK_RATE, "threads": threads}))
    }

    /// `framework_get_scheduler`: SPDK moves threads between reactors; pollux's reactors
    /// keep their connections and choose their own mode: "pollux_adaptive" where the
    /// adaptive policy chooses it, "static" where the conf fixes it.
    pub(super) fn spdk_get_scheduler(&self, p: &Value) -> Result<Value, RpcError> {
        no_params("framework_get_scheduler", p)?;
        let stats = self.stats();
        let adaptive = stats.iter().any(|s| s.adaptive);
        Ok(json!({
            "scheduler_name": if adaptive { "pollux_adaptive" } else { "static" },
            "scheduler_period": 1_000_000,
            "isolated_core_mask": "",
            "scheduling_core": stats.first().and_then(|s| s.core).unwrap_or(0),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpumask_is_spdk_hex() {
        assert_eq!(cpumask(Some(0)), "1");
        assert_eq!(cpumask(Some(1)), "2");
        assert_eq!(cpumask(Some(5)), "20");
        assert_eq!(cpumask(Some(12)), "1000");
    }
}
