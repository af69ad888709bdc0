# shellcheck shell=sh
# Guest side of ci/scenarios/harness.sh: with boot.sh --nvme IMG --iommu,
# the emulated NVMe controller is seen by the kernel driver, then handed to
# vfio-pci in its own IOMMU group: the path pollux's userspace driver takes.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh

step nvme-pci
nvme list
[ -b /dev/nvme0n1 ] || die "the kernel nvme driver did not see the --nvme device"

step vfio-bind
r=$(vfio_bind_nvme)   # an assignment, so sh -e stops on failure
bdf=${r% *} group=${r#* }
echo "bound $bdf to vfio-pci, group $group"
members=$(ls "/sys/kernel/iommu_groups/$group/devices")
[ "$members" = "$bdf" ] || die "IOMMU group $group holds more than $bdf: $members"
[ ! -e /dev/nvme0n1 ] || die "/dev/nvme0n1 still there after the unbind"

step end
