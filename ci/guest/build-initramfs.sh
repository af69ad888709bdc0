#!/bin/bash
# Build a guest initramfs (zstd newc cpio): busybox, kernel modules with
# their modules.dep dependencies, nvme-cli, fio, EXTRA_BINS, each with the
# host shared libraries ldd reports, /init and guest.d/* as /guest/*.
#   usage: [EXTRA_BINS="/path/bin ..."] build-initramfs.sh [--kernel SERIES] [OUT]
# SERIES (kernels.sh: 6.1, the default, 6.12, 6.18 or 7.3) picks the kernel, from its
# work dir (guest_kdir: $GUEST_WORK, or $GUEST_WORK/k-SERIES). OUT defaults
# to initramfs.img in that dir. Rebuilt only when its inputs change: their
# hash is kept in OUT.hash (a rebuild costs ~30 s of zstd).
# EXTRA_BINS land in the guest's /usr/local/bin.
# A series for which kernels.sh's guest_trixie holds (6.12, 6.18, 7.3) also gets the
# Debian 13 root of fetch-trixie.sh ($GUEST_WORK/trixie/root) as /trixie
# (+29 MB unpacked, +11.6 MB in the image, ~0.4 s more boot under TCG), and
# wrappers in /usr/local/bin that run its tools in a chroot there: tnvme
# (nvme-cli 2.13: --tls, gen-tls-key, check-tls-key; the guest's `nvme`
# stays bookworm's 2.4), tlshd and keyctl. /init bind-mounts /proc, /sys,
# /dev, /dev/pts, /run, /tmp and /etc/nvme into it; paths given to these
# tools are the chroot's (so /tmp, /run, /dev and /etc/nvme are the guest's
# own, anything else is not).
# Needs fetch-kernel.sh first (and fetch-trixie.sh for /trixie);
# busybox-static nvme-cli fio cpio zstd xz-utils.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=${GUEST_WORK:-$(cd "$HERE/../.." && pwd)/build/guest}
# shellcheck source=ci/guest/kernels.sh
. "$HERE/kernels.sh"
series=$GUEST_KERNEL_DEFAULT
if [ "${1:-}" = --kernel ]; then series=${2:?build-initramfs: --kernel wants a series}; shift 2; fi
guest_kernel_ok "$series" || { echo "build-initramfs: unknown kernel series '$series' (known: $GUEST_KERNELS)" >&2; exit 2; }
KW=$(guest_kdir "$series")
OUT=${1:-$KW/initramfs.img}
[ -s "$KW/kver" ] || { echo "build-initramfs: no $series kernel in $KW: run fetch-kernel.sh --kernel $series" >&2; exit 1; }
KVER=$(cat "$KW/kver")
MD=$KW/kroot/lib/modules/$KVER

# Loaded by /init at boot, in this order. crc32c/crc64 back nvme-tcp's
# digests and nvme-core's T10-PI: the crypto API finds them only if loaded.
# (6.18 has none of these four: nvme-tcp, nvmet-tcp and nvme-core call the
# CRC library, built in, and add_mod lets a missing crc* go.) Then the
# series' own (guest_kmods: the DH-HMAC-CHAP and kTLS stack of 6.12, 6.18, 7.3).
BOOT_MODULES="virtio_pci virtio_net crc32c-intel crc32c_generic crct10dif-pclmul
 crc64_rocksoft_generic nvme nvme-tcp nvmet nvmet-tcp vfio vfio_iommu_type1
 vfio-pci 9pnet_virtio 9p $(guest_kmods "$series") ${BOOT_MODULES_EXTRA:-}"
# Only copied: guest scripts load them with parameters (brd rd_size=...).
LATE_MODULES="brd null_blk ${LATE_MODULES_EXTRA:-}"

TROOT=""
if guest_trixie "$series"; then
    TROOT=$W/trixie/root
    [ -s "$TROOT/.stamp" ] || { echo "build-initramfs: no trixie root in $TROOT: run fetch-trixie.sh" >&2; exit 1; }
fi

bins=("$(command -v busybox)" "$(command -v nvme)" "$(command -v fio)")
for b in ${EXTRA_BINS:-}; do
    [ -x "$b" ] || { echo "build-initramfs: EXTRA_BINS: $b is not executable" >&2; exit 1; }
    bins+=("$(readlink -f "$b")")
done
libs_of() { ldd "$1" 2>/dev/null | grep -oE '/[^ ]+' || true; }

# Everything that shapes the image goes into the hash: this script, /init,
# the guest scripts, the kernel, the module lists and every binary + library.
inputs_hash() {
    {
        echo "$KVER|$BOOT_MODULES|$LATE_MODULES|${EXTRA_BINS:-}"
        for f in "$0" "$HERE/kernels.sh" "$HERE/init" "$HERE"/guest.d/* "$MD/modules.dep"; do sha256sum "$f"; done
        for b in "${bins[@]}"; do
            sha256sum "$b"
            for l in $(libs_of "$b"); do sha256sum "$(readlink -f "$l")"; done
        done
        # The trixie root by its packages and its files' names and sizes.
        if [ -n "$TROOT" ]; then
            cat "$TROOT/.stamp"
            (cd "$TROOT" && find . -printf '%p %s %l\n' | LC_ALL=C sort)
        fi
    } | sha256sum | cut -d' ' -f1
}
hash=$(inputs_hash)
if [ -s "$OUT" ] && [ "$(cat "$OUT.hash" 2>/dev/null)" = "$hash" ]; then
    echo "initramfs: $OUT up to date"
    exit 0
fi

S=$(mktemp -d "$KW/stage.XXXXXX")
trap 'rm -rf "$S"' EXIT
mkdir -p "$S"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,etc,guest,root,lib/modules/"$KVER"}

declare -A seen=()
modre() { echo "${1//[-_]/[-_]}"; }   # modules.dep spells - or _ freely
is_mod() { grep -qE "(^|/)$(modre "$1")\.ko(\.xz|\.zst)?:" "$MD/modules.dep"; }
add_mod() {   # add_mod NAME: copy a module and, recursively, what it depends on
    local re line f dst
    re=$(modre "$1")
    line=$(grep -E "(^|/)$re\.ko(\.xz|\.zst)?:" "$MD/modules.dep" | head -1) || true
    if [ -z "$line" ]; then
        grep -qE "(^|/)$re\.ko" "$MD/modules.builtin" && return 0
        echo "build-initramfs: module $1 not in $KVER" >&2
        return 1
    fi
    for f in ${line%%:*} ${line#*:}; do
        [ -n "${seen[$f]:-}" ] && continue
        seen[$f]=1
        # Stored decompressed: busybox modprobe may lack xz/zstd support.
        dst=$S/lib/modules/$KVER/${f%.xz}
        dst=${dst%.zst}
        mkdir -p "$(dirname "$dst")"
        case $f in
            *.xz) xz -dc "$MD/$f" > "$dst" ;;
            *.zst) zstd -qdc "$MD/$f" > "$dst" ;;
            *) cp "$MD/$f" "$dst" ;;
        esac
        [ "$f" = "${line%%:*}" ] || add_mod "$(basename "${f%%.ko*}")"
    done
}
for m in $BOOT_MODULES $LATE_MODULES; do
    # A crypto helper may be built in or renamed in another kernel; what the
    # tests drive (nvme, nvmet, vfio, 9p, brd) must be there.
    add_mod "$m" || case $m in crc*) ;; *) exit 1 ;; esac
done
cp "$MD/modules.builtin" "$MD/modules.order" "$S/lib/modules/$KVER/" 2>/dev/null || true
busybox depmod -b "$S" "$KVER"
# /init modprobes these: the boot modules that are modules in this kernel
# (not built in, not missing).
for m in $BOOT_MODULES; do if is_mod "$m"; then echo "$m"; fi; done > "$S/etc/guest-modules"

copy_bin() {  # copy_bin SRC DST: a binary and the shared libraries it needs
    local l
    install -D -m755 "$1" "$S$2"
    for l in $(libs_of "$1"); do
        [ -e "$S$l" ] || install -D -m755 "$(readlink -f "$l")" "$S$l"
    done
}
copy_bin "${bins[0]}" /bin/busybox
for a in $(busybox --list-full); do [ -e "$S/$a" ] || ln -s /bin/busybox "$S/$a"; done
copy_bin "${bins[1]}" /usr/sbin/nvme
copy_bin "${bins[2]}" /usr/bin/fio
for b in "${bins[@]:3}"; do copy_bin "$b" "/usr/local/bin/$(basename "$b")"; done

if [ -n "$TROOT" ]; then
    cp -a "$TROOT" "$S/trixie"
    T=$S/trixie
    # Mount points of /init's bind mounts.
    mkdir -p "$T"/{proc,sys,dev,run,tmp,root,etc/nvme}
    # What glibc and the tools read in /etc: users and groups (root only),
    # name services from files alone (no libnss modules are there).
    echo "root:x:0:0:root:/root:/bin/sh" > "$T/etc/passwd"
    echo "root:x:0:" > "$T/etc/group"
    printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files\n' > "$T/etc/nsswitch.conf"
    printf '127.0.0.1 localhost\n' > "$T/etc/hosts"
    # tlshd links the keyrings named here into its session keyring, so that
    # it may read the PSKs the kernel names in a handshake request: .nvme is
    # the nvme-keyring module's, where nvme-cli (--keyring default) and
    # nvme-tcp keep NVMe/TCP's TLS PSKs. ktls-utils ships the line commented.
    sed -i 's/^#\{0,1\}keyrings=.*/keyrings= .nvme/' "$T/etc/tlshd.conf"
    grep -qx 'keyrings= .nvme' "$T/etc/tlshd.conf" ||
        { echo "build-initramfs: no keyrings= line in trixie's tlshd.conf" >&2; exit 1; }
    wrap() {   # wrap NAME PATH: /usr/local/bin/NAME runs /trixie/PATH
        printf '#!/bin/sh\n# %s from Debian 13 (ci/guest/fetch-trixie.sh), in the /trixie chroot.\nexec chroot /trixie %s "$@"\n' \
            "$2" "$2" > "$S/usr/local/bin/$1"
        chmod 755 "$S/usr/local/bin/$1"
    }
    wrap tnvme /usr/sbin/nvme
    wrap tlshd /usr/sbin/tlshd
    wrap keyctl /usr/bin/keyctl
fi

install -m755 "$HERE/init" "$S/init"
install -m644 "$HERE"/guest.d/* "$S/guest/"
echo "root:x:0:0:root:/root:/bin/sh" > "$S/etc/passwd"
echo "root:x:0:" > "$S/etc/group"

(cd "$S" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) | zstd -q -3 -T0 > "$OUT.new"
mv "$OUT.new" "$OUT"
echo "$hash" > "$OUT.hash"
echo "initramfs: $OUT ($(du -h "$OUT" | cut -f1), $(du -sh "$S" | cut -f1) unpacked, ${#seen[@]} module files)"
