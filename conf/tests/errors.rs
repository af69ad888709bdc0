//! Every error names the file, line and column of the offending value.

use pollux_conf::{ConfError, Config};

/// Reactors and one listener: lines 1-4. Tests append from line 5 on.
const BASE: &str = "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n";

/// A valid subsystem header and NQN as lines 5-7 of BASE + SUB.
const SUB: &str = "[[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:a\"\nallow_any_host = true\n";

fn err(text: &str) -> ConfError {
    match Config::parse(text, "test.toml") {
        Ok(c) => panic!("parsed, expected an error:\n{text}\n{c:?}"),
        Err(e) => e,
    }
}

/// Asserts the error for `text` is at `line:col` and its message contains
/// `needle`.
#[track_caller]
fn assert_err(text: &str, line: usize, col: usize, needle: &str) {
    let e = err(text);
    assert_eq!(
        (e.line(), e.column()),
        (Some(line), Some(col)),
        "wrong position for {e}"
    );
    assert!(e.message().contains(needle), "{e} lacks {needle:?}");
    assert_eq!(e.to_string(), format!("test.toml:{line}:{col}: {}", e.message()));
}

#[test]
fn base_is_valid() {
    Config::parse(BASE, "test.toml").expect("BASE");
    Config::parse(&format!("{BASE}{SUB}"), "test.toml").expect("BASE+SUB");
}

#[test]
fn display_format_exact() {
    let e = err("[reactors]\ncores = []\n");
    assert_eq!(
        e.to_string(),
        "test.toml:2:9: `cores` is empty: list at least one CPU core, e.g. `cores = [0]`"
    );
    let e = err("");
    assert_eq!(e.line(), None);
    assert_eq!(e.column(), None);
    assert!(e.to_string().starts_with("test.toml: missing the [reactors] table"));
    assert_eq!(e.origin(), "test.toml");
}

#[test]
fn syntax_errors() {
    assert_err("[reactors\n", 1, 10, "");
    assert_err("[reactors]\ncores = [0\n", 3, 1, "expected `]`");
    assert_err("[reactors]\ncores = [0]\ncores = [1]\n", 3, 1, "duplicate key");
    assert_err("[reactors]\ncores = [0]\nmode = poll\n", 3, 8, "");
}

#[test]
fn unknown_keys_are_rejected_with_position() {
    assert_err(&format!("{BASE}bogus = 1\n"), 5, 1, "unknown key `bogus`");
    assert_err(
        "[reactors]\ncores = [0]\n  threads = 2\n",
        3,
        3,
        "unknown key `threads`",
    );
    assert_err(
        &format!("{BASE}[[listeners]]\naddress = \"x\"\n"),
        5,
        3,
        "unknown key `listeners`",
    );
    assert_err(
        &format!("{BASE}[transport]\nqueue_depth = 4\n"),
        6,
        1,
        "unknown key `queue_depth`",
    );
    assert_err(&format!("{BASE}[keep_alive]\nmin = 4\n"), 6, 1, "unknown key `min`");
    assert_err(&format!("{BASE}{SUB}nsqn = 1\n"), 8, 1, "unknown key `nsqn`");
    assert_err(
        &format!("{BASE}{SUB}[[subsystem.namespace]]\nnsid = 1\nbackend = {{ nbd = {{ host = \"h\" }} }}\n"),
        10,
        13,
        "unknown key `nbd`, expected one of `ram`, `file`, `sim`, `nvme`",
    );
    assert_err(
        &format!("{BASE}{SUB}[[subsystem.namespace]]\nnsid = 1\nbackend = {{ ram = {{ size = 512, sise = 1 }} }}\n"),
        10,
        33,
        "unknown key `sise`",
    );
    assert_err(
        &format!("{BASE}{SUB}[[subsystem.namespace]]\nnsid = 1\nsize = 4096\nbackend = {{ ram = {{ size = 512 }} }}\n"),
        10,
        1,
        "unknown key `size`",
    );
}

#[test]
fn wrong_types() {
    assert_err("[reactors]\ncores = \"0\"\n", 2, 9, "expected a sequence");
    assert_err("[reactors]\ncores = [0, \"1\"]\n", 2, 13, "");
    assert_err(&format!("{BASE}{SUB}allow_any_host = \"yes\"\n"), 8, 1, "duplicate key");
    assert_err(
        &format!("{BASE}[[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:a\"\nallow_any_host = \"yes\"\n"),
        7,
        18,
        "expected a boolean",
    );
    assert_err(&format!("{BASE}[transport]\nio_queue_depth = 12.5\n"), 6, 18, "");
    assert_err(&format!("{BASE}[transport]\nmax_io_size = true\n"), 6, 15, "a size");
}

#[test]
fn missing_keys() {
    assert_err("[reactors]\nmode = \"poll\"\n", 1, 1, "missing key `cores`");
    assert_err(
        &format!("{BASE}[[subsystem]]\nallow_any_host = true\n"),
        5,
        1,
        "missing key `nqn`",
    );
    assert_err(
        &format!("{BASE}{SUB}[[subsystem.namespace]]\nnsid = 1\n"),
        8,
        1,
        "missing key `backend`",
    );
    let e = err("[reactors]\ncores = [0]\n");
    assert_eq!(e.line(), None);
    assert!(e.message().contains("[[listener]]"), "{e}");
}

#[test]
fn reactors_checks() {
    assert_err("[reactors]\ncores = []\n", 2, 9, "is empty");
    assert_err("[reactors]\ncores = [0, 1, 0]\n", 2, 16, "core 0 is listed twice");
    assert_err("[reactors]\ncores = [-1]\n", 2, 10, "between 0 and 1023");
    assert_err(
        "[reactors]\ncores = [0]\nmode = \"turbo\"\n",
        3,
        8,
        "unknown reactor mode \"turbo\": expected \"poll\", \"hybrid\", \"interrupt\" or \"adaptive\"",
    );
    assert_err(
        "[reactors]\ncores = [0]\nmode = \"Poll\"\n",
        3,
        8,
        "unknown reactor mode",
    );
    assert_err(
        "[reactors]\ncores = [0]\nstall_threshold_us = 0\n",
        3,
        22,
        "`stall_threshold_us` must be between 1",
    );
    assert_err(
        "[reactors]\ncores = [0]\nplacement = \"random\"\n",
        3,
        13,
        "unknown placement",
    );
}

#[test]
fn listener_checks() {
    assert_err(
        &format!("{BASE}[[listener]]\naddress = \"127.0.0.1:4420\"\n"),
        6,
        11,
        "already listed on line 4",
    );
    assert_err(
        "[reactors]\ncores = [0]\n[[listener]]\naddress = \"[::1]:4420\"\n[[listener]]\naddress = \"[0:0::1]:4420\"\n",
        6,
        11,
        "already listed",
    );
    assert_err(
        "[reactors]\ncores = [0]\n[[listener]]\naddress = \"localhost:4420\"\n",
        4,
        11,
        "IPv4:port",
    );
    assert_err(
        "[reactors]\ncores = [0]\n[[listener]]\naddress = \"::1:4420\"\n",
        4,
        11,
        "[IPv6]:port",
    );
    assert_err(
        "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1\"\n",
        4,
        11,
        "",
    );
    assert_err("[reactors]\ncores = [0]\n[[listener]]\n", 3, 1, "missing key `address`");
}

#[test]
fn transport_and_keep_alive_ranges() {
    let t = |body: &str, col: usize, needle: &str| assert_err(&format!("{BASE}[transport]\n{body}\n"), 6, col, needle);
    t("io_queue_depth = 1", 18, "between 2 and 65536, got 1");
    t("io_queue_depth = 65537", 18, "between 2 and 65536");
    t("max_io_queues = 0", 17, "between 1 and 65535");
    t("max_io_queues = 65536", 17, "between 1 and 65535");
    t("in_capsule_data_size = 4100", 24, "multiple of 16");
    t("in_capsule_data_size = 2048", 24, "between 4096 and 131072");
    t("in_capsule_data_size = \"256K\"", 24, "between 4096 and 131072");
    t("max_io_size = 5000", 15, "power of two");
    t("max_io_size = 2048", 15, "power of two");
    t("max_io_size = \"4GiB\"", 15, "at most 4294967295");
    t("max_h2c_data = 4098", 16, "multiple of 4");
    t("max_h2c_data = -4", 16, "must not be negative");
    t("max_io_size = \"lots\"", 15, "not a size");

    assert_err(
        &format!("{BASE}[keep_alive]\nmin_ms = 400000\n"),
        6,
        10,
        "greater than `max_ms`",
    );
    assert_err(
        &format!("{BASE}[keep_alive]\nmax_ms = 500\n"),
        6,
        10,
        "greater than `max_ms`",
    );
    assert_err(&format!("{BASE}[keep_alive]\nmax_ms = 0\n"), 6, 10, "between 1 and");
    assert_err(&format!("{BASE}[keep_alive]\nmin_ms = -1\n"), 6, 10, "between 0 and");
    assert_err(
        &format!("{BASE}[keep_alive]\nmin_ms = 4294967296\n"),
        6,
        10,
        "between 0 and 4294967295",
    );
}

#[test]
fn subsystem_checks() {
    // Malformed NQN.
    assert_err(
        &format!("{BASE}[[subsystem]]\nnqn = \"nqn.2026-13.io.pollux:a\"\nallow_any_host = true\n"),
        6,
        7,
        "no month 13",
    );
    // The discovery NQN is not a subsystem.
    assert_err(
        &format!("{BASE}[[subsystem]]\nnqn = \"nqn.2014-08.org.nvmexpress.discovery\"\nallow_any_host = true\n"),
        6,
        7,
        "discovery NQN",
    );
    // Duplicate NQN.
    assert_err(&format!("{BASE}{SUB}{SUB}"), 9, 7, "already defined on line 6");
    // Malformed and duplicate hosts.
    assert_err(
        &format!(
            "{BASE}[[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:a\"\nhosts = [\"nqn.2026-11.io.pollux:h\", \"host1\"]\n"
        ),
        7,
        37,
        "invalid host NQN",
    );
    assert_err(
        &format!(
            "{BASE}[[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:a\"\nhosts = [\"nqn.2026-11.io.pollux:h\",\n  \"nqn.2026-11.io.pollux:h\"]\n"
        ),
        8,
        3,
        "listed twice",
    );
    // Nobody could connect: points at what was written, and says how to fix.
    for (text, line, col) in [
        (
            format!("{BASE}[[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:a\"\n"),
            6,
            7,
        ),
        (
            format!("{BASE}[[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:a\"\nallow_any_host = false\n"),
            7,
            18,
        ),
    ] {
        assert_err(&text, line, col, "admits no host: set `allow_any_host = true`, or list");
    }
    // `hosts = []` said outright admits no host yet (SPDK's subsystem before
    // nvmf_subsystem_add_host): valid, and emitted as it is.
    let c = Config::parse(
        &format!("{BASE}[[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:a\"\nhosts = []\n"),
        "test.toml",
    )
    .expect("hosts = [] is valid");
    assert!(c.subsystems[0].hosts.is_empty() && !c.subsystems[0].allows_host("nqn.2014-08.org.nvmexpress:uuid:x"));
    assert_eq!(Config::parse(&c.to_toml(), "test.toml").expect("emitted"), c);
    // Serial and model.
    assert_err(
        &format!("{BASE}{SUB}serial = \"123456789012345678901\"\n"),
        8,
        10,
        "1 to 20 printable ASCII",
    );
    assert_err(&format!("{BASE}{SUB}serial = \"sé\"\n"), 8, 10, "printable ASCII");
    assert_err(&format!("{BASE}{SUB}serial = \"\"\n"), 8, 10, "printable ASCII");
    assert_err(&format!("{BASE}{SUB}serial = \"   \"\n"), 8, 10, "blank");
    assert_err(&format!("{BASE}{SUB}model = \"{}\"\n", "m".repeat(41)), 8, 9, "1 to 40");
}

fn ns(body: &str) -> String {
    // The namespace header is line 8; `body` starts on line 9.
    format!("{BASE}{SUB}[[subsystem.namespace]]\n{body}\n")
}

#[test]
fn namespace_checks() {
    let ram = "backend = { ram = { size = \"1MiB\" } }";
    assert_err(
        &ns(&format!("nsid = 0\n{ram}")),
        9,
        8,
        "`nsid` must be between 1 and 4294967294",
    );
    assert_err(
        &ns(&format!("nsid = 4294967295\n{ram}")),
        9,
        8,
        "`nsid` must be between 1",
    );
    assert_err(
        &ns(&format!("nsid = 1\n{ram}\n[[subsystem.namespace]]\nnsid = 1\n{ram}")),
        12,
        8,
        "nsid 1 is already used in subsystem \"nqn.2026-11.io.pollux:a\" (line 9)",
    );
    assert_err(
        &ns(&format!("nsid = 1\nblock_size = 1024\n{ram}")),
        10,
        14,
        "512 or 4096, got 1024",
    );
    assert_err(
        &ns("nsid = 1\nblock_size = 4096\nbackend = { ram = { size = 6144 } }"),
        11,
        28,
        "not a multiple of block_size 4096",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { ram = { size = 1000 } }"),
        10,
        28,
        "not a multiple of block_size 512",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { ram = { size = 0 } }"),
        10,
        28,
        "greater than 0",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { ram = { size = \"0G\" } }"),
        10,
        28,
        "greater than 0",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { ram = { size = \"1.5G\" } }"),
        10,
        28,
        "not a size",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { ram = { size = \"1X\" } }"),
        10,
        28,
        "unknown size suffix",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { ram = { size = -512 } }"),
        10,
        28,
        "must not be negative",
    );
    assert_err(&ns("nsid = 1\nbackend = {}"), 9, 8, "empty `backend`");
    // The same namespace written with table headers: positions still exact.
    assert_err(
        &ns("nsid = 1\n[subsystem.namespace.backend.ram]\nsize = 1000"),
        11,
        8,
        "not a multiple",
    );
    assert_err(
        &ns("nsid = 1\n[subsystem.namespace.backend]\n"),
        9,
        8,
        "empty `backend`",
    );
    // Identifiers.
    assert_err(
        &ns(&format!("nsid = 1\n{ram}\nuuid = \"not-a-uuid\"")),
        11,
        8,
        "invalid `uuid`",
    );
    assert_err(
        &ns(&format!(
            "nsid = 1\n{ram}\nuuid = \"00000000-0000-0000-0000-000000000000\""
        )),
        11,
        8,
        "must not be all zero",
    );
    assert_err(
        &ns(&format!("nsid = 1\n{ram}\nnguid = \"0123\"")),
        11,
        9,
        "32 hex digits",
    );
    assert_err(
        &ns(&format!("nsid = 1\n{ram}\neui64 = \"0000000000000000\"")),
        11,
        9,
        "all zero",
    );
    assert_err(
        &ns(&format!("nsid = 1\n{ram}\neui64 = \"00000000000000zz\"")),
        11,
        9,
        "16 hex digits",
    );
    assert_err(
        &ns(&format!(
            "nsid = 1\n{ram}\neui64 = \"0200000000000001\"\n[[subsystem.namespace]]\nnsid = 2\n{ram}\neui64 = \"0200000000000001\""
        )),
        15,
        9,
        "already used by namespace 1",
    );
}

#[test]
fn identifiers_unique_across_subsystems() {
    let uuid = "uuid = \"6d1f6c2e-5c1a-4f0e-9b7d-2a4c8e1f3b5d\"";
    let ram = "backend = { ram = { size = \"1MiB\" } }";
    let text = format!(
        "{BASE}{SUB}[[subsystem.namespace]]\nnsid = 1\n{ram}\n{uuid}\n\
         [[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:b\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 7\n{ram}\n{uuid}\n"
    );
    assert_err(
        &text,
        18,
        8,
        "already used by namespace 1 in \"nqn.2026-11.io.pollux:a\"",
    );
}

#[test]
fn columns_count_characters() {
    // "é" is two bytes but one column.
    assert_err("# é\n[reactors]\ncores = [0]\n  é = 1\n", 4, 3, "");
    assert_err("[reactors]\ncores = [0]\nmode = \"é\" \n", 3, 8, "unknown reactor mode");
}

#[test]
fn io_errors_name_the_path() {
    let path = std::path::Path::new("/nonexistent/pollux/conf.toml");
    let e = Config::from_path(path).expect_err("missing file");
    assert_eq!(e.io_kind(), Some(std::io::ErrorKind::NotFound));
    assert!(
        e.to_string()
            .starts_with("/nonexistent/pollux/conf.toml: cannot read configuration: "),
        "{e}"
    );
    assert!(std::error::Error::source(&e).is_some());
    assert_eq!(e.line(), None);
}

#[test]
fn invalid_utf8_is_located() {
    let dir = std::env::temp_dir().join(format!("pollux-conf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let path = dir.join("bad.toml");
    std::fs::write(&path, b"[reactors]\ncores = [0] # \xff\n").expect("write");
    let e = Config::from_path(&path).expect_err("bad utf-8");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!((e.line(), e.column()), (Some(2), Some(15)), "{e}");
    assert!(e.message().contains("UTF-8"));
    assert!(e.to_string().starts_with(&format!("{}:2:15: ", path.display())));
}

#[test]
fn reactors_new_keys() {
    let r = |line: &str, col: usize, needle: &str| {
        assert_err(&format!("[reactors]\ncores = [0]\n{line}\n"), 3, col, needle)
    };
    r(
        "cpu_budget = 0.0",
        14,
        "`cpu_budget` must be greater than 0 and at most 1",
    );
    r("cpu_budget = 1.5", 14, "at most 1 (a fraction of one core), got 1.5");
    r("cpu_budget = -0.1", 14, "greater than 0");
    r("cpu_budget = nan", 14, "`cpu_budget` must be a finite number, got NaN");
    r("cpu_budget = \"30%\"", 14, "");
    r(
        "latency_target_us = 0",
        21,
        "`latency_target_us` must be greater than 0, got 0",
    );
    r("latency_target_us = -5.0", 21, "greater than 0, got -5");
    r("latency_target_us = inf", 21, "finite number, got inf");
    r(
        "policy = \"linux\"",
        10,
        "unknown sleep policy \"linux\": expected \"pollux\" or \"linux-half-mean\"",
    );
    r("policy = \"Pollux\"", 10, "unknown sleep policy");
    r("sleep_policy = \"pollux\"", 1, "unknown key `sleep_policy`");
    r(
        "hybrid_margin_us = -1",
        20,
        "`hybrid_margin_us` must be at least 0 and at most 1000000 (one second), got -1",
    );
    r(
        "hybrid_margin_us = 2e6",
        20,
        "at most 1000000 (one second), got 2000000",
    );
    r(
        "hybrid_margin_us = nan",
        20,
        "`hybrid_margin_us` must be a finite number, got NaN",
    );
    r("hybrid_margin_us = \"10us\"", 20, "");
    r(
        "hybrid_turnaround = \"poll\"",
        21,
        "unknown hybrid turnaround \"poll\": expected \"spin\" or \"sleep\"",
    );
    r("hybrid_turnaround = true", 21, "");
}

#[test]
fn control_checks() {
    let c = |body: &str, col: usize, needle: &str| assert_err(&format!("{BASE}[control]\n{body}\n"), 6, col, needle);
    for addr in [
        "0.0.0.0:9100",
        "192.168.1.10:9100",
        "[::]:9100",
        "[::ffff:127.0.0.1]:9100",
    ] {
        c(
            &format!("metrics = \"{addr}\""),
            11,
            "is not a loopback address: the metrics endpoint has no authentication",
        );
    }
    c("metrics = \"localhost:9100\"", 11, "not of the form \"127.0.0.1:port\"");
    c("metrics = \"127.0.0.1\"", 11, "not of the form");
    c("metrics = 9100", 11, "");
    c("metrics = \"127.0.0.1:4420\"", 11, "also a [[listener]] address");
    c("socket = \"\"", 10, "`socket` must not be empty");
    c(
        &format!("socket = \"/run/{}.sock\"", "s".repeat(100)),
        10,
        "at most 107",
    );
    c(
        "sockets = \"/run/pollux.sock\"",
        1,
        "unknown key `sockets`, expected `socket` or `metrics`",
    );
}

/// The start of a sim backend on line 10, columns 1-35.
const SIM: &str = "nsid = 1\nbackend = { sim = { size = \"1MiB\", ";

#[test]
fn sim_checks() {
    let sim = |tail: &str, col: usize, needle: &str| assert_err(&ns(&format!("{SIM}{tail} }} }}")), 10, col, needle);
    // Unknown keys, in the sim table and in a distribution.
    sim(
        "latency = 5",
        36,
        "unknown key `latency`, expected one of `size`, `read`, `write`",
    );
    sim(
        "read = { mean_us = 80.0 }",
        45,
        "unknown key `mean_us`, expected one of `fixed_us`, `min_us`, `max_us`, `median_us`, `sigma`, `fast_us`, `slow_us`, `slow_fraction`",
    );
    // Exactly one distribution, complete; the error points at the value of
    // the first key that does not fit.
    sim(
        "read = { fixed_us = 5.0, median_us = 80.0 }",
        73,
        "`read` mixes two latency distributions: `median_us` is lognormal but `fixed_us` is fixed",
    );
    sim(
        "read = { min_us = 5.0 }",
        54,
        "`min_us` makes `read` a uniform latency, which also needs `max_us`",
    );
    sim(
        "write = { slow_fraction = 0.1, fast_us = 1.0 }",
        62,
        "`slow_fraction` makes `write` a bimodal latency, which also needs `slow_us`",
    );
    assert_err(
        &ns(&format!("{SIM}read = {{}} }} }}")),
        9,
        8,
        "namespace 1 has an empty `read` latency",
    );
    // Distribution parameters.
    sim(
        "read = { median_us = 0.0, sigma = 0.2 }",
        57,
        "`read.median_us` must be greater than 0, got 0",
    );
    sim(
        "write = { median_us = 20.0, sigma = 4 }",
        72,
        "`write.sigma` must be between 0 and 3, got 4",
    );
    sim(
        "read = { fast_us = 10.0, slow_us = 900.0, slow_fraction = 1.5 }",
        94,
        "`read.slow_fraction` must be between 0 and 1, got 1.5",
    );
    sim(
        "read = { min_us = 50.0, max_us = 10.0 }",
        54,
        "`read.min_us` (50) is greater than `read.max_us` (10)",
    );
    sim(
        "read = { fast_us = 50.0, slow_us = 10.0, slow_fraction = 0.1 }",
        55,
        "`read.fast_us` (50) is greater than `read.slow_us` (10)",
    );
    sim(
        "read = { fixed_us = -1.0 }",
        56,
        "`read.fixed_us` must not be negative, got -1",
    );
    sim(
        "read = { fixed_us = nan }",
        56,
        "`read.fixed_us` must be a finite number",
    );
    sim(
        "read = { min_us = 1.0, max_us = inf }",
        68,
        "`read.max_us` must be a finite number, got inf",
    );
    // The other keys.
    sim(
        "parallelism = 0",
        50,
        "`parallelism` must be between 1 and 65536, got 0",
    );
    sim("parallelism = 65537", 50, "between 1 and 65536");
    sim("per_kib_us = -1.0", 49, "`per_kib_us` must not be negative");
    sim(
        "interrupt_delay_us = nan",
        57,
        "`interrupt_delay_us` must be a finite number",
    );
    sim("coalesce_us = inf", 50, "`coalesce_us` must be a finite number");
    sim(
        "coalesce_count = 0",
        53,
        "`coalesce_count` must be between 1 and 4294967295, got 0",
    );
    sim(
        "bandwidth = 0",
        48,
        "`bandwidth` must be greater than 0 bytes per second",
    );
    sim("bandwidth = \"fast\"", 48, "invalid `bandwidth`");
    sim(
        "seed = -1",
        43,
        "`seed` must be between 0 and 9223372036854775807, got -1",
    );
    sim("seed = 1.0", 43, "");
    // Capacity, like RAM.
    assert_err(
        &ns("nsid = 1\nbackend = { sim = { size = 1000 } }"),
        10,
        28,
        "sim `size` 1000 bytes is not a multiple of block_size 512",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { sim = { size = 0 } }"),
        10,
        28,
        "sim `size` must be greater than 0",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { sim = { read = { fixed_us = 1.0 } } }"),
        10,
        19,
        "missing key `size`",
    );
    // Written with table headers and dotted keys: positions still exact.
    assert_err(
        &ns(
            "nsid = 1\n[subsystem.namespace.backend.sim]\nsize = \"1MiB\"\n[subsystem.namespace.backend.sim.read]\nmedian_us = 80.0\nsigma = -0.5",
        ),
        14,
        9,
        "`read.sigma` must be between 0 and 3, got -0.5",
    );
    assert_err(
        &ns("nsid = 1\n[subsystem.namespace.backend.sim]\nsize = \"1MiB\"\nread.fixed_us = 1.0\nread.typo_us = 2.0"),
        13,
        6,
        "unknown key `typo_us`",
    );
}

#[test]
fn exactly_one_backend_kind() {
    assert_err(
        &ns("nsid = 1\nbackend = { ram = { size = 512 }, sim = { size = 1024 } }"),
        10,
        50,
        "namespace 1 has two backends, `ram` and `sim`: give exactly one kind",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { file = { path = \"/d.img\" }, ram = { size = 512 } }"),
        10,
        56,
        "two backends, `file` and `ram`",
    );
}

#[test]
fn file_checks() {
    assert_err(
        &ns("nsid = 1\nbackend = { file = { path = \"\" } }"),
        10,
        29,
        "`path` must not be empty",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { file = { path = \"/a\\u0000b\" } }"),
        10,
        29,
        "must not contain a NUL character",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { file = { size = 512 } }"),
        10,
        20,
        "missing key `path`",
    );
    assert_err(
        &ns("nsid = 1\nblock_size = 4096\nbackend = { file = { path = \"/d.img\", size = \"6KiB\" } }"),
        11,
        46,
        "file `size` 6144 bytes is not a multiple of block_size 4096",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { file = { path = \"/d.img\", size = 0 } }"),
        10,
        46,
        "file `size` must be greater than 0",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { file = { path = \"/d.img\", direct = \"yes\" } }"),
        10,
        48,
        "expected a boolean",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { file = { path = \"/d.img\", o_direct = true } }"),
        10,
        39,
        "unknown key `o_direct`, expected one of `path`, `size`, `direct`",
    );
}

#[test]
fn nvme_checks() {
    assert_err(
        &ns("nsid = 1\nbackend = { nvme = { pci = \"00:04\" } }"),
        10,
        28,
        "invalid `pci` address \"00:04\": no `.function`",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { nvme = { pci = \"0000:00:20.0\" } }"),
        10,
        28,
        "bad device \"20\"",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { nvme = { nsid = 1 } }"),
        9,
        8,
        "the `nvme` backend needs `pci`",
    );
    assert_err(
        &ns("nsid = 1\nblock_size = 4096\nbackend = { nvme = { pci = \"00:04.0\" } }"),
        10,
        14,
        "`block_size` cannot be given for an NVMe device (0000:00:04.0)",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { nvme = { pci = \"00:04.0\", size = \"1GiB\" } }"),
        10,
        28,
        "`size` is for a `fake` NVMe device",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { nvme = { fake = \"f0\" } }"),
        10,
        29,
        "give the namespace's `size`",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { nvme = { fake = \"f 0\", size = 512 } }"),
        10,
        29,
        "invalid fake device name",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { nvme = { pci = \"00:04.0\", nsid = 0 } }"),
        10,
        46,
        "`nsid`",
    );
    // One device namespace backs one namespace; the address is compared normalised.
    assert_err(
        &ns("nsid = 1\nbackend = { nvme = { pci = \"00:04.0\" } }\n\
             [[subsystem.namespace]]\nnsid = 2\nbackend = { nvme = { pci = \"0000:00:04.0\", nsid = 1 } }"),
        13,
        28,
        "namespace 1 of NVMe device 0000:00:04.0 is already the backend of namespace 1",
    );
    // A name is either a PCI function or a fake device.
    assert_err(
        &ns(
            "nsid = 1\nbackend = { nvme = { fake = \"0000:00:04.0\", size = 512 } }\n\
             [[subsystem.namespace]]\nnsid = 2\nbackend = { nvme = { pci = \"0000:00:04.0\" } }",
        ),
        10,
        29,
        "invalid fake device name",
    );
    assert_err(
        &ns("nsid = 1\nbackend = { nvme = { fake = \"f0\", size = 512 } }\n\
             [[subsystem.namespace]]\nnsid = 2\nbackend = { nvme = { fake = \"f0\", size = 512, nsid = 2 } }"),
        13,
        29,
        "fake NVMe device \"f0\" already backs a namespace (line 10)",
    );
    // Two namespaces of one device are fine.
    let text = ns("nsid = 1\nbackend = { nvme = { pci = \"00:04.0\" } }\n\
             [[subsystem.namespace]]\nnsid = 2\nbackend = { nvme = { pci = \"0000:00:04.0\", nsid = 2 } }");
    Config::parse(&text, "test.toml").expect("two namespaces of one device");
}

#[test]
fn duplicate_file_paths() {
    // Compared after resolution: `.` components do not make a new file.
    assert_err(
        &ns("nsid = 1\nbackend = { file = { path = \"/var/lib/pollux/d0.img\" } }\n\
             [[subsystem.namespace]]\nnsid = 2\nbackend = { file = { path = \"/var/lib/pollux/./d0.img\", direct = false } }"),
        13,
        29,
        "file /var/lib/pollux/d0.img is already the backend of namespace 1 in \"nqn.2026-11.io.pollux:a\" (line 10); a file can back only one namespace",
    );
    // Across subsystems, relative and `./`-relative.
    assert_err(
        &ns("nsid = 1\nbackend = { file = { path = \"d0.img\" } }\n\
             [[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:b\"\nallow_any_host = true\n\
             [[subsystem.namespace]]\nnsid = 1\nbackend = { file = { path = \"./d0.img\" } }"),
        16,
        29,
        "is already the backend of namespace 1 in \"nqn.2026-11.io.pollux:a\" (line 10)",
    );
    // A relative path and the same file given absolutely.
    let cwd = std::env::current_dir().expect("cwd");
    assert_err(
        &ns(&format!(
            "nsid = 1\nbackend = {{ file = {{ path = \"{}\" }} }}\n\
             [[subsystem.namespace]]\nnsid = 2\nbackend = {{ file = {{ path = \"d0.img\" }} }}",
            cwd.join("d0.img").display()
        )),
        13,
        29,
        "already the backend of namespace 1",
    );
    // Different files are fine, and so is one file name in two directories.
    Config::parse(
        &ns("nsid = 1\nbackend = { file = { path = \"/a/d0.img\" } }\n\
             [[subsystem.namespace]]\nnsid = 2\nbackend = { file = { path = \"/b/d0.img\" } }"),
        "test.toml",
    )
    .expect("distinct files");
}

#[test]
fn polling_values_are_checked_where_they_are() {
    // Subsystem level: line 8; namespace level: line 12.
    assert_err(
        &format!("{BASE}{SUB}polling = \"sometimes\"\n"),
        8,
        11,
        "unknown polling \"sometimes\": expected \"auto\", \"always\" or \"never\"",
    );
    let ns = "[[subsystem.namespace]]\nnsid = 1\nbackend = { ram = { size = \"1MiB\" } }\npolling = \"Always\"\n";
    assert_err(
        &format!("{BASE}{SUB}{ns}"),
        11,
        11,
        "`polling`: unknown polling \"Always\"",
    );
    let ns = "[[subsystem.namespace]]\nnsid = 1\nbackend = { ram = { size = \"1MiB\" } }\npolling = 1\n";
    let e = err(&format!("{BASE}{SUB}{ns}"));
    assert_eq!(e.line(), Some(11), "{e}");
    let ok = format!(
        "{BASE}{SUB}polling = \"never\"\n[[subsystem.namespace]]\nnsid = 1\nbackend = {{ ram = {{ size = \"1MiB\" }} }}\npolling = \"always\"\n"
    );
    let c = Config::parse(&ok, "test.toml").expect("valid");
    let s = &c.subsystems[0];
    assert_eq!(s.polling_of(&s.namespaces[0]), pollux_conf::Polling::Always);
    // Emitted and parsed back the same.
    assert_eq!(Config::parse(&c.to_toml(), "test.toml").expect("round trip"), c);
}
