#!/bin/bash
# Fetch a guest kernel: a Debian linux-image package, downloaded with
# apt-get download and unpacked into its work dir's kroot/ (never installed
# on the host: this machine's own kernel can load no modules, and the guest
# is where nvme-tcp, nvmet and vfio-pci live). From 6.19 on linux-image-KVER
# is an empty package that depends on linux-base-KVER, linux-binary-KVER and
# linux-modules-KVER (kernels.sh, 7.3): the packages of linux-image-KVER's
# Depends that are named for KVER are downloaded and unpacked with it (none
# for 6.1, 6.12 and 6.18, whose linux-image holds everything), and a
# vmlinuz, config and System.map in /usr/lib/modules/KVER (no /boot there)
# get /boot's names as symlinks.
#   usage: fetch-kernel.sh [--kernel SERIES] [KVER]
# SERIES (kernels.sh: 6.1, the default, 6.12, 6.18 or 7.3) picks the work dir
# ($GUEST_WORK for 6.1, $GUEST_WORK/k-SERIES else) and where the kernel
# comes from. KVER defaults to the one already fetched there (no registry
# query at all), else to the one the series' meta package in the host's
# apt sources (linux-image-amd64, linux-image-6.12-amd64) depends on now,
# else (6.18, 7.3: guest_ksuite, trixie-backports) to the highest
# linux-image-SERIES.N+debNN-amd64 that suite has now. Old ABIs leave the
# mirror, so no pin.
# A suite that is not in the host's apt sources (the host is Debian 12) is
# read through a private apt configuration in $GUEST_WORK/apt-SUITE, as
# fetch-trixie.sh's: its own sources.list, lists, cache and an empty dpkg
# status, APT_CONFIG pointing at it; the host's apt is not touched.
# Produces: kroot/ (modules + modules.dep from busybox depmod, as the host
# has no kmod), vmlinux (uncompressed ELF, booted through its PVH entry:
# this skips in-guest decompression, ~5 s under TCG) and kver.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=${GUEST_WORK:-$(cd "$HERE/../.." && pwd)/build/guest}
GW=$W
# shellcheck source=ci/guest/kernels.sh
. "$HERE/kernels.sh"
series=$GUEST_KERNEL_DEFAULT
if [ "${1:-}" = --kernel ]; then series=${2:?fetch-kernel: --kernel wants a series}; shift 2; fi
guest_kernel_ok "$series" || { echo "fetch-kernel: unknown kernel series '$series' (known: $GUEST_KERNELS)" >&2; exit 2; }
W=$(guest_kdir "$series")
suite=$(guest_ksuite "$series") suite_ready=""
mkdir -p "$W"
cd "$W"

want=${1:-}
if [ -z "$want" ] && [ -s kver ] && [ -s "kroot/boot/vmlinuz-$(cat kver)" ]; then
    want=$(cat kver)   # cached: no registry query at all
fi

# suite_apt: point apt (APT_CONFIG) at a private configuration for $suite
# and fetch its package lists (2 MB for trixie-backports). Dir::Etc is its
# own, so the host's sources, apt.conf.d and pins are not read; the status
# is empty (apt-get download and apt-cache need nothing installed). amd64
# only: the guest is x86_64, and a multiarch host would fetch i386 lists.
# apt checks the suite's Release signature against bookworm's
# debian-archive-keyring, which has trixie's keys (2023.3+deb12u2 here).
suite_apt() {
    local a=$GW/apt-$suite keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    mkdir -p "$a"/etc/apt.conf.d "$a"/etc/preferences.d "$a"/etc/sources.list.d \
        "$a"/etc/trusted.gpg.d "$a"/state/lists/partial "$a"/cache/archives/partial "$a"/log
    echo "deb [signed-by=$keyring] http://deb.debian.org/debian $suite main" > "$a/etc/sources.list"
    : > "$a/state/status"
    cat > "$a/apt.conf" <<EOF
Dir::Etc "$a/etc";
Dir::Etc::Parts "$a/etc/apt.conf.d";
Dir::State "$a/state";
Dir::State::status "$a/state/status";
Dir::Cache "$a/cache";
Dir::Log "$a/log";
APT::Architecture "amd64";
APT::Architectures { "amd64"; };
APT::Sandbox::User "root";
Acquire::Languages "none";
EOF
    export APT_CONFIG=$a/apt.conf
    suite_ready=1
    apt-get update -qq ||
        { echo "fetch-kernel: apt-get update of $suite failed (no network? $keyring without its keys?)" >&2; exit 1; }
}

if [ -z "$want" ]; then
    pkg=$(guest_kmeta "$series")
    if [ -n "$pkg" ]; then
        meta() { apt-cache depends "$pkg" 2>/dev/null |
                 sed -n 's/^ *Depends: linux-image-\([0-9].*\)$/\1/p' | head -1; }
        want=$(meta)
        # A fresh machine may have no package lists yet.
        [ -n "$want" ] || { apt-get update -qq; want=$(meta); }
        [ -n "$want" ] || { echo "fetch-kernel: cannot resolve $pkg" >&2; exit 1; }
    else
        # No meta package: the highest SERIES.N of the suite's image packages
        # (not -cloud-, -rt-, -dbg or -unsigned ones), in version order
        # (6.18.15 after 6.18.9).
        [ -n "$suite" ] || { echo "fetch-kernel: series $series has neither a meta package nor a suite" >&2; exit 2; }
        suite_apt
        want=$(apt-cache search --names-only "^linux-image-${series//./\\.}\\.[0-9]+\\+deb[0-9]+-amd64\$" |
               sed -n 's/^linux-image-\([^ ]*\) .*/\1/p' | sort -V | tail -1)
        [ -n "$want" ] || { echo "fetch-kernel: no linux-image-$series.N+debNN-amd64 in $suite" >&2; exit 1; }
        echo "fetch-kernel: the newest $series kernel in $suite is $want"
    fi
fi
case $want in
    "$series".*) ;;
    *) echo "fetch-kernel: $want is not a $series kernel" >&2; exit 2 ;;
esac

if [ ! -s "kroot/boot/vmlinuz-$want" ]; then
    # A suite's kernel (KVER given, or resolved above) downloads through its apt.
    if [ -n "$suite" ] && [ -z "$suite_ready" ]; then suite_apt; fi
    dl=$(mktemp -d "$W/dl.XXXXXX")
    trap 'rm -rf "$dl"' EXIT
    # parts: the real packages linux-image-$want depends on that are named
    # for $want (linux-base-, linux-binary-, linux-modules-$want from 6.19
    # on); apt-cache depends writes a virtual or missing one in <>.
    parts() {
        apt-cache depends "linux-image-$want" 2>/dev/null |
            awk -v w="-$want" '$1 == "Depends:" && $2 ~ /^linux-/ &&
                substr($2, length($2) - length(w) + 1) == w { print $2 }'
    }
    get() {   # as root apt warns that the download is unsandboxed: noise
        # shellcheck disable=SC2046  # package names: words
        (cd "$dl" || exit 1
         apt-get download -q "linux-image-$want" $(parts) 2>&1 |
             grep -v -e unsandboxed -e '^Get:' -e '^Fetched' || true)
    }
    get
    if ! ls "$dl"/linux-image-"$want"_*.deb >/dev/null 2>&1; then
        apt-get update -qq && get   # stale package lists
    fi
    for p in "linux-image-$want" $(parts); do
        ls "$dl/${p}"_*.deb >/dev/null 2>&1 ||
            { echo "fetch-kernel: apt-get download $p failed" >&2; exit 1; }
    done
    # Unpack beside, then swap: an interrupted run never leaves a half tree.
    rm -rf kroot.new
    for d in "$dl"/*.deb; do dpkg-deb -x "$d" kroot.new; done
    # A split kernel (6.19+) has no /boot: its vmlinuz (linux-binary), config
    # and System.map (linux-base; the latter a stub, the real one is in the
    # -dbg package) are in /usr/lib/modules/KVER. /boot's names point there.
    m=usr/lib/modules/$want
    if [ ! -e "kroot.new/boot/vmlinuz-$want" ] && [ -s "kroot.new/$m/vmlinuz" ]; then
        mkdir -p kroot.new/boot
        for f in vmlinuz config System.map; do
            if [ -e "kroot.new/$m/$f" ]; then ln -s "../$m/$f" "kroot.new/boot/$f-$want"; fi
        done
    fi
    [ -s "kroot.new/boot/vmlinuz-$want" ] ||
        { echo "fetch-kernel: no vmlinuz in the packages of linux-image-$want" >&2; exit 1; }
    rm -rf kroot vmlinux
    mv kroot.new kroot
fi

# Debian 13's kernels (6.18, 7.3) ship their modules in /usr/lib/modules
# (merged /usr), bookworm's in /lib/modules: the usr/lib symlink of a merged-/usr
# system gives both the one path that depmod and build-initramfs.sh use.
if [ ! -e kroot/lib ] && [ -d kroot/usr/lib/modules ]; then ln -s usr/lib kroot/lib; fi
[ -s "kroot/lib/modules/$want/modules.dep" ] || busybox depmod -b kroot "$want"

if [ ! -s vmlinux ] || [ "$(cat kver 2>/dev/null)" != "$want" ]; then
    rm -f vmlinux
    python3 "$HERE/extract-vmlinux.py" "kroot/boot/vmlinuz-$want" vmlinux.new && mv vmlinux.new vmlinux ||
        echo "fetch-kernel: no vmlinux extracted; boot.sh falls back to the bzImage" >&2
fi
echo "$want" > kver
echo "kernel $want: $W/vmlinux ($(du -h "$W/vmlinux" 2>/dev/null | cut -f1 || echo none))"
