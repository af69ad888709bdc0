#!/bin/bash
# Everything the guest needs, idempotent and cached under $GUEST_WORK
# (default build/guest): Debian packages, then for each kernel series
# (kernels.sh: 6.1, the default guest; 6.12, with NVMe in-band auth and
# TLS; 6.18 from trixie-backports, which adds secure channel concatenation;
# 7.3, trixie-backports' newest line, on demand only) the kernel (fetched
# once) and its initramfs (rebuilt only when its inputs change), each in the
# series' own work dir (6.1: $GUEST_WORK itself, else $GUEST_WORK/k-SERIES).
# For 6.12, 6.18 and 7.3 also the Debian 13 (trixie) userland of their
# /trixie (fetch-trixie.sh: nvme-cli 2.13, tlshd, keyctl; in
# $GUEST_WORK/trixie, fetched once, with a private apt configuration: the
# host's apt is not touched; so are the 6.18 and 7.3 kernels, through
# $GUEST_WORK/apt-trixie-backports). Prints each step's time.
#   usage: [EXTRA_BINS="/path/bin ..."] ci/guest/setup.sh [SERIES...]
# SERIES: only these (default: kernels.sh's GUEST_KERNELS_SETUP, 6.1 6.12
# 6.18; 7.3 is prepared only when named: ci/guest/setup.sh 7.3, for
# CONCAT_KERNEL=7.3 ci/scenarios/pollux-concat-linux.sh).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CI_NAME=guest-setup
# shellcheck source=ci/lib.sh
. "$HERE/../lib.sh"
W=$GUEST_WORK
# shellcheck source=ci/guest/kernels.sh
. "$HERE/kernels.sh"
# shellcheck disable=SC2086  # a list of words
[ $# -gt 0 ] || set -- $GUEST_KERNELS_SETUP
for k in "$@"; do
    guest_kernel_ok "$k" || fail "unknown kernel series '$k' (known: $GUEST_KERNELS)"
done
mkdir -p "$GUEST_WORK"
# Two setups on one work dir (two engineers, or CI beside a developer) would
# unpack and pack over each other: one at a time.
exec 9>"$GUEST_WORK/.setup.lock"
flock 9

timed() {   # timed NAME CMD...: run CMD, log its time
    local name=$1 t0=$SECONDS
    shift
    "$@" || fail "$name failed"
    log "$name: $((SECONDS - t0))s"
}

# qemu-system-x86 (bookworm, 7.2) makes apt remove the image's backported
# qemu-utils (10.x), so qemu-utils is checked again afterwards, which brings
# back qemu-img 7.2 for scenarios that make disk images.
timed packages ensure_debs qemu-system-x86 busybox-static nvme-cli fio cpio zstd xz-utils
timed qemu-utils ensure_debs qemu-utils
for k in "$@"; do
    timed "fetch-kernel $k" "$HERE/fetch-kernel.sh" --kernel "$k"
    # Once, for the series that carry it (6.12, 6.18, 7.3); cached after the first run.
    if guest_trixie "$k"; then timed "fetch-trixie" "$HERE/fetch-trixie.sh"; fi
    timed "build-initramfs $k" "$HERE/build-initramfs.sh" --kernel "$k"
done
