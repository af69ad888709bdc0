# shellcheck shell=sh
# Guest side of ci/scenarios/vfio-driver.sh: pollux's userspace NVMe driver (the
# vfio-smoke example, shared at /mnt/host) on QEMU's NVMe controller behind
# intel-iommu: its error while the kernel driver still owns the function, then
# bring-up, I/O at QD1 and QD16, the device's own Copy (when it reports one: QEMU's
# does), PRP lists, MDTS splitting, an MSI-X interrupt and shutdown, twice in a row.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
smoke=/mnt/host/vfio-smoke
[ -x "$smoke" ] || die "no $smoke (boot.sh --share-ro DIR with vfio-smoke in it)"

step wrong-driver
[ -b /dev/nvme0n1 ] || die "the kernel nvme driver did not see the --nvme device"
bdf=
for p in /sys/bus/pci/devices/*; do
    [ "$(cat "$p/class")" = 0x010802 ] && { bdf=${p##*/}; break; }
done
[ -n "$bdf" ] || die "no NVMe PCI function"
if out=$("$smoke" "$bdf" 2>&1); then die "vfio-smoke ran on $bdf while nvme owns it: $out"; fi
echo "$out" | tail -1
echo "$out" | grep -q "$bdf: bound to nvme, not vfio-pci" || die "no wrong-driver error naming $bdf: $out"

step vfio-bind
r=$(vfio_bind_nvme)
[ "${r% *}" = "$bdf" ] || die "vfio_bind_nvme bound ${r% *}, expected $bdf"
echo "bound $bdf to vfio-pci, group ${r#* }"

step smoke-1
"$smoke" "$bdf" || die "vfio-smoke failed on $bdf"

step smoke-2
"$smoke" "$bdf" 2048 || die "vfio-smoke failed on $bdf the second time"

step end
