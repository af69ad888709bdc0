//! What a gateway of a gateway group runs from the group's configuration (kept in the
//! cluster, `crate::gateway::config`): its own conf's document, the group's document it
//! applied last, and how the two make the configuration it runs (`pollux_conf::group`).
//! Held in [`super::Shared`] so that a reload of the conf file keeps the group's part and a
//! change of either part is composed the same way wherever it comes from.

use pollux_conf::Config;
use pollux_conf::group::{ClusterKeys, GroupPeer, Merged};
use zeroize::Zeroizing;

use crate::error::TargetError;

/// A hot upgrade's new process: its predecessor's own part, taken by the first
/// [`GroupConf::new`].
static INHERITED_LOCAL: std::sync::Mutex<Option<Zeroizing<String>>> = std::sync::Mutex::new(None);

/// Give the next target started in this process its predecessor's own part of the
/// configuration (a hot upgrade's new process).
pub fn inherit_local(local: Option<String>) {
    *INHERITED_LOCAL.lock().unwrap_or_else(|p| p.into_inner()) = local.map(Zeroizing::new);
}

/// A gateway's two parts.
#[derive(Debug)]
pub struct GroupConf {
    /// This gateway's name.
    pub me: String,
    /// Its slot in the group (its controller IDs); None until the group gave it one.
    pub slot: Option<u16>,
    /// The document of this gateway's own conf, run-time changes of its own included
    /// (what `pollux ctl save` writes).
    pub local: Zeroizing<String>,
    /// The group's configuration applied last (its secrets unsealed), and its version (0:
    /// none yet).
    pub doc: Zeroizing<String>,
    /// The version of `doc`.
    pub version: u64,
    /// Where this gateway's group namespaces connect to the cluster.
    pub cluster: ClusterKeys,
    /// The other gateways' listeners, as the group lists them.
    pub peers: Vec<GroupPeer>,
    /// Gateways that are fenced or out of the group now (the agent's view): their listeners
    /// are not in the discovery log.
    pub down: std::collections::BTreeSet<String>,
    /// The group's subsystems.
    pub subsystems: Vec<String>,
    /// Why the last group configuration read was not applied (None: it was).
    pub error: Option<String>,
}

impl GroupConf {
    /// The group part of a gateway running `cfg` (its own conf), before it read the group.
    pub fn new(cfg: &Config) -> Option<Self> {
        let g = cfg.gateway.as_ref()?;
        let inherited = INHERITED_LOCAL.lock().unwrap_or_else(|p| p.into_inner()).take();
        let local = match (inherited, cfg.document.text()) {
            (Some(l), _) => l.to_string(),
            (None, "") => cfg.to_toml(),
            (None, t) => t.to_string(),
        };
        Some(Self {
            me: g.name.clone(),
            slot: None,
            local: Zeroizing::new(local),
            doc: Zeroizing::new(String::new()),
            version: 0,
            cluster: ClusterKeys {
                ceph_conf: Some(g.cluster.ceph_conf.display().to_string()),
                user: Some(g.cluster.user.clone()),
                keyring: g.cluster.keyring.as_ref().map(|k| k.display().to_string()),
            },
            peers: Vec::new(),
            down: Default::default(),
            subsystems: Vec::new(),
            error: None,
        })
    }

    /// The configuration of own document `local` and group document `doc` with this
    /// gateway in slot `slot` (None: it has none yet, and the group's subsystems are not
    /// served: their controller IDs are not known), parsed as conf file `origin` would be.
    pub fn compose(
        &self,
        local: &str,
        doc: &str,
        slot: Option<u16>,
        origin: &str,
    ) -> Result<(Config, Merged), TargetError> {
        let merged = match slot {
            Some(slot) => pollux_conf::group::merge(local, doc, &self.me, slot, &self.cluster)?,
            None => pollux_conf::group::merge(local, "", &self.me, 0, &self.cluster)?,
        };
        let mut cfg = if origin == pollux_conf::EMBEDDED_ORIGIN {
            Config::parse(&merged.text, origin)?
        } else {
            Config::parse_as(&merged.text, origin, std::path::Path::new(origin))?
        };
        // The discovery log lists the paths through the gateways that serve.
        cfg.group_peers = merged
            .peers
            .iter()
            .filter(|p| !self.down.contains(&p.gateway))
            .cloned()
            .collect();
        Ok((cfg, merged))
    }

    /// Take what `merged` says of the group (after its configuration was applied).
    pub fn took(&mut self, merged: Merged) {
        self.peers = merged.peers;
        self.subsystems = merged.subsystems;
    }
}
