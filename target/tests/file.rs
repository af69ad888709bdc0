//! File namespaces end to end over NVMe/TCP (the guest scenario pollux-file covers the kernel
//! host and crashes): data round trips through the per-reactor io_uring channels in every
//! mode, Write Zeroes and deallocate read back zeroes, Flush, and the data is in the file.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use pollux_host::{Controller, Digests};

const FILE_NQN: &str = "nqn.2026-11.io.pollux:file-test";

/// A conf with reactors in `mode` and [`FILE_NQN`] serving an 8 MiB file at `path` (direct =
/// false: the temporary directory may be a tmpfs, which has no O_DIRECT).
fn file_conf(mode: &str, path: &std::path::Path) -> String {
    conf_with(
        mode,
        "",
        FILE_NQN,
        &format!(
            "[[subsystem.namespace]]\nnsid = 1\nblock_size = 512\n\
             backend = {{ file = {{ path = \"{}\", size = \"8MiB\", direct = false }} }}",
            path.display()
        ),
    )
}

#[test]
fn data_round_trips_through_the_file_channels_in_every_mode() {
    let dir = std::env::temp_dir().join(format!("pollux-file-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for mode in ["poll", "hybrid", "interrupt", "adaptive"] {
        let path = dir.join(format!("{mode}.img"));
        let _ = std::fs::remove_file(&path);
        let t = start_text(&file_conf(mode, &path));
        let mut c = Controller::connect(addr(&t), FILE_NQN, HOST, 2, 32, Digests::NONE).unwrap();
        assert_round_trips(&mut c, 512, &[1, 8, 64, 256], |k| 5 + k as u64 * 1000, 0, mode);
        assert_zeroing_reads_zeroes(&mut c, 3000, mode);
        c.io[1].flush(1).unwrap();
        c.shutdown().unwrap();
        t.shutdown().unwrap();
        // What the host wrote is in the file at its byte offset.
        let file = std::fs::read(&path).unwrap();
        assert_eq!(
            &file[5 * 512..6 * 512],
            &pattern(0, 5, 512)[..],
            "{mode}: the file holds the data"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The CapsuleResp of `cid` on `q`, past any C2HData: its (SCT, SC).
fn final_status(q: &mut pollux_host::HostQueue, cid: u16) -> (u8, u8) {
    use pollux_host::RawReply;
    use pollux_nvme::tcp::PduHeader;
    loop {
        match q.recv_raw(WAIT).unwrap() {
            RawReply::Pdu {
                hdr: Some(PduHeader::C2HData { .. }),
                ..
            } => continue,
            RawReply::Pdu {
                hdr: Some(PduHeader::CapsuleResp { cqe }),
                ..
            } => {
                assert_eq!(cqe.cid.get(), cid);
                return code(cqe.status());
            }
            other => panic!("expected C2HData or the CapsuleResp of {cid}, got {other:?}"),
        }
    }
}

#[test]
fn an_abort_of_a_file_command_says_what_became_of_it() {
    use pollux_host::sqe;
    use pollux_nvme::spec::{SglDescriptor, Sqe};
    let dir = std::env::temp_dir().join(format!("pollux-file-abort-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("abort.img");
    let _ = std::fs::remove_file(&path);
    let t = start_text(&file_conf("interrupt", &path));
    let mut c = Controller::connect(addr(&t), FILE_NQN, HOST, 1, 32, Digests::NONE).unwrap();
    // Whether a 128 KiB read is still in flight when the Abort reaches it is a race; what
    // the target answers must agree with what became of the read, every time.
    let (mut aborted, mut ran) = (0, 0);
    for i in 0..40u16 {
        let cid = 100 + i;
        let mut s = sqe::read(1, u64::from(i) * 256, 256);
        s.cid.set(cid);
        s.set_psdt(Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
        s.set_sgl(&SglDescriptor::transport_data_block(128 << 10));
        let pdu = c.io[0].capsule_pdu(&s, &[]);
        c.io[0].send_raw(&pdu).unwrap();
        let not_aborted = c.admin.abort(1, cid).unwrap() & 1;
        match (not_aborted, final_status(&mut c.io[0], cid)) {
            (0, (0, 0x07)) => aborted += 1,
            (1, (0, 0)) => ran += 1,
            (bit, status) => panic!("Abort said bit 0 = {bit}, the read completed with {status:?}"),
        }
    }
    assert_eq!(aborted + ran, 40);
    eprintln!("file abort: {aborted} aborted, {ran} ran to their end");
    // The queue keeps working.
    let mut back = vec![0u8; 4096];
    c.io[0].read(1, 0, 8, &mut back).unwrap();
    c.shutdown().unwrap();
    t.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn smart_counts_the_files_starts_and_unsafe_shutdowns() {
    let dir = std::env::temp_dir().join(format!("pollux-file-smart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("store.img");
    let _ = std::fs::remove_file(&path);
    let smart = |path: &std::path::Path| {
        let t = start_text(&file_conf("interrupt", path));
        let mut c = Controller::connect(addr(&t), FILE_NQN, HOST, 1, 32, Digests::NONE).unwrap();
        let h = c.admin.smart_log().unwrap();
        c.shutdown().unwrap();
        t.shutdown().unwrap();
        (h.power_cycles, h.unsafe_shutdowns)
    };
    // A new file, then a clean restart.
    assert_eq!(smart(&path), (1, 0));
    assert_eq!(smart(&path), (2, 0));
    // What a killed pollux leaves: the record still says open. The next start counts it.
    let name = c"user.pollux.shutdowns";
    let v = b"v1 starts=2 unsafe=0 open";
    let cpath = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: setxattr reads the NUL-terminated path and name and `v.len()` bytes of `v`.
    let rc = unsafe { libc::setxattr(cpath.as_ptr(), name.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    assert_eq!(smart(&path), (3, 1));
    assert_eq!(smart(&path), (4, 1));
    let _ = std::fs::remove_dir_all(&dir);
}
