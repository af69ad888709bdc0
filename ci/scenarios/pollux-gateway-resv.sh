#!/bin/bash
# Scenario pollux-gateway-resv: persistent reservations (NVMe 2.0 §8.19) that hold across two
# pollux gateways in front of one Ceph RBD image, kept in the cluster (one RADOS object beside
# the image, changed by version-asserted writes and announced by watch/notify). A one-node
# cluster (ci/ceph.sh); gateway A (killable) and gateway B each serve rbd/img0 under one
# subsystem NQN with disjoint controller-ID ranges. The guest (nvme_core.multipath=N) is two
# hosts with distinct host NQNs and host IDs: host 1 through A, host 2 through B (and, at
# the end, also through A). Host 1 registers and takes Write Exclusive through A; host 2's
# write through B gets Reservation Conflict and its resv-report through B shows host 1 as
# the holder; host 2 preempts through B and host 1's next write through A conflicts; A is
# killed with SIGKILL and started again: host 1 reconnects, the state is intact and enforced;
# then release and unregister through either gateway. Guest side:
# ci/guest/guest.d/pollux-gateway-resv.sh.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
# shellcheck source=ci/ceph.sh
. "$CI_REPO/ci/ceph.sh"
need_pollux
ceph_ensure_debs

sub=nqn.2026-12.io.pollux.ci:gw-resv
pa=$(free_port) pb=$(free_port) prel=$(free_port)
share=$CI_LOG_DIR/share
rm -rf "$share"
mkdir -p "$share"
cdir=$CI_LOG_DIR/ceph
CEPH_IMG_SIZE=64M ceph_start "$cdir"

# conf NAME PORT CORE CNTLIDS: gateway NAME's conf.
conf() {
    cat > "$CI_LOG_DIR/$1.toml" <<TOML
[reactors]
cores = [$3]
mode = "interrupt"

[control]
socket = "$CI_LOG_DIR/$1.sock"

[[listener]]
address = "127.0.0.1:$2"

[[subsystem]]
nqn = "$sub"
allow_any_host = true
$4

[[subsystem.namespace]]
nsid = 1
backend = { rbd = { pool = "rbd", image = "img0", ceph_conf = "$CEPH_CONF" } }
TOML
    "$POLLUX_BIN" --check "$CI_LOG_DIR/$1.toml" >/dev/null || fail "conf $1 is invalid"
}
conf a "$pa" 0 $'min_cntlid = 1\nmax_cntlid = 100'
conf b "$pb" 1 $'min_cntlid = 101\nmax_cntlid = 200'

start_pollux "$CI_LOG_DIR/b.toml" "$pb"
a_pid=$CI_LOG_DIR/a.pid
trap 'stop_side_pollux a; ci_cleanup' EXIT
start_side_pollux a "$CI_LOG_DIR/a.toml" "$pa"

subs=$("$POLLUX_BIN" ctl --socket "$CI_LOG_DIR/b.sock" subsystems) || fail "pollux ctl subsystems failed"
echo "$subs"
grep -Eq '^ +1 .* rbd .* cluster ' <<<"$subs" || fail "ctl subsystems does not say namespace 1's reservations are kept in the cluster"

# The relay: a guest line "kill" kills A with SIGKILL; "restart" starts it again.
relay=$CI_LOG_DIR/relay.sh
cat > "$relay" <<SH
#!/bin/bash
read -r cmd
case \$cmd in
    kill) p=\$(cat "$a_pid"); kill -9 "\$p" && rm -f "$a_pid"
        while kill -0 "\$p" 2>/dev/null; do sleep 0.05; done; echo killed ;;
    restart) NO_COLOR=1 setsid "$POLLUX_BIN" --config "$CI_LOG_DIR/a.toml" >>"$CI_LOG_DIR/pollux-a.log" 2>&1 </dev/null &
        echo \$! > "$a_pid"
        for _ in \$(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$pa") 2>/dev/null && { echo restarted; exit 0; }; sleep 0.1; done
        echo "not listening" ;;
    *) echo "unknown \$cmd" ;;
esac
SH
chmod +x "$relay"
busybox nc -ll -p "$prel" -e "$relay" >"$CI_LOG_DIR/relay.log" 2>&1 &
ci_track $!

run_guest pollux-gateway-resv.sh --timeout 900 --share "$share" --guestfwd "4420=$pa" --guestfwd "4421=$pb" \
    --guestfwd "9000=$prel" --append "nvme_core.multipath=N" --env "SUB=$sub" ||
    { ceph_ops "$cdir"; fail "pollux-gateway-resv guest failed (console $CI_LOG_DIR/guest-pollux-gateway-resv.log)"; }

# The state is the cluster's: an object beside the image, read by no pollux code.
id=$(ceph_rbd "$cdir" info rbd/img0 | sed -n 's/^[[:space:]]*id: //p')
[ -n "$id" ] || fail "rbd info shows no image id"
rados -c "$CEPH_CONF" -p rbd get "pollux.resv.$id" "$CI_LOG_DIR/resv.json" || fail "no reservation object pollux.resv.$id in pool rbd"
log "reservation object pollux.resv.$id: $(cat "$CI_LOG_DIR/resv.json")"
grep -q '"registrants":\[\]' "$CI_LOG_DIR/resv.json" || fail "the object still has registrants after both hosts unregistered"
grep -q "reservations kept in the cluster" "$CI_LOG_DIR/pollux-a.log" || fail "gateway A did not keep its reservations in the cluster"
stop_side_pollux a
stop_pollux || fail "gateway B did not stop cleanly"
ceph_stop "$cdir"
log "PASS"
