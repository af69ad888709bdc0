//! Connection set-up: the TLS handshake, ICReq/ICResp and Fabrics Connect.

use std::sync::Arc;
use std::time::Instant;

use pollux_nvme::tcp::{CommonHeader, Direction, PduHeader, PduLimits, PduType, encode_ic_req, parse_pdu_header};
use tracing::debug;
use zerocopy::FromBytes;

use super::{CONNECT_DATA_LEN, ConnectResult, Data, HostQueue, IcInfo, RawReply};
use crate::HostTls;
use crate::error::HostError;
use crate::sqe;
use pollux_link::tls::TlsLink;

impl HostQueue {
    /// The TLS 1.3 handshake on the freshly connected socket (NVMe/TCP 1.0 §3.6.1.1: before
    /// ICReq), offering the identity and TLS PSK of `cfg` for this queue's host and
    /// subsystem, driven with poll(2) under the queue's timeout. A failure closes the queue.
    pub(super) fn tls_handshake(&mut self, cfg: &HostTls) -> Result<TlsLink, HostError> {
        let psk = cfg.tls_psk(&self.opts.hostnqn, &self.opts.subnqn)?;
        // The record layer reads and writes its own handle of the socket (a dup: the same
        // file description, O_NONBLOCK included), so the queue's socket stays a plain
        // `TcpStream` and the plain path is untouched.
        let sock = Arc::new(self.sock.try_clone()?);
        let mut link = TlsLink::connect(sock, psk).map_err(|e| HostError::Tls(e.to_string()))?;
        let start = Instant::now();
        let deadline = start + self.opts.timeout;
        loop {
            match link.handshake() {
                Ok(true) => {
                    debug!(
                        qid = self.opts.qid,
                        cipher = link.cipher(),
                        "TLS 1.3 session established"
                    );
                    return Ok(link);
                }
                Ok(false) => {}
                Err(why) => {
                    self.close();
                    return Err(HostError::Tls(format!("handshake failed: {why}")));
                }
            }
            if Instant::now() >= deadline {
                self.close();
                return Err(HostError::Timeout {
                    waited: start.elapsed(),
                    what: "the TLS handshake",
                });
            }
            // The controller's next flight, or room for the rest of ours.
            self.wait_fd(deadline, true, link.pending() > 0)?;
        }
    }

    /// ICReq/ICResp (NVMe/TCP 1.0 §3.6.2.2-3): asks for the digests of the options, HPDA 0,
    /// MAXR2T 0 (as Linux), and refuses an ICResp that Linux would refuse: PLEN not 128,
    /// PFV not 0, digests other than requested, CPDA not 0, MAXH2CDATA below 4096 or not a
    /// multiple of 4.
    pub fn initialize(&mut self) -> Result<IcInfo, HostError> {
        if self.ic_done {
            return Err(HostError::Invalid("ICReq/ICResp already exchanged"));
        }
        let req = encode_ic_req(self.opts.hdgst, self.opts.ddgst, 0, 0);
        self.send_raw(&req)?;
        let timeout = self.opts.timeout;
        let reply = match self.recv_raw(timeout) {
            Err(HostError::Timeout { waited, .. }) => {
                return Err(HostError::Timeout { waited, what: "ICResp" });
            }
            r => r?,
        };
        let (hdr, bytes) = match reply {
            RawReply::Pdu { hdr, bytes } => (hdr, bytes),
            RawReply::TermReq { fes, fei, .. } => {
                self.closed = true;
                return Err(HostError::TermReq { fes, fei });
            }
            RawReply::Eof => {
                self.closed = true;
                return Err(HostError::Closed);
            }
            RawReply::Garbage(b) => {
                self.closed = true;
                return Err(HostError::IcResp(format!("not a PDU: {:02x?}", &b[..b.len().min(16)])));
            }
        };
        let fail = |q: &mut Self, why: String| {
            q.closed = true;
            Err(HostError::IcResp(why))
        };
        let ty = bytes.first().copied().unwrap_or_default();
        if ty != PduType::IcResp as u8 {
            return fail(self, format!("PDU type {ty:#04x} instead of ICResp"));
        }
        if bytes.len() != 128 {
            return fail(self, format!("PLEN {} instead of 128", bytes.len()));
        }
        let Some(PduHeader::IcResp(ic)) = hdr else {
            // Re-parse for the precise reason.
            let why = match CommonHeader::read_from_prefix(&bytes) {
                Ok((ch, _)) => parse_pdu_header(&ch, &bytes, &PduLimits::default(), Direction::ControllerToHost)
                    .err()
                    .map_or_else(|| "invalid ICResp".to_string(), |e| e.to_string()),
                Err(_) => "short ICResp".to_string(),
            };
            return fail(self, why);
        };
        if ic.pfv.get() != 0 {
            return fail(self, format!("PFV {}", ic.pfv.get()));
        }
        if ic.hdgst() != self.opts.hdgst || ic.ddgst() != self.opts.ddgst {
            return fail(
                self,
                format!(
                    "digests {:#x}, requested header {} data {}",
                    ic.dgst, self.opts.hdgst, self.opts.ddgst
                ),
            );
        }
        if ic.cpda != 0 {
            return fail(self, format!("CPDA {} (only 0 is supported)", ic.cpda));
        }
        let m = ic.maxh2cdata.get();
        if m < 4096 || !m.is_multiple_of(4) {
            return fail(self, format!("MAXH2CDATA {m}"));
        }
        self.hdgst = ic.hdgst();
        self.ddgst = ic.ddgst();
        self.maxh2cdata = m;
        self.ic_done = true;
        Ok(self.ic_info())
    }

    /// Fabrics Connect (NVMe-oF 1.1 §6.3) with the options' QID, SQSIZE, CATTR, KATO,
    /// HOSTID, CNTLID, SUBNQN and HOSTNQN; the Connect data goes in-capsule. Returns the
    /// status and dw0 whatever they are; on success the controller id is remembered.
    pub fn fabrics_connect(&mut self) -> Result<ConnectResult, HostError> {
        let o = &self.opts;
        let sqe = sqe::connect(o.qid, o.sqsize, o.cattr, o.kato_ms);
        let data = sqe::connect_data(&o.hostid, o.cntlid, &o.subnqn, &o.hostnqn);
        debug_assert_eq!(data.len(), CONNECT_DATA_LEN);
        let cid = self.submit_inner(sqe, Data::ToCtrl(data.to_vec()), 0, true)?;
        let c = self.wait_for(cid)?;
        if c.status.is_success() {
            self.cntlid = c.dw0 as u16;
        }
        Ok(ConnectResult {
            status: c.status,
            dw0: c.dw0,
        })
    }
}
