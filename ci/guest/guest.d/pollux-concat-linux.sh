# shellcheck shell=sh
# Guest side of ci/scenarios/pollux-concat-linux.sh (the 6.18 guest kernel from
# trixie-backports, or its 7.3 with CONCAT_KERNEL=7.3, with Debian 13's nvme-cli 2.13 as
# tnvme, tlshd and keyctl): secure channel concatenation
# (TP 8018) from the Linux host to pollux on the host: 10.0.2.100:4420 is a listener with
# tls = "allowed" (the first admin connection is plain TCP, the rest TLS with the generated
# PSK), :4421 one without TLS. Env: SUB (secure_concat = true), PLAIN (a subsystem without
# it), HOSTNQN, KEY (the host's DH-HMAC-CHAP secret), KWRONG (another). Every refusal must
# leave nothing connected.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
port=4420
port_plain=4421
hostid=${HOSTNQN##*:uuid:}

# generated: the descriptions of the generated PSKs in the kernel's keyrings, one a line.
generated() { grep -oE "psk +NVMe1G0[12] $HOSTNQN $SUB [A-Za-z0-9+/=]+" /proc/keys | sed 's/^psk *//' || true; }

step kernel
case $(uname -r) in
    6.1[89].* | 6.[2-9][0-9].* | [7-9].* | [1-9][0-9].*) ;;
    *) die "this is $(uname -r): concatenation needs the 6.18 guest (6.15-6.17 derive the TLS PSK otherwise)" ;;
esac
[ -d /trixie ] || die "no /trixie: the image carries Debian 13's nvme-cli and tlshd"
tnvme version
tnvme connect --help 2>&1 | grep -q -- '--concat' || die "tnvme connect has no --concat"
grep -qw tls /proc/sys/net/ipv4/tcp_available_ulp || die "no kTLS (tls TCP ULP)"
echo 10 > /sys/module/nvme_core/parameters/admin_timeout

step tlshd
tlshd_up

step connect-concat
kmark connect-concat
t0=$(now)
timeout 90 tnvme connect -t tcp -n "$SUB" -a "$HOST_ADDR" -s "$port" --hostnqn="$HOSTNQN" \
    --hostid="$hostid" --nr-io-queues=2 --dhchap-secret="$KEY" --concat >&2 ||
    { cat /tmp/tlshd.log; ksince connect-concat; die "nvme connect --concat failed"; }
echo "TIME: connect --concat $(since "$t0")s"
dev=$(wait_bdev "$SUB")
ctrl=$(ctrl_of "$dev")
ksince connect-concat | grep -E 'nvme|tls|concat|auth' || true
echo "controller ${ctrl##*/}: $(cat "$ctrl/transport") $(cat "$ctrl/address"), $(cat "$ctrl/queue_count") queues"
[ "$(cat "$ctrl/queue_count")" = 3 ] || die "want an admin and 2 I/O queues, got $(cat "$ctrl/queue_count")"
# The key that secures the queues is the generated one: its identity (NVMe1G, the
# host and subsystem, the digest) is in the keyring, and the controller names its serial.
first=$(generated)
[ -n "$first" ] || { cat /proc/keys; die "no generated PSK (NVMe1G) in the kernel's keyrings"; }
echo "generated PSK: $first"
if [ -e "$ctrl/tls_key" ]; then
    used=$(cat "$ctrl/tls_key")
    grep -E "^0*$used " /proc/keys | grep -q "NVMe1G" ||
        { cat /proc/keys; die "the controller's TLS key $used is not the generated one"; }
    echo "tls_key: $used (generated)"
fi
grep -q 'tls' /tmp/tlshd.log || true
grep -ciE 'handshake with .* was successful|Handshake .*success' /tmp/tlshd.log ||
    echo "(tlshd logged no success line; its log follows at the end)"

step fio-verify
fio_verify "$dev" 4k
fio_verify "$dev" 128k

step reauth-replaces-psk
# A write to dhchap_secret re-authenticates the admin queue, now over TLS: SC_C
# REPLACETLSPSK, and the host's keyring gets the new generated PSK.
kmark reauth
printf '%s' "$KEY" > "$ctrl/dhchap_secret"
n=0
while [ "$n" -lt 100 ]; do
    now_keys=$(generated)
    for k in $now_keys; do
        case " $(echo "$first" | tr '\n' ' ') " in *" $k "*) ;; *) newkey=$k ;; esac
    done
    [ -n "${newkey:-}" ] && break
    sleep 0.2
    n=$((n + 1))
done
ksince reauth | grep -E 'nvme|auth|concat' || true
[ -n "${newkey:-}" ] || { cat /proc/keys; die "re-authentication generated no new PSK"; }
echo "replaced: a generated PSK with the new digest $newkey"
[ "$(cat "$ctrl/state")" = live ] || die "controller ${ctrl##*/} is $(cat "$ctrl/state") after re-authentication"
fio_verify "$dev" 4k 8M

step disconnect
disconnect "$SUB"
nothing_connected "$port" "$SUB"

step refused
refused_connect no-secure-concat "$port" tnvme -n "$PLAIN" --hostnqn="$HOSTNQN" --hostid="$hostid" \
    --dhchap-secret="$KEY" --concat
refused_connect listener-without-tls "$port_plain" tnvme -n "$SUB" --hostnqn="$HOSTNQN" --hostid="$hostid" \
    --dhchap-secret="$KEY" --concat
refused_connect wrong-key "$port" tnvme -n "$SUB" --hostnqn="$HOSTNQN" --hostid="$hostid" \
    --dhchap-secret="$KWRONG" --concat
nothing_connected "$port_plain"

step end
kill "$TLSHD_PID" 2>/dev/null || true
echo "tlshd's log:"
tail -40 /tmp/tlshd.log
