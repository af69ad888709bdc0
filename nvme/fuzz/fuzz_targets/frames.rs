//! The NVMe/TCP receive framing (`next_frame`, NVMe/TCP 1.0 §3.6) fed a byte stream as a
//! receive loop feeds it, in both directions and with any limits: never a panic, every frame
//! within the bytes there, and the same frames however the stream is split (the property
//! `next_frame` promises). The first bytes choose the limits and the split points.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pollux_nvme::tcp::{Direction, FrameErrorKind, Framed, PduLimits, PduType, encode_term_req_for, next_frame};

/// The frames of `stream` read `step` bytes more at a time (0: all at once), until an error
/// or the end: (PLEN of each whole PDU, the error's text).
fn frames(
    stream: &[u8],
    dir: Direction,
    limits: PduLimits,
    max_plen: usize,
    step: usize,
) -> (Vec<usize>, Option<String>) {
    let mut out = Vec::new();
    let (mut start, mut have) = (
        0,
        if step == 0 {
            stream.len()
        } else {
            step.min(stream.len())
        },
    );
    let mut ic_done = false;
    loop {
        let avail = &stream[start..have];
        let framed = next_frame(avail, dir, max_plen, |_, ty| {
            if (ty == PduType::IcReq || ty == PduType::IcResp) == ic_done {
                return Err("ICReq first and only once");
            }
            Ok(limits)
        });
        match framed {
            Ok(Framed::Pdu(f)) => {
                assert!(
                    f.hl <= f.plen && f.plen <= avail.len(),
                    "a frame beyond the bytes there"
                );
                let pdu = &avail[..f.plen];
                let _ = (f.data(pdu), f.digest_ok(pdu), f.data_digest(pdu));
                ic_done |= matches!(
                    f.hdr,
                    pollux_nvme::tcp::PduHeader::IcReq(_) | pollux_nvme::tcp::PduHeader::IcResp(_)
                );
                out.push(f.plen);
                start += f.plen;
            }
            Ok(Framed::Header(f)) => {
                assert!(f.hl <= avail.len() && f.plen > avail.len());
                if have == stream.len() {
                    return (out, None);
                }
                have = (have + step.max(1)).min(stream.len());
            }
            Ok(Framed::Need(n)) => {
                assert!(n > avail.len(), "Need({n}) with {} there", avail.len());
                if have == stream.len() {
                    return (out, None);
                }
                have = (have + step.max(1)).min(stream.len());
            }
            Err(e) => {
                let header = e.offending_header(avail);
                assert!(header.len() <= avail.len());
                if let FrameErrorKind::Pdu(err) = &e.kind {
                    let _ = encode_term_req_for(err, dir, header);
                }
                return (out, Some(format!("{:?}", e.kind)));
            }
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&[knobs, step, cap], stream)) = input.split_first_chunk::<3>() else {
        return;
    };
    let dir = if knobs & 1 == 0 {
        Direction::HostToController
    } else {
        Direction::ControllerToHost
    };
    let limits = PduLimits {
        hdgst: knobs & 2 != 0,
        ddgst: knobs & 4 != 0,
        max_data: [0u32, 1, 512, 4096, 8192, 65536, 131072, u32::MAX][usize::from(knobs >> 5)],
    };
    let max_plen = 64 + usize::from(cap) * 1024;
    let whole = frames(stream, dir, limits, max_plen, 0);
    let split = frames(stream, dir, limits, max_plen, usize::from(step) + 1);
    assert_eq!(whole, split, "the frames depend on how the stream was split");
});
