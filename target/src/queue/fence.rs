//! The fences of a namespace's range locks ([`crate::range_lock`]): the writes in flight
//! counted per reactor and namespace in two slots, and a locker's wait for every reactor's
//! writes started before it (the design is told there).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use pollux_reactor::Reactor;

use crate::counter::bump;
use crate::range_lock::Waiter;
use crate::subsystem::Namespace;

/// Unlock range `id` of `ns` and wake whoever waited for it: `wake` runs on each waiter's
/// reactor, by message.
pub fn unlock_and_wake(r: &mut Reactor, ns: &Namespace, id: u64, wake: fn(&mut Reactor, Waiter)) {
    for w in ns.locks.unlock(id) {
        r.send(w.reactor, move |r| wake(r, w));
    }
}

/// A write is starting on this reactor: count it in the current slot; the slot to give
/// back when it completes.
#[inline(always)]
pub fn write_started(ns: &Namespace, reactor: usize) -> u8 {
    let c = ns.counters(reactor);
    let slot = (c.write_epoch.load(Ordering::Relaxed) & 1) as u8;
    bump(&c.writes[usize::from(slot)], 1);
    slot
}

/// A write counted in `slot` completed on this reactor.
#[inline(always)]
pub fn write_done(r: &mut Reactor, ns: &Arc<Namespace>, slot: u8) {
    let c = ns.counters(r.id());
    let w = &c.writes[usize::from(slot)];
    let left = w.load(Ordering::Relaxed).saturating_sub(1);
    w.store(left, Ordering::Relaxed);
    if left == 0 && u64::from(slot) != c.write_epoch.load(Ordering::Relaxed) & 1 {
        pump(r, ns);
    }
}

/// A fence waiting on this reactor: done once every write of `ns` started here in epochs up
/// to `epoch` has completed.
struct FenceWait {
    ns: Arc<Namespace>,
    epoch: u64,
    done: Box<dyn FnOnce(&mut Reactor)>,
}

/// This reactor's waiting fences.
#[derive(Default)]
struct Fences(Vec<FenceWait>);

/// Run `done` on this reactor once the writes of `ns` that it started before now have
/// completed (at once when there are none).
pub fn fence(r: &mut Reactor, ns: Arc<Namespace>, done: Box<dyn FnOnce(&mut Reactor)>) {
    let epoch = ns.counters(r.id()).write_epoch.load(Ordering::Relaxed);
    if r.local::<Fences>().is_none() {
        r.set_local(Fences::default());
    }
    if let Some(f) = r.local::<Fences>() {
        f.0.push(FenceWait {
            ns: ns.clone(),
            epoch,
            done,
        });
    }
    pump(r, &ns);
}

/// Flip the epoch of `ns` on this reactor while the old slot is empty and a fence waits for
/// the current one, and run the fences whose writes have all completed.
fn pump(r: &mut Reactor, ns: &Arc<Namespace>) {
    let me = r.id();
    let c = ns.counters(me);
    let mut ready = Vec::new();
    loop {
        let epoch = c.write_epoch.load(Ordering::Relaxed);
        let old_empty = c.writes[((epoch + 1) & 1) as usize].load(Ordering::Relaxed) == 0;
        let cur_empty = c.writes[(epoch & 1) as usize].load(Ordering::Relaxed) == 0;
        let Some(f) = r.local::<Fences>() else { return };
        // Done: every epoch up to the fence's has drained. Epoch E's writes are in slot
        // E & 1; a flip past E + 1 needed that slot empty.
        let (mine, rest): (Vec<_>, Vec<_>) = f.0.drain(..).partition(|w| Arc::ptr_eq(&w.ns, ns));
        f.0 = rest;
        let mut waiting = Vec::new();
        for w in mine {
            let drained = epoch >= w.epoch + 2
                || (epoch == w.epoch + 1 && old_empty)
                || (epoch == w.epoch && old_empty && cur_empty);
            if drained { ready.push(w) } else { waiting.push(w) }
        }
        let flip = old_empty && waiting.iter().any(|w| w.epoch == epoch);
        f.0.extend(waiting);
        if !flip {
            break;
        }
        c.write_epoch.store(epoch + 1, Ordering::Relaxed);
    }
    for w in ready {
        (w.done)(r);
    }
}

/// What runs when every reactor has answered a fence.
type Done = Box<dyn FnOnce(&mut Reactor) + Send>;

/// Fence every reactor for `ns` and run `done` on reactor `home` when all have answered.
pub fn fence_all(r: &mut Reactor, ns: &Arc<Namespace>, home: usize, done: impl FnOnce(&mut Reactor) + Send + 'static) {
    let n = r.reactor_count().max(1);
    let left = Arc::new(AtomicUsize::new(n));
    let done: Arc<Mutex<Option<Done>>> = Arc::new(Mutex::new(Some(Box::new(done))));
    for to in 0..n {
        let (ns, left, done) = (ns.clone(), left.clone(), done.clone());
        r.send(to, move |r| {
            fence(
                r,
                ns,
                Box::new(move |r: &mut Reactor| {
                    if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                        let f = done.lock().unwrap_or_else(PoisonError::into_inner).take();
                        if let Some(f) = f {
                            r.send(home, f);
                        }
                    }
                }),
            );
        });
    }
}
