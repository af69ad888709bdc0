//! Registrant keys at rest in the cluster: the reservation object of an image a gateway
//! group serves (`pollux.resv.<image id>`, readable by any client of the pool) holds each
//! registrant's reservation key sealed, under the group's key, where the gateway has one
//! (`crate::gateway::seal`): whoever reads the pool cannot learn a key, and so cannot release
//! or preempt with it as a registered host could. Set by the gateway at start; without one,
//! keys are kept in clear, as before.

use std::sync::{Arc, RwLock};

/// Seals and opens reservation keys.
pub trait KeySeal: Send + Sync + std::fmt::Debug {
    /// `key`, sealed (None: it cannot be, and is kept in clear).
    fn seal(&self, key: u64) -> Option<String>;
    /// The key `sealed` seals (None: it does not open here).
    fn open(&self, sealed: &str) -> Option<u64>;
}

static SEALER: RwLock<Option<Arc<dyn KeySeal>>> = RwLock::new(None);

/// Seal the keys of every reservation object this process writes from now on with `s`
/// (None: keep them in clear).
pub fn set_sealer(s: Option<Arc<dyn KeySeal>>) {
    *SEALER.write().unwrap_or_else(|p| p.into_inner()) = s;
}

/// The sealer set, if any.
pub(super) fn sealer() -> Option<Arc<dyn KeySeal>> {
    SEALER.read().unwrap_or_else(|p| p.into_inner()).clone()
}
