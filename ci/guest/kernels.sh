# shellcheck shell=bash
# The guest kernels the harness can boot, by series (boot.sh --kernel SERIES,
# so run_guest SCRIPT --kernel SERIES; setup.sh prepares those of
# GUEST_KERNELS_SETUP, 6.1 6.12 6.18, and 7.3 only when asked: setup.sh 7.3):
#   6.1   Debian 12's own kernel (the ABI that linux-image-amd64 depends on).
#         The default. Its NVMe host and target have no in-band
#         authentication (CONFIG_NVME_AUTH is not set).
#   6.12  bookworm's 6.12 (the ABI that linux-image-6.12-amd64 depends on):
#         CONFIG_NVME_HOST_AUTH=y, CONFIG_NVME_TARGET_AUTH=y (DH-HMAC-CHAP,
#         NVMe 2.0 section 8.13), CONFIG_NVME_TCP_TLS=y (NVMe/TCP TLS 1.3
#         with PSKs from the .nvme keyring, CONFIG_NVME_KEYRING=m), with
#         CONFIG_TLS=m (kTLS) and CONFIG_NET_HANDSHAKE=y (the netlink
#         family through which the kernel asks tlshd for handshakes). Its
#         initramfs also carries a Debian 13 (trixie) userland in /trixie
#         (guest_trixie): nvme-cli 2.13 (tnvme), tlshd and keyctl, which
#         Debian 12 lacks or ships too old for TLS.
#   6.18  trixie-backports' 6.18 (an LTS line; the newest
#         linux-image-6.18.N+deb13-amd64 there: guest_ksuite). 6.15 and later
#         have the host side of NVMe/TCP secure channel concatenation
#         (nvme connect --concat: TLS on a queue whose PSK comes from the
#         DH-HMAC-CHAP exchange). The same options as 6.12 for auth and TLS,
#         the same /trixie userland and the same extra boot modules.
#   7.3   trixie-backports' newest line (the highest linux-image-7.3.N+deb13-
#         amd64 there, as 6.18), the strongest NVMe host Debian offers; on
#         demand only (setup.sh 7.3: 122 MB of packages, ~30 s of setup),
#         for pollux-concat-linux (CONCAT_KERNEL=7.3). From 6.19 on Debian
#         splits the kernel: linux-image-KVER is an empty meta package that
#         depends on linux-base-KVER (config, modules.builtin, .order and
#         .builtin.modinfo in /usr/lib/modules/KVER; System.map there is a
#         stub naming the -dbg package), linux-binary-KVER (the signed
#         vmlinuz, as /usr/lib/modules/KVER/vmlinuz; no /boot at all) and
#         linux-modules-KVER (the modules, .ko.xz, no modules.dep):
#         fetch-kernel.sh unpacks all four and links /boot's names to them.
#         The same options as 6.18 for auth and TLS (CONFIG_NVME_HOST_AUTH=y,
#         CONFIG_NVME_TCP_TLS=y, CONFIG_NVME_KEYRING=m, CONFIG_TLS=m,
#         CONFIG_NET_HANDSHAKE=y), the same /trixie userland.
# Each series has its own work dir (guest_kdir): kroot/, vmlinux, kver and
# initramfs.img. The 6.1 one is $GUEST_WORK itself, where it always was.
# Sourced by setup.sh, fetch-kernel.sh, build-initramfs.sh and boot.sh, which
# set W (the work dir, $GUEST_WORK) first.

GUEST_KERNELS="6.1 6.12 6.18 7.3"
# What setup.sh prepares when given no series: not 7.3 (CI time, downloads).
# shellcheck disable=SC2034  # read by setup.sh
GUEST_KERNELS_SETUP="6.1 6.12 6.18"
GUEST_KERNEL_DEFAULT=6.1

# guest_kernel_ok SERIES: true if SERIES is one of GUEST_KERNELS.
guest_kernel_ok() {
    case " $GUEST_KERNELS " in *" $1 "*) return 0 ;; esac
    return 1
}

# guest_kdir SERIES: the work dir of that series' kernel and initramfs.
guest_kdir() {
    case $1 in
        "$GUEST_KERNEL_DEFAULT") echo "$W" ;;
        *) echo "$W/k-$1" ;;
    esac
}

# guest_kmeta SERIES: the Debian meta package whose Depends names that
# series' current linux-image ABI (old ABIs leave the mirror: no pin), in
# the host's own apt sources. None for a series of guest_ksuite: no meta
# package follows one line there (trixie-backports' linux-image-amd64 is
# whatever is newest), so fetch-kernel.sh takes the highest
# linux-image-SERIES.N+debNN-amd64 that the suite has.
guest_kmeta() {
    case $1 in
        6.1) echo linux-image-amd64 ;;
        6.18 | 7.3) ;;
        *) echo "linux-image-$1-amd64" ;;
    esac
}

# guest_ksuite SERIES: the Debian suite that series' kernel comes from when
# it is not in the host's apt sources (the host is Debian 12), fetched
# through a private apt configuration ($GUEST_WORK/apt-SUITE, see
# fetch-kernel.sh; the host's apt is not touched). Empty: the host's apt.
guest_ksuite() {
    case $1 in
        6.18 | 7.3) echo trixie-backports ;;
    esac
}

# guest_kmods SERIES: boot modules of that series beyond the common list
# (build-initramfs.sh BOOT_MODULES). For 6.12, 6.18, 7.3 the DH-HMAC-CHAP stack:
# nvme-auth and nvme-keyring (modules, which nvme-core, nvme-tcp and nvmet
# depend on anyway; in 6.18 nvme-auth brings hkdf), and the crypto the
# protocol asks for by name: hmac(sha256|sha384|sha512) and dh with the
# RFC 7919 ffdhe groups (CRYPTO_DH_RFC7919_GROUPS, inside dh_generic). In
# Debian's 6.12, 6.18, 7.3 those crypto drivers are built in; a build that
# makes them modules gets them loaded at boot. 6.18 names the SHA-2 drivers
# sha256 and sha512 (sha256_generic and sha512_generic are gone there since
# the SHA-2 lib/crypto rework): each series lists its kernel's own names, as
# build-initramfs.sh refuses a listed module that the kernel neither has
# nor builds in (but for crc*). Then tls (kTLS), which tlshd hands a socket
# to after the handshake (TCP_ULP "tls"): loaded at boot rather than left to
# the kernel's request_module, which busybox modprobe may not resolve by
# alias. And the AEADs kTLS asks the crypto API for by name, gcm(aes) for
# TLS_AES_128_GCM_SHA256 and TLS_AES_256_GCM_SHA384 (gcm, ghash, AES-NI:
# modules in Debian's 6.12, 6.18 and 7.3): without them tlshd's handshake
# succeeds and handing the keys to the kernel fails ("The kernel does not
# support the requested algorithm", nvme-tcp -EIO). 7.3 has no ghash-generic
# (CONFIG_CRYPTO_GHASH is gone: gcm hashes with the GF(2^128) library,
# libgf128hash, built in; aesni-intel brings gf128mul) and its nvme-auth
# needs no hkdf module.
guest_kmods() {
    case $1 in
        6.1) ;;
        6.12) echo "nvme-keyring nvme-auth hmac sha256_generic sha512_generic kpp dh_generic tls gcm ghash-generic aesni-intel" ;;
        6.18) echo "nvme-keyring nvme-auth hmac sha256 sha512 kpp dh_generic tls gcm ghash-generic aesni-intel" ;;
        *) echo "nvme-keyring nvme-auth hmac sha256 sha512 kpp dh_generic tls gcm aesni-intel" ;;
    esac
}

# guest_trixie SERIES: true if that series' initramfs carries the Debian 13
# userland of fetch-trixie.sh in /trixie (nvme-cli 2.13 with TLS, tlshd,
# keyctl; see build-initramfs.sh). Only 6.12, 6.18 and 7.3 have the kernel
# side of NVMe/TCP TLS; the 6.1 image stays without it (29 MB unpacked).
guest_trixie() {
    case $1 in
        6.1) return 1 ;;
        *) return 0 ;;
    esac
}
