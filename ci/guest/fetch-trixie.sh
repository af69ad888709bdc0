#!/bin/bash
# Fetch a Debian 13 ("trixie") userland for the guest's NVMe/TCP TLS host:
# nvme-cli (2.13, with --tls and gen-tls-key/check-tls-key), ktls-utils
# (tlshd, the kernel's TLS handshake agent) and keyutils (keyctl), with the
# whole closure of their dependencies, trixie's glibc included: bookworm's
# glibc 2.36 cannot run them, and bookworm has no tlshd at all.
#   usage: fetch-trixie.sh
# The host's apt is never touched: a private apt configuration under
# $GUEST_WORK/trixie/apt (its own sources.list, lists, cache and an empty
# dpkg status, so that apt downloads every dependency instead of counting
# the host's bookworm packages as installed) resolves and downloads the
# packages; each .deb is unpacked with dpkg-deb -x (no maintainer scripts
# run) into $GUEST_WORK/trixie/root, then docs, man pages and locales are
# removed. build-initramfs.sh copies that root into the image of the series
# that ask for it (kernels.sh guest_trixie) as /trixie, where the guest runs
# the tools in a chroot (its wrappers tnvme, tlshd and keyctl; /init
# bind-mounts /proc, /sys, /dev, /run, /tmp and /etc/nvme into it).
# Cached: root/.stamp holds the package list with versions, and a run that
# finds it (for the same PKGS and script) does nothing (no network). Versions are not pinned (old ones leave
# the mirror); they are printed. rm -rf $GUEST_WORK/trixie to refetch.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=${GUEST_WORK:-$(cd "$HERE/../.." && pwd)/build/guest}
T=$W/trixie
PKGS="nvme-cli ktls-utils keyutils"
STUBS="uuid-runtime"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
ROOT=$T/root

# The stamp's first line: what was asked for and how (this script's hash:
# a change in what it prunes or adds refetches).
key="packages: $PKGS; stubs: $STUBS; script: $(sha256sum < "$0" | cut -c1-16)"
if [ -s "$ROOT/.stamp" ] && [ "$(head -1 "$ROOT/.stamp")" = "$key" ]; then
    echo "trixie: $ROOT up to date ($(tail -n +2 "$ROOT/.stamp" | wc -l) packages)"
    exit 0
fi
A=$T/apt
mkdir -p "$A"/etc/apt.conf.d "$A"/etc/preferences.d "$A"/etc/sources.list.d \
    "$A"/etc/trusted.gpg.d "$A"/state/lists/partial "$A"/cache/archives/partial "$A"/log
echo "deb [signed-by=$KEYRING] http://deb.debian.org/debian trixie main" > "$A/etc/sources.list"
# A status where nothing is installed, so the whole closure is fetched, but
# for STUBS, marked installed so that apt leaves them and what they pull in
# out: nvme-cli depends on uuid-runtime only for uuidgen in its postinst
# (which never runs here: the guest's /init writes hostnqn and hostid), and
# uuid-runtime's uuidd brings systemd, PAM, adduser and debconf (some 25 MB).
for p in $STUBS; do
    printf 'Package: %s\nStatus: install ok installed\nVersion: 99\nArchitecture: all\nMaintainer: pollux ci <ci@localhost>\nDescription: stub of fetch-trixie.sh\n\n' "$p"
done > "$A/state/status"
# Dir::Etc is our own: the host's apt.conf.d, preferences (pins) and sources
# are not read at all (APT_CONFIG is read before Dir::Etc::Parts). amd64
# only: the guest is x86_64, and a multiarch host would fetch i386 lists.
cat > "$A/apt.conf" <<EOF
Dir::Etc "$A/etc";
Dir::Etc::Parts "$A/etc/apt.conf.d";
Dir::State "$A/state";
Dir::State::status "$A/state/status";
Dir::Cache "$A/cache";
Dir::Log "$A/log";
APT::Architecture "amd64";
APT::Architectures { "amd64"; };
APT::Install-Recommends "false";
APT::Install-Suggests "false";
APT::Sandbox::User "root";
Acquire::Languages "none";
EOF
export APT_CONFIG=$A/apt.conf

# apt checks trixie's Release signature against bookworm's
# debian-archive-keyring, which has trixie's keys (2023.3+deb12u2 here).
apt-get update -qq ||
    { echo "fetch-trixie: apt-get update failed (no network? $KEYRING without trixie's keys?)" >&2; exit 1; }
rm -f "$A"/cache/archives/*.deb
# shellcheck disable=SC2086  # PKGS is a list of words
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --download-only $PKGS >/dev/null
debs=("$A"/cache/archives/*.deb)
[ -e "${debs[0]}" ] || { echo "fetch-trixie: apt downloaded nothing" >&2; exit 1; }

# Unpack beside, then swap: an interrupted run never leaves a half root.
rm -rf "$ROOT.new"
mkdir -p "$ROOT.new"
for d in "${debs[@]}"; do dpkg-deb -x "$d" "$ROOT.new"; done
# Merged /usr, as on an installed trixie (whose top-level symlinks no
# package unpacked here carries): binaries ask for
# /lib64/ld-linux-x86-64.so.2, and a few packages still ship files under
# /lib or /sbin.
for d in bin sbin lib lib64; do
    if [ -d "$ROOT.new/$d" ] && [ ! -L "$ROOT.new/$d" ]; then
        mkdir -p "$ROOT.new/usr/$d"
        cp -a "$ROOT.new/$d/." "$ROOT.new/usr/$d/"
        rm -rf "${ROOT:?}.new/$d"
    fi
    [ -e "$ROOT.new/usr/$d" ] || mkdir -p "$ROOT.new/usr/$d"
    ln -sfn "usr/$d" "$ROOT.new/$d"
done
# Only binaries and libraries matter in the guest: the rest is initramfs
# size (and zstd time at every image build).
# gconv (iconv's charset modules, 8 MB) serves no tool here: they speak
# UTF-8 and ASCII only.
rm -rf "$ROOT.new"/usr/share/{doc,man,locale,info,lintian,bug,bash-completion,zsh} \
    "$ROOT.new"/usr/lib/x86_64-linux-gnu/gconv
{
    echo "$key"
    for d in "${debs[@]}"; do dpkg-deb -f "$d" Package Version | paste -sd' '; done |
        sed 's/^Package: //; s/ Version: / /' | LC_ALL=C sort
} > "$ROOT.new/.stamp"
rm -rf "$ROOT"
mv "$ROOT.new" "$ROOT"
rm -f "$A"/cache/archives/*.deb   # unpacked: the .debs are not needed again
echo "trixie: $ROOT ($(du -sh "$ROOT" | cut -f1), ${#debs[@]} packages):"
grep -E '^(nvme-cli|libnvme1t64|ktls-utils|keyutils|libkeyutils1|libc6) ' "$ROOT/.stamp" | sed 's/^/  /'
