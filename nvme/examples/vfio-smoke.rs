//! Smoke test of the userspace NVMe driver on a real (or QEMU-emulated) controller bound to
//! vfio-pci: bring-up, Identify, one I/O queue pair, write + read-back of patterns at QD1 and
//! QD16, a PRP-list transfer from a misaligned buffer, an MDTS-split transfer, an interrupt
//! on the queue's MSI-X eventfd, shutdown.
//!
//!     vfio-smoke BDF [START_LBA]
//!
//! Exits 0 and prints "vfio-smoke: PASS" when every check passed. The blocks written from
//! START_LBA (default 0) are overwritten.
#![allow(clippy::print_stdout)]

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_nvme::pci::{
    Completion, Controller, ControllerConfig, DmaBuf, Hardware, IoRequest, Namespace, QueuePair, vfio,
};

type Res<T> = Result<T, Box<dyn Error>>;

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn buffer(hw: &Hardware, offset: usize, len: usize) -> Res<DmaBuf> {
    let r = Arc::new(hw.dma.allocate(offset + len)?);
    DmaBuf::new(r, offset, len).ok_or_else(|| "buffer out of range".into())
}

fn wait(qp: &mut QueuePair, n: usize) -> Res<Vec<Completion>> {
    let mut out = Vec::new();
    let t = Instant::now();
    while out.len() < n {
        qp.poll(|c| out.push(c));
        if t.elapsed() > Duration::from_secs(30) {
            return Err(format!("only {} of {n} completions after 30 s", out.len()).into());
        }
    }
    for c in &out {
        if !c.status.is_success() {
            return Err(format!("request {} failed: {}", c.tag, c.status).into());
        }
    }
    Ok(out)
}

/// Writes `count` requests of `len` bytes (at most `qd` in flight), reads them back, compares.
#[allow(clippy::too_many_arguments)]
fn write_read(
    hw: &Hardware,
    qp: &mut QueuePair,
    ns: &Namespace,
    lba0: u64,
    qd: usize,
    count: usize,
    len: usize,
    offset: usize,
) -> Res<(Duration, Duration)> {
    let blocks = (len >> ns.lba_shift) as u64;
    let bufs: Vec<DmaBuf> = (0..qd).map(|_| buffer(hw, offset, len)).collect::<Res<_>>()?;
    let mut lat_w = Duration::ZERO;
    let mut lat_r = Duration::ZERO;
    for batch in (0..count).collect::<Vec<_>>().chunks(qd) {
        for (slot, &i) in batch.iter().enumerate() {
            bufs[slot].write(&pattern(lba0 + i as u64, len));
            let req = IoRequest::write(ns, lba0 + i as u64 * blocks, bufs[slot].clone(), i as u64);
            qp.submit(req).map_err(|r| format!("submit: {}", r.error))?;
        }
        qp.flush();
        lat_w += wait(qp, batch.len())?.iter().map(|c| c.latency).sum::<Duration>();
        for (slot, &i) in batch.iter().enumerate() {
            bufs[slot].write(&vec![0u8; len]);
            let req = IoRequest::read(ns, lba0 + i as u64 * blocks, bufs[slot].clone(), i as u64);
            qp.submit(req).map_err(|r| format!("submit: {}", r.error))?;
        }
        qp.flush();
        lat_r += wait(qp, batch.len())?.iter().map(|c| c.latency).sum::<Duration>();
        for (slot, &i) in batch.iter().enumerate() {
            let mut got = vec![0u8; len];
            bufs[slot].read(&mut got);
            if got != pattern(lba0 + i as u64, len) {
                return Err(format!("data mismatch at LBA {}", lba0 + i as u64 * blocks).into());
            }
        }
    }
    Ok((lat_w / count as u32, lat_r / count as u32))
}

/// The device's own Copy (NVM Command Set 1.0 §3.2.2), when it has one: requests 0 and 2 of
/// the QD1 pass (4 KiB each at `lba0`) to `lba0 + 2048`, read back.
fn copy(hw: &Hardware, qp: &mut QueuePair, ns: &Namespace, lba0: u64) -> Res<()> {
    let Some(limits) = ns.copy else {
        println!("Copy: the device has none (ONCS bit 8, OCFS bit 0)");
        return Ok(());
    };
    let b = (4096 >> ns.lba_shift) as u64;
    if b > u64::from(limits.max_range_blocks) || 2 * b > limits.max_blocks || limits.max_ranges < 2 {
        println!("Copy: limits {limits:?} below two 4 KiB ranges, not tried");
        return Ok(());
    }
    let mut raw = vec![0u8; 64];
    for (e, slba) in raw.chunks_exact_mut(32).zip([lba0, lba0 + 2 * b]) {
        e[8..16].copy_from_slice(&slba.to_le_bytes());
        e[16..18].copy_from_slice(&((b - 1) as u16).to_le_bytes());
    }
    let entries = buffer(hw, 0, raw.len())?;
    entries.write(&raw);
    qp.submit(IoRequest::copy(ns, lba0 + 2048, entries, 2, 0))
        .map_err(|r| format!("submit: {}", r.error))?;
    qp.flush();
    let c = wait(qp, 1)?.remove(0);
    if !c.status.is_success() {
        return Err(format!("Copy failed: {:?}", c.status).into());
    }
    let back = buffer(hw, 0, 8192)?;
    qp.submit(IoRequest::read(ns, lba0 + 2048, back.clone(), 1))
        .map_err(|r| format!("submit: {}", r.error))?;
    qp.flush();
    wait(qp, 1)?;
    let mut got = vec![0u8; 8192];
    back.read(&mut got);
    if got != [pattern(lba0, 4096), pattern(lba0 + 2, 4096)].concat() {
        return Err("Copy: the destination does not hold the sources".into());
    }
    println!("Copy: 2 ranges of 4 KiB copied by the device ({limits:?}), read back");
    Ok(())
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vfio-smoke: FAIL: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Res<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let mut args = std::env::args().skip(1);
    let bdf = args.next().ok_or("usage: vfio-smoke BDF [START_LBA]")?;
    let lba0: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(0);
    let t0 = Instant::now();
    let hw = vfio::open(&bdf)?;
    let cfg = ControllerConfig {
        io_queues: 1,
        command_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let mut ctrl = Controller::new(hw.clone(), cfg)?;
    let info = ctrl.info().clone();
    println!(
        "controller {}: vid {:#06x} model '{}' serial '{}' fw '{}' VS {:#x} MQES {} DSTRD {} TO {} MDTS {:?} max_transfer {} io_queues {} vectors {} (bring-up {:?})",
        ctrl.name(),
        info.vid,
        info.model,
        info.serial,
        info.firmware,
        info.version,
        info.cap.mqes(),
        info.cap.dstrd(),
        info.cap.to(),
        info.mdts_bytes,
        info.max_transfer,
        info.io_queues,
        info.vectors,
        t0.elapsed()
    );
    for ns in &info.namespaces {
        println!(
            "namespace {}: {} blocks of {} bytes ({} MiB)",
            ns.nsid,
            ns.blocks,
            ns.block_size(),
            ns.bytes() >> 20
        );
    }
    let ns = *info.namespaces.first().ok_or("no usable namespace")?;
    let mut qp = ctrl.create_io_queue_pair(64)?;
    println!(
        "queue pair {}: depth {}, eventfd {:?}",
        qp.qid(),
        qp.depth(),
        qp.eventfd()
    );

    // Interrupt: one write, sleep on the eventfd.
    if let Some(fd) = qp.eventfd() {
        let b = buffer(&hw, 0, 4096)?;
        b.write(&pattern(1, 4096));
        qp.submit(IoRequest::write(&ns, lba0, b, 0))
            .map_err(|r| format!("submit: {}", r.error))?;
        qp.flush();
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, 10_000) };
        let irqs = qp.ack_interrupts();
        wait(&mut qp, 1)?;
        println!("interrupt: poll() = {n}, eventfd count {irqs}");
        if n != 1 || irqs == 0 {
            return Err("no MSI-X interrupt on the queue's eventfd".into());
        }
    }

    let (w, r) = write_read(&hw, &mut qp, &ns, lba0, 1, 32, 4096, 0)?;
    println!("QD1: 32 x 4 KiB written and read back, mean latency write {w:?} read {r:?}");
    copy(&hw, &mut qp, &ns, lba0)?;
    let (w, r) = write_read(&hw, &mut qp, &ns, lba0 + 1024, 16, 64, 4096, 0)?;
    println!("QD16: 64 x 4 KiB written and read back, mean latency write {w:?} read {r:?}");
    let (w, r) = write_read(&hw, &mut qp, &ns, lba0 + 4096, 4, 8, 128 << 10, 512)?;
    println!("PRP lists: 8 x 128 KiB from buffers at offset 512, mean latency write {w:?} read {r:?}");
    let big = (info.max_transfer * 2 + 4096).min(4 << 20);
    let (w, r) = write_read(&hw, &mut qp, &ns, lba0 + 8192, 1, 2, big, 0)?;
    println!(
        "MDTS split: 2 x {big} bytes ({} commands each), mean latency write {w:?} read {r:?}",
        big.div_ceil(info.max_transfer)
    );
    let st = qp.stats();
    println!("queue stats: {st:?}");
    let out = ctrl.service()?;
    println!("service: {out:?}");
    drop(qp);
    ctrl.shutdown()?;
    println!("shutdown: CSTS.SHST = 10b");
    println!("vfio-smoke: PASS ({:?})", t0.elapsed());
    Ok(())
}
