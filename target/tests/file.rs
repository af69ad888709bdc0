//! File namespaces end to end over NVMe/TCP (the guest scenario pollux-file covers the kernel
//! host and crashes): data round trips through the per-reactor io_uring channels in every
//! mode, Write Zeroes and deallocate read back zeroes, Flush, and the data is in the file.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use pollux_target::host::{Controller, Digests};

const FILE_NQN: &str = "nqn.2026-11.io.pollux:file-test";

#[test]
fn data_round_trips_through_the_file_channels_in_every_mode() {
    let dir = std::env::temp_dir().join(format!("pollux-file-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for mode in ["poll", "hybrid", "interrupt", "adaptive"] {
        let path = dir.join(format!("{mode}.img"));
        let _ = std::fs::remove_file(&path);
        // direct = false: the temporary directory may be a tmpfs, which has no O_DIRECT.
        let text = conf_with(
            mode,
            "",
            FILE_NQN,
            &format!(
                "[[subsystem.namespace]]\nnsid = 1\nblock_size = 512\n\
                 backend = {{ file = {{ path = \"{}\", size = \"8MiB\", direct = false }} }}",
                path.display()
            ),
        );
        let t = start_text(&text);
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
