//! `pollux ctl VERB --flag ...`: one subcommand per method of [`METHODS`] that has a verb,
//! with its flags, help and checks generated from the table (clap's builder API), and the
//! command line turned back into the method's JSON params.

use clap::{Arg, ArgAction, ArgMatches, Command};
use serde_json::{Map, Value};

use super::methods::{Kind, METHODS, Method, Param, insert_at};

/// A verb of the table and the JSON params its command line gave.
#[derive(Debug, Clone)]
pub struct Verb {
    /// The method.
    pub method: &'static Method,
    /// Its params.
    pub params: Value,
}

fn arg_of(p: &Param) -> Arg {
    let id = p.name;
    let mut a = Arg::new(id).help(p.help).required(p.required);
    if !p.positional {
        a = a.long(id);
    }
    a = match p.kind {
        Kind::Switch => a.action(ArgAction::SetTrue).required(false),
        Kind::List => a.action(ArgAction::Append).value_delimiter(',').value_name("NAME,..."),
        Kind::Uint => a.value_parser(clap::value_parser!(u64)).value_name("N"),
        Kind::Float => a.value_parser(clap::value_parser!(f64)).value_name("X"),
        Kind::Bool => a
            .value_parser(clap::builder::BoolishValueParser::new())
            .value_name("true|false"),
        Kind::Size => a.value_name("SIZE"),
        Kind::Json => a.value_name("JSON"),
        Kind::PoolImage => a.value_name("POOL/IMAGE"),
        Kind::NsidOrDefault => a.value_name("NSID|default"),
        Kind::Str => a.value_name(id.to_uppercase()),
    };
    if p.positional {
        a = a.value_name(id.to_uppercase());
    }
    a
}

/// The clap command of `m`.
pub fn command(m: &Method) -> Command {
    let mut c = Command::new(m.verb_name()).about(m.summary);
    for p in m.params {
        c = c.arg(arg_of(p));
    }
    // A namespace has one backend.
    if m.name == "add_namespace" {
        c = c
            .group(
                clap::ArgGroup::new("backend-kind")
                    .args(["ram", "null", "file", "rbd", "backend"])
                    .required(true),
            )
            .mut_arg("size", |a| {
                a.requires("file").conflicts_with_all(["ram", "null", "rbd", "backend"])
            });
    }
    c
}

/// Why a value on the command line is refused.
#[derive(Debug, thiserror::Error)]
pub enum VerbError {
    /// Not the JSON a param takes.
    #[error("--{param}: {value:?} is not JSON: {why}")]
    Json {
        /// The param.
        param: &'static str,
        /// The value given.
        value: String,
        /// serde_json's reason.
        why: String,
    },
    /// Not POOL/IMAGE.
    #[error("--{param}: {value:?} is not POOL/IMAGE")]
    PoolImage {
        /// The param.
        param: &'static str,
        /// The value given.
        value: String,
    },
    /// Not a namespace ID nor `default`.
    #[error("{param}: {value:?} is neither a namespace ID nor `default`")]
    Nsid {
        /// The param.
        param: &'static str,
        /// The value given.
        value: String,
    },
}

/// The JSON params of `m` from its matches.
pub fn params(m: &Method, am: &ArgMatches) -> Result<Value, VerbError> {
    let mut out = Map::new();
    for p in m.params {
        let to = if p.at.is_empty() {
            p.name.replace('-', "_")
        } else {
            p.at.to_string()
        };
        let v = match p.kind {
            Kind::Switch => match am.get_flag(p.name) {
                true => Value::Bool(true),
                false => continue,
            },
            Kind::List => match am.get_many::<String>(p.name) {
                Some(vs) => Value::Array(vs.map(|s| Value::String(s.clone())).collect()),
                None => continue,
            },
            Kind::Uint => match am.get_one::<u64>(p.name) {
                Some(n) => Value::from(*n),
                None => continue,
            },
            Kind::Float => match am.get_one::<f64>(p.name) {
                Some(x) => Value::from(*x),
                None => continue,
            },
            Kind::Bool => match am.get_one::<bool>(p.name) {
                Some(b) => Value::Bool(*b),
                None => continue,
            },
            Kind::Str | Kind::Size | Kind::Json | Kind::PoolImage | Kind::NsidOrDefault => {
                let Some(s) = am.get_one::<String>(p.name) else {
                    continue;
                };
                match p.kind {
                    Kind::Json => serde_json::from_str(s).map_err(|e| VerbError::Json {
                        param: p.name,
                        value: s.clone(),
                        why: e.to_string(),
                    })?,
                    Kind::PoolImage => {
                        let Some((pool, image)) = s.split_once('/').filter(|(a, b)| !a.is_empty() && !b.is_empty())
                        else {
                            return Err(VerbError::PoolImage {
                                param: p.name,
                                value: s.clone(),
                            });
                        };
                        serde_json::json!({"pool": pool, "image": image})
                    }
                    Kind::NsidOrDefault => match s.as_str() {
                        "default" => continue,
                        n => Value::from(n.parse::<u32>().map_err(|_| VerbError::Nsid {
                            param: p.name,
                            value: s.clone(),
                        })?),
                    },
                    // A size is sent as given: the conf parses and names it in its errors.
                    _ => Value::String(s.clone()),
                }
            }
        };
        insert_at(&mut out, &to, v);
    }
    Ok(Value::Object(out))
}

impl clap::FromArgMatches for Verb {
    fn from_arg_matches(am: &ArgMatches) -> Result<Self, clap::Error> {
        let (name, sub) = am
            .subcommand()
            .ok_or_else(|| clap::Error::raw(clap::error::ErrorKind::MissingSubcommand, "a verb is needed"))?;
        let method = METHODS
            .iter()
            .find(|m| m.verb && m.verb_name() == name)
            .ok_or_else(|| clap::Error::raw(clap::error::ErrorKind::InvalidSubcommand, format!("no verb {name}")))?;
        let params = params(method, sub).map_err(|e| clap::Error::raw(clap::error::ErrorKind::ValueValidation, e))?;
        Ok(Verb { method, params })
    }

    fn update_from_arg_matches(&mut self, am: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(am)?;
        Ok(())
    }
}

impl clap::Subcommand for Verb {
    fn augment_subcommands(mut cmd: Command) -> Command {
        for m in METHODS.iter().filter(|m| m.verb) {
            cmd = cmd.subcommand(command(m));
        }
        cmd
    }

    fn augment_subcommands_for_update(cmd: Command) -> Command {
        Self::augment_subcommands(cmd)
    }

    fn has_subcommand(name: &str) -> bool {
        METHODS.iter().any(|m| m.verb && m.verb_name() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(args: &[&str]) -> Result<Verb, clap::Error> {
        let m = METHODS.iter().find(|m| m.verb_name() == args[0]).expect("a verb");
        let am = command(m).try_get_matches_from(args)?;
        Ok(Verb {
            method: m,
            params: params(m, &am).map_err(|e| clap::Error::raw(clap::error::ErrorKind::ValueValidation, e))?,
        })
    }

    #[test]
    fn flags_become_the_methods_params() {
        let v = parse(&["add-namespace", "--nqn", "nqn.a:b", "--nsid", "2", "--ram", "1GiB"]).expect("ok");
        assert_eq!(
            v.params,
            json!({"nqn": "nqn.a:b", "nsid": 2, "backend": {"ram": {"size": "1GiB"}}})
        );
        let v = parse(&["add-namespace", "--nqn", "q", "--nsid", "1", "--rbd", "rbd/img1"]).expect("ok");
        assert_eq!(v.params["backend"], json!({"rbd": {"pool": "rbd", "image": "img1"}}));
        let v = parse(&[
            "add-subsystem",
            "--nqn",
            "q",
            "--hosts",
            "h1,h2",
            "--hosts",
            "h3",
            "--allow-any-host",
        ])
        .expect("ok");
        assert_eq!(
            v.params,
            json!({"nqn": "q", "hosts": ["h1", "h2", "h3"], "allow_any_host": true})
        );
        let v = parse(&["set-polling", "q", "default", "never"]).expect("ok");
        assert_eq!(v.params, json!({"nqn": "q", "polling": "never"}));
        // Host masking: the namespace and the host by flag.
        for verb in ["ns-add-host", "ns-remove-host"] {
            let v = parse(&[verb, "--nqn", "q", "--nsid", "3", "--host", "h"]).expect("ok");
            assert_eq!(v.params, json!({"nqn": "q", "nsid": 3, "host": "h"}), "{verb}");
            assert!(
                parse(&[verb, "--nqn", "q", "--host", "h"]).is_err(),
                "{verb} without --nsid"
            );
            assert!(parse(&[verb, "--nqn", "q", "--nsid", "x", "--host", "h"]).is_err());
        }
        let v = parse(&["set-mode", "1", "poll"]).expect("ok");
        assert_eq!(v.params, json!({"reactor": 1, "mode": "poll"}));
        let v = parse(&["set-allow-any-host", "--nqn", "q", "--allow", "off"]).expect("ok");
        assert_eq!(v.params["allow"], json!(false));
        let v = parse(&["set-subsystem-secure-concat", "--nqn", "q", "--enable", "yes"]).expect("ok");
        assert_eq!(v.params, json!({"nqn": "q", "enable": true}));
        let v = parse(&["add-subsystem", "--nqn", "q", "--allow-any-host", "--secure-concat"]).expect("ok");
        assert_eq!(
            v.params,
            json!({"nqn": "q", "allow_any_host": true, "secure_concat": true})
        );
        // A host's own DH-HMAC-CHAP lists (NVMe 2.0 §8.13.5.1) are lists like `--hosts`.
        let v = parse(&[
            "set-host-keys",
            "--nqn",
            "q",
            "--host",
            "h",
            "--dhchap-key-file",
            "/k",
            "--dhchap-hashes",
            "sha384,sha512",
            "--dhchap-dh-groups",
            "ffdhe3072",
        ])
        .expect("ok");
        assert_eq!(
            v.params,
            json!({"nqn": "q", "host": "h", "dhchap_key_file": "/k",
                   "dhchap_hashes": ["sha384", "sha512"], "dhchap_dh_groups": ["ffdhe3072"]})
        );
    }

    #[test]
    fn bad_command_lines_are_refused_by_name() {
        // No backend, two backends, --size without --file, a bad POOL/IMAGE.
        assert!(parse(&["add-namespace", "--nqn", "q", "--nsid", "1"]).is_err());
        assert!(
            parse(&[
                "add-namespace",
                "--nqn",
                "q",
                "--nsid",
                "1",
                "--ram",
                "1G",
                "--null",
                "1G"
            ])
            .is_err()
        );
        assert!(
            parse(&[
                "add-namespace",
                "--nqn",
                "q",
                "--nsid",
                "1",
                "--ram",
                "1G",
                "--size",
                "1G"
            ])
            .is_err()
        );
        let e = parse(&["add-namespace", "--nqn", "q", "--nsid", "1", "--rbd", "justimage"]).expect_err("refused");
        assert!(e.to_string().contains("POOL/IMAGE"), "{e}");
        let e = parse(&["add-namespace", "--nqn", "q", "--nsid", "x", "--ram", "1G"]).expect_err("refused");
        assert!(e.to_string().contains("--nsid"), "{e}");
    }
}
