//! Property tests of the controller's DH-HMAC-CHAP exchange (`pollux_target::controller::auth`)
//! over arbitrary message sequences: Authentication Send of any bytes (garbage, truncated or
//! mutated messages, messages out of order, replays) and Receive of any length never panic
//! and never leave a queue authenticated without the host's key.
#![allow(clippy::unwrap_used)]

use pollux_conf::{Dhchap, DhchapKey, HashId, HostKeys, Secret};
use pollux_nvme::auth::msg::{Message, Negotiate, Reply};
use pollux_nvme::tls::PskIdentity;
use pollux_target::controller::auth::{AuthCtx, Concat, Outcome, QueueAuth};
use proptest::prelude::*;

const HOST: &str = "nqn.2026-11.io.pollux:prop-host";
const SUB: &str = "nqn.2026-11.io.pollux:prop-sub";

#[derive(Debug, Clone)]
enum Op {
    /// Authentication Send of these bytes.
    Send(Vec<u8>),
    /// Authentication Receive of this many bytes.
    Receive(u32),
}

/// Messages near the valid ones (so the exchange gets past parsing), and garbage.
fn message() -> impl Strategy<Value = Vec<u8>> {
    let negotiate = (
        any::<u16>(),
        prop::sample::select(vec![0u8, 1, 2, 3, 0xFF]),
        prop::collection::vec(0u8..6, 0..6),
        prop::collection::vec(0u8..8, 0..8),
    )
        .prop_map(|(t_id, sc_c, hashes, dh_groups)| {
            Message::Negotiate(Negotiate {
                t_id,
                sc_c,
                hashes,
                dh_groups,
            })
            .encode()
        });
    let reply = (
        any::<u16>(),
        any::<bool>(),
        any::<u32>(),
        prop::sample::select(vec![0usize, 256, 384, 17]),
    )
        .prop_map(|(t_id, cvalid, seq, dhlen)| {
            Message::Reply(Reply {
                t_id,
                r: vec![0x5A; 32],
                cvalid,
                seq,
                c2: vec![7; 32],
                dhv: vec![3; dhlen],
            })
            .encode()
        });
    let success2 = any::<u16>().prop_map(|t_id| Message::Success2 { t_id }.encode());
    let garbage = prop::collection::vec(any::<u8>(), 0..600);
    prop_oneof![negotiate, reply, success2, garbage]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        message().prop_map(Op::Send),
        prop::sample::select(vec![0u32, 7, 16, 100, 4096]).prop_map(Op::Receive),
        (message(), any::<usize>(), any::<u8>()).prop_map(|(mut m, i, b)| {
            if !m.is_empty() {
                let n = m.len();
                m[i % n] ^= b | 1;
            }
            Op::Send(m)
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn no_sequence_authenticates_without_the_key(ops in prop::collection::vec(op(), 1..24), tls_generated in any::<bool>()) {
        let keys = HostKeys {
            host: Secret { key: DhchapKey::generate(Some(HashId::Sha256), 32).unwrap(), file: None },
            ctrl: None,
            dhchap: None,
        };
        // Small groups only: the exponentiations run inline here.
        let policy = Dhchap {
            hashes: HashId::ALL.to_vec(),
            dh_groups: vec![pollux_conf::DhGroup::Null, pollux_conf::DhGroup::Ffdhe2048],
        };
        // Concatenation allowed, on a plain queue or one a generated PSK secures (SC_C
        // NEWTLSPSK and REPLACETLSPSK then get past the checks).
        let generated = PskIdentity::parse(format!("NVMe1G01 {HOST} {SUB} ZGlnZXN0").as_bytes()).unwrap();
        let concat = Concat { refused: None, tls: tls_generated.then_some(&generated) };
        let ctx = AuthCtx { hostnqn: HOST, subnqn: SUB, keys: Some(&keys), policy: &policy, concat };
        let mut a = QueueAuth::new(HOST, true);
        for op in ops {
            let outcome = match op {
                Op::Send(b) => a.send(&ctx, &b),
                Op::Receive(al) => match a.receive(al) {
                    Ok((data, o)) => {
                        prop_assert_eq!(data.len(), al as usize);
                        o
                    }
                    Err(s) => {
                        prop_assert_eq!((s.sct(), s.sc()), (0, 0x02));
                        Outcome::Continue
                    }
                },
            };
            match outcome {
                Outcome::Compute(job) => {
                    let done = job.run();
                    let o = a.computed(&ctx, done);
                    let authed = matches!(o, Outcome::Authenticated { .. });
                    prop_assert!(!authed, "authenticated by {:?}", o);
                }
                o => {
                    let authed = matches!(o, Outcome::Authenticated { .. });
                    prop_assert!(!authed, "authenticated by {:?}", o);
                }
            }
            prop_assert!(!a.authenticated);
            prop_assert!(!a.allows_commands());
        }
    }
}
