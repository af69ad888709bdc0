//! A controller as `nvme connect` sets it up: admin queue Connect, CC.EN, Identify
//! Controller, Set Features Number of Queues, then one Connect per I/O queue (NVMe-oF 1.1
//! §3.5).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pollux_nvme::spec::{Cap, property};

use super::admin::IdCtrl;
use super::error::HostError;
use super::queue::{HostQueue, QueueOpts};

/// NVMe/TCP digests to ask for on every queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Digests {
    /// Header digests.
    pub hdgst: bool,
    /// Data digests.
    pub ddgst: bool,
}

impl Digests {
    /// No digests.
    pub const NONE: Self = Self {
        hdgst: false,
        ddgst: false,
    };
    /// Header and data digests.
    pub const BOTH: Self = Self {
        hdgst: true,
        ddgst: true,
    };
}

/// Everything [`Controller::connect_with`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerOpts {
    /// Subsystem NQN.
    pub subnqn: String,
    /// Host NQN.
    pub hostnqn: String,
    /// I/O queues to create (fewer if the controller grants fewer).
    pub io_queues: u16,
    /// Entries per I/O queue (SQSIZE + 1).
    pub queue_size: u16,
    /// Digests on every queue.
    pub digests: Digests,
    /// Keep-alive timeout asked for at Connect, ms (0: none).
    pub kato_ms: u32,
    /// CATTR of the I/O queue Connects (bit 2: disable SQ flow control).
    pub io_cattr: u8,
    /// Deadline of each blocking step.
    pub timeout: Duration,
    /// DH-HMAC-CHAP keys for every queue (authenticating where the controller asks).
    pub dhchap: Option<super::HostDhchap>,
    /// TLS 1.3 with a PSK on every queue, admin and I/O (NVMe/TCP 1.0 §3.6.1).
    pub tls: Option<super::HostTls>,
    /// The local address every queue connects from (None: the system's choice), as
    /// `nvme connect --host-traddr`.
    pub source: Option<std::net::IpAddr>,
}

impl ControllerOpts {
    /// `io_queues` queues of `queue_size` entries, no digests, no keep-alive, 5 s timeout.
    pub fn new(subnqn: &str, hostnqn: &str, io_queues: u16, queue_size: u16) -> Self {
        Self {
            subnqn: subnqn.to_string(),
            hostnqn: hostnqn.to_string(),
            io_queues,
            queue_size,
            digests: Digests::NONE,
            kato_ms: 0,
            io_cattr: 0,
            timeout: Duration::from_secs(5),
            dhchap: None,
            tls: None,
            source: None,
        }
    }
}

/// An enabled controller with its I/O queues.
#[derive(Debug)]
pub struct Controller {
    /// The admin queue.
    pub admin: HostQueue,
    /// I/O queues; `io[i]` has qid `i + 1`.
    pub io: Vec<HostQueue>,
    /// Controller ID.
    pub cntlid: u16,
    /// Identify Controller.
    pub id: IdCtrl,
    /// CAP.
    pub cap: Cap,
    /// KATO asked for, ms.
    pub kato_ms: u32,
    last_keep_alive: Instant,
}

impl Controller {
    /// Connects to `subnqn` at `addr` as `hostnqn` with `io_queues` I/O queues of
    /// `queue_size` entries each.
    pub fn connect(
        addr: SocketAddr,
        subnqn: &str,
        hostnqn: &str,
        io_queues: u16,
        queue_size: u16,
        digests: Digests,
    ) -> Result<Self, HostError> {
        let mut o = ControllerOpts::new(subnqn, hostnqn, io_queues, queue_size);
        o.digests = digests;
        Self::connect_with(addr, &o)
    }

    /// Connects with every option spelled out.
    ///
    /// With secure channel concatenation ([`super::HostDhchap::concat`], no `tls`), as the
    /// Linux host's `nvme connect --concat`: the admin queue connects over plain TCP and
    /// authenticates asking for a new PSK, is closed, and the admin and I/O queues then
    /// connect over TLS with the generated PSK (TP 8018).
    pub fn connect_with(addr: SocketAddr, o: &ControllerOpts) -> Result<Self, HostError> {
        let mut aq = QueueOpts::admin(&o.subnqn, &o.hostnqn).digests(o.digests.hdgst, o.digests.ddgst);
        aq.kato_ms = o.kato_ms;
        aq.timeout = o.timeout;
        aq.dhchap = o.dhchap.clone();
        aq.tls = o.tls.clone();
        aq.source = o.source;
        let mut tls = o.tls.clone();
        if tls.is_none() && o.dhchap.as_ref().is_some_and(|d| d.concat) {
            let mut plain = HostQueue::connect(addr, aq.clone())?;
            let generated = plain.take_generated().ok_or_else(|| {
                HostError::Auth("concatenation: the controller asked no authentication, so no PSK was generated".into())
            })?;
            plain.close();
            tls = Some(super::HostTls::generated(generated));
            aq.tls = tls.clone();
        }
        let mut admin = HostQueue::connect(addr, aq)?;
        let cntlid = admin.cntlid();
        let cap = Cap(admin.property_get(property::CAP)?);
        admin.enable()?;
        let id = admin.identify_controller()?;
        if id.cntlid != cntlid {
            return Err(HostError::Protocol(format!(
                "Identify Controller CNTLID {} differs from Connect's {cntlid}",
                id.cntlid
            )));
        }
        let mut io = Vec::new();
        if o.io_queues > 0 {
            let granted = admin.set_num_queues(o.io_queues)?;
            let n = u32::from(o.io_queues).min(granted.sq).min(granted.cq);
            let max_entries = u32::from(cap.mqes()) + 1;
            let entries = u32::from(o.queue_size).min(max_entries).clamp(2, 0xFFFF) as u16;
            let max_data = id
                .max_transfer(cap.mpsmin())
                .map_or(16 << 20, |m| m.min(64 << 20) as u32);
            for qid in 1..=n as u16 {
                let mut qo = QueueOpts::io(&o.subnqn, &o.hostnqn, qid, cntlid, entries)
                    .digests(o.digests.hdgst, o.digests.ddgst);
                qo.cattr = o.io_cattr;
                qo.timeout = o.timeout;
                qo.in_capsule_max = id.in_capsule_data();
                qo.max_data = max_data;
                qo.dhchap = o.dhchap.clone();
                qo.tls = tls.clone();
                qo.source = o.source;
                io.push(HostQueue::connect(addr, qo)?);
            }
        }
        Ok(Self {
            admin,
            io,
            cntlid,
            id,
            cap,
            kato_ms: o.kato_ms,
            last_keep_alive: Instant::now(),
        })
    }

    /// The largest transfer of one command in bytes (MDTS), if limited.
    pub fn max_transfer(&self) -> Option<u64> {
        self.id.max_transfer(self.cap.mpsmin())
    }

    /// Sends Keep Alive if KATO/2 passed since the last one (as Linux does); returns whether
    /// it sent one.
    pub fn keep_alive_if_due(&mut self) -> Result<bool, HostError> {
        if self.kato_ms == 0 || self.last_keep_alive.elapsed() < Duration::from_millis(u64::from(self.kato_ms) / 2) {
            return Ok(false);
        }
        self.admin.keep_alive()?;
        self.last_keep_alive = Instant::now();
        Ok(true)
    }

    /// Disconnects: Fabrics Disconnect on each I/O queue, then a normal controller shutdown
    /// (CC.SHN, wait for CSTS.SHST) and close.
    pub fn shutdown(mut self) -> Result<(), HostError> {
        for q in self.io.drain(..) {
            q.disconnect()?;
        }
        self.admin.shutdown_controller()?;
        self.admin.close();
        Ok(())
    }
}
