#!/bin/bash
# Scenario pollux-nvme: pollux's nvme namespace backend (the userspace NVMe driver over VFIO)
# end to end, with pollux running INSIDE the guest: `pollux setup` binds QEMU's NVMe
# controller (behind intel-iommu) to vfio-pci, pollux serves it over NVMe/TCP on the guest's
# loopback to the guest's kernel host (fio crc32c verify at 4k/64k/1m, persistence across a
# SIGTERM restart, idle CPU in interrupt mode, ten `pollux ctl upgrade`s under fio verify:
# the device re-initialized by each new process), `pollux setup unbind` gives it back to the
# kernel; then faults injected into the in-process fake controller (a failed command, a
# controller fatal status that pollux resets under fio verify). A 4k randread comparison,
# pollux vs the kernel nvme driver on the same device, goes to the log and to
# $CI_LOG_DIR/nvme-relative.txt (TCG: only the ratio means anything). Guest steps:
# ci/guest/guest.d/pollux-nvme.sh.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
need_pollux

share=$CI_LOG_DIR/share
mkdir -p "$share"
cp "$POLLUX_BIN" "$share/pollux"
img=$CI_LOG_DIR/nvme.img
truncate -s 256M "$img"
rc=0
run_guest pollux-nvme.sh --timeout 540 --nvme "$img" --iommu --share "$share" || rc=$?
rm -f "$img"
glog=$CI_LOG_DIR/guest-pollux-nvme.log
[ "$rc" = 0 ] || fail "pollux-nvme guest failed (rc $rc; console $glog, pollux logs $share/guest-pollux-*.log)"

# BENCH lines: "BENCH <kernel|pollux> qd<N> iops=<n> (...)".
iops() {
    tr -d '\r' < "$glog" | sed -n "s/^BENCH $1 qd$2 iops=\([0-9.]*\).*/\1/p" | tail -1
}
{
    echo "4k randread IOPS in the TCG guest, pollux (userspace driver, NVMe/TCP over loopback)"
    echo "vs the kernel nvme driver on the same QEMU NVMe device; only the ratio means anything"
    for qd in 1 16; do
        k=$(iops kernel "$qd") p=$(iops pollux "$qd")
        { [ -n "$k" ] && [ -n "$p" ]; } || fail "no BENCH result for qd$qd in $glog"
        awk -v k="$k" -v p="$p" -v q="$qd" \
            'BEGIN { printf "QD%-2d pollux/kernel = %.2f  (pollux %.0f IOPS, kernel %.0f IOPS)\n", q, p / k, p, k }'
    done
    sed -n 's/^IDLE //p' "$glog" | tr -d '\r'
} > "$CI_LOG_DIR/nvme-relative.txt"
while read -r l; do log "$l"; done < "$CI_LOG_DIR/nvme-relative.txt"
log "PASS"
