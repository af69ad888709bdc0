//! A Connect command and its data (NVMe-oF 1.1 §6.3) as a queue receives them, checked
//! against a running in-process target (an open subsystem, one admitting one host, the
//! discovery controller): the command's fields (record format, QID, SQSIZE, CATTR, KATO,
//! the SGL that must point in-capsule) and its 1024 bytes of data come from the input, the
//! NQN fields stamped with names the target knows now and then so that the checks past the
//! parse are reached. Whatever they are, a refusal with a Connect status or an accepted
//! request that is right, never a panic: an accepted Connect names an existing subsystem (or
//! the discovery NQN) that admits its host, a queue size within the limits, and the
//! NUL-terminated NQNs of its data.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use pollux_nvme::spec::{SglDescriptor, Sqe};
use pollux_target::controller::connect::{ConnectCmd, check};
use pollux_target::{Options, Target};

const OPEN: &str = "nqn.2026-12.io.pollux.fuzz:open";
const CLOSED: &str = "nqn.2026-12.io.pollux.fuzz:closed";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-000000000001";
const NAMES: [&str; 5] = [OPEN, CLOSED, HOST, "nqn.2014-08.org.nvmexpress.discovery", ""];

fn conf() -> String {
    format!(
        r#"
[reactors]
cores = [0]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:0"

[[subsystem]]
nqn = "{OPEN}"
allow_any_host = true

[[subsystem]]
nqn = "{CLOSED}"
hosts = ["{HOST}"]
"#
    )
}

fn target() -> &'static Target {
    static T: OnceLock<Target> = OnceLock::new();
    T.get_or_init(|| {
        let cfg = pollux_conf::Config::parse(&conf(), "fuzz").expect("the fuzz conf parses");
        Target::start(&cfg, Options { pin: false }).expect("the target starts")
    })
}

fn take<const N: usize>(d: &mut &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = d.len().min(N);
    out[..n].copy_from_slice(&d[..n]);
    *d = &d[n..];
    out
}

/// Write `name` NUL-terminated at `off` of the Connect data.
fn stamp(data: &mut [u8], off: usize, name: &str) {
    data[off..off + 256].fill(0);
    data[off..off + name.len()].copy_from_slice(name.as_bytes());
}

fuzz_target!(|input: &[u8]| {
    let t = target();
    let mut d = input;
    let [recfmt_lo, qid_lo, qid_hi, sq_lo, sq_hi, cattr, k0, k1, k2, k3, sel, sgl_sel] = take::<12>(&mut d);
    let c = ConnectCmd {
        recfmt: u16::from(recfmt_lo & 1),
        qid: u16::from_le_bytes([qid_lo, qid_hi & 0x3]),
        sqsize: u16::from_le_bytes([sq_lo, sq_hi]),
        cattr,
        kato: u32::from_le_bytes([k0, k1, k2, k3]),
    };
    let mut data = [0u8; 1024];
    let n = d.len().min(1024);
    data[..n].copy_from_slice(&d[..n]);
    // NVMe-oF 1.1 Figure 20: SUBNQN at 256, HOSTNQN at 512.
    if sel & 1 != 0 {
        stamp(&mut data, 256, NAMES[usize::from(sel >> 1) % NAMES.len()]);
    }
    if sel & 0x10 != 0 {
        stamp(&mut data, 512, NAMES[usize::from(sel >> 5) % NAMES.len()]);
    }
    let mut sqe: Sqe = pollux_host::sqe::connect(c.qid, c.sqsize, c.cattr, c.kato);
    sqe.set_psdt(Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
    let len = if sgl_sel & 0x80 != 0 { 1024 } else { u32::from(sgl_sel) * 8 };
    sqe.set_sgl(&if sgl_sel & 0x40 != 0 {
        SglDescriptor::transport_data_block(len)
    } else {
        SglDescriptor::in_capsule(0, len)
    });
    let body: &[u8] = if sgl_sel & 0x20 != 0 { &data[..n.min(1024)] } else { &data };
    match check(t.shared(), &sqe, c, body, None, None) {
        Err(_) => {}
        Ok(req) => {
            assert_eq!(req.qid, c.qid);
            assert!(req.entries >= 2, "an SQ of one entry accepted");
            let sub = &req.data.subnqn;
            match &req.subsys {
                None => assert_eq!(sub, "nqn.2014-08.org.nvmexpress.discovery"),
                Some(s) => {
                    assert_eq!(&s.nqn, sub);
                    assert!(s.allows(&req.data.hostnqn), "a host not allowed accepted");
                }
            }
        }
    }
});
