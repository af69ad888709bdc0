//! The configuration as deserialized, before validation.
//!
//! Every leaf value is wrapped in [`Spanned`] so validation can point at it.
//! Tables are deliberately *not* wrapped: toml 0.8 cannot give a span for a
//! table that is only created implicitly (e.g. by the header
//! `[subsystem.namespace.backend.ram]`) and fails to deserialize a
//! `Spanned<table>` there. Required keys are plain fields so that toml itself
//! reports "missing key" at the enclosing table's header.
//!
//! Integers are read as `i64` (TOML's integer type) and range-checked during
//! validation, so that out-of-range values get a message naming the allowed
//! range instead of serde's "invalid value". Floats are read as `f64`, which
//! also accepts a TOML integer (`80` for `80.0`); `nan` and `inf` are
//! rejected during validation.

use serde::Deserialize;
use toml::Spanned;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    pub state_dir: Option<Spanned<String>>,
    pub reactors: Option<RawReactors>,
    pub listener: Option<Vec<RawListener>>,
    pub transport: Option<RawTransport>,
    pub keep_alive: Option<RawKeepAlive>,
    pub subsystem: Option<Vec<RawSubsystem>>,
    pub control: Option<RawControl>,
    pub discovery: Option<RawDiscovery>,
    pub referral: Option<Vec<RawReferral>>,
    pub gateway: Option<RawGateway>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGateway {
    pub group: Spanned<String>,
    pub name: Spanned<String>,
    pub ana_groups: Option<Spanned<Vec<Spanned<i64>>>>,
    pub heartbeat_ms: Option<Spanned<i64>>,
    pub grace_ms: Option<Spanned<i64>>,
    pub blocklist_expiry_s: Option<Spanned<i64>>,
    pub failback_delay_ms: Option<Spanned<i64>>,
    pub pool: Option<Spanned<String>>,
    pub rados_namespace: Option<Spanned<String>>,
    pub ceph_conf: Option<Spanned<String>>,
    pub user: Option<Spanned<String>>,
    pub keyring: Option<Spanned<String>>,
    pub key_file: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReferral {
    pub address: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDiscovery {
    pub filter: Option<Spanned<String>>,
    pub hosts: Option<Spanned<Vec<Spanned<RawHost>>>>,
    pub require_authentication: Option<Spanned<bool>>,
    pub dhchap_hashes: Option<Spanned<Vec<Spanned<String>>>>,
    pub dhchap_dh_groups: Option<Spanned<Vec<Spanned<String>>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReactors {
    pub cores: Spanned<Vec<Spanned<i64>>>,
    pub mode: Option<Spanned<String>>,
    pub stall_threshold_us: Option<Spanned<i64>>,
    pub placement: Option<Spanned<String>>,
    pub cpu_budget: Option<Spanned<f64>>,
    pub latency_target_us: Option<Spanned<f64>>,
    pub policy: Option<Spanned<String>>,
    pub hybrid_margin_us: Option<Spanned<f64>>,
    pub hybrid_turnaround: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListener {
    pub address: Spanned<String>,
    pub tls: Option<Spanned<String>>,
    pub ana: Option<Spanned<std::collections::BTreeMap<String, Spanned<String>>>>,
    pub max_connections: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTransport {
    pub io_queue_depth: Option<Spanned<i64>>,
    pub max_io_queues: Option<Spanned<i64>>,
    pub in_capsule_data_size: Option<Spanned<RawSize>>,
    pub max_io_size: Option<Spanned<RawSize>>,
    pub max_h2c_data: Option<Spanned<RawSize>>,
    pub max_connections: Option<Spanned<i64>>,
    pub setup_timeout_ms: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawKeepAlive {
    pub min_ms: Option<Spanned<i64>>,
    pub max_ms: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawControl {
    pub socket: Option<Spanned<String>>,
    pub metrics: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSubsystem {
    pub nqn: Spanned<String>,
    pub serial: Option<Spanned<String>>,
    pub model: Option<Spanned<String>>,
    pub allow_any_host: Option<Spanned<bool>>,
    pub hosts: Option<Spanned<Vec<Spanned<RawHost>>>>,
    pub dhchap_hashes: Option<Spanned<Vec<Spanned<String>>>>,
    pub dhchap_dh_groups: Option<Spanned<Vec<Spanned<String>>>>,
    pub secure_concat: Option<Spanned<bool>>,
    pub min_cntlid: Option<Spanned<i64>>,
    pub max_cntlid: Option<Spanned<i64>>,
    pub polling: Option<Spanned<String>>,
    pub listeners: Option<Spanned<Vec<Spanned<String>>>>,
    pub namespace: Option<Vec<RawNamespace>>,
}

/// One entry of `hosts`: an NQN, or a table naming the host's DH-HMAC-CHAP keys.
pub(crate) enum RawHost {
    Nqn(String),
    Entry(Box<RawHostEntry>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHostEntry {
    pub nqn: Spanned<String>,
    pub dhchap_key: Option<Spanned<String>>,
    pub dhchap_key_file: Option<Spanned<String>>,
    pub dhchap_ctrl_key: Option<Spanned<String>>,
    pub dhchap_ctrl_key_file: Option<Spanned<String>>,
    pub tls_key: Option<Spanned<String>>,
    pub tls_key_file: Option<Spanned<String>>,
    pub tls_key_derivation: Option<Spanned<String>>,
    pub dhchap_hashes: Option<Spanned<Vec<Spanned<String>>>>,
    pub dhchap_dh_groups: Option<Spanned<Vec<Spanned<String>>>>,
}

/// The keys given inline are zeroed when the raw entry goes (after validation has parsed
/// them into their zeroing types), as a key file's text is.
impl Drop for RawHostEntry {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        for k in [&mut self.dhchap_key, &mut self.dhchap_ctrl_key, &mut self.tls_key]
            .into_iter()
            .flatten()
        {
            k.get_mut().zeroize();
        }
    }
}

impl<'de> Deserialize<'de> for RawHost {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawHost;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "a host NQN, or a table such as { nqn = \"nqn...\", dhchap_key_file = \"/etc/pollux/host.key\" }",
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawHost, E> {
                Ok(RawHost::Nqn(v.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<RawHost, A::Error> {
                RawHostEntry::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(|e| RawHost::Entry(Box::new(e)))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNamespace {
    pub nsid: Spanned<i64>,
    pub block_size: Option<Spanned<i64>>,
    pub backend: RawBackend,
    pub uuid: Option<Spanned<String>>,
    pub nguid: Option<Spanned<String>>,
    pub eui64: Option<Spanned<String>>,
    pub ana_group: Option<Spanned<i64>>,
    pub polling: Option<Spanned<String>>,
    pub hosts: Option<Spanned<Vec<Spanned<String>>>>,
    pub qos: Option<RawQos>,
}

/// A namespace's `qos` (not spanned, as every table here). Integers are read as `i64` and
/// range-checked in validation; a float or a string is a type error at its place.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawQos {
    pub iops: Option<Spanned<i64>>,
    pub mbps: Option<Spanned<i64>>,
    pub read_mbps: Option<Spanned<i64>>,
    pub write_mbps: Option<Spanned<i64>>,
}

/// One optional field per backend kind; validation requires exactly one.
/// (A struct rather than an enum so that an unknown kind is reported as an
/// unknown key at its position, with the list of known kinds.)
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBackend {
    pub ram: Option<RawRam>,
    pub file: Option<RawFile>,
    pub sim: Option<RawSim>,
    pub nvme: Option<RawNvme>,
    pub rbd: Option<RawRbd>,
    pub null: Option<RawRam>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRbd {
    pub pool: Spanned<String>,
    pub image: Spanned<String>,
    pub ceph_conf: Option<Spanned<String>>,
    pub user: Option<Spanned<String>>,
    pub keyring: Option<Spanned<String>>,
    pub rados_namespace: Option<Spanned<String>>,
    pub write_cache: Option<Spanned<bool>>,
    pub op_timeout_s: Option<Spanned<i64>>,
    pub take_over_group: Option<Spanned<bool>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNvme {
    pub pci: Option<Spanned<String>>,
    pub fake: Option<Spanned<String>>,
    pub nsid: Option<Spanned<i64>>,
    pub size: Option<Spanned<RawSize>>,
    pub latency_us: Option<Spanned<f64>>,
}

/// A `ram` backend's keys, and a `null` one's (the same: a size).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRam {
    pub size: Spanned<RawSize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFile {
    pub path: Spanned<String>,
    pub size: Option<Spanned<RawSize>>,
    pub direct: Option<Spanned<bool>>,
    pub shared: Option<Spanned<bool>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSim {
    pub size: Spanned<RawSize>,
    pub read: Option<RawLatency>,
    pub write: Option<RawLatency>,
    pub per_kib_us: Option<Spanned<f64>>,
    pub parallelism: Option<Spanned<i64>>,
    pub bandwidth: Option<Spanned<RawSize>>,
    pub interrupt_delay_us: Option<Spanned<f64>>,
    pub coalesce_count: Option<Spanned<i64>>,
    pub coalesce_us: Option<Spanned<f64>>,
    pub seed: Option<Spanned<i64>>,
}

/// The keys of every latency distribution; validation requires exactly one
/// distribution's keys, all of them. (One struct, like [`RawBackend`], so an
/// unknown key is reported at its position with the list of known ones.)
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLatency {
    pub fixed_us: Option<Spanned<f64>>,
    pub min_us: Option<Spanned<f64>>,
    pub max_us: Option<Spanned<f64>>,
    pub median_us: Option<Spanned<f64>>,
    pub sigma: Option<Spanned<f64>>,
    pub fast_us: Option<Spanned<f64>>,
    pub slow_us: Option<Spanned<f64>>,
    pub slow_fraction: Option<Spanned<f64>>,
}

/// A size as written: an integer byte count or a string with a suffix.
pub(crate) enum RawSize {
    Int(i64),
    Text(String),
}

impl<'de> Deserialize<'de> for RawSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = RawSize;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a size: an integer byte count or a string such as \"64KiB\" or \"1GiB\"")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<RawSize, E> {
                Ok(RawSize::Int(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<RawSize, E> {
                i64::try_from(v)
                    .map(RawSize::Int)
                    .map_err(|_| E::custom("size is too large"))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawSize, E> {
                Ok(RawSize::Text(v.to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}
