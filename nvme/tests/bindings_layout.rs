//! Sizes and offsets of the generated bindings, checked against the NVMe base spec 2.0
//! (Identify Controller figure 275, Identify Namespace figure 280, SMART / Health log figure
//! 207, Error Information log figure 205) and NVMe-oF 1.1 (Discovery Log Page figure 38,
//! Connect command data figure 20).

use std::mem::{offset_of, size_of};

use pollux_nvme::bindings::*;
use zerocopy::{FromZeros, IntoBytes};

#[test]
fn sizes() {
    assert_eq!(size_of::<nvme_id_ctrl>(), 4096);
    assert_eq!(size_of::<nvme_id_ns>(), 4096);
    assert_eq!(size_of::<nvme_id_psd>(), 32);
    assert_eq!(size_of::<nvme_lbaf>(), 4);
    // The fixed part only: NID (NIDL bytes) follows it.
    assert_eq!(size_of::<nvme_ns_id_desc>(), 4);
    assert_eq!(size_of::<nvme_smart_log>(), 512);
    assert_eq!(size_of::<nvme_error_log_page>(), 64);
    assert_eq!(size_of::<nvme_firmware_slot>(), 512);
    assert_eq!(size_of::<nvme_cmd_effects_log>(), 4096);
    assert_eq!(size_of::<nvmf_disc_log_entry>(), 1024);
    // The header only (genctr, numrec, recfmt, reserved): entries follow at offset 1024.
    assert_eq!(size_of::<nvmf_discovery_log>(), 1024);
    assert_eq!(size_of::<nvmf_connect_data>(), 1024);
}

#[test]
fn id_ctrl_offsets() {
    assert_eq!(offset_of!(nvme_id_ctrl, mdts), 77);
    assert_eq!(offset_of!(nvme_id_ctrl, cntlid), 78);
    assert_eq!(offset_of!(nvme_id_ctrl, ver), 80);
    assert_eq!(offset_of!(nvme_id_ctrl, oaes), 92);
    assert_eq!(offset_of!(nvme_id_ctrl, cntrltype), 111);
    assert_eq!(offset_of!(nvme_id_ctrl, oacs), 256);
    assert_eq!(offset_of!(nvme_id_ctrl, aerl), 259);
    assert_eq!(offset_of!(nvme_id_ctrl, lpa), 261);
    assert_eq!(offset_of!(nvme_id_ctrl, kas), 320);
    assert_eq!(offset_of!(nvme_id_ctrl, sqes), 512);
    assert_eq!(offset_of!(nvme_id_ctrl, cqes), 513);
    assert_eq!(offset_of!(nvme_id_ctrl, maxcmd), 514);
    assert_eq!(offset_of!(nvme_id_ctrl, nn), 516);
    assert_eq!(offset_of!(nvme_id_ctrl, oncs), 520);
    assert_eq!(offset_of!(nvme_id_ctrl, vwc), 525);
    assert_eq!(offset_of!(nvme_id_ctrl, sgls), 536);
    assert_eq!(offset_of!(nvme_id_ctrl, subnqn), 768);
    assert_eq!(offset_of!(nvme_id_ctrl, ioccsz), 1792);
    assert_eq!(offset_of!(nvme_id_ctrl, iorcsz), 1796);
    assert_eq!(offset_of!(nvme_id_ctrl, icdoff), 1800);
    assert_eq!(offset_of!(nvme_id_ctrl, fcatt), 1802);
    assert_eq!(offset_of!(nvme_id_ctrl, msdbd), 1803);
    assert_eq!(offset_of!(nvme_id_ctrl, psd), 2048);
    assert_eq!(offset_of!(nvme_id_ctrl, vs), 3072);
}

/// The brief listed MAXCMD at 526; the spec (and the header) place it at 514..516, right
/// after SQES/CQES (512, 513) and before NN (516). 526 is AWUPF.
#[test]
fn id_ctrl_maxcmd_is_at_514() {
    assert_eq!(offset_of!(nvme_id_ctrl, maxcmd), 514);
    assert_eq!(offset_of!(nvme_id_ctrl, awupf), 528);
    assert_eq!(offset_of!(nvme_id_ctrl, awun), 526);
}

#[test]
fn id_ns_offsets() {
    assert_eq!(offset_of!(nvme_id_ns, nsze), 0);
    assert_eq!(offset_of!(nvme_id_ns, ncap), 8);
    assert_eq!(offset_of!(nvme_id_ns, nuse), 16);
    assert_eq!(offset_of!(nvme_id_ns, nlbaf), 25);
    assert_eq!(offset_of!(nvme_id_ns, flbas), 26);
    assert_eq!(offset_of!(nvme_id_ns, nmic), 30);
    assert_eq!(offset_of!(nvme_id_ns, anagrpid), 92);
    assert_eq!(offset_of!(nvme_id_ns, nguid), 104);
    assert_eq!(offset_of!(nvme_id_ns, eui64), 120);
    assert_eq!(offset_of!(nvme_id_ns, lbaf), 128);
    assert_eq!(offset_of!(nvme_lbaf, ds), 2);
}

#[test]
fn discovery_and_connect_offsets() {
    assert_eq!(offset_of!(nvmf_disc_log_entry, portid), 4);
    assert_eq!(offset_of!(nvmf_disc_log_entry, cntlid), 6);
    assert_eq!(offset_of!(nvmf_disc_log_entry, asqsz), 8);
    assert_eq!(offset_of!(nvmf_disc_log_entry, trsvcid), 32);
    assert_eq!(offset_of!(nvmf_disc_log_entry, subnqn), 256);
    assert_eq!(offset_of!(nvmf_disc_log_entry, traddr), 512);
    assert_eq!(offset_of!(nvmf_disc_log_entry, tsas), 768);
    assert_eq!(offset_of!(nvmf_discovery_log, numrec), 8);
    assert_eq!(offset_of!(nvmf_discovery_log, recfmt), 16);

    assert_eq!(offset_of!(nvmf_connect_data, hostid), 0);
    assert_eq!(offset_of!(nvmf_connect_data, cntlid), 16);
    assert_eq!(offset_of!(nvmf_connect_data, subsysnqn), 256);
    assert_eq!(offset_of!(nvmf_connect_data, hostnqn), 512);

    assert_eq!(offset_of!(nvme_smart_log, data_units_read), 32);
    assert_eq!(offset_of!(nvme_smart_log, temp_sensor), 200);
    assert_eq!(offset_of!(nvme_error_log_page, status_field), 12);
    assert_eq!(offset_of!(nvme_error_log_page, nsid), 24);
}

/// The usage the target relies on: zero, fill, serialise.
#[test]
fn build_identify_controller() {
    let mut id = nvme_id_ctrl::new_zeroed();
    id.cntlid = 0x1234u16.to_le();
    id.kas = 10u16.to_le();
    id.ioccsz = 260u32.to_le();
    let nqn = b"nqn.2014-08.org.nvmexpress.discovery";
    id.subnqn[..nqn.len()].copy_from_slice(nqn);
    let mut buf = [0u8; 4096];
    buf.copy_from_slice(id.as_bytes());
    assert_eq!(&buf[78..80], &[0x34, 0x12]);
    assert_eq!(&buf[320..322], &[10, 0]);
    assert_eq!(&buf[1792..1796], &260u32.to_le_bytes());
    assert_eq!(&buf[768..768 + nqn.len()], nqn);
}

#[test]
fn parse_connect_data() {
    let mut raw = [0u8; 1024];
    raw[16..18].copy_from_slice(&0xffffu16.to_le_bytes());
    raw[256..260].copy_from_slice(b"nqn.");
    let data = zerocopy::FromBytes::read_from_bytes(&raw[..]).map(|d: nvmf_connect_data| d);
    let data = data.expect("1024 bytes");
    assert_eq!(u16::from_le(data.cntlid), 0xffff);
    assert_eq!(&data.subsysnqn[..4], b"nqn.");
}

#[test]
fn constants_from_the_header() {
    assert_eq!(nvme_admin_opcode::nvme_admin_fabrics, 0x7f);
    assert_eq!(nvme_admin_opcode::nvme_admin_keep_alive, 0x18);
    assert_eq!(nvme_fctype::nvme_fabrics_type_connect, 0x01);
    assert_eq!(nvme_status_field::NVME_SC_CONNECT_INVALID_HOST, 0x84);
    assert_eq!(nvmf_trtype::NVMF_TRTYPE_TCP, 3);
    assert_eq!(nvme_cmd_get_log_lid::NVME_LOG_LID_DISCOVER, 0x70);
    assert_eq!(nvme_features_id::NVME_FEAT_FID_KATO, 0x0f);
    assert_eq!(nvme_identify_cns::NVME_IDENTIFY_CNS_NS_DESC_LIST, 3);
}
