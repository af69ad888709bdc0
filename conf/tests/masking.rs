//! A namespace's `hosts`: host masking (the hosts whose controllers have it attached, NVMe
//! 2.0 §3.2.1.5), parsed, checked against the subsystem's hosts and written back.

use pollux_conf::Config;

const A: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-00000000000a";
const B: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-00000000000b";
const C: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-00000000000c";

/// Reactors and a listener (lines 1-4), a subsystem admitting `admits` (lines 5-7), then a
/// namespace whose `hosts` line, when given, is line 10.
fn conf(admits: &str, ns_hosts: Option<&str>) -> String {
    let hosts_line = ns_hosts.map(|h| format!("hosts = {h}\n")).unwrap_or_default();
    format!(
        "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n\
         [[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:a\"\n{admits}\n\
         [[subsystem.namespace]]\nnsid = 1\n{hosts_line}backend = {{ ram = {{ size = \"1MiB\" }} }}\n\
         [[subsystem.namespace]]\nnsid = 2\nbackend = {{ ram = {{ size = \"1MiB\" }} }}\n"
    )
}

fn parse(text: &str) -> Config {
    Config::parse(text, "test.toml").unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn admits(hosts: &[&str]) -> String {
    let quoted: Vec<String> = hosts.iter().map(|h| format!("\"{h}\"")).collect();
    format!("hosts = [{}]", quoted.join(", "))
}

#[track_caller]
fn assert_refused(text: &str, line: usize, col: usize, needles: &[&str]) {
    match Config::parse(text, "test.toml") {
        Ok(_) => panic!("parsed:\n{text}"),
        Err(e) => {
            assert_eq!((e.line(), e.column()), (Some(line), Some(col)), "{e}");
            for n in needles {
                assert!(e.message().contains(n), "{e} lacks {n:?}");
            }
            assert!(e.to_string().starts_with(&format!("test.toml:{line}:{col}: ")), "{e}");
        }
    }
}

#[test]
fn absent_means_every_host_and_is_not_written() {
    let c = parse(&conf(&admits(&[A, B]), None));
    let n = &c.subsystems[0].namespaces[0];
    assert_eq!(n.hosts, None);
    assert!(n.visible_to(A) && n.visible_to(B) && n.visible_to(C));
    let text = c.to_toml();
    // Only the subsystem's own `hosts` line.
    assert_eq!(text.matches("hosts = ").count(), 1, "{text}");
    assert_eq!(parse(&text), c);
}

#[test]
fn a_list_masks_the_namespace_from_everyone_else_and_round_trips() {
    let c = parse(&conf(&admits(&[A, B, C]), Some(&format!("[\"{B}\", \"{A}\"]"))));
    let n = &c.subsystems[0].namespaces[0];
    // Kept in conf order.
    assert_eq!(n.hosts, Some(vec![B.to_string(), A.to_string()]));
    assert!(n.visible_to(A) && n.visible_to(B));
    assert!(!n.visible_to(C));
    // The other namespace is not masked.
    assert_eq!(c.subsystems[0].namespaces[1].hosts, None);
    let text = c.to_toml();
    assert!(text.contains(&format!("hosts = [\"{B}\", \"{A}\"]")), "{text}");
    assert_eq!(parse(&text), c, "{text}");
}

#[test]
fn an_empty_list_attaches_the_namespace_to_no_host() {
    let c = parse(&conf(&admits(&[A]), Some("[]")));
    let n = &c.subsystems[0].namespaces[0];
    assert_eq!(n.hosts, Some(Vec::new()));
    assert!(!n.visible_to(A));
    let text = c.to_toml();
    assert!(text.contains("hosts = []"), "{text}");
    assert_eq!(parse(&text), c, "{text}");
}

#[test]
fn with_allow_any_host_any_valid_nqn_may_be_named() {
    let c = parse(&conf("allow_any_host = true", Some(&format!("[\"{C}\"]"))));
    assert_eq!(c.subsystems[0].namespaces[0].hosts, Some(vec![C.to_string()]));
    assert_eq!(parse(&c.to_toml()), c);
}

#[test]
fn an_entry_that_is_not_an_nqn_is_refused_at_its_line() {
    // Line 10, the entry begins after `hosts = [`.
    assert_refused(
        &conf("allow_any_host = true", Some("[\"not-an-nqn\"]")),
        10,
        10,
        &["invalid host NQN in namespace 1's `hosts`"],
    );
    let second = format!("[\"{A}\", \"nqn.\"]");
    let col = 10 + A.len() + 4;
    assert_refused(
        &conf(&admits(&[A]), Some(&second)),
        10,
        col,
        &["invalid host NQN in namespace 1's `hosts`"],
    );
    // Not a string at all: toml's own error, at the value.
    match Config::parse(&conf("allow_any_host = true", Some("[1]")), "test.toml") {
        Ok(_) => panic!("parsed hosts = [1]"),
        Err(e) => assert_eq!(e.line(), Some(10), "{e}"),
    }
}

#[test]
fn a_host_the_subsystem_does_not_admit_is_refused() {
    assert_refused(
        &conf(&admits(&[A]), Some(&format!("[\"{B}\"]"))),
        10,
        10,
        &[B, "does not admit", "nqn.2026-11.io.pollux:a", "allow_any_host"],
    );
}

#[test]
fn a_host_listed_twice_is_refused() {
    let col = 10 + A.len() + 4;
    assert_refused(
        &conf(&admits(&[A]), Some(&format!("[\"{A}\", \"{A}\"]"))),
        10,
        col,
        &["listed twice in namespace 1's `hosts`"],
    );
}

#[test]
fn the_tenants_example_masks_as_it_says() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tenants.toml");
    let c = Config::from_path(&path).unwrap_or_else(|e| panic!("{e}"));
    let s = &c.subsystems[0];
    let (a, b) = (&s.hosts[0], &s.hosts[1]);
    let seen_by = |h: &str| -> Vec<u32> {
        s.namespaces
            .iter()
            .filter(|n| n.visible_to(h))
            .map(|n| n.nsid)
            .collect()
    };
    assert_eq!(seen_by(a), [1, 3]);
    assert_eq!(seen_by(b), [2, 3]);
    assert_eq!(s.namespaces[3].hosts, Some(Vec::new()));
    let mut back = Config::parse(&c.to_toml(), &c.origin).unwrap_or_else(|e| panic!("{e}"));
    back.origin.clone_from(&c.origin);
    assert_eq!(back, c);
}
