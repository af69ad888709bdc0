//! The state a running pollux hands to the next one (`pollux ctl upgrade`, [`crate::upgrade`]),
//! as a documented, versioned format: serde structs sent as JSON over the handover socket
//! ([`crate::upgrade::wire`]), with the descriptors they name (by index into the message's
//! descriptors) passed beside them by `SCM_RIGHTS`. Below the queues and transports, which
//! write and read their part of it (a connection's [`ConnState`]: the queue's
//! [`QueueState`], NVMe/TCP's [`TcpState`]); the upgrade above them sends it
//! (it is also `crate::upgrade::state`).
//!
//! Versioning: every message carries `format`. A binary writes [`FORMAT`] and reads every
//! format from [`OLDEST_READ`] to [`FORMAT`]; the new process says which it reads in its
//! [`Hello`], and the old one refuses the upgrade, before anything is paused, if its own
//! format is not among them (an older binary refuses a newer format cleanly). A field added
//! later is `#[serde(default)]` so that a newer binary reads an older format; a change an
//! older reader would misread bumps [`FORMAT`].
//!
//! Format 1:
//! - [`Prepare`] (sent before anything is paused): the running conf (TOML, with every run-time
//!   change), the reactor count, the listening sockets, the control endpoints, the
//!   namespaces' stores (RAM memfds, open files), the next connection serial.
//! - [`Handover`] (sent while every queue is paused at a command boundary): each queue's
//!   state ([`ConnState`]: its transport's negotiated parameters and unread bytes,
//!   [`TcpState`]; its SQ, its role and controller, the commands it received and holds,
//!   [`QueueState`]; one JSON object) and every namespace's
//!   reservation state.

use std::net::SocketAddr;
use std::path::PathBuf;

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The format this binary writes.
pub const FORMAT: u32 = 1;
/// The oldest format this binary reads.
pub const OLDEST_READ: u32 = 1;

/// Bytes, as base64 in the JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(s.as_bytes())
            .map(Bytes)
            .map_err(serde::de::Error::custom)
    }
}

/// The new process's first word: who it is and which formats it reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    /// Its version (`CARGO_PKG_VERSION`).
    pub version: String,
    /// The commit it was built from.
    pub commit: String,
    /// Its process id.
    pub pid: u32,
    /// The oldest format it reads.
    pub oldest_read: u32,
    /// The newest format it reads (its own).
    pub newest_read: u32,
}

/// A listening NVMe/TCP socket handed over.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListenerFd {
    /// The address its `[[listener]]` names.
    pub configured: SocketAddr,
    /// The address it is bound to (the port resolved).
    pub bound: SocketAddr,
    /// Its descriptor: an index into the message's descriptors.
    pub fd: usize,
}

/// A namespace's store handed over: a RAM namespace's memory (a memfd), a file
/// namespace's open file (its lock with it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoreFd {
    /// Its subsystem.
    pub subnqn: String,
    /// Its namespace id.
    pub nsid: u32,
    /// The backend kind (`ram`, `file`).
    pub kind: String,
    /// Its size in bytes.
    pub len: u64,
    /// The descriptor: an index into the message's descriptors.
    pub fd: usize,
}

/// Phase 1, before anything pauses: what the new process needs to start.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Prepare {
    /// The format of this message and of the [`Handover`] that follows.
    pub format: u32,
    /// The old process's version and commit, for the log.
    pub from_version: String,
    /// Its commit.
    pub from_commit: String,
    /// The running configuration (TOML), run-time changes included.
    pub config: String,
    /// The conf file it came from (None: the embedded default), for later reloads.
    pub origin: Option<PathBuf>,
    /// Reactors running (the new process must run as many: a controller id names its
    /// reactor).
    pub reactors: usize,
    /// The NVMe/TCP listeners.
    pub listeners: Vec<ListenerFd>,
    /// The control socket: its path and descriptor index.
    pub control: Option<(PathBuf, usize)>,
    /// The metrics listener's descriptor index.
    pub metrics: Option<usize>,
    /// Namespaces' stores: RAM memory, open files.
    pub stores: Vec<StoreFd>,
    /// The first connection serial the new process may give.
    pub next_serial: u64,
    /// A gateway group's member: its own part of `config` (the rest is the group's, which
    /// the new process follows from the cluster). Absent from an older process's message.
    #[serde(default)]
    pub group_local: Option<String>,
}

/// The submission queue's state (NVMe-oF 1.1 §3.3).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct SqState {
    /// Queue id.
    pub qid: u16,
    /// Entries (agreed at Connect).
    pub entries: u32,
    /// SQ head as completions report it.
    pub head: u32,
    /// SQ flow control disabled.
    pub flow_off: bool,
}

/// A command the queue received while it was being paused and holds: it runs in the new
/// process (or in the old one again on a rollback), in arrival order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeldCmd {
    /// The 64-byte SQE.
    pub sqe: Bytes,
    /// Its in-capsule data.
    pub data: Bytes,
}

/// One error log entry (NVMe 2.0 §5.16.1.2).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct ErrorState {
    /// Error count.
    pub count: u64,
    /// Queue.
    pub sqid: u16,
    /// Command id.
    pub cid: u16,
    /// Status field (SCT/SC/DNR/MORE as the CQE carries them, without phase).
    pub status: u16,
    /// Namespace.
    pub nsid: u32,
    /// LBA.
    pub lba: u64,
}

/// An I/O queue of a controller, as the controller knows it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct IoQueueRef {
    /// Its queue id.
    pub qid: u16,
    /// Its connection serial.
    pub serial: u64,
}

/// A controller (on its admin queue).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CtrlState {
    /// Controller id.
    pub cntlid: u16,
    /// Its subsystem (None: the discovery controller).
    pub subnqn: Option<String>,
    /// Host NQN.
    pub hostnqn: String,
    /// Host identifier.
    pub hostid: [u8; 16],
    /// CC.
    pub cc: u32,
    /// CSTS.
    pub csts: u32,
    /// KATO in ms.
    pub kato_ms: u32,
    /// I/O queues granted by Set Features Number of Queues.
    pub io_queues_granted: u16,
    /// Asynchronous Event Configuration.
    pub aec: u32,
    /// Outstanding Asynchronous Event Request command ids.
    pub aers: Vec<u16>,
    /// Events waiting for an AER.
    pub events: Vec<u32>,
    /// Its I/O queues.
    pub io_queues: Vec<IoQueueRef>,
    /// Error log, newest last.
    pub errors: Vec<ErrorState>,
    /// Errors ever logged.
    pub error_count: u64,
    /// Changed Namespace List not yet read.
    pub changed_ns: Vec<u32>,
    /// Set Features values.
    pub features: crate::controller::features::Features,
    /// SMART bits reported.
    pub smart_reported: u8,
    /// SMART events masked.
    pub smart_masked: bool,
    /// How it authenticated.
    pub authenticated: Option<String>,
    /// ANA change count the host saw.
    pub ana_seen: u64,
    /// ANA events masked.
    pub ana_masked: bool,
    /// Reservation notifications and masks.
    pub resv_log: crate::controller::reservation_log::ResvLog,
    /// Its age in ms (Identify and `pollux ctl controllers` report it).
    pub age_ms: u64,
}

/// What a queue is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum RoleState {
    /// No Connect yet.
    Unbound,
    /// The admin queue and its controller.
    Admin(Box<CtrlState>),
    /// An I/O queue.
    Io {
        /// Its controller.
        cntlid: u16,
        /// Its controller's reactor.
        owner: usize,
        /// Its subsystem.
        subnqn: String,
        /// Its Connect's host NQN.
        hostnqn: String,
        /// Its Connect's host identifier.
        hostid: [u8; 16],
    },
}

/// One connection handed over, paused at a command boundary (nothing in flight, nothing
/// unsent): its queue's part and its transport's, each written and read by its owner. In the
/// JSON both parts' fields sit side by side in one object, as format 1 has always had them
/// (`#[serde(flatten)]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConnState {
    /// The NVMe-oF queue's part (`crate::queue`).
    #[serde(flatten)]
    pub queue: QueueState,
    /// The NVMe/TCP transport's part (`crate::tcp`).
    #[serde(flatten)]
    pub transport: TcpState,
}

/// An NVMe/TCP connection's part of its handed-over state (NVMe/TCP 1.0 §3.6.2.2: what
/// ICReq and ICResp agreed).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TcpState {
    /// Its socket: an index into the message's descriptors.
    pub fd: usize,
    /// Header digests negotiated.
    pub hdgst: bool,
    /// Data digests negotiated.
    pub ddgst: bool,
    /// ICReq done.
    pub ic_done: bool,
    /// Bytes read from the socket and not yet a whole PDU.
    pub rx: Bytes,
}

/// An NVMe-oF queue's part of its handed-over state, whatever transport carries it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueState {
    /// Its serial (unique in the process, kept).
    pub serial: u64,
    /// Its reactor.
    pub reactor: usize,
    /// The listener that accepted it (bound address).
    pub listener: Option<SocketAddr>,
    /// The SQ.
    pub sq: SqState,
    /// Its role.
    pub role: RoleState,
    /// Its Connect's host NQN for authentication.
    pub auth_hostnqn: String,
    /// It had to authenticate (and has: queues still authenticating are not handed over).
    pub auth_required: bool,
    /// Commands received and held while it paused.
    pub held: Vec<HeldCmd>,
    /// Its age in ms.
    pub age_ms: u64,
}

/// One registrant.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct RegistrantState {
    /// Host identifier.
    pub hostid: [u8; 16],
    /// Reservation key.
    pub key: u64,
}

/// A namespace's reservations (NVMe 2.0 §8.19).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResvEntry {
    /// Subsystem.
    pub subnqn: String,
    /// Namespace id.
    pub nsid: u32,
    /// Generation.
    pub generation: u32,
    /// Registrants in order.
    pub registrants: Vec<RegistrantState>,
    /// Holder: host identifier and reservation type code (NVMe 2.0 Figure 580).
    pub holder: Option<([u8; 16], u8)>,
    /// PTPL.
    pub ptpl: bool,
}

/// Phase 2, while every queue is paused: the queues and the reservations.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Handover {
    /// Format.
    pub format: u32,
    /// Every queue that moves, with its transport's state.
    pub queues: Vec<ConnState>,
    /// Every namespace's reservation state with anything in it.
    pub reservations: Vec<ResvEntry>,
}

/// Every message of the handover, in the order they go.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Msg {
    /// New to old: who it is and what it reads.
    Hello(Hello),
    /// Old to new: start with this.
    Prepare(Box<Prepare>),
    /// New to old: started, reactors running, nothing served yet.
    Prepared,
    /// Old to new: the queues, paused.
    Handover(Box<Handover>),
    /// New to old: every queue installed, paused; ready to serve.
    Ready {
        /// Queues installed.
        queues: usize,
        /// Queues it could not install, with why (they are closed).
        refused: Vec<String>,
        /// How long bringing up the NVMe devices the old process let go of took, ms (0:
        /// none). Absent from a writer before it: 0.
        #[serde(default)]
        devices_ms: f64,
    },
    /// Old to new: the old process will not touch a queue again: serve.
    Commit,
    /// New to old: serving.
    Serving,
    /// Either way: the handover cannot go on, and why.
    Refuse(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> ConnState {
        ConnState {
            queue: QueueState {
                serial: 42,
                reactor: 1,
                listener: Some("127.0.0.1:4420".parse().unwrap_or_else(|_| unreachable!())),
                sq: SqState {
                    qid: 3,
                    entries: 128,
                    head: 77,
                    flow_off: false,
                },
                role: RoleState::Io {
                    cntlid: 2,
                    owner: 0,
                    subnqn: "nqn.2026-12.io.pollux:a".into(),
                    hostnqn: "nqn.2014-08.org.nvmexpress:uuid:1".into(),
                    hostid: [7; 16],
                },
                auth_hostnqn: "nqn.2014-08.org.nvmexpress:uuid:1".into(),
                auth_required: false,
                held: vec![HeldCmd {
                    sqe: Bytes(vec![1; 64]),
                    data: Bytes(vec![9; 4096]),
                }],
                age_ms: 1234,
            },
            transport: TcpState {
                fd: 0,
                hdgst: true,
                ddgst: false,
                ic_done: true,
                rx: Bytes(vec![4, 0, 0xFF, 1, 2]),
            },
        }
    }

    #[test]
    fn a_handover_round_trips_through_json_with_its_bytes() {
        let h = Msg::Handover(Box::new(Handover {
            format: FORMAT,
            queues: vec![queue()],
            reservations: vec![ResvEntry {
                subnqn: "nqn.2026-12.io.pollux:a".into(),
                nsid: 1,
                generation: 3,
                registrants: vec![RegistrantState {
                    hostid: [7; 16],
                    key: 9,
                }],
                holder: Some(([7; 16], 1)),
                ptpl: false,
            }],
        }));
        let text = serde_json::to_string(&h).unwrap_or_default();
        let Ok(Msg::Handover(back)) = serde_json::from_str::<Msg>(&text) else {
            panic!("does not parse back: {text}");
        };
        let (q, t) = (&back.queues[0].queue, &back.queues[0].transport);
        assert_eq!(t.rx, queue().transport.rx);
        assert_eq!(q.held[0].data.0.len(), 4096);
        assert_eq!((q.sq.head, q.sq.entries), (77, 128));
        assert!(matches!(&q.role, RoleState::Io { cntlid: 2, .. }));
        assert_eq!(back.reservations[0].holder, Some(([7; 16], 1)));
    }

    #[test]
    fn bad_bytes_and_unknown_messages_are_errors_not_panics() {
        assert!(serde_json::from_str::<Bytes>("\"not base64!\"").is_err());
        assert!(serde_json::from_str::<Msg>("{\"Explode\":1}").is_err());
        assert!(serde_json::from_str::<Msg>("[]").is_err());
    }

    /// A newer format may only add fields an older reader can do without: this one reads a
    /// queue whose JSON has a field it does not know.
    #[test]
    fn a_field_added_later_is_ignored_by_this_reader() {
        let mut v = serde_json::to_value(queue()).unwrap_or_default();
        v["added_in_format_2"] = serde_json::json!({"x": 1});
        assert!(serde_json::from_value::<ConnState>(v).is_ok());
    }

    /// The split into a queue's and a transport's part changed no byte of format 1: a
    /// connection is one JSON object with every field at its top, as before the split, and
    /// such an object (written by a binary from before it) reads back whole.
    #[test]
    fn a_connection_is_one_flat_object_as_format_1_had_it() {
        let v = serde_json::to_value(queue()).unwrap_or_default();
        let keys: Vec<&str> = v
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        for k in [
            "serial",
            "reactor",
            "fd",
            "listener",
            "hdgst",
            "ddgst",
            "ic_done",
            "rx",
            "sq",
            "role",
            "auth_hostnqn",
            "auth_required",
            "held",
            "age_ms",
        ] {
            assert!(keys.contains(&k), "{k} missing from {v}");
        }
        assert!(!keys.contains(&"queue") && !keys.contains(&"transport"), "{v}");
        let before_the_split = serde_json::json!({
            "serial": 7, "reactor": 0, "fd": 3, "listener": null, "hdgst": false, "ddgst": true,
            "ic_done": true, "rx": "AQI=", "sq": {"qid": 1, "entries": 32, "head": 5, "flow_off": false},
            "role": "Unbound", "auth_hostnqn": "", "auth_required": false, "held": [], "age_ms": 9
        });
        let c: ConnState = serde_json::from_value(before_the_split).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((c.queue.serial, c.queue.sq.head, c.transport.fd), (7, 5, 3));
        assert!(c.transport.ddgst && c.transport.ic_done);
        assert_eq!(c.transport.rx.0, vec![1, 2]);
    }
}
