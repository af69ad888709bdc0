#!/bin/bash
# Everything the guest needs, idempotent and cached under $GUEST_WORK
# (default build/guest): Debian packages, the kernel (fetched once), the
# initramfs (rebuilt only when its inputs change). Prints each step's time.
#   usage: [EXTRA_BINS="/path/bin ..."] ci/guest/setup.sh [KVER]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CI_NAME=guest-setup
# shellcheck source=ci/lib.sh
. "$HERE/../lib.sh"
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
timed fetch-kernel "$HERE/fetch-kernel.sh" "$@"
timed build-initramfs "$HERE/build-initramfs.sh"
