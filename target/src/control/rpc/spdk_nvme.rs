//! SPDK's NVMe bdevs on pollux ([`super::spdk`]): `bdev_nvme_attach_controller` for a local
//! PCIe SSD, which pollux drives with its userspace driver (vfio-pci), a bdev per usable
//! namespace as SPDK names them (`<name>n<nsid>`), attached as `nvme` namespaces later;
//! `bdev_nvme_detach_controller` deletes them. SPDK's NVMe-oF initiator (trtype TCP, RDMA)
//! is not pollux's: pollux is the target.

use serde_json::{Value, json};

use super::spdk::{invalid, obj, req_str};
use super::spdk_bdev::{Bdev, new_name};
use super::{Ctx, RpcError};

/// The product name SPDK's NVMe bdevs report.
pub(super) const PRODUCT: &str = "NVMe disk";

impl Ctx {
    /// `bdev_nvme_attach_controller {name, trtype: PCIe, traddr}`: the device's usable
    /// namespaces (active, without metadata) as bdevs `<name>n<nsid>`, answered as their
    /// names. The device is brought up to read them (unless a namespace serves it already)
    /// and let go until one is attached: a function bound to vfio-pci, as for an `nvme`
    /// namespace (`pollux setup bind`).
    pub(super) fn spdk_nvme_attach(&self, p: &Value) -> Result<Value, RpcError> {
        let o = obj(p)?;
        let name = req_str(o, "name")?;
        let trtype = req_str(o, "trtype")?;
        if !trtype.eq_ignore_ascii_case("pcie") {
            return Err(invalid(format!(
                "trtype '{trtype}': pollux attaches local PCIe SSDs only (it is an NVMe-oF target, not an initiator)"
            )));
        }
        let traddr = req_str(o, "traddr")?;
        // An open fake controller (tests) by its name; else a PCI address.
        let fake = self
            .nvme_devices()
            .into_iter()
            .find(|d| d.name == traddr && d.kind == "fake");
        let device = match (pollux_conf::parse_pci_address(traddr), &fake) {
            (_, Some(f)) => f.name.clone(),
            (Ok(bdf), None) => bdf,
            (Err(e), None) => return Err(invalid(format!("traddr '{traddr}': {e}"))),
        };
        if self
            .spdk()
            .bdevs
            .values()
            .any(|b| b.controller.as_deref() == Some(name))
        {
            return Err(invalid(format!("A controller named {name} already exists")));
        }
        let namespaces = crate::backend::nvme::probe(&device, self.reactor_count())
            .map_err(|e| RpcError::new(super::CONFIG_ERROR, format!("{traddr}: {e}")))?;
        let mut s = self.spdk();
        let mut names = Vec::new();
        for (nsid, blocks, block_size) in namespaces {
            let bdev = new_name(&mut s, Some(&format!("{name}n{nsid}")), "")?;
            let backend = match &fake {
                None => json!({"nvme": {"pci": device, "nsid": nsid}}),
                Some(_) => json!({"nvme": {"fake": device, "size": blocks * u64::from(block_size), "nsid": nsid}}),
            };
            s.bdevs.insert(
                bdev.clone(),
                Bdev {
                    product: PRODUCT,
                    block_size,
                    num_blocks: blocks,
                    uuid: super::spdk_bdev::uuid_param(&serde_json::Map::new())?,
                    backend,
                    attached: None,
                    cluster: None,
                    controller: Some(name.to_owned()),
                },
            );
            names.push(Value::String(bdev));
        }
        tracing::info!(controller = name, device = %device, bdevs = ?names, "control: SPDK bdev_nvme_attach_controller");
        Ok(Value::Array(names))
    }

    /// `bdev_nvme_detach_controller {name}`: its bdevs deleted (an attached one's namespace
    /// removed first, as SPDK's hot remove does).
    pub(super) fn spdk_nvme_detach(&self, p: &Value) -> Result<Value, RpcError> {
        let name = req_str(obj(p)?, "name")?;
        let bdevs: Vec<String> = self
            .spdk()
            .bdevs
            .iter()
            .filter(|(_, b)| b.controller.as_deref() == Some(name))
            .map(|(n, _)| n.clone())
            .collect();
        if bdevs.is_empty() {
            return Err(invalid(format!("Controller {name} not found")));
        }
        for b in bdevs {
            self.spdk_bdev_delete(&json!({"name": b}))?;
        }
        Ok(Value::Bool(true))
    }
}
