//! Compare and Verify (NVM Command Set 1.0 §3.2.1, §3.2.4) on RAM, file, NVMe (the fake
//! controller: data in DMA buffers) and simulated namespaces: Compare succeeds on equal data and fails with Compare Failure on any
//! difference, in-capsule and by R2T; Verify succeeds on a readable range; both refuse
//! out-of-range LBAs and transfers beyond MDTS and change nothing; Identify says they exist.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use pollux_host::{Controller, Data, Digests, sqe};
use pollux_nvme::spec::Status;

const CMP_NQN: &str = "nqn.2026-11.io.pollux:compare";

fn target(backend: &str) -> pollux_target::Target {
    start_text(&conf_with(
        "interrupt",
        "",
        CMP_NQN,
        &format!("[[subsystem.namespace]]\nnsid = 1\nblock_size = 512\nbackend = {backend}"),
    ))
}

fn status(c: &mut Controller, s: pollux_nvme::spec::Sqe, d: Data) -> Status {
    c.io[0].exec(s, d).unwrap().status
}

fn exercise(c: &mut Controller, what: &str) {
    // 4 KiB goes in-capsule, 64 KiB by R2T and H2CData.
    for (slba, nlb) in [(8u64, 8u32), (1000, 128)] {
        let data = pattern(slba, slba, nlb as usize * 512);
        c.io[0].write(1, slba, nlb, &data).unwrap();
        assert_eq!(
            status(c, sqe::compare(1, slba, nlb), Data::ToCtrl(data.clone())),
            Status::SUCCESS,
            "{what}: equal"
        );
        for at in [0, data.len() / 2, data.len() - 1] {
            let mut other = data.clone();
            other[at] ^= 0x01;
            let s = status(c, sqe::compare(1, slba, nlb), Data::ToCtrl(other));
            assert_eq!(
                (s.sct(), s.sc()),
                (2, 0x85),
                "{what}: a one-bit difference at byte {at}"
            );
        }
        assert_eq!(
            status(c, sqe::verify(1, slba, nlb), Data::None),
            Status::SUCCESS,
            "{what}: verify"
        );
        // Nothing changed: the blocks still read back as written.
        let mut back = vec![0u8; data.len()];
        c.io[0].read(1, slba, nlb, &mut back).unwrap();
        assert_eq!(back, data, "{what}: compare changed the data");
    }
    // Out of range and beyond MDTS: refused, with DNR.
    let blocks = 16384u64; // 8 MiB of 512-byte blocks
    let s = status(c, sqe::compare(1, blocks - 1, 2), Data::ToCtrl(vec![0; 1024]));
    assert_eq!((s.sc(), s.dnr()), (0x80, true), "{what}: compare beyond the end");
    let s = status(c, sqe::verify(1, blocks, 1), Data::None);
    assert_eq!((s.sc(), s.dnr()), (0x80, true), "{what}: verify beyond the end");
    let s = status(c, sqe::verify(1, 0, blocks as u32), Data::None);
    assert_eq!(
        (s.sct(), s.sc()),
        (0, 0x02),
        "{what}: verify beyond MDTS is Invalid Field"
    );
}

#[test]
fn compare_and_verify_on_ram_file_nvme_and_sim_namespaces() {
    let dir = std::env::temp_dir().join(format!("pollux-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ns.img");
    let _ = std::fs::remove_file(&file);
    for (what, backend) in [
        ("ram", "{ ram = { size = \"8MiB\" } }".to_string()),
        (
            "file",
            format!(
                "{{ file = {{ path = \"{}\", size = \"8MiB\", direct = false }} }}",
                file.display()
            ),
        ),
        (
            "nvme",
            "{ nvme = { fake = \"compare0\", size = \"8MiB\", latency_us = 5.0 } }".to_string(),
        ),
        (
            "sim",
            "{ sim = { size = \"8MiB\", read = { median_us = 20.0, sigma = 0.2 }, write = { median_us = 20.0, sigma = 0.2 } } }".to_string(),
        ),
    ] {
        let t = target(&backend);
        let mut c = Controller::connect(addr(&t), CMP_NQN, HOST, 1, 32, Digests::NONE).unwrap();
        let id = c.admin.identify(1, 0).unwrap();
        let oncs = u16::from_le_bytes([id[520], id[521]]);
        assert_eq!(oncs & 1, 1, "ONCS: Compare");
        assert_eq!(oncs & (1 << 7), 1 << 7, "ONCS: Verify");
        exercise(&mut c, what);
        c.shutdown().unwrap();
        t.shutdown().unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
