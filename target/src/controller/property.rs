//! Controller properties over fabrics (NVMe-oF 1.1 §6.5, §6.6; NVMe 2.0 §3.1.3): CAP, VS, CC
//! and CSTS, and what enabling, resetting and shutting down through CC does.

use pollux_nvme::spec::{Cap, Cc, Csts, Status, property};

use super::Ctrl;
use super::admin::VERSION;
use super::reply::Reply;
use crate::shared::Shared;

/// The CAP property (NVMe 2.0 §3.1.3.1): MQES, CQR, TO 7.5 s, NVM command set, 4 KiB pages.
pub fn cap(shared: &Shared) -> u64 {
    let mqes = (shared.transport.io_queue_depth.clamp(2, 65536) - 1) as u16;
    Cap(0)
        .with_mqes(mqes)
        .with_cqr(true)
        .with_to(15)
        .with_css(Cap::CSS_NVM)
        .0
}

/// Property Get.
pub fn property_get(ctrl: &Ctrl, shared: &Shared, size8: bool, offset: u32) -> Reply {
    let (value, is8) = match offset {
        property::CAP => (cap(shared), true),
        property::VS => (u64::from(VERSION.0), false),
        property::CC => (u64::from(ctrl.cc), false),
        property::CSTS => (u64::from(ctrl.csts), false),
        _ => return Reply::err(Status::INVALID_FIELD.with_dnr()),
    };
    if size8 != is8 {
        return Reply::err(Status::INVALID_FIELD.with_dnr());
    }
    Reply {
        status: Status::SUCCESS,
        dw0: value as u32,
        dw1: (value >> 32) as u32,
        data: Vec::new(),
    }
}

/// What a Property Set changed that the connection must act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CcEffect {
    /// Nothing beyond the registers.
    None,
    /// Enabled.
    Enabled,
    /// Disabled (reset): I/O queues go away.
    Disabled,
    /// Shutdown requested.
    Shutdown,
}

/// Property Set (only CC is writable): EN 0->1 sets CSTS.RDY if the queue entry sizes, page
/// size and command set are ones we serve, CSTS.CFS otherwise; EN 1->0 resets; SHN sets
/// SHST complete (nothing to flush: completed writes are already in the namespace).
pub fn property_set(ctrl: &mut Ctrl, size8: bool, offset: u32, value: u64) -> (Reply, CcEffect) {
    if offset != property::CC || size8 {
        return (Reply::err(Status::INVALID_FIELD.with_dnr()), CcEffect::None);
    }
    let old = Cc(ctrl.cc);
    let new = Cc(value as u32);
    ctrl.cc = new.0;
    let mut csts = Csts(ctrl.csts);
    let mut effect = CcEffect::None;
    if new.en() && !old.en() {
        let ok = new.iosqes() == 6 && new.iocqes() == 4 && new.mps() == 0 && new.css() == Cc::CSS_NVM;
        csts = if ok { csts.with_rdy(true) } else { csts.with_cfs(true) };
        if ok {
            effect = CcEffect::Enabled;
        }
    } else if !new.en() && old.en() {
        csts = csts.with_rdy(false).with_cfs(false).with_shst(Csts::SHST_NORMAL);
        effect = CcEffect::Disabled;
    }
    if new.shn() != Cc::SHN_NONE && old.shn() == Cc::SHN_NONE {
        csts = csts.with_shst(Csts::SHST_COMPLETE);
        effect = CcEffect::Shutdown;
    } else if new.shn() == Cc::SHN_NONE && old.shn() != Cc::SHN_NONE {
        csts = csts.with_shst(Csts::SHST_NORMAL);
    }
    ctrl.csts = csts.0;
    (Reply::ok(), effect)
}
