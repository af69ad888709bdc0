//! `pollux perf --target-conf` places its client off the target's reactor cores, which its
//! placement probe then measures. In its own test binary: the probe pins two threads to
//! those cores and gives up after 1 s, and the other `pollux perf` tests, run beside it in
//! one binary, spin reactors and clients on the same two CPUs: in CI the probe gave up and
//! the test failed (it asserts that the probe ran).
#![allow(clippy::unwrap_used)]

use pollux_host::perf::{self, PerfReport};

#[derive(clap::Parser)]
struct PerfCli {
    #[command(flatten)]
    perf: perf::cli::PerfArgs,
}

fn perf_args(argv: &[&str]) -> perf::cli::PerfArgs {
    use clap::Parser as _;
    PerfCli::parse_from(["perf"].iter().chain(argv)).perf
}

/// `pollux perf` as the binary runs it, with pollux's own target for `--target-conf`.
fn perf_main(a: &perf::cli::PerfArgs) -> Result<PerfReport, perf::cli::CliError> {
    perf::cli::run::<pollux_target::Target>(a)
}

fn two_cores() -> bool {
    pollux_reactor::sys::allowed_cores().is_ok_and(|c| c.len() >= 2)
}

#[test]
fn an_in_process_target_and_the_default_client_do_not_share_a_core() {
    if !two_cores() {
        return;
    }
    let core = pollux_reactor::sys::allowed_cores().unwrap()[0];
    let dir = std::env::temp_dir().join(format!("pollux-perf-cores-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("poll.toml");
    std::fs::write(
        &conf,
        format!(
            r#"
[reactors]
cores = [{core}]
mode = "poll"

[[listener]]
address = "127.0.0.1:0"

[[subsystem]]
nqn = "nqn.2026-11.io.pollux:perf-cores"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = {{ ram = {{ size = "4MiB" }} }}
"#
        ),
    )
    .unwrap();
    let path = conf.to_str().unwrap();
    let r = perf_main(&perf_args(&["--target-conf", path, "--ios", "2000", "-q", "1"])).unwrap();
    // The placement probe names both cores: before, the client took core 0 as well (and
    // no probe ran, one core being both).
    let p = r.placement.expect("client and target on two cores, probed");
    assert_eq!(p.target_core, core);
    assert_ne!(p.client_core, core);
    assert_eq!(r.ios, 2000);
    std::fs::remove_dir_all(&dir).unwrap();
}
