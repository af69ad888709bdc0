//! File namespaces end to end over NVMe/TCP (the guest scenario pollux-file covers the kernel
//! host and crashes): data round trips through the per-reactor io_uring channels in every
//! mode, Write Zeroes and deallocate read back zeroes, Flush, and the data is in the file.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use pollux_target::host::{Controller, Digests, DsmRange, sqe};

const FILE_NQN: &str = "nqn.2026-11.io.pollux:file-test";

#[test]
fn data_round_trips_through_the_file_channels_in_every_mode() {
    let dir = std::env::temp_dir().join(format!("pollux-file-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for mode in ["poll", "hybrid", "interrupt", "adaptive"] {
        let path = dir.join(format!("{mode}.img"));
        let _ = std::fs::remove_file(&path);
        // direct = false: the temporary directory may be a tmpfs, which has no O_DIRECT.
        let text = format!(
            r#"
[reactors]
cores = [0, 1]
mode = "{mode}"

[[listener]]
address = "127.0.0.1:0"

[[subsystem]]
nqn = "{FILE_NQN}"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
block_size = 512
backend = {{ file = {{ path = "{}", size = "8MiB", direct = false }} }}
"#,
            path.display()
        );
        let t = start_text(&text);
        let mut c = Controller::connect(addr(&t), FILE_NQN, HOST, 2, 32, Digests::NONE).unwrap();
        for (k, nlb) in [1u32, 8, 64, 256].into_iter().enumerate() {
            let slba = 5 + k as u64 * 1000;
            let data = pattern(k as u64, slba, nlb as usize * 512);
            c.io[k % 2].write(1, slba, nlb, &data).unwrap();
            let mut back = vec![0u8; data.len()];
            c.io[(k + 1) % 2].read(1, slba, nlb, &mut back).unwrap();
            assert!(back == data, "{mode}: {nlb} blocks at {slba}");
        }
        c.io[0].write(1, 3000, 16, &[0xEE; 16 * 512]).unwrap();
        c.io[0].write_zeroes(1, 3000, 8).unwrap();
        let range = DsmRange {
            cattr: 0,
            nlb: 8,
            slba: 3008,
        };
        c.io[1].dataset_management(1, &[range], sqe::DSM_DEALLOCATE).unwrap();
        let mut back = vec![1u8; 16 * 512];
        c.io[0].read(1, 3000, 16, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0), "{mode}: zeroed blocks");
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
