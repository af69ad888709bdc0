//! The tables and listings `pollux ctl` prints for people (`--json` prints the raw result).

use std::fmt::Write as _;

use super::view::{CtrlList, DiscoveryView, ReactorView, SubsystemView};

/// Columns padded to their widest cell; the first row is the header.
pub fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            let _ = write!(line, "{cell:<w$}  ", w = widths[c]);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A duration in ns, short: `850ns`, `12.3us`, `4.1ms`.
pub fn ns(v: u64) -> String {
    match v {
        0 => "-".into(),
        v if v < 1_000 => format!("{v}ns"),
        v if v < 1_000_000 => format!("{:.1}us", v as f64 / 1e3),
        v if v < 1_000_000_000 => format!("{:.1}ms", v as f64 / 1e6),
        v => format!("{:.2}s", v as f64 / 1e9),
    }
}

/// A byte count, short.
pub fn bytes(v: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = v as f64;
    let mut i = 0;
    while x >= 1024.0 && i < U.len() - 1 {
        x /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v}B")
    } else {
        format!("{x:.1}{}", U[i])
    }
}

fn opt(v: Option<u64>) -> String {
    v.map_or("-".into(), |x| x.to_string())
}

/// The columns of the default reactors table, which fits 120 columns (`--wide`: all of
/// them).
const ESSENTIAL: [&str; 14] = [
    "REACTOR",
    "CORE",
    "MODE",
    "BUDGET",
    "POLL%",
    "HYBRID%",
    "CPU%",
    "BUSY%",
    "IOPS",
    "OUTST",
    "QUEUES",
    "CTRLS",
    "PREDICTED",
    "STALLS",
];

/// The reactors table: the essential columns, or all 28 when `wide`. QUEUES counts every
/// open connection (bound or still connecting), CTRLS the admin queues (the controllers the
/// reactor owns) and IOQ the I/O queues.
pub fn format_reactors(rs: &[ReactorView], wide: bool) -> String {
    let header = [
        "REACTOR",
        "CORE",
        "MODE",
        "ADAPTIVE",
        "BUDGET",
        "POLL%",
        "HYBRID%",
        "INTR%",
        "SWITCHES",
        "HELD%",
        "CPU%1S",
        "CPU%",
        "BUSY%",
        "ITERATIONS",
        "IOPS",
        "CMDS",
        "OUTST",
        "QUEUES",
        "CTRLS",
        "IOQ",
        "PREDICTED",
        "WAKECOST",
        "HYBSPIN",
        "LATE_P50/P99_US",
        "STALLS",
        "REQ_DATA/PARK/SUB/DRAIN/HELD",
        "OPEN",
        "AERS",
    ];
    let keep: Vec<bool> = header.iter().map(|h| wide || ESSENTIAL.contains(h)).collect();
    let pick = |row: Vec<String>| -> Vec<String> {
        row.into_iter()
            .zip(&keep)
            .filter(|(_, k)| **k)
            .map(|(c, _)| c)
            .collect()
    };
    let mut rows = vec![pick(header.map(String::from).to_vec())];
    for r in rs {
        rows.push(pick(vec![
            r.id.to_string(),
            r.core.map_or("-".into(), |c| c.to_string()),
            r.mode.clone(),
            if r.adaptive { "on" } else { "off" }.into(),
            format!("{:.2}", r.cpu_budget),
            format!("{:.1}", r.mode_pct.poll),
            format!("{:.1}", r.mode_pct.hybrid),
            format!("{:.1}", r.mode_pct.interrupt),
            r.switches.to_string(),
            format!("{:.1}{}", r.held_pct, if r.held { "*" } else { "" }),
            format!("{:.1}", r.cpu_pct_1s),
            format!("{:.1}", r.cpu_pct),
            format!("{:.1}", r.busy_pct),
            r.iterations.to_string(),
            format!("{:.0}", r.iops),
            r.commands.to_string(),
            r.outstanding.to_string(),
            r.connections.to_string(),
            r.admin_queues.to_string(),
            r.io_queues.to_string(),
            ns(r.predicted_ns),
            ns(r.wake_cost_ns),
            ns(r.hybrid_spin_ns),
            format!("{}/{}", opt(r.wake_late_us.p50), opt(r.wake_late_us.p99)),
            r.stalls.to_string(),
            {
                let q = &r.requests;
                format!(
                    "{}/{}/{}/{}/{}",
                    q.awaiting_data, q.parked, q.submitted, q.draining, q.held
                )
            },
            r.requests.open().to_string(),
            r.requests.aers.to_string(),
        ]));
    }
    table(&rows)
}

/// The per-class estimates behind each reactor's PREDICTED (`pollux ctl estimates`): WEIGHT
/// is the class's completions in the last policy window. Its own table, so that the
/// reactors table keeps one row per reactor for scripts that read it.
pub fn format_classes(rs: &[ReactorView]) -> String {
    let mut rows = vec![
        ["REACTOR", "CHANNEL", "OP", "SIZE", "ESTIMATE", "COMPLETIONS", "WEIGHT"]
            .map(String::from)
            .to_vec(),
    ];
    for r in rs {
        for c in &r.classes {
            rows.push(vec![
                r.id.to_string(),
                c.channel.clone(),
                c.op.clone(),
                c.size.clone(),
                ns(c.estimate_ns),
                c.completions.to_string(),
                c.window_completions.to_string(),
            ]);
        }
    }
    if rows.len() == 1 {
        return "no latency estimates yet (no device channel has completed a command)\n".into();
    }
    table(&rows)
}

/// The subsystems listing: one block per subsystem.
pub fn format_subsystems(ss: &[SubsystemView]) -> String {
    let mut out = String::new();
    for s in ss {
        let hosts = if s.allow_any_host {
            "any".to_string()
        } else {
            s.hosts.join(", ")
        };
        let _ = writeln!(out, "{}", s.nqn);
        let _ = writeln!(
            out,
            "  serial {}  model {}  controllers {}",
            s.serial, s.model, s.controllers
        );
        let _ = writeln!(out, "  hosts {hosts}");
        if (s.min_cntlid, s.max_cntlid) != (pollux_conf::MIN_CNTLID, pollux_conf::MAX_CNTLID) {
            let _ = writeln!(out, "  controller ids {}..={}", s.min_cntlid, s.max_cntlid);
        }
        if !s.dhchap_hosts.is_empty() {
            let _ = writeln!(out, "  dhchap {}", s.dhchap_hosts.join(", "));
        }
        if !s.tls_hosts.is_empty() {
            let _ = writeln!(out, "  tls psk {}", s.tls_hosts.join(", "));
        }
        if s.secure_concat {
            // Spelled as the conf key, shown only when set (as the controller ID range).
            let _ = writeln!(out, "  secure_concat true");
        }
        if s.paths.is_empty() {
            let _ = writeln!(out, "  listeners {}", s.listeners.join(", "));
        } else {
            // Each listener serving it, with the ANA state there of each of its groups.
            let mut rows = vec![["LISTENER", "TLS", "ANA (group:state)"].map(String::from).to_vec()];
            for p in &s.paths {
                let ana: Vec<String> = p.ana.iter().map(|(g, st)| format!("{g}:{st}")).collect();
                rows.push(vec![
                    p.address.clone(),
                    p.tls.clone(),
                    if ana.is_empty() { "-".into() } else { ana.join(" ") },
                ]);
            }
            for l in table(&rows).lines() {
                let _ = writeln!(out, "  {l}");
            }
        }
        let mut rows = vec![
            [
                "NSID", "SIZE", "BLOCK", "BACKEND", "IO PATH", "POLLING", "RESV", "UUID", "READS", "WRITES", "READ",
                "WRITTEN", "R_P50", "R_P99", "W_P50", "W_P99",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for n in &s.namespaces {
            rows.push(vec![
                n.nsid.to_string(),
                bytes(n.size),
                n.block_size.to_string(),
                n.backend.clone(),
                n.io_path.clone(),
                if n.polling.is_empty() {
                    "-".into()
                } else {
                    n.polling.clone()
                },
                if n.reservations.is_empty() {
                    "-".into()
                } else {
                    n.reservations.clone()
                },
                n.uuid.clone(),
                n.read_cmds.to_string(),
                n.write_cmds.to_string(),
                bytes(n.read_bytes),
                bytes(n.write_bytes),
                ns(n.read_latency.p50_ns),
                ns(n.read_latency.p99_ns),
                ns(n.write_latency.p50_ns),
                ns(n.write_latency.p99_ns),
            ]);
        }
        for l in table(&rows).lines() {
            let _ = writeln!(out, "  {l}");
        }
        for v in &s.vanished {
            let _ = writeln!(out, "  namespace {} removed: {}", v.nsid, v.why);
        }
        // Masked namespaces: the hosts they are attached to (the others see them not).
        for n in &s.namespaces {
            match n.hosts.as_deref() {
                None => {}
                Some([]) => {
                    let _ = writeln!(out, "  namespace {} attached to no host", n.nsid);
                }
                Some(hs) => {
                    let _ = writeln!(out, "  namespace {} attached only to {}", n.nsid, hs.join(", "));
                }
            }
        }
        for n in &s.namespaces {
            if let Some(r) = &n.rbd {
                let _ = writeln!(
                    out,
                    "  namespace {} rbd {} (id {}) cluster {} ({}): {}, {} ops, {} unavailable, {} errors, {} overdue; cache {}, lock {}",
                    n.nsid,
                    r.image,
                    r.image_id,
                    r.fsid,
                    r.ceph_conf,
                    r.health,
                    r.ops,
                    r.unavailable,
                    r.errors,
                    r.overdue,
                    if r.write_cache { "writeback" } else { "off" },
                    match (r.exclusive_lock, r.lock_owner) {
                        (false, _) => "none (no exclusive-lock feature)",
                        (true, true) => "held here",
                        (true, false) => "not held here",
                    }
                );
            }
        }
        for n in &s.namespaces {
            if let Some(q) = &n.qos {
                // The limits as the conf's keys (MiB/s), and what they held.
                let _ = writeln!(
                    out,
                    "  namespace {} qos {} (held {} commands so far)",
                    n.nsid,
                    q.limits_text(),
                    q.held
                );
            }
        }
        for n in s.namespaces.iter().filter(|n| !n.reservation.is_empty()) {
            let _ = writeln!(out, "  namespace {} reservation: {}", n.nsid, n.reservation);
        }
    }
    if ss.is_empty() {
        out.push_str("no subsystems (discovery only)\n");
    }
    out
}

/// The discovery view: one line each.
pub fn format_discovery(d: &DiscoveryView) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "genctr {}  controllers {}", d.genctr, d.controllers);
    let _ = writeln!(out, "listeners {}", d.listeners.join(", "));
    let referrals = if d.referrals.is_empty() {
        "none".to_string()
    } else {
        d.referrals.join(", ")
    };
    let _ = writeln!(out, "referrals {referrals}");
    out
}

/// The controllers table.
pub fn format_controllers(c: &CtrlList) -> String {
    let mut rows = vec![
        [
            "CNTLID",
            "SUBSYSTEM",
            "HOSTNQN",
            "HOSTID",
            "KATO_MS",
            "READY",
            "ADMIN",
            "IO_QUEUES(qid:reactor)",
            "AGE_S",
            "AUTH",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for x in &c.controllers {
        let q: Vec<String> = x.io_queues.iter().map(|(q, r)| format!("{q}:{r}")).collect();
        rows.push(vec![
            x.cntlid.to_string(),
            x.subsystem.clone(),
            x.hostnqn.clone(),
            x.hostid.clone(),
            x.kato_ms.to_string(),
            if x.ready { "yes" } else { "no" }.into(),
            x.admin_reactor.to_string(),
            if q.is_empty() { "-".into() } else { q.join(",") },
            format!("{:.0}", x.age_s),
            x.authenticated.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    let mut out = if c.controllers.is_empty() {
        "no controllers\n".to_string()
    } else {
        table(&rows)
    };
    if !c.unanswered.is_empty() {
        let _ = writeln!(
            out,
            "warning: reactors {:?} did not answer; their controllers are missing",
            c.unanswered
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::view::{Lateness, PerMode};

    /// A reactor with every figure as wide as a long-running, loaded target makes it.
    fn busy_reactor(id: usize) -> ReactorView {
        ReactorView {
            id,
            core: Some(127),
            mode: "interrupt".into(),
            adaptive: true,
            cpu_budget: 0.3,
            mode_ns: PerMode::from_array([u64::MAX / 4; 3]),
            mode_pct: PerMode::from_array([33.3, 33.3, 100.0]),
            switches: 123_456_789,
            held: true,
            held_pct: 100.0,
            cpu_ns: u64::MAX / 4,
            cpu_pct_1s: 100.0,
            cpu_pct: 100.0,
            busy_ns: u64::MAX / 4,
            busy_pct: 100.0,
            iterations: 18_446_744_073_709,
            iops: 12_345_678.0,
            commands: 98_765_432_109_876,
            outstanding: 65_536,
            device_completions: 98_765_432_109_876,
            predicted_ns: 999_999_999,
            classes: vec![],
            wake_cost_ns: 999_999,
            hybrid_spin_ns: 999_999,
            wakeups: 1 << 40,
            wake_late_us: Lateness {
                p50: Some(123_456),
                p90: Some(1_234_567),
                p99: Some(12_345_678),
            },
            stalls: 123_456_789,
            sources: 4096,
            connections: 4096,
            admin_queues: 4096,
            io_queues: 4096,
            closed: Default::default(),
            requests: Default::default(),
        }
    }

    #[test]
    fn the_default_reactors_table_fits_120_columns_and_wide_has_all_28() {
        let rs = [busy_reactor(0), busy_reactor(1)];
        let t = format_reactors(&rs, false);
        for l in t.lines() {
            assert!(l.chars().count() <= 120, "{} columns: {l}", l.chars().count());
        }
        let header: Vec<&str> = t.lines().next().unwrap_or_default().split_whitespace().collect();
        assert_eq!(header, ESSENTIAL, "{t}");
        assert_eq!(t.lines().count(), 3);
        let w = format_reactors(&rs, true);
        let header: Vec<&str> = w.lines().next().unwrap_or_default().split_whitespace().collect();
        assert_eq!(header.len(), 28, "{w}");
        // All 28 do not fit.
        assert!(w.lines().any(|l| l.chars().count() > 120), "{w}");
        assert!(w.lines().nth(1).is_some_and(|l| l.contains("123456789")), "{w}");
    }
}
