//! The `null` backend end to end: writes discarded, reads zeroes, every command that
//! changes or syncs data succeeds, and `ctl subsystems` names it.
#![allow(missing_docs, clippy::unwrap_used)]

use serde_json::Value;

mod common;
use common::{HOST, NQN, addr, conf_with, pattern, start_with_ctx};
use pollux_host::{Controller, Digests, DsmRange, sqe};

/// 1 TiB of 4 KiB blocks: far more than the machine's memory, which a null namespace never
/// takes.
const BLOCKS: u64 = 1 << 28;

fn conf() -> String {
    conf_with(
        "interrupt",
        "[transport]\nmax_io_size = \"1MiB\"\n",
        NQN,
        r#"
[[subsystem.namespace]]
nsid = 1
block_size = 4096
backend = { null = { size = "1TiB" } }
"#,
    )
}

#[test]
fn a_null_namespace_discards_writes_and_reads_zeroes() {
    let (t, ctx) = start_with_ctx(&conf());
    // Without digests a read's zeroes are sent in place; with a data digest they are copied
    // for it: both paths.
    for digests in [
        Digests::NONE,
        Digests {
            hdgst: true,
            ddgst: true,
        },
    ] {
        let mut c = Controller::connect(addr(&t), NQN, HOST, 2, 32, digests).unwrap();
        for (lba, nlb) in [(0u64, 1u32), (BLOCKS - 1, 1), (BLOCKS / 2 + 3, 256)] {
            let data = pattern(lba, lba, nlb as usize * 4096);
            c.io[0].write(1, lba, nlb, &data).unwrap();
            let mut back = vec![0xffu8; data.len()];
            c.io[1].read(1, lba, nlb, &mut back).unwrap();
            assert!(
                back.iter().all(|&b| b == 0),
                "{nlb} blocks at {lba} ({digests:?}): written data read back"
            );
        }
        c.io[0].write_zeroes(1, 7, 64).unwrap();
        let range = DsmRange {
            cattr: 0,
            nlb: 1 << 20,
            slba: BLOCKS - (1 << 20),
        };
        c.io[0].dataset_management(1, &[range], sqe::DSM_DEALLOCATE).unwrap();
        c.io[1].flush(1).unwrap();
        // Compare against zeroes matches: that is what the blocks hold.
        let zeroes = vec![0u8; 4096];
        c.io[0]
            .exec_ok(sqe::compare(1, 42, 1), pollux_host::Data::ToCtrl(zeroes))
            .unwrap();
        // Out of range stays an error, as on any namespace.
        let mut one = vec![0u8; 4096];
        assert!(c.io[0].read(1, BLOCKS, 1, &mut one).is_err(), "a read past the end");
        c.shutdown().unwrap();
    }
    let ss = ctx.call("subsystems", &Value::Null).unwrap();
    let ns = ss
        .as_array()
        .and_then(|s| s.iter().find(|s| s["nqn"] == NQN))
        .map(|s| s["namespaces"][0].clone())
        .unwrap();
    assert_eq!(ns["backend"], "null", "{ns}");
    assert_eq!(ns["io_path"], "inline", "{ns}");
    let views: Vec<pollux_target::control::view::SubsystemView> = serde_json::from_value(ss).unwrap();
    let table = pollux_target::control::format::format_subsystems(&views);
    assert!(table.contains("null"), "{table}");
    t.shutdown().unwrap();
}
