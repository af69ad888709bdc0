//! Shutdown leaves nothing behind. In its own test binary (its own process) so that fd and
//! thread counts are not disturbed by other tests running in parallel.
#![allow(missing_docs, clippy::unwrap_used)]

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

mod common;
use common::{cfg, start};
use pollux_reactor::sys::EventFd;
use pollux_reactor::{Mode, Progress, Reactor, Runtime, Source, SourceId, SourceOpts};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn shutdown_joins_every_thread_and_leaks_no_fd() {
    // Warm up anything lazily allocated (e.g. by the test harness) first.
    start(&[Mode::Interrupt]).shutdown().unwrap();
    let before = open_fds();
    let dropped = Arc::new(AtomicUsize::new(0));
    struct Dropper(Arc<AtomicUsize>, #[allow(dead_code)] EventFd);
    impl Source for Dropper {
        fn name(&self) -> &str {
            "dropper"
        }
        fn run(&mut self, _r: &mut Reactor, _id: SourceId) -> Progress {
            Progress::IDLE
        }
    }
    impl Drop for Dropper {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
        }
    }
    let d = dropped.clone();
    let rt = Runtime::start(
        vec![cfg(Mode::Poll), cfg(Mode::Hybrid), cfg(Mode::Interrupt)],
        Arc::new(move |r: &mut Reactor| {
            let e = EventFd::new().map_err(|e| e.to_string())?;
            let fd = e.as_raw_fd();
            r.add_source(Box::new(Dropper(d.clone(), e)), SourceOpts::readable(fd))
                .map_err(|e| e.to_string())?;
            Ok(())
        }),
    )
    .unwrap();
    assert!(open_fds() > before);
    rt.shutdown().unwrap();
    assert_eq!(dropped.load(SeqCst), 3, "every source dropped");
    assert_eq!(open_fds(), before, "every fd closed");
    // No thread named reactor-* is left. pthread_join returns when the kernel clears the
    // thread's tid, which is before the task leaves /proc/self/task: give it a moment.
    let reactor_threads = || -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).ok())
            .filter(|n| n.starts_with("reactor-"))
            .collect()
    };
    let t0 = std::time::Instant::now();
    while !reactor_threads().is_empty() && t0.elapsed() < std::time::Duration::from_secs(2) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(reactor_threads(), Vec::<String>::new());
}
