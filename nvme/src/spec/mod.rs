//! Hand-written NVMe base spec 2.0 wire structures and constants: the submission queue entry
//! (SQE, NVMe 2.0 §4.2), the completion queue entry (CQE, NVMe 2.0 §4.6), the SGL descriptor (NVMe 2.0 §4.3.2), status
//! values (NVMe 2.0 §4.6.1.2), opcodes (NVMe 2.0 §5, NVM Command Set 1.0 §3, NVMe-oF 1.1 §6),
//! the table of the commands served ([`command`]) and the
//! controller properties a fabrics target exposes (NVMe 2.0 §3.1.3).
//!
//! Multi-byte fields use `zerocopy::little_endian` types: the structs have alignment 1, can be
//! read from any offset of a receive buffer, and are correct on any host.

pub mod ana;
pub mod command;
mod cqe;
mod ids;
pub mod opcode;
mod properties;
pub mod resv;
mod sgl;
pub mod smart;
mod sqe;
mod status;
pub mod text;

pub use ana::AnaState;
pub use cqe::Cqe;
pub use ids::{cns, feature, log_page};
pub use properties::{Cap, Cc, Csts, Vs, property};
pub use sgl::SglDescriptor;
pub use smart::{Health, critical_warning};
pub use sqe::Sqe;
pub use status::{Status, StatusContext, StatusIn, sct};

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn wire_struct_sizes() {
        assert_eq!(size_of::<Sqe>(), 64);
        assert_eq!(size_of::<Cqe>(), 16);
        assert_eq!(size_of::<SglDescriptor>(), 16);
        assert_eq!(align_of::<Sqe>(), 1);
        assert_eq!(offset_of!(Sqe, nsid), 4);
        assert_eq!(offset_of!(Sqe, mptr), 16);
        assert_eq!(offset_of!(Sqe, dptr), 24);
        assert_eq!(offset_of!(Sqe, cdw10), 40);
        assert_eq!(offset_of!(Sqe, cdw15), 60);
        assert_eq!(offset_of!(Cqe, sqhd), 8);
        assert_eq!(offset_of!(Cqe, cid), 12);
        assert_eq!(offset_of!(Cqe, status), 14);
        assert_eq!(offset_of!(SglDescriptor, length), 8);
        assert_eq!(offset_of!(SglDescriptor, id), 15);
    }

    #[test]
    fn opcodes() {
        assert_eq!(opcode::FABRICS, 0x7F);
        assert_eq!(opcode::admin::KEEP_ALIVE, 0x18);
        assert_eq!(opcode::admin::ASYNC_EVENT_REQUEST, 0x0C);
        assert_eq!(opcode::io::WRITE_ZEROES, 0x08);
        assert_eq!(opcode::io::COPY, 0x19);
        let fc = [
            opcode::fctype::PROPERTY_SET,
            opcode::fctype::CONNECT,
            opcode::fctype::PROPERTY_GET,
            opcode::fctype::AUTHENTICATION_SEND,
            opcode::fctype::AUTHENTICATION_RECEIVE,
            opcode::fctype::DISCONNECT,
        ];
        assert_eq!(fc, [0x00, 0x01, 0x04, 0x05, 0x06, 0x08]);
        assert_eq!(log_page::DISCOVERY, 0x70);
        assert_eq!(feature::KEEP_ALIVE_TIMER, 0x0F);
        assert_eq!(cns::NS_ID_DESCRIPTOR_LIST, 3);
    }
}
