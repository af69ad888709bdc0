//! One subsystem on several targets and discovery referrals: controller ID ranges,
//! `[[referral]]` entries, their errors (with positions) and their round trip.

use pollux_conf::{ConfError, Config, MAX_CNTLID, MIN_CNTLID, Referral};

/// Two reactors and one listener: lines 1-4.
const BASE: &str = "[reactors]\ncores = [0, 1]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n";

fn parse(text: &str) -> Config {
    Config::parse(text, "ha.toml").unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn err(text: &str) -> ConfError {
    match Config::parse(text, "ha.toml") {
        Ok(c) => panic!("parsed, expected an error:\n{text}\n{c:?}"),
        Err(e) => e,
    }
}

#[track_caller]
fn assert_err(text: &str, line: usize, col: usize, needles: &[&str]) {
    let e = err(text);
    assert_eq!(
        (e.line(), e.column()),
        (Some(line), Some(col)),
        "wrong position for {e}"
    );
    for n in needles {
        assert!(e.message().contains(n), "{e} lacks {n:?}");
    }
}

/// A subsystem `name` open to any host with `keys` (e.g. `min_cntlid = 1`), on 3 lines
/// plus one per key.
fn sub(name: &str, keys: &str) -> String {
    format!("[[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:{name}\"\nallow_any_host = true\n{keys}")
}

#[track_caller]
fn round_trip(c: &Config) {
    let text = c.to_toml();
    let back = Config::parse(&text, &c.origin).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(&back, c, "round trip changed the config:\n{text}");
}

#[test]
fn the_default_range_is_the_whole_dynamic_id_space_and_is_not_written() {
    assert_eq!((MIN_CNTLID, MAX_CNTLID), (1, 0xFFEF));
    let c = parse(&format!("{BASE}{}{}", sub("a", ""), sub("b", "")));
    for s in &c.subsystems {
        assert_eq!((s.min_cntlid, s.max_cntlid), (1, 0xFFEF));
        assert!(s.default_cntlid_range());
    }
    let text = c.to_toml();
    assert!(!text.contains("cntlid"), "{text}");
    // Written out in full, the default is still the default (and shared).
    let c = parse(&format!(
        "{BASE}{}{}",
        sub("a", "min_cntlid = 1\nmax_cntlid = 65519\n"),
        sub("b", "min_cntlid = 1\nmax_cntlid = 65519\n")
    ));
    assert!(c.subsystems.iter().all(|s| s.default_cntlid_range()));
}

#[test]
fn ranges_are_kept_and_round_trip() {
    let c = parse(&format!(
        "{BASE}{}{}{}{}",
        sub("a", "min_cntlid = 1\nmax_cntlid = 1000\n"),
        sub("b", "min_cntlid = 1001\nmax_cntlid = 2000\n"),
        sub("c", "min_cntlid = 60000\n"),
        sub("d", "")
    ));
    let r: Vec<(u16, u16)> = c.subsystems.iter().map(|s| (s.min_cntlid, s.max_cntlid)).collect();
    assert_eq!(r, [(1, 1000), (1001, 2000), (60000, 0xFFEF), (1, 0xFFEF)]);
    let text = c.to_toml();
    assert!(text.contains("min_cntlid = 1001\nmax_cntlid = 2000\n"), "{text}");
    round_trip(&c);
    // Only max given.
    let c = parse(&format!("{BASE}{}", sub("a", "max_cntlid = 2\n")));
    assert_eq!((c.subsystems[0].min_cntlid, c.subsystems[0].max_cntlid), (1, 2));
    round_trip(&c);
}

#[test]
fn out_of_range_and_empty_ranges_are_refused_where_written() {
    assert_err(
        &format!("{BASE}{}", sub("a", "min_cntlid = 0\n")),
        8,
        14,
        &["`min_cntlid` must be between 1 and 65519, got 0"],
    );
    assert_err(
        &format!("{BASE}{}", sub("a", "max_cntlid = 65520\n")),
        8,
        14,
        &["`max_cntlid` must be between 1 and 65519, got 65520"],
    );
    assert_err(
        &format!("{BASE}{}", sub("a", "max_cntlid = -1\n")),
        8,
        14,
        &["`max_cntlid` must be between 1 and 65519"],
    );
    assert_err(
        &format!("{BASE}{}", sub("a", "min_cntlid = 10\nmax_cntlid = 9\n")),
        9,
        14,
        &["nqn.2026-11.io.pollux:a", "`min_cntlid` 10 is above `max_cntlid` 9"],
    );
    // min above the default max: reported at min (max is not written).
    assert_err(
        &format!("{BASE}{}", sub("a", "min_cntlid = 65519\n")),
        8,
        14,
        &["holds 1 ID(s) but the conf runs 2 reactors", "at least 2"],
    );
    assert_err(
        &format!("{BASE}{}", sub("a", "max_cntlid = \"9\"\n")),
        8,
        14,
        &["invalid type"],
    );
}

#[test]
fn a_range_needs_one_id_per_reactor() {
    // Two reactors: two IDs are enough (one each), one is not.
    parse(&format!("{BASE}{}", sub("a", "min_cntlid = 7\nmax_cntlid = 8\n")));
    assert_err(
        &format!("{BASE}{}", sub("a", "min_cntlid = 7\nmax_cntlid = 7\n")),
        9,
        14,
        &["7..=7", "nqn.2026-11.io.pollux:a", "2 reactors"],
    );
    let four = BASE.replace("cores = [0, 1]", "cores = [0, 1, 2, 3]");
    assert_err(
        &format!("{four}{}", sub("a", "min_cntlid = 7\nmax_cntlid = 9\n")),
        9,
        14,
        &["holds 3 ID(s) but the conf runs 4 reactors"],
    );
    parse(&format!("{four}{}", sub("a", "min_cntlid = 7\nmax_cntlid = 10\n")));
}

#[test]
fn overlapping_ranges_of_one_conf_are_refused_naming_both() {
    // Subsystem a: lines 5-9, b: lines 10-14.
    let text = format!(
        "{BASE}{}{}",
        sub("a", "min_cntlid = 1\nmax_cntlid = 100\n"),
        sub("b", "min_cntlid = 100\nmax_cntlid = 200\n")
    );
    assert_err(
        &text,
        13,
        14,
        &[
            "100..=200",
            "nqn.2026-11.io.pollux:b",
            "overlaps the range 1..=100",
            "nqn.2026-11.io.pollux:a",
            "(line 8)",
        ],
    );
    // Contained, given by max only.
    let text = format!(
        "{BASE}{}{}",
        sub("a", "min_cntlid = 10\nmax_cntlid = 100\n"),
        sub("b", "max_cntlid = 50\n")
    );
    assert_err(&text, 13, 14, &["1..=50", "overlaps the range 10..=100"]);
    // Touching but disjoint ranges, and a subsystem with the default range beside them.
    parse(&format!(
        "{BASE}{}{}{}",
        sub("a", "min_cntlid = 1\nmax_cntlid = 100\n"),
        sub("b", ""),
        sub("c", "min_cntlid = 101\nmax_cntlid = 200\n")
    ));
}

#[test]
fn referrals_parse_in_order_and_round_trip() {
    let text = format!(
        "{BASE}[[referral]]\naddress = \"10.0.0.2:8009\"\n[[referral]]\naddress = \" [fd00::2]:4420 \"\n[[referral]]\naddress = \"127.0.0.1:8009\"\n"
    );
    let c = parse(&text);
    let want: Vec<Referral> = ["10.0.0.2:8009", "[fd00::2]:4420", "127.0.0.1:8009"]
        .iter()
        .map(|a| Referral {
            address: a.parse().unwrap_or_else(|e| panic!("{e}")),
        })
        .collect();
    assert_eq!(c.referrals, want);
    assert!(c.to_toml().contains("[[referral]]\naddress = \"[fd00::2]:4420\"\n"));
    round_trip(&c);
    assert!(parse(BASE).referrals.is_empty());
    assert!(!parse(BASE).to_toml().contains("referral"));
}

#[test]
fn bad_referrals_are_refused_where_written() {
    let r = |a: &str| format!("{BASE}[[referral]]\naddress = \"{a}\"\n");
    assert_err(
        &r("target2:8009"),
        6,
        11,
        &["\"target2:8009\" is not of the form", "numeric"],
    );
    assert_err(&r("10.0.0.2"), 6, 11, &["is not of the form"]);
    assert_err(&r("10.0.0.2:0"), 6, 11, &["port 0"]);
    assert_err(&r("0.0.0.0:8009"), 6, 11, &["not the address of one machine"]);
    assert_err(&r("[::]:8009"), 6, 11, &["not the address of one machine"]);
    assert_err(&r("224.0.0.1:8009"), 6, 11, &["not the address of one machine"]);
    assert_err(
        &format!("{BASE}[[referral]]\naddress = 8009\n"),
        6,
        11,
        &["invalid type"],
    );
    assert_err(
        &format!("{BASE}[[referral]]\naddress = \"10.0.0.2:8009\"\ntls = \"required\"\n"),
        7,
        1,
        &["unknown key `tls`"],
    );
    assert_err(&format!("{BASE}[[referral]]\n"), 5, 1, &["missing key `address`"]);
}

#[test]
fn duplicate_referrals_are_refused_naming_the_first() {
    let text = format!(
        "{BASE}[[referral]]\naddress = \"10.0.0.2:8009\"\n[[referral]]\naddress = \"10.0.0.3:8009\"\n[[referral]]\naddress = \"10.0.0.2:08009\"\n"
    );
    assert_err(&text, 10, 11, &["10.0.0.2:8009 is already listed on line 6"]);
    let text =
        format!("{BASE}[[referral]]\naddress = \"[fd00::2]:8009\"\n[[referral]]\naddress = \"[fd00:0::2]:8009\"\n");
    assert_err(&text, 8, 11, &["already listed on line 6"]);
}

#[test]
fn a_referral_to_this_target_is_refused() {
    assert_err(
        &format!("{BASE}[[referral]]\naddress = \"127.0.0.1:4420\"\n"),
        6,
        11,
        &["this target's own listener 127.0.0.1:4420"],
    );
    // Through loopback to a listener on every address.
    let any = "[reactors]\ncores = [0]\n[[listener]]\naddress = \"0.0.0.0:8009\"\n";
    assert_err(
        &format!("{any}[[referral]]\naddress = \"127.0.0.1:8009\"\n"),
        6,
        11,
        &["own listener 0.0.0.0:8009"],
    );
    // Another port of the same machine is another target.
    parse(&format!("{BASE}[[referral]]\naddress = \"127.0.0.1:4421\"\n"));
    parse(&format!("{any}[[referral]]\naddress = \"127.0.0.1:8010\"\n"));
    parse(&format!("{any}[[referral]]\naddress = \"10.0.0.2:8009\"\n"));
}

/// Two targets' confs that say the same about a subsystem give it the same identity: the
/// serial number and every namespace identifier are a function of the conf alone (a host's
/// multipath joins the paths by them, NVMe 2.0 §4.7).
#[test]
fn the_same_subsystem_in_two_confs_has_the_same_identifiers() {
    let ns = "[[subsystem.namespace]]\nnsid = 1\nbackend = { ram = { size = \"1MiB\" } }\n[[subsystem.namespace]]\nnsid = 7\nblock_size = 4096\nbackend = { ram = { size = \"1MiB\" } }\n";
    let a = parse(&format!(
        "{BASE}{}{ns}",
        sub("shared", "min_cntlid = 1\nmax_cntlid = 100\n")
    ));
    let b = parse(&format!(
        "[reactors]\ncores = [3]\n[[listener]]\naddress = \"10.9.9.9:4420\"\n{}{ns}",
        sub("shared", "min_cntlid = 101\nmax_cntlid = 200\n")
    ));
    let (sa, sb) = (&a.subsystems[0], &b.subsystems[0]);
    assert_eq!((&sa.serial, &sa.model), (&sb.serial, &sb.model));
    assert_eq!(sa.namespaces.len(), 2);
    for (x, y) in sa.namespaces.iter().zip(&sb.namespaces) {
        assert_eq!((x.nsid, x.uuid, x.nguid, x.eui64), (y.nsid, y.uuid, y.nguid, y.eui64));
    }
    assert_ne!(sa.namespaces[0].nguid, sa.namespaces[1].nguid);
    assert_ne!((sa.min_cntlid, sa.max_cntlid), (sb.min_cntlid, sb.max_cntlid));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

    /// A range is accepted exactly when it is within the ID space, not empty and holds an
    /// ID per reactor; what is accepted round-trips.
    #[test]
    fn ranges_are_accepted_exactly_when_valid(min in -2i64..70_000, max in -2i64..70_000, cores in 1usize..5) {
        let cores_list: Vec<String> = (0..cores).map(|c| c.to_string()).collect();
        let text = format!(
            "[reactors]\ncores = [{}]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n{}",
            cores_list.join(", "),
            sub("p", &format!("min_cntlid = {min}\nmax_cntlid = {max}\n"))
        );
        let valid = (1..=i64::from(MAX_CNTLID)).contains(&min)
            && (1..=i64::from(MAX_CNTLID)).contains(&max)
            && max - min + 1 >= cores as i64;
        match Config::parse(&text, "p.toml") {
            Ok(c) => {
                proptest::prop_assert!(valid, "accepted {min}..={max} with {cores} reactors");
                let s = &c.subsystems[0];
                proptest::prop_assert_eq!((i64::from(s.min_cntlid), i64::from(s.max_cntlid)), (min, max));
                let back = Config::parse(&c.to_toml(), "p.toml");
                proptest::prop_assert_eq!(back.ok(), Some(c));
            }
            Err(e) => {
                proptest::prop_assert!(!valid, "refused {min}..={max} with {cores} reactors: {e}");
                proptest::prop_assert!(e.line() == Some(8) || e.line() == Some(9), "{e}");
            }
        }
    }
}

#[test]
fn a_file_store_may_be_shared_with_other_targets() {
    let ns = |keys: &str| {
        format!(
            "{BASE}{}[[subsystem.namespace]]\nnsid = 1\nbackend = {{ file = {{ path = \"/srv/shared.img\"{keys} }} }}\n",
            sub("a", "")
        )
    };
    let file = |c: &Config| match &c.subsystems[0].namespaces[0].backend {
        pollux_conf::Backend::File(f) => f.clone(),
        other => panic!("{other:?}"),
    };
    let c = parse(&ns(""));
    assert!(!file(&c).shared, "exclusive by default");
    assert!(!c.to_toml().contains("shared ="));
    let c = parse(&ns(", shared = true"));
    assert!(file(&c).shared && file(&c).direct);
    assert!(c.to_toml().contains("direct = true, shared = true"), "{}", c.to_toml());
    round_trip(&c);
    assert_err(&ns(", shared = \"yes\""), 10, 57, &["invalid type"]);
}
