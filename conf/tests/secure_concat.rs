//! A subsystem's `secure_concat`: whether a host may ask for secure channel concatenation
//! (SC_C in its DH-HMAC-CHAP Negotiate, NVMe 2.0 §8.13.5.9 as TP 8018 adds it).

use pollux_conf::Config;

/// One listener (lines 3-4), then a subsystem header, NQN and hosts (lines 5-7); tests
/// append the `secure_concat` key as line 8.
const BASE: &str = "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n[[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:a\"\nallow_any_host = true\n";

fn parse(text: &str) -> Config {
    Config::parse(text, "test.toml").unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn absent_is_false_and_not_emitted() {
    let c = parse(BASE);
    assert!(!c.subsystems[0].secure_concat);
    let text = c.to_toml();
    assert!(!text.contains("secure_concat"), "{text}");
    assert_eq!(parse(&text), c);
}

#[test]
fn given_values_are_kept() {
    for (value, want) in [("true", true), ("false", false)] {
        let c = parse(&format!("{BASE}secure_concat = {value}\n"));
        assert_eq!(c.subsystems[0].secure_concat, want, "secure_concat = {value}");
    }
}

#[test]
fn true_round_trips_and_false_is_not_written() {
    let c = parse(&format!("{BASE}secure_concat = true\n"));
    let text = c.to_toml();
    assert_eq!(text.matches("secure_concat = true").count(), 1, "{text}");
    assert_eq!(parse(&text), c, "{text}");

    // False is the default: the emitted conf is the one of a conf without the key.
    let off = parse(&format!("{BASE}secure_concat = false\n"));
    assert_eq!(off.to_toml(), parse(BASE).to_toml());
}

#[test]
fn needs_no_host_with_keys() {
    // Hosts with DH-HMAC-CHAP keys may be added at run time: a subsystem without any is
    // still valid.
    let text = "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n\
                [[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:a\"\nhosts = [\"nqn.2026-11.io.pollux:h\"]\n\
                secure_concat = true\n";
    assert!(parse(text).subsystems[0].secure_concat);
}

#[test]
fn a_value_not_a_boolean_is_refused_at_its_line() {
    for (value, col) in [("\"yes\"", 17), ("1", 17), ("[true]", 17)] {
        let text = format!("{BASE}secure_concat = {value}\n");
        match Config::parse(&text, "test.toml") {
            Ok(_) => panic!("parsed secure_concat = {value}"),
            Err(e) => {
                assert_eq!((e.line(), e.column()), (Some(8), Some(col)), "{e}");
                assert!(e.message().contains("expected a boolean"), "{e}");
                assert!(e.to_string().starts_with("test.toml:8:17: "), "{e}");
            }
        }
    }
    // Once per subsystem.
    let text = format!("{BASE}secure_concat = true\nsecure_concat = false\n");
    match Config::parse(&text, "test.toml") {
        Ok(_) => panic!("parsed a duplicate secure_concat"),
        Err(e) => {
            assert_eq!(e.line(), Some(9), "{e}");
            assert!(e.message().contains("duplicate key"), "{e}");
        }
    }
}

#[test]
fn a_misspelt_key_is_offered_the_right_one() {
    let text = format!("{BASE}secure_concatenation = true\n");
    match Config::parse(&text, "test.toml") {
        Ok(_) => panic!("parsed secure_concatenation"),
        Err(e) => {
            assert_eq!((e.line(), e.column()), (Some(8), Some(1)), "{e}");
            assert!(e.message().contains("`secure_concat`"), "{e}");
        }
    }
}
