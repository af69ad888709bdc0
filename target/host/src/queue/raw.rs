//! Raw mode, for protocol tests: PDUs sent and received as bytes, and whole PDUs built with
//! the negotiated digests.

use std::time::{Duration, Instant};

use pollux_nvme::spec::Sqe;
use pollux_nvme::tcp::{
    CommonHeader, Direction, PduLimits, PduType, TermReqHdr, crc32c, encode_capsule_cmd, encode_h2c_data_hdr,
    parse_pdu_header,
};
use zerocopy::FromBytes;

use super::{HostQueue, MAX_RAW_PLEN, RawReply};
use crate::error::HostError;

impl HostQueue {
    /// Sends `bytes` as they are (after anything already queued), waiting up to the timeout.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), HostError> {
        if self.closed {
            return Err(HostError::Closed);
        }
        self.out.extend_from_slice(bytes);
        self.send_pending()
    }

    /// Reads the next PDU whole, whatever it is, waiting up to `timeout`: a PDU (parsed when
    /// valid), a C2HTermReq, bytes that are no PDU, or EOF. Nothing is dispatched: commands
    /// in flight are not completed by what this returns.
    pub fn recv_raw(&mut self, timeout: Duration) -> Result<RawReply, HostError> {
        let start = Instant::now();
        let deadline = start + timeout;
        loop {
            let avail = self.rx.avail();
            if let Some(ch8) = avail.first_chunk::<8>() {
                let Ok(ch) = CommonHeader::read_from_bytes(ch8) else {
                    return Err(HostError::Invalid("common header"));
                };
                let plen = ch.plen.get();
                if CommonHeader::parse(ch8).is_err() || plen > MAX_RAW_PLEN {
                    let bytes = avail.to_vec();
                    self.rx.clear();
                    self.need = 8;
                    return Ok(RawReply::Garbage(bytes));
                }
                let plen = plen as usize;
                self.need = plen;
                if avail.len() >= plen {
                    let bytes = avail[..plen].to_vec();
                    self.rx.consume(plen);
                    self.need = 8;
                    return Ok(self.raw_reply(&ch, bytes));
                }
            }
            match self.fill() {
                Ok(true) => continue,
                Ok(false) => {}
                Err(HostError::Closed) => return Ok(RawReply::Eof),
                Err(e) => return Err(e),
            }
            if Instant::now() >= deadline {
                return Err(HostError::Timeout {
                    waited: start.elapsed(),
                    what: "a PDU",
                });
            }
            self.wait_fd(deadline, true, false)?;
        }
    }

    fn raw_reply(&self, ch: &CommonHeader, bytes: Vec<u8>) -> RawReply {
        if ch.pdu_type == PduType::C2HTermReq as u8
            && let Ok((t, rest)) = TermReqHdr::read_from_prefix(&bytes)
        {
            return RawReply::TermReq {
                fes: t.fes.get(),
                fei: t.fei.get(),
                offending: rest.to_vec(),
            };
        }
        let limits = PduLimits {
            max_data: u32::MAX,
            ..self.limits()
        };
        let hl = ch.header_len(&limits);
        let hdr = bytes
            .get(..hl)
            .and_then(|h| parse_pdu_header(ch, h, &limits, Direction::ControllerToHost).ok());
        RawReply::Pdu { hdr, bytes }
    }

    /// A whole CapsuleCmd PDU for `sqe` with `data` in-capsule, digests as negotiated (for
    /// raw tests; CID, PSDT and SGL are taken as they are in `sqe`).
    pub fn capsule_pdu(&self, sqe: &Sqe, data: &[u8]) -> Vec<u8> {
        let (h, n) = encode_capsule_cmd(sqe, data.len() as u32, self.hdgst, self.ddgst);
        let mut v = h[..n].to_vec();
        v.extend_from_slice(data);
        if self.ddgst && !data.is_empty() {
            v.extend_from_slice(&crc32c(data).to_le_bytes());
        }
        v
    }

    /// A whole H2CData PDU, digests as negotiated (for raw tests).
    pub fn h2c_data_pdu(&self, cccid: u16, ttag: u16, datao: u32, data: &[u8], last: bool) -> Vec<u8> {
        let (h, n) = encode_h2c_data_hdr(cccid, ttag, datao, data.len() as u32, last, self.hdgst, self.ddgst);
        let mut v = h[..n].to_vec();
        v.extend_from_slice(data);
        if self.ddgst {
            v.extend_from_slice(&crc32c(data).to_le_bytes());
        }
        v
    }

    /// Closes the connection now (both directions), like a host that goes away.
    pub fn close(&mut self) {
        self.closed = true;
        if let Some(link) = &mut self.tls {
            // close_notify first (RFC 8446 §6.1), best effort.
            link.close();
        }
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}
