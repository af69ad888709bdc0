# shellcheck shell=sh
# Guest side of ci/scenarios/pollux-tls-linux.sh (6.12 guest kernel with Debian 13's
# nvme-cli 2.13 as tnvme, tlshd and keyctl): the Linux NVMe/TCP host over TLS 1.3 with
# a PSK to pollux on the host (10.0.2.100:4420, a listener with tls = "required"), the
# handshake done by tlshd, the keys derived and inserted by nvme-cli as the README says.
# Env: SUB (the subsystem NQN), HOSTNQN, KEY (the host's configured PSK, NVMeTLSkey-1:01:),
# KWRONG (another PSK). Every refusal must leave nothing connected.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
port=4420
hostid=${HOSTNQN##*:uuid:}
disc=nqn.2014-08.org.nvmexpress.discovery

# insert KEY SUBNQN: derive the host's TLS PSK for SUBNQN from KEY and put it in .nvme (the
# README's command), replacing a key of the same identity. Prints the key's serial (hex).
insert() {
    out=$(tnvme check-tls-key --keydata="$1" --hostnqn="$HOSTNQN" --subsysnqn="$2" --insert) ||
        die "nvme check-tls-key --insert for $2 failed: $out"
    echo "$out" >&2
    echo "${out##* }"
}

step kernel
case $(uname -r) in 6.12.*) ;; *) die "this is $(uname -r), not the 6.12 guest" ;; esac
[ -d /trixie ] || die "no /trixie: the 6.12 image carries Debian 13's nvme-cli and tlshd"
tnvme version
grep -qw tls /proc/sys/net/ipv4/tcp_available_ulp || die "no kTLS (tls TCP ULP)"
grep -E ' keyring +\.nvme: ' /proc/keys || die "no .nvme keyring"
# A lost completion costs the admin timeout: 10 s, not 60 (and is a failure).
echo 10 > /sys/module/nvme_core/parameters/admin_timeout

step tlshd
# tlshd does the handshake for the kernel (netlink handshake upcall); its conf links the
# .nvme keyring, where nvme-cli puts the PSKs.
tlshd_up

step keys
serial=$(insert "$KEY" "$SUB")
insert "$KEY" "$disc" > /dev/null
keyctl show %:.nvme

step discover-tls
# The discovery controller over TLS (its PSK identity names the discovery NQN); the log
# entry of a listener that requires TLS says so: TREQ required, TSAS sectype TLS 1.3.
out=$(timeout 60 tnvme discover -t tcp -a "$HOST_ADDR" -s "$port" --hostnqn="$HOSTNQN" \
    --hostid="$hostid" --tls) || { cat /tmp/tlshd.log; die "nvme discover --tls failed"; }
echo "$out"
echo "$out" | grep -q "subnqn: *$SUB" || die "the discovery log lists no $SUB"
echo "$out" | grep -qiE 'treq: *required' || die "the log entry's TREQ is not 'required'"
echo "$out" | grep -qiE 'sectype: *tls ?1\.?3' || die "the log entry's TSAS is not TLS 1.3"
nothing_connected "$port"

step connect-tls
kmark connect-tls
t0=$(now)
timeout 60 tnvme connect -t tcp -n "$SUB" -a "$HOST_ADDR" -s "$port" --hostnqn="$HOSTNQN" \
    --hostid="$hostid" --nr-io-queues=2 --tls >&2 ||
    { cat /tmp/tlshd.log; ksince connect-tls; die "nvme connect --tls failed"; }
echo "TIME: connect --tls $(since "$t0")s"
dev=$(wait_bdev "$SUB")
ctrl=$(ctrl_of "$dev")
ksince connect-tls | grep -E 'nvme|tls' || true
echo "controller ${ctrl##*/}: $(cat "$ctrl/transport") $(cat "$ctrl/address"), $(cat "$ctrl/queue_count") queues"
[ "$(cat "$ctrl/queue_count")" = 3 ] || die "want an admin and 2 I/O queues, got $(cat "$ctrl/queue_count")"
# The kernel says which key secured the queues (6.12: tls_key, the key's serial).
if [ -e "$ctrl/tls_key" ]; then
    used=$(cat "$ctrl/tls_key")
    echo "tls_key: $used (inserted: $serial)"
    [ "$((0x$used))" = "$((0x$serial))" ] || die "the controller used key $used, not $serial"
fi

step fio-verify
fio_verify "$dev" 4k
fio_verify "$dev" 128k

step disconnect
disconnect "$SUB"
nothing_connected "$port" "$SUB"

step wrong-psk
# The same identity with another key: nvme-cli revokes the old key and inserts the new.
wserial=$(insert "$KWRONG" "$SUB")
[ "$wserial" != "$serial" ] || die "the wrong key did not replace the right one"
grep -E "^0*$wserial .* psk +NVMe0R01 $HOSTNQN $SUB" /proc/keys || die "no wrong key $wserial in /proc/keys"
refused_connect wrong-psk "$port" tnvme -n "$SUB" --hostnqn="$HOSTNQN" --hostid="$hostid" --tls
nothing_connected "$port" "$SUB"

step plaintext
# Debian 12's nvme-cli, no TLS: the listener requires it.
refused_connect plaintext "$port" nvme -n "$SUB" --hostnqn="$HOSTNQN" --hostid="$hostid"
nothing_connected "$port" "$SUB"

step end
kill "$TLSHD_PID" 2>/dev/null || true
echo "tlshd's log:"
cat /tmp/tlshd.log
