#!/bin/bash
# Scenario pollux-rbd: pollux as a gateway to Ceph RBD, with the Linux host as the client.
# A one-node Ceph cluster (ci/ceph.sh: one mon, one memstore OSD on 127.0.0.1) holds two
# images; two pollux gateways, A and B, each serve both under one subsystem NQN with
# disjoint controller-ID ranges. Load is shared as ceph-nvmeof's load-balancing groups do:
# namespace 1 (img0) is in ANA group 1, optimized on A and non-optimized on B, namespace 2
# (img1) in group 2, the other way round. The guest (ci/guest/guest.d/pollux-rbd.sh):
# discovers, connects to A, runs fio verify at 4k and 128k; connects to B (native
# multipath: two live paths per namespace, the I/O of each on its optimized gateway); A is
# killed with SIGKILL during fio verify: no I/O error, the I/O moves to B; what was written
# reads back the same through B, and through A again after A restarts and the host
# reconnects by itself; A is paused (SIGSTOP) during fio verify: its keep-alive lapses, the
# I/O moves to B, and when A runs again it finds itself fenced, re-executes itself and
# rejoins, and its path is optimized again; the cluster stops answering (SIGSTOP) for 15 s
# during fio verify: no I/O error, I/O resumes, and no gateway is fenced for it. The two
# gateways are a gateway group (`[gateway]`): B fences A (kill, pause) within its grace and
# takes its ANA group. At the end `rbd export` of each image matches what the guest read:
# the data is in Ceph. Measured, not asserted (TCG: function, not speed): the failover,
# pause and outage times and fio's completion latencies (max: the longest write), in
# $CI_LOG_DIR/rbd.txt.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
# shellcheck source=ci/ceph.sh
. "$CI_REPO/ci/ceph.sh"
need_pollux
ceph_ensure_debs

sub=nqn.2026-12.io.pollux.ci:rbd
pa=$(free_port) pb=$(free_port) prel=$(free_port)
share=$CI_LOG_DIR/share
rm -rf "$share"
mkdir -p "$share"
cdir=$CI_LOG_DIR/ceph
CEPH_IMG_SIZE=128M ceph_start "$cdir"
ceph_rbd "$cdir" create --size 64M rbd/img1

# conf NAME PORT CORE CNTLIDS ANA: gateway NAME's conf (it owns the ANA group it does not
# report non-optimized).
conf() {
    cat > "$CI_LOG_DIR/$1.toml" <<TOML
[reactors]
cores = [$3]

[control]
socket = "$CI_LOG_DIR/$1.sock"

[gateway]
group = "ci"
name = "$1"
ana_groups = [$((3 - $5))]
failback_delay_ms = 3000

[[listener]]
address = "127.0.0.1:$2"
ana = { $5 = "non-optimized" }

[[subsystem]]
nqn = "$sub"
allow_any_host = true
$4

[[subsystem.namespace]]
nsid = 1
ana_group = 1
backend = { rbd = { pool = "rbd", image = "img0", ceph_conf = "$CEPH_CONF" } }

[[subsystem.namespace]]
nsid = 2
ana_group = 2
backend = { rbd = { pool = "rbd", image = "img1", ceph_conf = "$CEPH_CONF" } }
TOML
    "$POLLUX_BIN" --check "$CI_LOG_DIR/$1.toml" >/dev/null || fail "conf $1 is invalid"
}
conf a "$pa" 0 $'min_cntlid = 1\nmax_cntlid = 100' 2
conf b "$pb" 1 $'min_cntlid = 101\nmax_cntlid = 200' 1

# Gateway B runs as the harness's pollux; A is started and killed by the relay below.
start_pollux "$CI_LOG_DIR/b.toml" "$pb"
a_pid=$CI_LOG_DIR/a.pid
# stop_a: gateway A, whichever process serves it now (after its fence it re-executes itself).
stop_a() {
    local pid
    pid=$("$POLLUX_BIN" ctl --socket "$CI_LOG_DIR/a.sock" --json version 2>/dev/null |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["pid"])' 2>/dev/null) && echo "$pid" > "$a_pid"
    stop_side_pollux a
}
trap 'stop_a; ci_cleanup' EXIT
start_side_pollux a "$CI_LOG_DIR/a.toml" "$pa"

subs=$("$POLLUX_BIN" ctl --socket "$CI_LOG_DIR/b.sock" subsystems) || fail "pollux ctl subsystems failed"
echo "$subs"
grep -q "namespace 1 rbd rbd/img0 (id [0-9a-f]*) cluster $CEPH_FSID" <<<"$subs" ||
    fail "ctl subsystems does not show namespace 1's image and cluster"

# The relay: a guest line runs it now and answers, so the guest times it from its clock.
relay=$CI_LOG_DIR/relay.sh
cat > "$relay" <<SH
#!/bin/bash
read -r cmd
# A's pid now: a fenced A re-executes itself as a new process (a loaded machine can miss a
# heartbeat), so the pid file may be stale; the pid file while A cannot answer (paused).
now_a() {
    "$POLLUX_BIN" ctl --socket "$CI_LOG_DIR/a.sock" --json version 2>/dev/null |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["pid"])' 2>/dev/null || cat "$a_pid"
}
case \$cmd in
    kill) pid=\$(now_a); kill -9 "\$pid" && rm -f "$a_pid" && echo killed ;;
    stop) pid=\$(now_a); echo "\$pid" > "$a_pid"; kill -STOP "\$pid" && echo stopped ;;
    cont) kill -CONT "\$(cat "$a_pid")" && echo continued ;;
    rejoined) old=\$(cat "$a_pid")
        for _ in \$(seq 300); do
            pid=\$("$POLLUX_BIN" ctl --socket "$CI_LOG_DIR/a.sock" --json version 2>/dev/null |
                python3 -c 'import json, sys; print(json.load(sys.stdin)["pid"])' 2>/dev/null)
            if [ -n "\$pid" ] && [ "\$pid" != "\$old" ] &&
                "$POLLUX_BIN" ctl --socket "$CI_LOG_DIR/b.sock" --json gateways | python3 -c '
import json, sys
m = {x["name"]: x for x in json.load(sys.stdin)["members"]}
sys.exit(0 if m["a"]["state"] == "alive" and m["a"]["taken_by"] is None else 1)'; then
                echo "\$pid" > "$a_pid"; echo rejoined; exit 0
            fi
            sleep 0.2
        done
        echo "not rejoined" ;;
    restart) NO_COLOR=1 setsid "$POLLUX_BIN" --config "$CI_LOG_DIR/a.toml" >>"$CI_LOG_DIR/pollux-a.log" 2>&1 </dev/null &
        echo \$! > "$a_pid"; sleep 0.5; echo restarted ;;
    pause|resume) "$CI_REPO/ci/ceph.sh" "\$cmd" "$cdir" && echo "\${cmd}d" ;;
    *) echo "unknown \$cmd" ;;
esac
SH
chmod +x "$relay"
busybox nc -ll -p "$prel" -e "$relay" >"$CI_LOG_DIR/relay.log" 2>&1 &
ci_track $!

# The guest's bound is under ci/test's per-scenario one, so a guest that hangs is reported
# with its console's tail rather than cut off by the scenario's timeout.
run_guest pollux-rbd.sh --timeout 480 --share "$share" --guestfwd "4420=$pa" --guestfwd "4421=$pb" \
    --guestfwd "9000=$prel" --env "SUB=$sub" ||
    { ceph_ops "$cdir"; fail "pollux-rbd guest failed (console $CI_LOG_DIR/guest-pollux-rbd.log)"; }
cp "$share/rbd.txt" "$CI_LOG_DIR/rbd.txt" 2>/dev/null || fail "the guest wrote no measurements"
cat "$CI_LOG_DIR/rbd.txt"

# The data is in Ceph: what the guest read back is what `rbd export` has.
for ns in 1 2; do
    img=img$((ns - 1))
    want=$(cat "$share/md5-n$ns") || fail "the guest wrote no checksum of namespace $ns"
    rm -f "$CI_LOG_DIR/$img.raw"
    ceph_rbd "$cdir" export --no-progress "rbd/$img" "$CI_LOG_DIR/$img.raw" || fail "rbd export of $img failed"
    got=$(head -c $((32 << 20)) "$CI_LOG_DIR/$img.raw" | md5sum | cut -d' ' -f1)
    rm -f "$CI_LOG_DIR/$img.raw"
    [ "$got" = "$want" ] || fail "rbd export of $img ($got) differs from what the guest read ($want)"
    log "rbd export of $img matches what the guest read through the gateways ($got)"
done
grep -q "controller created cntlid=1[0-9][0-9] " "$POLLUX_LOG" || fail "B handed out no controller ID from 101..=200"
# The group: B fenced A twice (the kill, the pause), nobody was fenced for the cluster's
# outage, and A (re-executed after its fence) is a member again.
fences=$(grep -c "gateway: fencing a silent member" "$POLLUX_LOG" "$CI_LOG_DIR/pollux-a.log" | awk -F: '{n += $2} END {print n}')
echo "gateway group: $fences fences" | tee -a "$CI_LOG_DIR/rbd.txt"
[ "$fences" = 2 ] || fail "expected 2 fences (A killed, A paused), saw $fences"
grep -q "re-executing as new cluster clients" "$CI_LOG_DIR/pollux-a.log" || fail "the fenced A did not re-execute itself"
"$POLLUX_BIN" ctl --socket "$CI_LOG_DIR/b.sock" gateways | tee -a "$CI_LOG_DIR/rbd.txt"
"$POLLUX_BIN" ctl --socket "$CI_LOG_DIR/b.sock" --json gateways | python3 -c '
import json, sys
m = json.load(sys.stdin)["members"]
sys.exit(0 if len(m) == 2 and all(x["state"] == "alive" for x in m) else 1)' ||
    fail "the group does not show both gateways alive"
subs=$("$POLLUX_BIN" ctl --socket "$CI_LOG_DIR/b.sock" subsystems) || fail "pollux ctl subsystems failed"
echo "$subs" | grep "rbd rbd/" | tee -a "$CI_LOG_DIR/rbd.txt"
stop_a
stop_pollux || fail "gateway B did not stop cleanly"
ceph_stop "$cdir"
log "PASS"
