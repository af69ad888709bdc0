//! Writing a [`Config`] back as TOML.

use std::fmt::Write;

use crate::nqn::{format_uuid, hex};
use crate::size::format_size;
use crate::{Backend, Config};

/// A TOML string literal for `s`, escaped by the toml crate itself so any
/// NQN (which may hold arbitrary UTF-8 after the colon) survives.
fn quote(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
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

    let r = &c.reactors;
    let cores: Vec<String> = r.cores.iter().map(ToString::to_string).collect();
    let _ = writeln!(o, "[reactors]");
    let _ = writeln!(o, "cores = [{}]", cores.join(", "));
    let _ = writeln!(o, "mode = {}", quote(r.mode.as_str()));
    let _ = writeln!(o, "stall_threshold_us = {}", r.stall_threshold_us);
    let _ = writeln!(o, "placement = {}", quote(r.placement.as_str()));

    for l in &c.listeners {
        let _ = writeln!(o, "\n[[listener]]");
        let _ = writeln!(o, "address = {}", quote(&l.address.to_string()));
    }

    let t = &c.transport;
    let _ = writeln!(o, "\n[transport]");
    let _ = writeln!(o, "io_queue_depth = {}", t.io_queue_depth);
    let _ = writeln!(o, "max_io_queues = {}", t.max_io_queues);
    let _ = writeln!(o, "in_capsule_data_size = {}", t.in_capsule_data_size);
    let _ = writeln!(o, "max_io_size = {}", t.max_io_size);
    let _ = writeln!(o, "max_h2c_data = {}", t.max_h2c_data);

    let k = &c.keep_alive;
    let _ = writeln!(o, "\n[keep_alive]");
    let _ = writeln!(o, "min_ms = {}", k.min_ms);
    let _ = writeln!(o, "max_ms = {}", k.max_ms);

    for s in &c.subsystems {
        let _ = writeln!(o, "\n[[subsystem]]");
        let _ = writeln!(o, "nqn = {}", quote(&s.nqn));
        let _ = writeln!(o, "serial = {}", quote(&s.serial));
        let _ = writeln!(o, "model = {}", quote(&s.model));
        let _ = writeln!(o, "allow_any_host = {}", s.allow_any_host);
        let hosts: Vec<String> = s.hosts.iter().map(|h| quote(h)).collect();
        let _ = writeln!(o, "hosts = [{}]", hosts.join(", "));
        for n in &s.namespaces {
            let _ = writeln!(o, "\n[[subsystem.namespace]]");
            let _ = writeln!(o, "nsid = {}", n.nsid);
            let _ = writeln!(o, "block_size = {}", n.block_size);
            match &n.backend {
                Backend::Ram { size } => {
                    let _ = writeln!(o, "backend = {{ ram = {{ size = {} }} }}", quote(&format_size(*size)));
                }
            }
            let _ = writeln!(o, "uuid = {}", quote(&format_uuid(&n.uuid)));
            let _ = writeln!(o, "nguid = {}", quote(&hex(&n.nguid)));
            let _ = writeln!(o, "eui64 = {}", quote(&hex(&n.eui64)));
        }
    }
    o
}
