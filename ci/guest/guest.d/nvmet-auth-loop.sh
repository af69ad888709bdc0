# shellcheck shell=sh
# Guest side of ci/scenarios/nvmet-auth-loop.sh (6.12 guest kernel: boot.sh
# --kernel 6.12): NVMe in-band authentication (DH-HMAC-CHAP, NVMe 2.0
# section 8.13) between the kernel's nvme-tcp host and its nvmet-tcp target,
# both in this guest over 127.0.0.1, the reference a pollux implementation is
# held to. Each case is its own host NQN on nvmet (hosts/<hostnqn>/dhchap_*,
# linked into the subsystem's allowed_hosts), keys from nvme gen-dhchap-key:
#   sha256/null host-only: the right key connects (dd round trip), a wrong
#     key and no key are refused and leave nothing connected;
#   sha256/null bidirectional (--dhchap-ctrl-secret), a wrong ctrl secret is
#     refused;
#   sha384/ffdhe2048 bidirectional, its wrong host key refused;
#   sha512/ffdhe3072 host-only;
#   re-authentication through sysfs (/sys/class/nvme/nvmeX/dhchap_secret and
#     dhchap_ctrl_secret) with rotated keys, and with a key nvmet does not know.
# Prints "TIME: <case> <seconds>" for each connect and nvmet host setup.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
nqn=${NQN:-nqn.2024-01.io.pollux.ci:nvmet-auth-loop}
port=${PORT:-4420}
c=/sys/kernel/config/nvmet

# new_host: print a fresh host NQN (its uuid doubles as the host ID).
new_host() { echo "nqn.2014-08.org.nvmexpress:uuid:$(cat /proc/sys/kernel/random/uuid)"; }

# auth_host HOSTNQN HASH DHGROUP KEY [CTRLKEY]: nvmet lets HOSTNQN into the
# subsystem with these DH-HMAC-CHAP settings (CTRLKEY: bidirectional).
auth_host() {
    h=$c/hosts/$1
    t0=$(now)
    [ -d "$h" ] || mkdir "$h"
    echo "$2" > "$h/dhchap_hash"
    echo "$3" > "$h/dhchap_dhgroup"
    echo "$4" > "$h/dhchap_key"
    if [ -n "${5:-}" ]; then echo "$5" > "$h/dhchap_ctrl_key"; fi
    [ "$(cat "$h/dhchap_hash")" = "$2" ] || die "nvmet dhchap_hash reads $(cat "$h/dhchap_hash"), not $2"
    [ "$(cat "$h/dhchap_dhgroup")" = "$3" ] || die "nvmet dhchap_dhgroup reads $(cat "$h/dhchap_dhgroup"), not $3"
    [ -e "$c/subsystems/$nqn/allowed_hosts/$1" ] || ln -s "$h" "$c/subsystems/$nqn/allowed_hosts/$1"
    # The first use of an ffdhe group runs its crypto self-test: seconds.
    echo "TIME: nvmet host $2/$3 setup $(since "$t0")s"
}

# gen ARGS...: nvme gen-dhchap-key ARGS; it must print one DHHC-1 key.
gen() {
    k=$(nvme gen-dhchap-key "$@") || die "nvme gen-dhchap-key $* failed"
    echo "$k" | grep -qE '^DHHC-1:0[0-3]:[A-Za-z0-9+/]+={0,2}:$' || die "nvme gen-dhchap-key $*: not a key: $k"
    echo "$k"
}

# aconnect CASE HOSTNQN [nvme connect args]: connect as HOSTNQN (one I/O
# queue: each queue authenticates on its own), check nvmet made the
# controller "with DH-HMAC-CHAP", print the block device.
aconnect() {
    case_=$1 hn=$2
    shift 2
    kmark "$case_"
    t0=$(now)
    dev=$(connect "$nqn" 127.0.0.1 "$port" --hostnqn="$hn" --hostid="${hn##*:uuid:}" --nr-io-queues=1 "$@")
    echo "TIME: $case_ connect $(since "$t0")s" >&2
    ksince "$case_" | grep -E 'nvmet|nvme nvme' >&2
    ksince "$case_" | grep -q "for NQN $hn with DH-HMAC-CHAP" || die "nvmet did not authenticate $hn"
    echo "$dev"
}

# refused CASE HOSTNQN [nvme connect args]: the connect must fail and leave
# no controller, block device or TCP connection behind. nvmet ends a failed
# authentication (it sent failure1 for a wrong host key, or received the
# host's failure2 for a wrong ctrl secret) with a fatal error that closes the
# connection at once; now and then (1 refused connect in ~10 here) the
# completion of the host's last AUTH_Receive / AUTH_Send is lost with it, and
# the host waits for the admin timeout (set to 10 s below; 60 by default).
# Reported as KERNEL-RACE, not a failure: the connect still fails.
refused() {
    case_=$1 hn=$2
    shift 2
    kmark "$case_"
    t0=$(now)
    if timeout 60 nvme connect -t tcp -n "$nqn" -a 127.0.0.1 -s "$port" --hostnqn="$hn" \
            --hostid="${hn##*:uuid:}" --nr-io-queues=1 "$@" > /tmp/out 2>&1; then
        cat /tmp/out
        die "$case_: nvme connect as $hn succeeded"
    fi
    echo "TIME: $case_ refused $(since "$t0")s"
    echo "nvme connect (refused, as it must be): $(cat /tmp/out)"
    ksince "$case_" | grep -E 'nvmet|nvme nvme' || true
    if ksince "$case_" | grep -q 'QID 0 timeout'; then
        echo "KERNEL-RACE: $case_: nvmet closed before its last auth completion; the host waited for the admin timeout"
    fi
    nothing_connected "$port" "$nqn"
}

# have_alg NAME...: /proc/crypto lists each (templates such as hmac(sha384)
# or ffdhe2048(dh) appear once something asked for them).
have_alg() {
    for a in "$@"; do
        grep -qxF "name         : $a" /proc/crypto || die "/proc/crypto has no $a"
    done
    echo "/proc/crypto has $*"
}

# sysfs_refused FILE VALUE: writing VALUE to FILE must fail; prints the error
# (dd's: busybox printf does not report a failed write).
sysfs_refused() {
    if printf '%s' "$2" | dd of="$1" 2>/tmp/err; then die "$1 took '$2'"; fi
    echo "$1 <- '$2' refused: $(grep -v records /tmp/err)"
}

# sysfs_secret DEV ATTR: the controller's dhchap_secret / dhchap_ctrl_secret.
sysfs_secret() { cat "$(ctrl_of "$1")/$2"; }

step kernel
uname -r
case $(uname -r) in 6.12.*) ;; *) die "this is $(uname -r), not the 6.12 guest (boot.sh --kernel 6.12)" ;; esac
for m in nvme_auth nvme_keyring; do
    [ -d "/sys/module/$m" ] || die "module $m not loaded"
done
have_alg dh sha256 sha384 sha512
nvme version
nvme connect --help 2>&1 | grep -q -- '--dhchap-ctrl-secret' || die "nvme-cli has no --dhchap-ctrl-secret"

# A lost auth completion (see refused) costs an admin timeout: 10 s, not 60.
echo 10 > /sys/module/nvme_core/parameters/admin_timeout

step nvmet-setup
nvmet_setup 127.0.0.1 "$port" "$nqn" 16
echo 0 > "$c/subsystems/$nqn/attr_allow_any_host"
for a in dhchap_key dhchap_ctrl_key dhchap_hash dhchap_dhgroup; do
    mkdir "$c/hosts/probe"
    [ -e "$c/hosts/probe/$a" ] || die "nvmet hosts/<nqn>/ has no $a (CONFIG_NVME_TARGET_AUTH off?)"
    rmdir "$c/hosts/probe"
done

step gen-keys
t0=$(now)
h1=$(new_host) h2=$(new_host) h3=$(new_host) h4=$(new_host)
k1=$(gen --hmac=1 --nqn="$h1")                 # SHA-256 transformed, 32 bytes
kwrong=$(gen --hmac=1 --nqn="$h1")
k2=$(gen --hmac=0 --key-length=32)             # untransformed
c2=$(gen --hmac=0 --key-length=48 --nqn="$nqn")
cwrong=$(gen --hmac=0 --key-length=48)
k3=$(gen --hmac=2 --key-length=48 --nqn="$h3") # SHA-384 transformed
c3=$(gen --hmac=3 --key-length=64 --nqn="$nqn")
k3wrong=$(gen --hmac=2 --key-length=48 --nqn="$h3")
k4=$(gen --hmac=3 --nqn="$h4")                 # SHA-512, length follows (64)
echo "keys: $k1 $k2 $c2 $k3 $c3 $k4"
echo "TIME: gen-keys $(since "$t0")s"

step sha256-null
auth_host "$h1" 'hmac(sha256)' null "$k1"
dev=$(aconnect sha256-null "$h1" --dhchap-secret="$k1")
ksince sha256-null | grep -q 'qid 0: authenticated with hash hmac(sha256) dhgroup null' ||
    die "host did not log 'authenticated with hash hmac(sha256) dhgroup null'"
[ "$(sysfs_secret "$dev" dhchap_secret)" = "$k1" ] || die "sysfs dhchap_secret is not the key"
[ "$(sysfs_secret "$dev" dhchap_ctrl_secret)" = none ] || die "sysfs dhchap_ctrl_secret is not none"
have_alg 'hmac(sha256)'
roundtrip "$dev"
disconnect "$nqn"

step sha256-null-wrong-key
refused sha256-null-wrong-key "$h1" --dhchap-secret="$kwrong"

step sha256-null-no-key
refused sha256-null-no-key "$h1"

step sha256-null-bidi
auth_host "$h2" 'hmac(sha256)' null "$k2" "$c2"
dev=$(aconnect sha256-null-bidi "$h2" --dhchap-secret="$k2" --dhchap-ctrl-secret="$c2")
ksince sha256-null-bidi | grep -q 'qid 0: controller authenticated' || die "host did not log 'controller authenticated'"
[ "$(sysfs_secret "$dev" dhchap_ctrl_secret)" = "$c2" ] || die "sysfs dhchap_ctrl_secret is not the ctrl key"
roundtrip "$dev"
disconnect "$nqn"

step sha256-null-bidi-wrong-ctrl
refused sha256-null-bidi-wrong-ctrl "$h2" --dhchap-secret="$k2" --dhchap-ctrl-secret="$cwrong"

step sha384-ffdhe2048-bidi
auth_host "$h3" 'hmac(sha384)' ffdhe2048 "$k3" "$c3"
dev=$(aconnect sha384-ffdhe2048-bidi "$h3" --dhchap-secret="$k3" --dhchap-ctrl-secret="$c3")
ksince sha384-ffdhe2048-bidi | grep -q 'qid 0: authenticated with hash hmac(sha384) dhgroup ffdhe2048' ||
    die "host did not log 'authenticated with hash hmac(sha384) dhgroup ffdhe2048'"
ksince sha384-ffdhe2048-bidi | grep -q 'qid 0: controller authenticated' || die "host did not log 'controller authenticated'"
have_alg 'hmac(sha384)' 'ffdhe2048(dh)'
roundtrip "$dev"
disconnect "$nqn"

step sha384-ffdhe2048-wrong-key
refused sha384-ffdhe2048-wrong-key "$h3" --dhchap-secret="$k3wrong" --dhchap-ctrl-secret="$c3"

step sha512-ffdhe3072
# Host-only with a DH exchange. Not the larger groups: the first use of each
# ffdhe group runs the crypto self-test, which under TCG takes 2 s for
# ffdhe4096, 6 s for ffdhe6144 and 12 s for ffdhe8192 (0.5 s for 2048, 0.9 s
# for 3072); an ffdhe8192 connect itself is 1.6 s.
auth_host "$h4" 'hmac(sha512)' ffdhe3072 "$k4"
dev=$(aconnect sha512-ffdhe3072 "$h4" --dhchap-secret="$k4")
ksince sha512-ffdhe3072 | grep -q 'qid 0: authenticated with hash hmac(sha512) dhgroup ffdhe3072' ||
    die "host did not log 'authenticated with hash hmac(sha512) dhgroup ffdhe3072'"
have_alg 'hmac(sha512)' 'ffdhe3072(dh)'
roundtrip "$dev"
disconnect "$nqn"

step reauth-rotate
# Connected bidirectionally as h2; nvmet gets new keys first, then the host
# through sysfs: each write re-authenticates the admin queue. (2 s instead of
# the default 10 s before the reconnect of reauth-refused.)
dev=$(aconnect reauth-connect "$h2" --dhchap-secret="$k2" --dhchap-ctrl-secret="$c2" --reconnect-delay=2)
ctrl=$(ctrl_of "$dev")
k2b=$(gen --hmac=1 --nqn="$h2")
echo "$k2b" > "$c/hosts/$h2/dhchap_key"
kmark reauth-host
t0=$(now)
printf '%s' "$k2b" > "$ctrl/dhchap_secret"
kwait reauth-host 'qid 0: controller authenticated'
echo "TIME: reauth-host-key $(since "$t0")s"
ksince reauth-host
ksince reauth-host | grep -q 're-authenticating controller' || die "no 're-authenticating controller'"
[ "$(cat "$ctrl/dhchap_secret")" = "$k2b" ] || die "sysfs dhchap_secret does not read the new key"
[ "$(cat "$ctrl/state")" = live ] || die "controller $(cat "$ctrl/state") after re-auth"
roundtrip "$dev"
c2b=$(gen --hmac=0 --key-length=64)
echo "$c2b" > "$c/hosts/$h2/dhchap_ctrl_key"
kmark reauth-ctrl
t0=$(now)
printf '%s' "$c2b" > "$ctrl/dhchap_ctrl_secret"
kwait reauth-ctrl 'qid 0: controller authenticated'
echo "TIME: reauth-ctrl-key $(since "$t0")s"
ksince reauth-ctrl
[ "$(cat "$ctrl/dhchap_ctrl_secret")" = "$c2b" ] || die "sysfs dhchap_ctrl_secret does not read the new key"
roundtrip "$dev"
# Only DHHC-1 secrets are taken (EINVAL), and nothing is re-authenticated.
kmark reauth-junk
sysfs_refused "$ctrl/dhchap_secret" not-a-key
sysfs_refused "$ctrl/dhchap_ctrl_secret" DHHC-1:01:junk:
[ "$(cat "$ctrl/dhchap_secret")" = "$k2b" ] || die "a refused write changed dhchap_secret"
if ksince reauth-junk | grep -q re-authenticating; then die "a refused write re-authenticated"; fi

step reauth-refused
# A host key nvmet does not know: nvmet fails the re-authentication and
# drops the controller; the host recovers, reconnects with that key, is
# refused with EKEYREJECTED and gives up (nvmf_should_reconnect): the
# controller goes away by itself (~2.3 s with --reconnect-delay=2), and I/O
# waiting for it fails. In about half the runs here nvmet's failure1 is lost
# instead (see refused) and the host hangs in error recovery (state
# resetting, no reconnect), its re-authentication still waiting for that
# AUTH_Receive, until nvme disconnect interrupts it (EINTR): the kernel's
# race, not a result, so it is reported (KERNEL-RACE) and cleared with a
# disconnect.
kmark reauth-bad
t0=$(now)
printf '%s' "$kwrong" > "$ctrl/dhchap_secret"
kwait reauth-bad 'starting error recovery|qid 0: authentication failed' 30
echo "controller state after the refused re-authentication: $(cat "$ctrl/state" 2>/dev/null || echo gone)"
dd if="$dev" of=/dev/null bs=4k count=1 iflag=direct 2>/tmp/dderr &
ddpid=$!
# Recovering (a "Reconnecting in" line) or gone within 6 s, else the race.
n=0
while [ -e "$ctrl" ] && [ "$n" -lt 30 ]; do
    if ksince reauth-bad | grep -q 'Reconnecting in'; then break; fi
    sleep 0.2
    n=$((n + 1))
done
if [ -e "$ctrl" ] && ksince reauth-bad | grep -q 'Reconnecting in'; then
    n=0
    while [ -e "$ctrl" ] && [ "$n" -lt 150 ]; do sleep 0.2; n=$((n + 1)); done
    [ ! -e "$ctrl" ] || die "controller still there ($(cat "$ctrl/state")) 30 s after a refused re-authentication"
fi
if [ -e "$ctrl" ]; then
    st=$(cat "$ctrl/state")
    [ "$st" != live ] || die "controller live again after a refused re-authentication"
    ksince reauth-bad
    echo "KERNEL-RACE: reauth-refused: controller '$st', not reconnecting, 6 s after a refused re-authentication: nvme disconnect"
    timeout 60 nvme disconnect -n "$nqn" || die "nvme disconnect of the stuck controller failed"
    n=0
    while [ -e "$ctrl" ] && [ "$n" -lt 50 ]; do sleep 0.2; n=$((n + 1)); done
    [ ! -e "$ctrl" ] || die "controller still there ($(cat "$ctrl/state")) after nvme disconnect"
    echo "TIME: reauth-refused (race, until disconnected) $(since "$t0")s"
else
    echo "TIME: reauth-refused (until the controller is gone) $(since "$t0")s"
fi
ksince reauth-bad
if wait "$ddpid"; then die "a read while the controller reconnected succeeded"; fi
echo "read while reconnecting failed: $(cat /tmp/dderr)"
nothing_connected "$port" "$nqn"

step reauth-reconnect
# The rotated keys are nvmet's now: they connect, the old ones are refused.
dev=$(aconnect reauth-reconnect "$h2" --dhchap-secret="$k2b" --dhchap-ctrl-secret="$c2b")
roundtrip "$dev"
disconnect "$nqn"
refused reauth-old-key "$h2" --dhchap-secret="$k2" --dhchap-ctrl-secret="$c2b"

step no-ctrl-secret-attr
# A controller connected without a ctrl secret takes none through sysfs.
dev=$(aconnect no-ctrl-secret "$h1" --dhchap-secret="$k1")
sysfs_refused "$(ctrl_of "$dev")/dhchap_ctrl_secret" "$c2"
disconnect "$nqn"

step end
