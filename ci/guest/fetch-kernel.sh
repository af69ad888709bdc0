#!/bin/bash
# Fetch a guest kernel: a Debian linux-image package, downloaded with
# apt-get download and unpacked into its work dir's kroot/ (never installed
# on the host: this machine's own kernel can load no modules, and the guest
# is where nvme-tcp, nvmet and vfio-pci live).
#   usage: fetch-kernel.sh [--kernel SERIES] [KVER]
# SERIES (kernels.sh: 6.1, the default, or 6.12) picks the work dir
# ($GUEST_WORK for 6.1, $GUEST_WORK/k-SERIES else) and the meta package.
# KVER defaults to the one already fetched there, else to the one the
# series' meta package (linux-image-amd64, linux-image-6.12-amd64) depends
# on now (old ABIs leave the mirror, so no pin).
# Produces: kroot/ (modules + modules.dep from busybox depmod, as the host
# has no kmod), vmlinux (uncompressed ELF, booted through its PVH entry:
# this skips in-guest decompression, ~5 s under TCG) and kver.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=${GUEST_WORK:-$(cd "$HERE/../.." && pwd)/build/guest}
# shellcheck source=ci/guest/kernels.sh
. "$HERE/kernels.sh"
series=$GUEST_KERNEL_DEFAULT
if [ "${1:-}" = --kernel ]; then series=${2:?fetch-kernel: --kernel wants a series}; shift 2; fi
guest_kernel_ok "$series" || { echo "fetch-kernel: unknown kernel series '$series' (known: $GUEST_KERNELS)" >&2; exit 2; }
W=$(guest_kdir "$series")
mkdir -p "$W"
cd "$W"

want=${1:-}
if [ -z "$want" ] && [ -s kver ] && [ -s "kroot/boot/vmlinuz-$(cat kver)" ]; then
    want=$(cat kver)   # cached: no registry query at all
fi
if [ -z "$want" ]; then
    pkg=$(guest_kmeta "$series")
    meta() { apt-cache depends "$pkg" 2>/dev/null |
             sed -n 's/^ *Depends: linux-image-\([0-9].*\)$/\1/p' | head -1; }
    want=$(meta)
    # A fresh machine may have no package lists yet.
    [ -n "$want" ] || { apt-get update -qq; want=$(meta); }
    [ -n "$want" ] || { echo "fetch-kernel: cannot resolve $pkg" >&2; exit 1; }
fi
case $want in
    "$series".*) ;;
    *) echo "fetch-kernel: $want is not a $series kernel" >&2; exit 2 ;;
esac

if [ ! -s "kroot/boot/vmlinuz-$want" ]; then
    dl=$(mktemp -d "$W/dl.XXXXXX")
    trap 'rm -rf "$dl"' EXIT
    get() {   # as root apt warns that the download is unsandboxed: noise
        (cd "$dl" || exit 1
         apt-get download -q "linux-image-$want" 2>&1 |
             grep -v -e unsandboxed -e '^Get:' -e '^Fetched' || true)
    }
    get
    if ! ls "$dl"/linux-image-"$want"_*.deb >/dev/null 2>&1; then
        apt-get update -qq && get   # stale package lists
    fi
    ls "$dl"/linux-image-"$want"_*.deb >/dev/null 2>&1 ||
        { echo "fetch-kernel: apt-get download linux-image-$want failed" >&2; exit 1; }
    # Unpack beside, then swap: an interrupted run never leaves a half tree.
    rm -rf kroot.new
    dpkg-deb -x "$dl"/linux-image-"$want"_*.deb kroot.new
    rm -rf kroot vmlinux
    mv kroot.new kroot
fi

[ -s "kroot/lib/modules/$want/modules.dep" ] || busybox depmod -b kroot "$want"

if [ ! -s vmlinux ] || [ "$(cat kver 2>/dev/null)" != "$want" ]; then
    rm -f vmlinux
    python3 "$HERE/extract-vmlinux.py" "kroot/boot/vmlinuz-$want" vmlinux.new && mv vmlinux.new vmlinux ||
        echo "fetch-kernel: no vmlinux extracted; boot.sh falls back to the bzImage" >&2
fi
echo "$want" > kver
echo "kernel $want: $W/vmlinux ($(du -h "$W/vmlinux" 2>/dev/null | cut -f1 || echo none))"
