//! Writing a [`Config`] back as TOML.

use std::fmt::Write;

use crate::nqn::{format_uuid, hex};
use crate::size::format_size;
use std::path::PathBuf;

use crate::{Backend, Config, Dhchap, HostKeys, Latency, NvmeBackend, NvmeDevice, RBD_OP_TIMEOUT_S, TlsKey, TlsMode};

/// A TOML string literal for `s`, escaped by the toml crate itself so any
/// NQN (which may hold arbitrary UTF-8 after the colon) survives.
fn quote(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// A TOML float that parses back to exactly `x`: Rust's `{:?}` writes the
/// shortest text that reads back to the same `f64`, always with a `.` or an
/// exponent (`80.0`, `0.1`, `1e-7`, `1e300`), which is TOML float syntax.
/// Non-finite values (never produced by validation) use TOML's spellings.
fn float(x: f64) -> String {
    if x.is_nan() {
        "nan".into()
    } else if x.is_infinite() {
        if x > 0.0 { "inf".into() } else { "-inf".into() }
    } else {
        format!("{x:?}")
    }
}

/// A latency distribution as an inline table.
fn latency(l: &Latency) -> String {
    match *l {
        Latency::Fixed { us } => format!("{{ fixed_us = {} }}", float(us)),
        Latency::Uniform { min_us, max_us } => {
            format!("{{ min_us = {}, max_us = {} }}", float(min_us), float(max_us))
        }
        Latency::LogNormal { median_us, sigma } => {
            format!("{{ median_us = {}, sigma = {} }}", float(median_us), float(sigma))
        }
        Latency::Bimodal {
            fast_us,
            slow_us,
            slow_fraction,
        } => format!(
            "{{ fast_us = {}, slow_us = {}, slow_fraction = {} }}",
            float(fast_us),
            float(slow_us),
            float(slow_fraction)
        ),
    }
}

/// A path as a TOML string. Paths that are not UTF-8 cannot be written in
/// TOML; they are written lossily.
fn path(p: &std::path::Path) -> String {
    quote(&p.to_string_lossy())
}

pub(crate) fn to_toml(c: &Config) -> String {
    let mut o = String::new();
    // `write!` to a String cannot fail; the results are ignored for brevity.
    // The origin is escaped: a file name may hold a newline, which would end
    // the comment.
    let _ = writeln!(
        o,
        "# pollux configuration, written by pollux-conf from {}",
        c.origin.escape_debug()
    );
    let _ = writeln!(o);
    // A bare key: before the first table.
    if let Some(d) = &c.state_dir {
        let _ = writeln!(o, "state_dir = {}\n", path(d));
    }

    let r = &c.reactors;
    let cores: Vec<String> = r.cores.iter().map(ToString::to_string).collect();
    let _ = writeln!(o, "[reactors]");
    let _ = writeln!(o, "cores = [{}]", cores.join(", "));
    let _ = writeln!(o, "mode = {}", quote(r.mode.as_str()));
    let _ = writeln!(o, "stall_threshold_us = {}", r.stall_threshold_us);
    let _ = writeln!(o, "placement = {}", quote(r.placement.as_str()));
    let _ = writeln!(o, "cpu_budget = {}", float(r.cpu_budget));
    if let Some(t) = r.latency_target_us {
        let _ = writeln!(o, "latency_target_us = {}", float(t));
    }
    let _ = writeln!(o, "policy = {}", quote(r.policy.as_str()));
    if let Some(m) = r.hybrid_margin_us {
        let _ = writeln!(o, "hybrid_margin_us = {}", float(m));
    }
    let _ = writeln!(o, "hybrid_turnaround = {}", quote(r.hybrid_turnaround.as_str()));

    for l in &c.listeners {
        let _ = writeln!(o, "\n[[listener]]");
        let _ = writeln!(o, "address = {}", quote(&l.address.to_string()));
        if l.tls != TlsMode::None {
            let _ = writeln!(o, "tls = {}", quote(l.tls.as_str()));
        }
        if !l.ana.is_empty() {
            let states: Vec<String> = l
                .ana
                .iter()
                .map(|(g, s)| format!("{g} = {}", quote(s.name())))
                .collect();
            let _ = writeln!(o, "ana = {{ {} }}", states.join(", "));
        }
        if let Some(n) = l.max_connections {
            let _ = writeln!(o, "max_connections = {n}");
        }
    }

    for r in &c.referrals {
        let _ = writeln!(o, "\n[[referral]]");
        let _ = writeln!(o, "address = {}", quote(&r.address.to_string()));
    }

    let t = &c.transport;
    let _ = writeln!(o, "\n[transport]");
    let _ = writeln!(o, "io_queue_depth = {}", t.io_queue_depth);
    if let Some(n) = t.max_io_queues {
        let _ = writeln!(o, "max_io_queues = {n}");
    }
    let _ = writeln!(o, "in_capsule_data_size = {}", t.in_capsule_data_size);
    let _ = writeln!(o, "max_io_size = {}", t.max_io_size);
    let _ = writeln!(o, "max_h2c_data = {}", t.max_h2c_data);
    let _ = writeln!(o, "max_connections = {}", t.max_connections);
    let _ = writeln!(o, "setup_timeout_ms = {}", t.setup_timeout_ms);

    let k = &c.keep_alive;
    let _ = writeln!(o, "\n[keep_alive]");
    let _ = writeln!(o, "min_ms = {}", k.min_ms);
    let _ = writeln!(o, "max_ms = {}", k.max_ms);

    let ctl = &c.control;
    if !ctl.socket_is_default || ctl.metrics.is_some() {
        let _ = writeln!(o, "\n[control]");
        match &ctl.socket {
            _ if ctl.socket_is_default => {}
            Some(s) => {
                let _ = writeln!(o, "socket = {}", path(s));
            }
            None => {
                let _ = writeln!(o, "socket = \"none\"");
            }
        }
        if let Some(m) = &ctl.metrics {
            let _ = writeln!(o, "metrics = {}", quote(&m.to_string()));
        }
    }

    let d = &c.discovery;
    let keys = !d.host_keys.is_empty() || !d.tls_keys.is_empty();
    if keys || d.filter != crate::DiscoveryFilter::default() {
        let _ = writeln!(o, "\n[discovery]");
    }
    if d.filter != crate::DiscoveryFilter::default() {
        let _ = writeln!(o, "filter = {}", quote(&d.filter.name()));
    }
    if keys {
        let nqns: std::collections::BTreeSet<&String> = d.host_keys.keys().chain(d.tls_keys.keys()).collect();
        let hosts: Vec<String> = nqns
            .into_iter()
            .map(|h| host_entry(h, d.host_keys.get(h), d.tls_keys.get(h)))
            .collect();
        let _ = writeln!(o, "hosts = [{}]", hosts.join(", "));
        let _ = writeln!(o, "require_authentication = {}", d.require_authentication);
        write_dhchap(&mut o, &d.dhchap);
    }

    for s in &c.subsystems {
        let _ = writeln!(o, "\n[[subsystem]]");
        let _ = writeln!(o, "nqn = {}", quote(&s.nqn));
        let _ = writeln!(o, "serial = {}", quote(&s.serial));
        let _ = writeln!(o, "model = {}", quote(&s.model));
        let _ = writeln!(o, "allow_any_host = {}", s.allow_any_host);
        let hosts: Vec<String> = s
            .hosts
            .iter()
            .map(|h| host_entry(h, s.host_keys.get(h), s.tls_keys.get(h)))
            .collect();
        let _ = writeln!(o, "hosts = [{}]", hosts.join(", "));
        write_dhchap(&mut o, &s.dhchap);
        // Only when set: the confs emitted before the key existed stay as they were.
        if s.secure_concat {
            let _ = writeln!(o, "secure_concat = true");
        }
        if !s.default_cntlid_range() {
            let _ = writeln!(o, "min_cntlid = {}", s.min_cntlid);
            let _ = writeln!(o, "max_cntlid = {}", s.max_cntlid);
        }
        if let Some(p) = s.polling {
            let _ = writeln!(o, "polling = {}", quote(p.as_str()));
        }
        if let Some(ls) = &s.listeners {
            let ls: Vec<String> = ls.iter().map(|a| quote(&a.to_string())).collect();
            let _ = writeln!(o, "listeners = [{}]", ls.join(", "));
        }
        for n in &s.namespaces {
            let _ = writeln!(o, "\n[[subsystem.namespace]]");
            let _ = writeln!(o, "nsid = {}", n.nsid);
            // A PCI NVMe namespace's block size is the device's format.
            if !matches!(
                &n.backend,
                Backend::Nvme(NvmeBackend {
                    device: NvmeDevice::Pci(_),
                    ..
                })
            ) {
                let _ = writeln!(o, "block_size = {}", n.block_size);
            }
            // Identifiers are written only where the conf gave them: derived ones are
            // derived again (and an RBD namespace's come from its cluster and image at
            // start, the same on every gateway).
            if n.given_ids.uuid {
                let _ = writeln!(o, "uuid = {}", quote(&format_uuid(&n.uuid)));
            }
            if n.given_ids.nguid {
                let _ = writeln!(o, "nguid = {}", quote(&hex(&n.nguid)));
            }
            if n.given_ids.eui64 {
                let _ = writeln!(o, "eui64 = {}", quote(&hex(&n.eui64)));
            }
            if n.ana_group != 1 {
                let _ = writeln!(o, "ana_group = {}", n.ana_group);
            }
            if let Some(p) = n.polling {
                let _ = writeln!(o, "polling = {}", quote(p.as_str()));
            }
            // Only when given: absent means every host, `[]` none.
            if let Some(hs) = &n.hosts {
                let hs: Vec<String> = hs.iter().map(|h| quote(h)).collect();
                let _ = writeln!(o, "hosts = [{}]", hs.join(", "));
            }
            if !n.qos.is_unlimited() {
                let limits: Vec<String> = n.qos.entries().iter().map(|(k, v)| format!("{k} = {v}")).collect();
                let _ = writeln!(o, "qos = {{ {} }}", limits.join(", "));
            }
            // Written last: the sim backend is a table of its own, and keys
            // after its header would belong to it.
            match &n.backend {
                Backend::Ram { size } => {
                    let _ = writeln!(o, "backend = {{ ram = {{ size = {} }} }}", quote(&format_size(*size)));
                }
                Backend::Null { size } => {
                    let _ = writeln!(o, "backend = {{ null = {{ size = {} }} }}", quote(&format_size(*size)));
                }
                Backend::File(f) => {
                    let mut keys = vec![format!("path = {}", path(&f.path))];
                    if let Some(size) = f.size {
                        keys.push(format!("size = {}", quote(&format_size(size))));
                    }
                    keys.push(format!("direct = {}", f.direct));
                    if f.shared {
                        keys.push("shared = true".into());
                    }
                    let _ = writeln!(o, "backend = {{ file = {{ {} }} }}", keys.join(", "));
                }
                Backend::Nvme(NvmeBackend { device, nsid }) => {
                    let dev = match device {
                        NvmeDevice::Pci(bdf) => format!("pci = {}", quote(bdf)),
                        NvmeDevice::Fake { name, size, latency_us } => format!(
                            "fake = {}, size = {}, latency_us = {}",
                            quote(name),
                            quote(&format_size(*size)),
                            float(*latency_us)
                        ),
                    };
                    let _ = writeln!(o, "backend = {{ nvme = {{ {dev}, nsid = {nsid} }} }}");
                }
                Backend::Rbd(r) => {
                    let mut keys = vec![
                        format!("pool = {}", quote(&r.pool)),
                        format!("image = {}", quote(&r.image)),
                    ];
                    if let Some(ns) = &r.rados_namespace {
                        keys.push(format!("rados_namespace = {}", quote(ns)));
                    }
                    keys.push(format!("ceph_conf = {}", path(&r.ceph_conf)));
                    if r.user != "admin" {
                        keys.push(format!("user = {}", quote(&r.user)));
                    }
                    if let Some(k) = &r.keyring {
                        keys.push(format!("keyring = {}", path(k)));
                    }
                    if r.write_cache {
                        keys.push("write_cache = true".into());
                    }
                    if r.take_over_group {
                        keys.push("take_over_group = true".to_owned());
                    }
                    if r.op_timeout_s != RBD_OP_TIMEOUT_S {
                        keys.push(format!("op_timeout_s = {}", r.op_timeout_s));
                    }
                    let _ = writeln!(o, "backend = {{ rbd = {{ {} }} }}", keys.join(", "));
                }
                Backend::Sim(sim) => {
                    let _ = writeln!(o, "\n[subsystem.namespace.backend.sim]");
                    let _ = writeln!(o, "size = {}", quote(&format_size(sim.size)));
                    let _ = writeln!(o, "read = {}", latency(&sim.read));
                    let _ = writeln!(o, "write = {}", latency(&sim.write));
                    let _ = writeln!(o, "per_kib_us = {}", float(sim.per_kib_us));
                    let _ = writeln!(o, "parallelism = {}", sim.parallelism);
                    if let Some(b) = sim.bandwidth {
                        let _ = writeln!(o, "bandwidth = {}", quote(&format_size(b)));
                    }
                    let _ = writeln!(o, "interrupt_delay_us = {}", float(sim.interrupt_delay_us));
                    let _ = writeln!(o, "coalesce_count = {}", sim.coalesce_count);
                    let _ = writeln!(o, "coalesce_us = {}", float(sim.coalesce_us));
                    let _ = writeln!(o, "seed = {}", sim.seed);
                }
            }
        }
    }
    o
}

/// A `hosts` entry: the NQN, or an inline table with its keys. A key read from a file is
/// written as that file, never as the secret; an inline key stays inline (it was given so).
fn host_entry(nqn: &str, keys: Option<&HostKeys>, tls: Option<&TlsKey>) -> String {
    if keys.is_none() && tls.is_none() {
        return quote(nqn);
    }
    let mut e = format!("{{ nqn = {}", quote(nqn));
    let put = |e: &mut String, name: &str, file: &Option<PathBuf>, secret: &dyn Fn() -> zeroize::Zeroizing<String>| {
        match file {
            Some(f) => e.push_str(&format!(", {name}_file = {}", path(f))),
            None => e.push_str(&format!(", {name} = {}", quote(&secret()))),
        }
    };
    if let Some(k) = keys {
        put(&mut e, "dhchap_key", &k.host.file, &|| k.host.key.encode());
        if let Some(c) = &k.ctrl {
            put(&mut e, "dhchap_ctrl_key", &c.file, &|| c.key.encode());
        }
        // The host's own lists, only when it has them; both are written (a list its entry
        // did not give holds its subsystem's, and reads back the same).
        if let Some(d) = &k.dhchap {
            let (h, g) = dhchap_lists(d);
            e.push_str(&format!(", dhchap_hashes = [{h}], dhchap_dh_groups = [{g}]"));
        }
    }
    if let Some(t) = tls {
        put(&mut e, "tls_key", &t.file, &|| t.key.encode());
        if t.key.derivation() != pollux_nvme::tls::PskDerivation::default() {
            e.push_str(&format!(", tls_key_derivation = {}", quote(t.key.derivation().name())));
        }
    }
    e.push_str(" }");
    e
}

/// `dhchap_hashes` and `dhchap_dh_groups` unless they are the defaults.
fn write_dhchap(o: &mut String, d: &Dhchap) {
    if *d != Dhchap::default() {
        let (h, g) = dhchap_lists(d);
        let _ = writeln!(o, "dhchap_hashes = [{h}]");
        let _ = writeln!(o, "dhchap_dh_groups = [{g}]");
    }
}

/// The hash and group lists of `d` as TOML array items (`"sha256", "sha512"`).
fn dhchap_lists(d: &Dhchap) -> (String, String) {
    let h: Vec<String> = d.hashes.iter().map(|h| quote(h.name())).collect();
    let g: Vec<String> = d.dh_groups.iter().map(|g| quote(g.name())).collect();
    (h.join(", "), g.join(", "))
}
