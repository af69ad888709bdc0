# shellcheck shell=sh
# Guest side of ci/scenarios/pollux-auth.sh (6.12 guest kernel): the kernel's
# nvme-tcp host authenticating to pollux on the host (10.0.2.100:4420) with
# DH-HMAC-CHAP. Env: PFX (subsystem NQN prefix: s256, s384, s512, open),
# HOSTNQN (the keyed host), OTHERNQN (a host with no key), the secrets K256,
# K384 + C384 (controller key of s384), K512, KROT (s384's host key after the
# rotation), KWRONG, CWRONG; BIG_GROUPS=1 adds s4096, s6144, s8192 (K512).
# 10.0.2.100:9000 is a relay to a host script that rotates s384's host key to
# KROT through pollux ctl and answers "rotated".
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
port=4420
hostid=${HOSTNQN##*:uuid:}

# aconnect CASE SUB [nvme connect args]: connect as HOSTNQN with 2 I/O queues.
# The host logs the admin queue's authentication (the I/O queues' only at debug
# level: pollux's log shows them, which the host side checks).
aconnect() {
    case_=$1 sub=$PFX:$2
    shift 2
    kmark "$case_"
    t0=$(now)
    dev=$(host_connect "$sub" "$port" --hostnqn="$HOSTNQN" --hostid="$hostid" --nr-io-queues=2 "$@")
    echo "TIME: $case_ connect $(since "$t0")s" >&2
    kwait "$case_" "qid 0: authenticated" 10 >&2
    ksince "$case_" | grep -E 'nvme nvme' >&2
    echo "$dev"
}

# refused CASE SUB [args]: the connect fails and leaves nothing behind.
refused() {
    case_=$1 sub=$PFX:$2
    shift 2
    kmark "$case_"
    t0=$(now)
    if timeout 60 nvme connect -t tcp -n "$sub" -a "$HOST_ADDR" -s "$port" --hostnqn="$HOSTNQN" \
            --hostid="$hostid" "$@" > /tmp/out 2>&1; then
        cat /tmp/out
        die "$case_: nvme connect to $sub succeeded"
    fi
    echo "TIME: $case_ refused $(since "$t0")s"
    echo "nvme connect (refused, as it must be): $(cat /tmp/out)"
    ksince "$case_" | grep -E 'nvme nvme' || true
    if ksince "$case_" | grep -q 'timeout'; then
        die "$case_: the host waited for a timeout: pollux lost an authentication completion"
    fi
    nothing_connected "$port"
}

step kernel
uname -r
case $(uname -r) in 6.12.*) ;; *) die "this is $(uname -r), not the 6.12 guest" ;; esac
[ -d /sys/module/nvme_auth ] || die "nvme_auth not loaded"
# A lost completion would cost the admin timeout: 10 s, not 60 (and is a failure).
echo 10 > /sys/module/nvme_core/parameters/admin_timeout
host_discover "$port" | grep -E 'subnqn|trsvcid'

step discovery-auth
# nvme-cli 2.4 (libnvme 1.3) hands no DH-HMAC-CHAP secret to the kernel for a discovery
# controller ("qid 0: no key": a keyed host without its key is refused, as it must be), so
# the kernel gets the options straight through /dev/nvme-fabrics, and nvme-cli reads the
# log through the controller that made.
disc=nqn.2014-08.org.nvmexpress.discovery
opts="transport=tcp,traddr=$HOST_ADDR,trsvcid=$port,nqn=$disc,hostnqn=$HOSTNQN,hostid=$hostid"
kmark discovery-auth
dctrl=$(fabrics_add "$opts,dhchap_secret=$K256") || die "authenticated discovery connect failed"
kwait discovery-auth "qid 0: authenticated" 10
out=$(timeout 30 nvme discover -d "$dctrl") || die "nvme discover -d $dctrl failed"
echo "$out" | grep -q "subnqn: *$PFX:s256" || die "authenticated discovery lists no subsystem: $out"
ksince discovery-auth | grep -E 'nvme nvme' || true
timeout 30 nvme disconnect -d "$dctrl" >&2 || die "nvme disconnect -d $dctrl"
kmark discovery-wrong
if d=$(fabrics_add "$opts,dhchap_secret=$KWRONG" 2>/tmp/out); then
    die "a discovery connect with a wrong secret made $d"
fi
ksince discovery-wrong | grep -E 'nvme nvme' || true
nothing_connected "$port"

step sha256-null
dev=$(aconnect sha256-null s256 --dhchap-secret="$K256")
ksince sha256-null | grep -q 'qid 0: authenticated with hash hmac(sha256) dhgroup null' ||
    die "not authenticated with hmac(sha256) / null"
roundtrip "$dev"
disconnect "$PFX:s256"

step no-key
refused no-key s256

step wrong-key
refused wrong-key s256 --dhchap-secret="$KWRONG"

step sha384-ffdhe2048-bidi
dev=$(aconnect sha384-ffdhe2048-bidi s384 --dhchap-secret="$K384" --dhchap-ctrl-secret="$C384")
ksince sha384-ffdhe2048-bidi | grep -q 'qid 0: authenticated with hash hmac(sha384) dhgroup ffdhe2048' ||
    die "not authenticated with hmac(sha384) / ffdhe2048"
ksince sha384-ffdhe2048-bidi | grep -q 'qid 0: controller authenticated' || die "the controller was not authenticated"
fio_verify "$dev" 4k 16M
disconnect "$PFX:s384"

step wrong-ctrl-key
refused wrong-ctrl-key s384 --dhchap-secret="$K384" --dhchap-ctrl-secret="$CWRONG"

step sha512-ffdhe3072
dev=$(aconnect sha512-ffdhe3072 s512 --dhchap-secret="$K512")
ksince sha512-ffdhe3072 | grep -q 'qid 0: authenticated with hash hmac(sha512) dhgroup ffdhe3072' ||
    die "not authenticated with hmac(sha512) / ffdhe3072"
roundtrip "$dev"
disconnect "$PFX:s512"

if [ "${BIG_GROUPS:-0}" = 1 ]; then
    for g in 4096 6144 8192; do
        step "sha512-ffdhe$g"
        dev=$(aconnect "sha512-ffdhe$g" "s$g" --dhchap-secret="$K512")
        ksince "sha512-ffdhe$g" | grep -q "qid 0: authenticated with hash hmac(sha512) dhgroup ffdhe$g" ||
            die "not authenticated with hmac(sha512) / ffdhe$g"
        roundtrip "$dev"
        disconnect "$PFX:s$g"
    done
fi

step keyless-host
# A host without keys on a subsystem open to any host: no authentication asked.
kmark keyless
dev=$(host_connect "$PFX:open" "$port" --hostnqn="$OTHERNQN" --hostid="${OTHERNQN##*:uuid:}")
if ksince keyless | grep -q authenticated; then die "a keyless host was asked to authenticate"; fi
roundtrip "$dev"
disconnect "$PFX:open"

step rotate
dev=$(aconnect rotate-connect s384 --dhchap-secret="$K384" --dhchap-ctrl-secret="$C384" --reconnect-delay=2)
ctrl=$(ctrl_of "$dev")
r=$(nc "$HOST_ADDR" 9000 < /dev/null) || die "the rotation relay failed"
[ "$r" = rotated ] || die "the rotation relay answered '$r'"
kmark reauth
t0=$(now)
printf '%s' "$KROT" > "$ctrl/dhchap_secret"
kwait reauth 'qid 0: controller authenticated' 20
echo "TIME: reauth $(since "$t0")s"
ksince reauth
ksince reauth | grep -q 're-authenticating controller' || die "no 're-authenticating controller'"
# The target changed the host's hash and group with its key (nvme/045's case): the
# re-authentication negotiates SHA-512 and ffdhe3072.
ksince reauth | grep -q 'qid 0: authenticated with hash hmac(sha512) dhgroup ffdhe3072' ||
    die "re-authentication did not take the host's new hash and group (sha512, ffdhe3072)"
[ "$(cat "$ctrl/state")" = live ] || die "controller $(cat "$ctrl/state") after re-authentication"
roundtrip "$dev"
fio_verify "$dev" 64k 16M
disconnect "$PFX:s384"
refused old-key-after-rotation s384 --dhchap-secret="$K384" --dhchap-ctrl-secret="$C384"
dev=$(aconnect rotated-key s384 --dhchap-secret="$KROT" --dhchap-ctrl-secret="$C384")
roundtrip "$dev"
disconnect "$PFX:s384"
nothing_connected "$port"

step end
