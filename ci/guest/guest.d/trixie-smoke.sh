# shellcheck shell=sh
# Guest side of ci/scenarios/harness.sh's trixie cases (the 6.12 and 6.18
# guests): the Debian 13 userland in /trixie (fetch-trixie.sh) runs, and the
# kernel has what the Linux NVMe/TCP host needs for TLS:
#  - tnvme (nvme-cli 2.13 on libnvme 1.13) and keyctl run in the chroot and
#    see the guest's /etc/nvme;
#  - kTLS (CONFIG_TLS: the tls module, the "tls" TCP ULP), the .nvme keyring
#    (CONFIG_NVME_KEYRING, CONFIG_KEYS), nvme-fabrics' TLS and DH-HMAC-CHAP
#    options (CONFIG_NVME_TCP_TLS, CONFIG_NVME_HOST_AUTH) and the handshake
#    netlink family (CONFIG_NET_HANDSHAKE: tlshd starts and stays up);
#  - from Linux 6.15 on (the 6.18 guest), secure channel concatenation:
#    nvme-fabrics takes concat and tnvme connect offers --concat;
#  - a PSK from `nvme gen-tls-key`, derived and inserted by
#    `nvme check-tls-key --insert` (identities 0 and 1), lands in .nvme as a
#    "psk" key; libnvme's test key gives the TLS PSKs libnvme 1.13 derives.
# The kernel has no /proc/config.gz (IKCONFIG_PROC is off): each option is
# checked by what it makes visible.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh

step versions
[ -d /trixie ] || die "no /trixie in this image (boot the 6.12 or 6.18 kernel: run_guest ... --kernel 6.12)"
grep -E '^(nvme-cli|libnvme1t64|ktls-utils|keyutils|libc6) ' /trixie/.stamp
v=$(tnvme version) || die "tnvme version failed"
echo "$v"
echo "$v" | grep -q '^nvme version 2\.13' || die "tnvme is not nvme-cli 2.13"
echo "$v" | grep -q '^libnvme version 1\.13' || die "tnvme does not run on libnvme 1.13"
keyctl --version
[ "$(tnvme show-hostnqn)" = "$(cat /etc/nvme/hostnqn)" ] ||
    die "tnvme does not see the guest's /etc/nvme/hostnqn"
echo "tnvme show-hostnqn: $(tnvme show-hostnqn)"

step kernel-options
[ -e /proc/config.gz ] && echo "note: /proc/config.gz exists (not needed)"
modprobe tls || die "modprobe tls (CONFIG_TLS)"
grep -q '^tls ' /proc/modules || die "tls module not loaded"
grep -qw tls /proc/sys/net/ipv4/tcp_available_ulp ||
    die "no tls TCP ULP ($(cat /proc/sys/net/ipv4/tcp_available_ulp))"
echo "CONFIG_TLS: tls module loaded, TCP ULPs: $(cat /proc/sys/net/ipv4/tcp_available_ulp)"
[ -e /proc/keys ] || die "no /proc/keys (CONFIG_KEYS)"
grep -q 'nvme_keyring' /proc/modules || die "nvme-keyring not loaded"
grep -E ' keyring +\.nvme: ' /proc/keys || die "no .nvme keyring in /proc/keys (CONFIG_NVME_KEYRING)"
modprobe nvme-tcp || die "modprobe nvme-tcp"
opts=$(cat /dev/nvme-fabrics) || die "cannot read /dev/nvme-fabrics"
for o in tls tls_key= keyring= dhchap_secret= dhchap_ctrl_secret=; do
    echo "$opts" | tr ',' '\n' | grep -q "^$o" || die "nvme-fabrics has no option $o ($opts)"
done
echo "CONFIG_NVME_TCP_TLS, CONFIG_NVME_HOST_AUTH: nvme-fabrics takes tls, tls_key=, keyring=, dhchap_secret=, dhchap_ctrl_secret="
[ -e /sys/module/nvme_tcp/parameters/tls_handshake_timeout ] ||
    die "nvme-tcp has no tls_handshake_timeout parameter (CONFIG_NVME_TCP_TLS)"
# Secure channel concatenation (TLS on a queue whose PSK the DH-HMAC-CHAP
# exchange generated) came to the Linux host in 6.15.
kv=$(uname -r)
km=${kv%%.*} kn=${kv#*.}
kn=${kn%%[!0-9]*}
if [ "$km" -gt 6 ] || { [ "$km" = 6 ] && [ "$kn" -ge 15 ]; }; then
    echo "$opts" | tr ',' '\n' | grep -qx concat || die "Linux $kv: nvme-fabrics has no option concat ($opts)"
    tnvme connect --help 2>&1 | grep -q -- '--concat' || die "tnvme connect --help lists no --concat"
    echo "Linux $kv: nvme-fabrics takes concat, tnvme connect offers --concat"
fi

step tlshd
tlshd_up
tpid=$TLSHD_PID
echo "tlshd (pid $tpid) up after 1 s; its stderr:"
cat /tmp/tlshd.log
if grep -qiE 'fail|error|unable|cannot' /tmp/tlshd.log; then die "tlshd complained"; fi

step tls-keys
host=nqn.test:host sub=nqn.test:sub
key=$(tnvme gen-tls-key --subsysnqn=$sub --hostnqn=$host) || die "tnvme gen-tls-key failed"
echo "configured PSK: $key"
echo "$key" | grep -qE '^NVMeTLSkey-1:0[12]:[A-Za-z0-9+/=]+:$' || die "gen-tls-key printed no PSK interchange key"
for id in 0 1; do
    out=$(tnvme check-tls-key --hostnqn=$host --subsysnqn=$sub --keydata="$key" --identity=$id --insert) ||
        die "tnvme check-tls-key --identity=$id --insert failed: $out"
    echo "identity $id: $out"
    serial=${out##* }
    grep -E "^0*$serial .* psk +NVMe${id}R0[12] $host $sub" /proc/keys ||
        die "key $serial (identity $id) is not a psk key in /proc/keys"
done
keyctl show %:.nvme
n=$(keyctl show %:.nvme | grep -c "psk: NVMe[01]R0[12] $host $sub") || true
[ "$n" = 2 ] || die "want 2 psk keys of $host/$sub in .nvme, found $n"
# What .nvme holds is the TLS PSK that libnvme derived from the retained
# PSK (32 bytes with hash 01, 48 with 02). A psk key lets only its possessor
# search or read it (perm 3b010000): .nvme goes into a session keyring of
# this shell (keyctl new_session installs one on its parent; without one,
# `keyctl link ... @s` links into a throwaway session keyring of keyctl's
# own), as tlshd links it (tlshd.conf keyrings= .nvme).
keyctl new_session > /dev/null
keyctl link %:.nvme @s
# psk_of ID HOSTNQN SUBNQN: the hex bytes of that identity's TLS PSK.
psk_of() {
    s=$(keyctl search %:.nvme psk "NVMe${1}R01 $2 $3" 2>/dev/null ||
        keyctl search %:.nvme psk "NVMe${1}R02 $2 $3") || die "keyctl search for the identity $1 PSK of $2 $3 failed"
    keyctl pipe "$s" | od -An -tx1 | tr -d ' \n'
}
for id in 0 1; do
    b=$(psk_of $id $host $sub)
    echo "identity $id TLS PSK ($((${#b} / 2)) bytes): $b"
    [ ${#b} = 64 ] || [ ${#b} = 96 ] || die "identity $id PSK is ${#b} hex digits"
done

step tls-keys-known-answer
# libnvme's test key and NQNs: the TLS PSKs libnvme 1.13 derives (on the
# host too, with --keytype=user; and by a model of its HKDF, whose info is
# not RFC 8446's HkdfLabel: a little-endian length, "tls13 " + label and
# the context with no length bytes). A libnvme that derives otherwise would
# no longer match what pollux must accept.
kh=nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6
ks=nqn.2014-08.org.nvmexpress:uuid:e5df7ba0-c13f-4a61-9d72-2e0f4bbbd9ac
kk=NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:
for id in 0 1; do
    case $id in
        0) want=3350163105a981d8ebfcaff245a34c7811e41d4c25999e2c705b6775f93dea22 ;;
        1) want=06a65e2007b2593b867905290f62bc50c6c04154c4687bf3d21e56672d6ef6b9 ;;
    esac
    out=$(tnvme check-tls-key --hostnqn=$kh --subsysnqn=$ks --keydata=$kk --identity=$id --insert) ||
        die "check-tls-key of the known key, identity $id: $out"
    b=$(psk_of $id $kh $ks)
    echo "identity $id: $b"
    [ "$b" = "$want" ] || die "identity $id TLS PSK $b, libnvme 1.13 derived $want"
done
grep -q " psk .*NVMe1R01 $kh $ks Wsypc1u26YumpAoyhXuB7rtdl23KFRw7+K6FUT6imsU=: 32" /proc/keys ||
    die "identity 1 of the known key has another PSK digest"
kill -0 "$tpid" 2>/dev/null || { cat /tmp/tlshd.log; die "tlshd died"; }
kill "$tpid"

step end
