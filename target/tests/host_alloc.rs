//! The host library's I/O path allocates nothing per command once warm: buffers circulate
//! between the caller's pool and the queue, the send and receive buffers are reused. Counted
//! with a global allocator that counts only on the host's own thread (the target's reactors
//! run in this process too).
#![allow(clippy::unwrap_used)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use common::*;
use pollux_host::{Data, sqe};

struct Counting;

thread_local! {
    /// Allocations made by this thread while counting is on; `None` when off.
    static ALLOCS: Cell<Option<u64>> = const { Cell::new(None) };
}

fn count() {
    let _ = ALLOCS.try_with(|c| {
        if let Some(n) = c.get() {
            c.set(Some(n + 1));
        }
    });
}

// SAFETY: every method forwards to the system allocator with the caller's arguments
// unchanged, so the GlobalAlloc contract is the system allocator's; counting touches only a
// const-initialized thread-local Cell without destructor, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded unchanged; the caller upholds `alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged; `ptr` came from this allocator, i.e. from System.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded unchanged; `ptr` came from System with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn steady_state_io_allocates_nothing_on_the_host() {
    let t = start("");
    let mut c = controller(addr(&t), 1);
    let q = &mut c.io[0];
    const QD: usize = 16;
    let write_data = pattern(1, 0, 16384);
    // Buffers for every command in flight, reused from completion to submission.
    let mut pool: Vec<Vec<u8>> = (0..QD).map(|_| Vec::with_capacity(16384)).collect();
    let run = |q: &mut pollux_host::HostQueue, ops: u64, pool: &mut Vec<Vec<u8>>| {
        let (mut sent, mut done) = (0u64, 0u64);
        while done < ops {
            while sent < ops && q.free_slots() > 0 && !pool.is_empty() {
                let Some(mut b) = pool.pop() else { break };
                b.clear();
                let lba = (sent % 512) * 32;
                // 4 KiB reads, 4 KiB in-capsule writes, 16 KiB writes by R2T, flushes.
                match sent % 4 {
                    0 => {
                        b.resize(4096, 0);
                        q.submit_read(1, lba, 8, b, sent).unwrap();
                    }
                    1 => {
                        b.extend_from_slice(&write_data[..4096]);
                        q.submit_write(1, lba, 8, b, sent).unwrap();
                    }
                    2 => {
                        b.extend_from_slice(&write_data);
                        q.submit_write(1, lba, 32, b, sent).unwrap();
                    }
                    _ => {
                        pool.push(b);
                        q.submit(sqe::flush(1), Data::None, sent).unwrap();
                    }
                }
                sent += 1;
            }
            done += q
                .poll_completions(Some(Duration::from_secs(5)), |cpl| {
                    assert!(cpl.is_success());
                    if cpl.buf.capacity() > 0 {
                        pool.push(cpl.buf);
                    }
                })
                .unwrap() as u64;
        }
    };
    // The counter counts.
    ALLOCS.with(|c| c.set(Some(0)));
    drop(std::hint::black_box(vec![1u8; 64]));
    assert_eq!(ALLOCS.with(|c| c.replace(None)), Some(1));
    // Warm up: buffers reach their high-water marks.
    run(q, 2000, &mut pool);
    ALLOCS.with(|c| c.set(Some(0)));
    run(q, 4000, &mut pool);
    let n = ALLOCS.with(|c| c.replace(None)).unwrap_or(0);
    assert_eq!(n, 0, "{n} allocations in 4000 commands at queue depth {QD}");
    drop(c);
    t.shutdown().unwrap();
}
