#!/bin/bash
# Scenario vfio-driver: pollux's userspace NVMe driver (pollux_nvme::pci, the
# vfio-smoke example) drives QEMU's emulated NVMe controller through vfio-pci
# and intel-iommu inside the guest: errors naming the BDF, bring-up, Identify,
# an I/O queue pair with an MSI-X eventfd, write/read-back at QD1 and QD16,
# PRP lists from misaligned buffers, MDTS splitting, shutdown; twice. Guest
# steps: ci/guest/guest.d/vfio-driver.sh.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"

log "building the vfio-smoke example"
(cd "$CI_REPO" && cargo build --release -q -p pollux-nvme --example vfio-smoke) ||
    fail "cargo build --example vfio-smoke failed"
share=$CI_LOG_DIR/share
mkdir -p "$share"
cp "$CI_REPO/build/release/examples/vfio-smoke" "$share/"
truncate -s 64M "$CI_LOG_DIR/nvme.img"
run_guest vfio-driver.sh --timeout 300 --nvme "$CI_LOG_DIR/nvme.img" --iommu --share-ro "$share" ||
    fail "vfio-driver guest failed"
n=$(grep -c 'vfio-smoke: PASS' "$CI_LOG_DIR"/guest-vfio-driver.log || true)
[ "$n" = 2 ] || fail "vfio-smoke passed $n times, wanted 2"
rm -f "$CI_LOG_DIR/nvme.img"
log "PASS"
