//! [`ResvState`]: the reservation state of one namespace as a pure state machine (NVMe 2.0
//! §8.19): each command is a method that returns its status and what it caused.

use pollux_nvme::spec::Status;
use pollux_nvme::spec::resv::{
    Access, AcquireAction, Cptpl, RegisterAction, ReleaseAction, ReportEntry, ResvType, notice, report_ext,
};

/// A host identifier (NVMe-oF 1.1 §3.3: 128 bits, from Connect).
pub type HostId = [u8; 16];

/// One registrant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registrant {
    /// Its host.
    pub hostid: HostId,
    /// Its reservation key.
    pub key: u64,
}

/// The reservation held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    /// The host that acquired it (for the all-registrants types every registrant holds it;
    /// this is then one of them).
    pub hostid: HostId,
    /// Its type.
    pub rtype: ResvType,
}

/// The reservation state of one namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResvState {
    /// Reservation Report's generation: counts Register, Unregister, Replace, Preempt and
    /// Clear that succeeded.
    pub generation: u32,
    /// Registrants, in order of registration.
    pub registrants: Vec<Registrant>,
    /// The reservation, if one is held.
    pub holder: Option<Holder>,
    /// Persist Through Power Loss: the state survives a restart.
    pub ptpl: bool,
}

/// What a reservation command did beyond its status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effects {
    /// Notifications for the Reservation Notification log (host, [`notice`] type).
    pub notices: Vec<(HostId, u8)>,
    /// Hosts whose commands on the namespace are aborted (Preempt and Abort).
    pub aborted: Vec<HostId>,
}

/// A reservation command that changes state, decoded and with its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResvOp {
    /// Reservation Register.
    Register {
        /// Action.
        action: RegisterAction,
        /// Ignore Existing Key.
        iekey: bool,
        /// PTPL change.
        cptpl: Cptpl,
        /// Current key.
        crkey: u64,
        /// New key.
        nrkey: u64,
    },
    /// Reservation Acquire.
    Acquire {
        /// Action.
        action: AcquireAction,
        /// Ignore Existing Key.
        iekey: bool,
        /// The type (None: a reserved code).
        rtype: Option<ResvType>,
        /// Current key.
        crkey: u64,
        /// Preempt key.
        prkey: u64,
    },
    /// Reservation Release.
    Release {
        /// Action.
        action: ReleaseAction,
        /// Ignore Existing Key.
        iekey: bool,
        /// The type given (raw).
        rtype: u8,
        /// Current key.
        crkey: u64,
    },
    /// Set Features Reservation Persistence (NVMe 2.0 §5.27.1.22).
    SetPtpl(bool),
}

impl ResvOp {
    /// Whether it asks to abort the commands of the hosts it preempts.
    pub fn aborts(&self) -> bool {
        matches!(
            self,
            ResvOp::Acquire {
                action: AcquireAction::PreemptAndAbort,
                ..
            }
        )
    }
}

pub(super) fn conflict() -> Status {
    Status::RESERVATION_CONFLICT.with_dnr()
}

pub(super) fn invalid() -> Status {
    Status::INVALID_FIELD.with_dnr()
}

impl ResvState {
    /// The registration of `host`.
    pub fn registrant(&self, host: &HostId) -> Option<&Registrant> {
        self.registrants.iter().find(|r| &r.hostid == host)
    }

    /// Whether `host` holds the reservation (every registrant does for the all-registrants
    /// types).
    pub fn holds(&self, host: &HostId) -> bool {
        match self.holder {
            Some(h) if h.rtype.all_registrants() => self.registrant(host).is_some(),
            Some(h) => &h.hostid == host,
            None => false,
        }
    }

    /// Whether `host` may run a command of `access` (NVMe 2.0 §8.19.2, Figure 474).
    pub fn allows(&self, host: &HostId, access: Access) -> bool {
        match self.holder {
            None => true,
            Some(_) if self.holds(host) => true,
            Some(h) => h.rtype.allows(access, self.registrant(host).is_some()),
        }
    }

    /// Run `op` for `host`: its status and effects. `ptpl_capable`: the namespace can persist
    /// its reservations (RESCAP bit 0). On failure nothing changed.
    pub fn apply(&mut self, host: &HostId, op: &ResvOp, ptpl_capable: bool) -> Result<Effects, Status> {
        let mut next = self.clone();
        let fx = match *op {
            ResvOp::Register {
                action,
                iekey,
                cptpl,
                crkey,
                nrkey,
            } => {
                if cptpl == Cptpl::Set && !ptpl_capable {
                    return Err(invalid());
                }
                let fx = next.register(host, action, iekey, crkey, nrkey)?;
                match cptpl {
                    Cptpl::Set => next.ptpl = true,
                    Cptpl::Clear => next.ptpl = false,
                    Cptpl::NoChange => {}
                }
                next.generation = next.generation.wrapping_add(1);
                fx
            }
            ResvOp::Acquire {
                action,
                iekey,
                rtype,
                crkey,
                prkey,
            } => {
                // IEKEY has no meaning for Acquire and Release since NVMe 1.3 (RESCAP bit 7);
                // nvmet and SPDK refuse it alike.
                let Some(rtype) = rtype.filter(|_| !iekey) else {
                    return Err(invalid());
                };
                next.check_key(host, crkey)?;
                match action {
                    AcquireAction::Acquire => next.acquire(host, rtype)?,
                    AcquireAction::Preempt | AcquireAction::PreemptAndAbort => {
                        let mut fx = next.preempt(host, rtype, prkey)?;
                        next.generation = next.generation.wrapping_add(1);
                        if action == AcquireAction::PreemptAndAbort {
                            fx.aborted = fx
                                .notices
                                .iter()
                                .filter(|(_, t)| *t == notice::REGISTRATION_PREEMPTED)
                                .map(|(h, _)| *h)
                                .collect();
                        }
                        fx
                    }
                }
            }
            ResvOp::Release {
                action,
                iekey,
                rtype,
                crkey,
            } => {
                if iekey {
                    return Err(invalid());
                }
                next.check_key(host, crkey)?;
                match action {
                    ReleaseAction::Release => next.release(host, rtype)?,
                    ReleaseAction::Clear => {
                        let fx = Effects {
                            notices: next
                                .registrants
                                .iter()
                                .filter(|r| &r.hostid != host)
                                .map(|r| (r.hostid, notice::RESERVATION_PREEMPTED))
                                .collect(),
                            aborted: Vec::new(),
                        };
                        next.registrants.clear();
                        next.holder = None;
                        next.generation = next.generation.wrapping_add(1);
                        fx
                    }
                }
            }
            ResvOp::SetPtpl(on) => {
                if on && !ptpl_capable {
                    return Err(invalid());
                }
                next.ptpl = on;
                Effects::default()
            }
        };
        *self = next;
        Ok(fx)
    }

    /// The host is a registrant with key `crkey` (else Reservation Conflict).
    fn check_key(&self, host: &HostId, crkey: u64) -> Result<(), Status> {
        match self.registrant(host) {
            Some(r) if r.key == crkey => Ok(()),
            _ => Err(conflict()),
        }
    }

    fn register(
        &mut self,
        host: &HostId,
        action: RegisterAction,
        iekey: bool,
        crkey: u64,
        nrkey: u64,
    ) -> Result<Effects, Status> {
        let pos = self.registrants.iter().position(|r| &r.hostid == host);
        match (action, pos) {
            // Registering again with the key it has is no change (NVM Command Set 1.0 §7.3).
            (RegisterAction::Register, Some(i)) if self.registrants[i].key == nrkey => Ok(Effects::default()),
            (RegisterAction::Register, Some(_)) => Err(conflict()),
            (RegisterAction::Register, None) => {
                self.registrants.push(Registrant {
                    hostid: *host,
                    key: nrkey,
                });
                Ok(Effects::default())
            }
            (RegisterAction::Unregister | RegisterAction::Replace, Some(i))
                if iekey || self.registrants[i].key == crkey =>
            {
                if action == RegisterAction::Replace {
                    self.registrants[i].key = nrkey;
                    return Ok(Effects::default());
                }
                Ok(self.unregister(i))
            }
            _ => Err(conflict()),
        }
    }

    /// Remove registrant `i`; the reservation goes with it when it was its only holder
    /// (NVMe 2.0 §8.19.6): the other registrants hear of it for the registrants-only types.
    fn unregister(&mut self, i: usize) -> Effects {
        let gone = self.registrants.remove(i);
        let mut fx = Effects::default();
        match self.holder {
            Some(h) if h.rtype.all_registrants() => {
                if self.registrants.is_empty() {
                    self.holder = None;
                } else if h.hostid == gone.hostid {
                    self.holder = Some(Holder {
                        hostid: self.registrants[0].hostid,
                        rtype: h.rtype,
                    });
                }
            }
            Some(h) if h.hostid == gone.hostid => {
                self.holder = None;
                if matches!(
                    h.rtype,
                    ResvType::WriteExclusiveRegistrantsOnly | ResvType::ExclusiveAccessRegistrantsOnly
                ) {
                    fx.notices = self.released_notices(&gone.hostid);
                }
            }
            _ => {}
        }
        fx
    }

    /// Reservation Released notices for every registrant but `host`.
    fn released_notices(&self, host: &HostId) -> Vec<(HostId, u8)> {
        self.registrants
            .iter()
            .filter(|r| &r.hostid != host)
            .map(|r| (r.hostid, notice::RESERVATION_RELEASED))
            .collect()
    }

    fn acquire(&mut self, host: &HostId, rtype: ResvType) -> Result<Effects, Status> {
        match self.holder {
            None => {
                self.holder = Some(Holder { hostid: *host, rtype });
                Ok(Effects::default())
            }
            // Acquiring what it holds already is no change; anything else conflicts.
            Some(h) if self.holds(host) && h.rtype == rtype => Ok(Effects::default()),
            Some(_) => Err(conflict()),
        }
    }

    /// Remove every registrant with key `prkey` but `host` (and `host` too when `all`), as
    /// preempted: their Registration Preempted notices. None removed: Reservation Conflict.
    fn remove_by_key(&mut self, host: &HostId, prkey: u64, with_self: bool) -> Result<Effects, Status> {
        let mut fx = Effects::default();
        let mut found = false;
        let mut i = 0;
        while i < self.registrants.len() {
            let r = self.registrants[i];
            if r.key == prkey && (with_self || &r.hostid != host) {
                found = true;
                let more = self.unregister(i);
                fx.notices.extend(more.notices);
                if &r.hostid != host {
                    fx.notices.push((r.hostid, notice::REGISTRATION_PREEMPTED));
                }
            } else {
                i += 1;
            }
        }
        if found { Ok(fx) } else { Err(conflict()) }
    }

    /// Preempt (NVMe 2.0 §8.19.5, Figure 477).
    fn preempt(&mut self, host: &HostId, rtype: ResvType, prkey: u64) -> Result<Effects, Status> {
        let Some(h) = self.holder else {
            // No reservation: only the registrants of that key go.
            return self.remove_by_key(host, prkey, true);
        };
        if h.rtype.all_registrants() {
            if prkey != 0 {
                return self.remove_by_key(host, prkey, true);
            }
            // Key 0: every other registrant goes and this host holds a reservation of the
            // new type. It becomes holder first, so the removal cannot release it.
            self.holder = Some(Holder { hostid: *host, rtype });
            let others: Vec<HostId> = self
                .registrants
                .iter()
                .map(|r| r.hostid)
                .filter(|id| id != host)
                .collect();
            self.registrants.retain(|r| &r.hostid == host);
            return Ok(Effects {
                notices: others
                    .into_iter()
                    .map(|id| (id, notice::REGISTRATION_PREEMPTED))
                    .collect(),
                aborted: Vec::new(),
            });
        }
        if h.hostid == *host {
            // Preempting itself changes the type; the others hear of a release when it did.
            self.holder = Some(Holder { hostid: *host, rtype });
            let notices = if h.rtype != rtype {
                self.released_notices(host)
            } else {
                Vec::new()
            };
            return Ok(Effects {
                notices,
                aborted: Vec::new(),
            });
        }
        let holder_key = self.registrant(&h.hostid).map(|r| r.key);
        if holder_key == Some(prkey) {
            self.holder = Some(Holder { hostid: *host, rtype });
            let mut fx = self.remove_by_key(host, prkey, false)?;
            if h.rtype != rtype {
                fx.notices.extend(self.released_notices(host));
            }
            return Ok(fx);
        }
        if prkey == 0 {
            return Err(invalid());
        }
        self.remove_by_key(host, prkey, true)
    }

    fn release(&mut self, host: &HostId, rtype: u8) -> Result<Effects, Status> {
        let Some(h) = self.holder else {
            return Ok(Effects::default());
        };
        // A registrant that does not hold it releases nothing (NVMe 2.0 §8.19.7).
        if !self.holds(host) {
            return Ok(Effects::default());
        }
        if h.rtype.code() != rtype {
            return Err(invalid());
        }
        self.holder = None;
        let notices = match h.rtype {
            ResvType::WriteExclusive | ResvType::ExclusiveAccess => Vec::new(),
            _ => self.released_notices(host),
        };
        Ok(Effects {
            notices,
            aborted: Vec::new(),
        })
    }

    /// The extended Reservation Status data structure (NVM Command Set 1.0 §7.6), `len`
    /// bytes.
    pub fn report(&self, len: usize) -> Vec<u8> {
        let regs: Vec<ReportEntry> = self
            .registrants
            .iter()
            .map(|r| ReportEntry {
                // Dynamic controller model: a registration is the host's, not a controller's.
                cntlid: 0xFFFF,
                holder: self.holds(&r.hostid),
                rkey: r.key,
                hostid: r.hostid,
            })
            .collect();
        report_ext(self.generation, self.holder.map(|h| h.rtype), self.ptpl, &regs, len)
    }
}
