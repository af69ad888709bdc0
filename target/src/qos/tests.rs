#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use super::*;
use crate::nvm::Io;
use crate::subsystem::test_namespace;

const T0: u64 = 1_000_000_000_000;
const MS: u64 = 1_000_000;

#[test]
fn an_idle_bucket_serves_its_burst_at_once_then_one_cost_apart() {
    // 1000 commands a second: 1 ms each; the burst is 10 ms of it plus the one that starts it.
    let b = Bucket::new(1000);
    let at: Vec<u64> = (0..14).map(|_| b.take(1, T0)).collect();
    let burst = (BURST_NS / MS + 1) as usize;
    assert!(at[..burst].iter().all(|&t| t <= T0), "{at:?}");
    for (k, &t) in at.iter().enumerate().skip(burst) {
        assert_eq!(t, T0 + (k as u64 - 10) * MS, "command {k}");
    }
}

#[test]
fn it_refills_with_time_but_saves_no_more_than_the_burst() {
    let b = Bucket::new(1000);
    for _ in 0..100 {
        b.take(1, T0);
    }
    // 100 ms of debt: a command at T0 + 50 ms waits until the debt is within the burst.
    assert_eq!(b.take(1, T0 + 50 * MS), T0 + 90 * MS);
    // A second of idleness later the debt is paid: at once, and the burst is again only
    // 11 commands, not the thousand the idle second could have served.
    let now = T0 + 2_000 * MS;
    let at_once = (0..1000).take_while(|_| b.take(1, now) <= now).count();
    assert_eq!(at_once, 11);
}

#[test]
fn over_a_window_the_rate_is_the_limit_plus_the_burst() {
    // Commands arriving faster than the limit (a QD32 host): those released within one
    // second of the first are the rate plus the burst, whatever the arrival pattern.
    let b = Bucket::new(2500);
    let mut released = 0;
    let mut now = T0;
    for k in 0..100_000u64 {
        now = T0 + k * 20_000; // one arrival every 20 us: 20 times the limit, for 2 s
        if b.take(1, now) <= T0 + 1_000 * MS {
            released += 1;
        }
    }
    assert!(now > T0 + 1_000 * MS);
    assert_eq!(released, 2500 + 25 + 1);
}

#[test]
fn bytes_cost_their_share_of_a_mib_rate_rounded_up() {
    let b = Bucket::new(Qos::MIB); // 1 MiB/s
    // 4 KiB is 1/256 s = 3.90625 ms: three start within the 10 ms burst and run at once, the
    // fourth waits until the debt is down to 10 ms.
    let at: Vec<u64> = (0..4).map(|_| b.take(4096, T0)).collect();
    assert!(at[..3].iter().all(|&t| t <= T0), "{at:?}");
    assert_eq!(at[3], T0 + 3 * 3_906_250 - BURST_NS);
    // A command larger than the burst runs when the bucket is idle, and its debt is paid by
    // those after it: the long-run rate holds.
    let big = Bucket::new(Qos::MIB);
    assert!(big.take(1 << 20, T0) <= T0);
    assert_eq!(big.take(4096, T0), T0 + 1_000 * MS - BURST_NS);
    // Rounding up: 3 commands a second cost 333333334 ns, never less.
    let odd = Bucket::new(3);
    for _ in 0..1000 {
        odd.take(1, T0);
    }
    assert_eq!(odd.tat.load(Ordering::Relaxed), T0 + 1000 * 333_333_334);
}

#[test]
fn no_limit_and_nothing_to_take_cost_nothing() {
    let b = Bucket::new(0);
    assert_eq!(b.take(1 << 20, T0), 0);
    let b = Bucket::new(10);
    assert_eq!(b.take(0, T0), 0);
    assert_eq!(b.tat.load(Ordering::Relaxed), 0);
}

#[test]
fn consumers_on_many_threads_share_one_budget_without_losing_a_take() {
    // Four threads (reactors) take 5000 commands each from one bucket at one instant: every
    // take lands (no lost compare-and-swap), and the times handed out are exactly the
    // sequence one thread alone would have got: one cost apart, none twice.
    let b = Arc::new(Bucket::new(100_000)); // 10 us a command
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let b = b.clone();
            std::thread::spawn(move || (0..5000).map(|_| b.take(1, T0)).collect::<Vec<u64>>())
        })
        .collect();
    let mut all: Vec<u64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    all.sort_unstable();
    assert_eq!(b.tat.load(Ordering::Relaxed), T0 + 20_000 * 10_000);
    let burst = (BURST_NS / 10_000 + 1) as usize;
    assert!(all[..burst].iter().all(|&t| t <= T0));
    for (k, &t) in all.iter().enumerate().skip(burst) {
        assert_eq!(t, T0 + k as u64 * 10_000 - BURST_NS, "take {k}");
    }
}

#[test]
fn a_command_waits_for_the_slowest_of_its_limits() {
    let q = NsQos::new(&Qos {
        iops: Some(1000),
        mbps: Some(1),
        ..Qos::default()
    });
    assert!(q.is_on());
    // 64 KiB at 1 MiB/s is 62.5 ms of bytes, 1 ms of commands: the bytes decide.
    let read = Cost {
        cmds: 1,
        read: 65536,
        write: 0,
    };
    assert!(q.take(read, T0) <= T0);
    assert_eq!(q.take(read, T0), T0 + 62_500_000 - BURST_NS);
    // A write limit does not hold reads.
    let w = NsQos::new(&Qos {
        write_mbps: Some(1),
        ..Qos::default()
    });
    for _ in 0..100 {
        assert!(w.take(read, T0) <= T0);
    }
    let write = Cost {
        cmds: 1,
        read: 0,
        write: 65536,
    };
    assert!(w.take(write, T0) <= T0);
    assert!(w.take(write, T0) > T0);
}

#[test]
fn limits_are_set_in_place_with_a_new_generation_and_cleared() {
    let q = NsQos::default();
    assert!(!q.is_on());
    assert_eq!(q.limits(), Qos::default());
    let g0 = q.generation();
    let lim = Qos {
        iops: Some(5),
        mbps: Some(7),
        read_mbps: Some(3),
        write_mbps: Some(2),
    };
    q.set(&lim);
    assert!(q.is_on());
    assert_eq!(q.limits(), lim);
    assert_eq!(q.generation(), g0 + 1);
    // Debt under the old limits is forgiven by a new setting.
    let one = Cost {
        cmds: 1,
        ..Cost::default()
    };
    for _ in 0..10 {
        q.take(one, T0);
    }
    assert!(q.take(one, T0) > T0);
    q.set(&Qos {
        iops: Some(5),
        ..Qos::default()
    });
    assert!(q.take(one, T0) <= T0);
    q.set(&Qos::default());
    assert!(!q.is_on());
    assert_eq!(q.generation(), g0 + 3);
    assert_eq!(q.take(one, T0), 0);
}

#[test]
fn what_each_command_costs() {
    let ns = test_namespace(1, 64);
    let cost = |io: &Io| io.qos_cost();
    let read = Io::Read {
        ns: ns.clone(),
        off: 0,
        len: 4096,
    };
    assert_eq!(
        cost(&read),
        Some(Cost {
            cmds: 1,
            read: 4096,
            write: 0
        })
    );
    let write = Io::Write {
        ns: ns.clone(),
        off: 0,
        len: 512,
        fua: false,
    };
    assert_eq!(
        cost(&write),
        Some(Cost {
            cmds: 1,
            read: 0,
            write: 512
        })
    );
    let zeroes = Io::WriteZeroes {
        ns: ns.clone(),
        off: 0,
        len: 1 << 30,
    };
    assert_eq!(
        cost(&zeroes),
        Some(Cost {
            cmds: 1,
            ..Cost::default()
        })
    );
    assert_eq!(cost(&Io::Flush { ns: Some(ns.clone()) }), None);
    assert_eq!(cost(&Io::Flush { ns: None }), None);
    assert_eq!(cost(&Io::ReservationReport { ns, len: 4096 }), None);
}
