#!/bin/bash
# shellcheck shell=bash
# A throwaway one-node Ceph (Pacific) cluster for tests and benchmarks: one mon (mon.a) and
# one memstore OSD (osd.0: objects live in its memory, no disk), no mgr, no cephx (unless
# CEPH_AUTH=cephx: then every daemon and client authenticates, client.admin has every cap and
# the keys live in DIR/keyring), all on 127.0.0.1; conf, mon store, logs (DIR/log), pid files and sockets (DIR/run) under DIR.
# Source it (it sources ci/lib.sh unless already sourced) and call these in the scenario's
# shell, not in $(...):
#
#   ceph_ensure_debs           ensure_debs ceph-mon ceph-osd ceph-common librbd1
#   ceph_start DIR [PORT]      stop and wipe the cluster in DIR (a DIR that is not one is
#                              refused), write DIR/ceph.conf (the mon on 127.0.0.1:PORT,
#                              msgr2; PORT: free_port), start mon and osd, wait until the
#                              OSD is active (CEPH_START_TIMEOUT, 60 s), create pool rbd and
#                              image rbd/img0 (CEPH_IMG_SIZE, 256M; empty: none). Exports
#                              CEPH_CONF, CEPH_FSID, CEPH_PORT. The daemons are ci_track'ed:
#                              the scenario's cleanup kills them. On error: fail, with logs.
#   ceph_stop DIR              stop the daemons of DIR by their pid files: SIGTERM (and
#                              SIGCONT, should they be paused), up to CEPH_STOP_TIMEOUT
#                              (30 s), then SIGKILL. Returns 0.
#   ceph_stop_daemon DIR mon|osd   the same for one daemon. The OSD first turns
#                              osd_fast_shutdown off, so that it saves its memstore to
#                              DIR/osd.0 as it exits: ceph_start_daemon finds the data again.
#                              (A SIGKILLed OSD's data is gone: I/O to its PGs then hangs.)
#   ceph_start_daemon DIR mon|osd  start it again (no-op if running) and wait until ready.
#   ceph_pause DIR [mon|osd]   SIGSTOP both daemons (or one): client I/O waits, nothing lost;
#   ceph_resume DIR [mon|osd]  SIGCONT: the waiting I/O completes.
#   ceph_cli DIR ARGS...       ceph -c DIR/ceph.conf ARGS (no mgr: mgr commands, e.g.
#   ceph_rbd DIR ARGS...       rbd -c DIR/ceph.conf ARGS   `ceph pg ...`, `ceph df`, hang)
#   ceph_pid DIR mon|osd       print the daemon's pid; rc 1 if it is not running
#   ceph_ops DIR               the OSD's operations in flight and what they wait for (on a
#                              failure: a stuck cluster shows here)
#
# As a command (the daemons outlive it; called from a scenario they carry its CI_RUN_TAG,
# so its cleanup still kills them):
#   ci/ceph.sh start DIR [PORT]   start as above, print CEPH_CONF=, CEPH_FSID=, CEPH_PORT=
#   ci/ceph.sh stop DIR
#   ci/ceph.sh pause|resume DIR [mon|osd]
#   ci/ceph.sh restart DIR mon|osd   ceph_stop_daemon, then ceph_start_daemon (the OSD's
#                                 memstore saved and loaded again: its objects survive)
#   ci/ceph.sh status DIR         the daemons' pids and `ceph osd stat`; rc 1 unless both run
# Env: CEPH_MEMSTORE_BYTES (the OSD's capacity, 1 GiB), CEPH_CONF_EXTRA (lines appended to
# the conf's [global]: a key set again there wins), CEPH_AUTH (none or cephx; none).

_ceph_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_ceph_track=1
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    # lib.sh for log, fail and free_port, without its side effects: its log folder is a
    # temporary one, its cleanup trap (it would kill the daemons) is removed and the
    # caller's CI_RUN_TAG (or none) is restored.
    _ceph_tag=${CI_RUN_TAG-} _ceph_had_tag=${CI_RUN_TAG+1}
    CI_NAME=ceph CI_LOG_DIR=$(mktemp -d)
    # shellcheck source=ci/lib.sh
    . "$_ceph_here/lib.sh"
    trap - EXIT INT TERM HUP
    if [ -n "$_ceph_had_tag" ]; then CI_RUN_TAG=$_ceph_tag; else unset CI_RUN_TAG; fi
    _ceph_track=""
elif ! declare -F ci_track >/dev/null; then
    # shellcheck source=ci/lib.sh
    . "$_ceph_here/lib.sh"
fi
CEPH_START_TIMEOUT=${CEPH_START_TIMEOUT:-60}
CEPH_STOP_TIMEOUT=${CEPH_STOP_TIMEOUT:-30}
_ceph_starting=""    # the DIR ceph_start is working on (command mode stops it on failure)

ceph_ensure_debs() { ensure_debs ceph-mon ceph-osd ceph-common librbd1; }
ceph_cli() { local d=$1; shift; ceph -c "$d/ceph.conf" "$@"; }
ceph_rbd() { local d=$1; shift; rbd -c "$d/ceph.conf" "$@"; }

_ceph_name() {
    case $1 in mon) echo mon.a ;; osd) echo osd.0 ;; *) fail "ceph: no daemon '$1' (mon or osd)" ;; esac
}

# ceph_pid DIR mon|osd: the pid in its pid file, if that process is alive (not a zombie)
# and is that daemon of this DIR's conf (never another cluster's, nor a reused pid).
ceph_ops() {
    timeout 10 ceph --admin-daemon "$1/run/osd.0.asok" dump_ops_in_flight 2>&1 | python3 -c '
import json, sys
try:
    d = json.load(sys.stdin)
except ValueError:
    sys.exit("ceph: cannot read the OSD'"'"'s operations in flight")
waits = {}
for o in d.get("ops", []):
    for e in o.get("type_data", {}).get("events", []):
        if "wait" in e.get("event", ""):
            waits[e["event"]] = waits.get(e["event"], 0) + 1
print("ceph: osd.0 has %d operations in flight; waiting: %s" % (d.get("num_ops", 0), waits or "none"))
' || true
}

ceph_pid() {
    local n p
    n=$(_ceph_name "$2")
    p=$(cat "$1/run/$n.pid" 2>/dev/null) || return 1
    [[ $p =~ ^[0-9]+$ ]] || return 1
    [ "$(sed 's/.*) //; s/ .*//' "/proc/$p/stat" 2>/dev/null)" != Z ] || return 1
    tr '\0' ' ' 2>/dev/null < "/proc/$p/cmdline" |
        grep -qF -- "ceph-$2 -i ${n#*.} -c $(cd "$1" 2>/dev/null && pwd)/ceph.conf " || return 1
    echo "$p"
}

# _ceph_logs DIR: the last lines of the setup commands' and daemons' logs, on stderr.
_ceph_logs() {
    local f
    for f in "$1"/log/setup.log "$1"/log/mon.a.out "$1"/log/mon.a.log "$1"/log/osd.0.out "$1"/log/osd.0.log; do
        [ -s "$f" ] || continue
        echo "    ---- last 25 lines of $f ----" >&2
        tail -25 "$f" | sed 's/^/    | /' >&2
    done
}

# _ceph_do DIR CMD...: run a setup command (bounded), output to DIR/log/setup.log.
_ceph_do() {
    local d=$1 rc=0
    shift
    echo "+ $*" >> "$d/log/setup.log"
    timeout "$CEPH_START_TIMEOUT" "$@" >> "$d/log/setup.log" 2>&1 || rc=$?
    [ "$rc" = 0 ] || { _ceph_logs "$d"; fail "ceph: '$*' failed (rc=$rc)"; }
}

# _ceph_ready DIR mon|osd: the daemon answers on its admin socket as a leader / active.
_ceph_ready() {
    local n want=active
    n=$(_ceph_name "$2")
    [ "$2" = mon ] && want=leader
    timeout 10 ceph --admin-daemon "$1/run/$n.asok" "$([ "$2" = mon ] && echo mon_status || echo status)" \
        2>/dev/null | grep -q "\"state\": \"$want\""
}

ceph_start_daemon() {
    local d=$1 n p deadline
    n=$(_ceph_name "$2")
    ceph_pid "$d" "$2" >/dev/null && return 0
    # The daemon forks into the background (its own session) once it has started.
    "ceph-$2" -i "${n#*.}" -c "$d/ceph.conf" >> "$d/log/$n.out" 2>&1 </dev/null ||
        { _ceph_logs "$d"; fail "ceph: ceph-$2 did not start"; }
    p=$(ceph_pid "$d" "$2") || { _ceph_logs "$d"; fail "ceph: ceph-$2 exited at start"; }
    [ -z "$_ceph_track" ] || ci_track "$p"
    deadline=$((SECONDS + CEPH_START_TIMEOUT))
    until _ceph_ready "$d" "$2"; do
        ceph_pid "$d" "$2" >/dev/null || { _ceph_logs "$d"; fail "ceph: $n (pid $p) exited before it was ready"; }
        [ "$SECONDS" -lt "$deadline" ] || { _ceph_logs "$d"; fail "ceph: $n not ready after ${CEPH_START_TIMEOUT}s"; }
        sleep 0.3
    done
}

# _ceph_kill DIR mon|osd: SIGTERM (and SIGCONT, should it be paused), wait, SIGKILL.
_ceph_kill() {
    local n p deadline
    n=$(_ceph_name "$2")
    p=$(ceph_pid "$1" "$2") || return 0
    kill -TERM "$p" 2>/dev/null || true
    kill -CONT "$p" 2>/dev/null || true
    deadline=$((SECONDS + CEPH_STOP_TIMEOUT))
    while ceph_pid "$1" "$2" >/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
    if ceph_pid "$1" "$2" >/dev/null; then
        kill -KILL "$p" 2>/dev/null || true
        log "ceph: $n (pid $p) still running ${CEPH_STOP_TIMEOUT}s after SIGTERM: killed"
    fi
    ! declare -F _ci_forget >/dev/null || _ci_forget "$p"
}

ceph_stop_daemon() {
    if [ "$2" = osd ] && ceph_pid "$1" osd >/dev/null; then
        timeout 5 ceph --admin-daemon "$1/run/osd.0.asok" config set osd_fast_shutdown false >/dev/null 2>&1 ||
            log "ceph: could not turn osd_fast_shutdown off: the OSD may lose its data"
    fi
    _ceph_kill "$1" "$2"
}

# The whole cluster goes: the OSD need not save its memstore (osd_fast_shutdown stays on).
ceph_stop() {
    local p
    [ -f "$1/ceph.conf" ] || return 0
    for p in $(ceph_pid "$1" mon) $(ceph_pid "$1" osd); do kill -CONT "$p" 2>/dev/null || true; done
    _ceph_kill "$1" osd
    _ceph_kill "$1" mon
}

_ceph_signal() {
    local d=$1 sig=$2 w p
    for w in ${3:-mon osd}; do
        p=$(ceph_pid "$d" "$w") || fail "ceph: $w of $d is not running"
        kill "-$sig" "$p"
    done
}
ceph_pause() { _ceph_signal "$1" STOP "${2:-}"; }
ceph_resume() { _ceph_signal "$1" CONT "${2:-}"; }

ceph_start() {
    local d port fsid conf auth t0=$SECONDS
    [ -n "${1:-}" ] || fail "ceph_start: no DIR"
    if [ -d "$1" ] && [ -n "$(ls -A "$1")" ] && ! grep -qs '^# ci/ceph.sh cluster' "$1/ceph.conf"; then
        fail "ceph_start: $1 exists and is not a ci/ceph.sh cluster: not wiping it"
    fi
    ceph_stop "$1"
    rm -rf "$1"
    mkdir -p "$1/run" "$1/log" || fail "ceph_start: cannot make $1"
    d=$(cd "$1" && pwd)   # absolute: the daemons chdir to /
    _ceph_starting=$d
    port=${2:-$(free_port)}
    fsid=$(cat /proc/sys/kernel/random/uuid)
    conf=$d/ceph.conf
    auth=${CEPH_AUTH:-none}
    case $auth in none|cephx) ;; *) fail "ceph_start: CEPH_AUTH=$auth: none or cephx" ;; esac
    cat > "$conf" <<EOF
# ci/ceph.sh cluster (one mon, one memstore OSD, auth $auth, 127.0.0.1)
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$port
public addr = 127.0.0.1
ms bind ipv4 = true
ms bind ipv6 = false
auth cluster required = $auth
auth service required = $auth
auth client required = $auth
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon allow pool delete = true
osd crush chooseleaf type = 0
osd objectstore = memstore
memstore device bytes = ${CEPH_MEMSTORE_BYTES:-1073741824}
# Objects in 4 KiB pages, not one buffer each: 4K writes scattered over an image cost
# 4 KiB, not their whole 4 MiB object (16 MiB of random 4K writes: RSS +70 MB, not +340).
memstore page set = true
memstore page size = 4096
keyring = $d/keyring
run dir = $d/run
admin socket = $d/run/\$name.asok
pid file = $d/run/\$name.pid
log file = $d/log/\$name.log
mon cluster log file = default=$d/log/ceph.\$channel.log cluster=$d/log/ceph.log
mon data = $d/\$name
osd data = $d/\$name
# Quiet and small: two cores, no disk.
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
mon data avail warn = 2
mon data avail crit = 1
# No mgr: without this, health turns WARN (then ERR) MGR_DOWN two minutes after start.
mon mgr mkfs grace = 31536000
# On SIGTERM (ci_cleanup's, say) exit at once, without waiting up to 5 s for a mon that
# may be gone or paused. (ceph_stop_daemon's slow shutdown still tells the mon.)
osd fast shutdown notify mon = false
# Else an OSD paused (SIGSTOP) for over 150 s aborts on SIGCONT.
osd op thread suicide timeout = 0
# A PG's read lease (this ratio times osd heartbeat grace, 20 s) outlasts the longest pause
# a test makes (pollux-rbd: 15 s). With the default 0.8 (16 s) a pause that ran past the
# lease left the PG laggy on SIGCONT and, with no peer OSD to renew the lease, client ops
# waited "for readable" for good: a plain rbd bench, no pollux, stalled 45 s and more after
# a 17 s pause (ops_in_flight: every op 'waiting for readable'), and with 2 it ran on (the
# cause of pollux-rbd's cluster-outage failures; Ceph tracker 80404). Only a restarted OSD
# waits out the lease, and no test restarts one.
osd pool default read lease ratio = 2
# Commit mon changes (osd create, pool create...) at once, not every second: start in
# about 3 s instead of 8.
paxos propose interval = 0.1
paxos min wait = 0.01
osd op num shards = 2
osd op num threads per shard = 1
osd memory target = 1073741824
debug ms = 0/0
debug mon = 0/0
debug paxos = 0/0
debug osd = 0/0
debug auth = 0/0
debug asok = 0/0
debug rocksdb = 0/0
debug filestore = 0/0
debug monc = 0/0
debug objecter = 0/0
debug rados = 0/0
debug rbd = 0/0
${CEPH_CONF_EXTRA:-}
[client]
# One socket per client process (a pollux with librbd included), not one for all.
admin socket = $d/run/\$name.\$pid.asok
EOF
    _ceph_do "$d" ceph-authtool --create-keyring "$d/keyring" --gen-key -n mon. --cap mon 'allow *'
    _ceph_do "$d" ceph-authtool "$d/keyring" --gen-key -n client.admin --cap mon 'allow *' --cap osd 'allow *'
    # The OSD's key (used only with cephx), imported by the mon's mkfs with the others.
    _ceph_do "$d" ceph-authtool "$d/keyring" --gen-key -n osd.0 --cap mon 'allow profile osd' --cap osd 'allow *'
    _ceph_do "$d" monmaptool --create --addv a "[v2:127.0.0.1:$port]" --fsid "$fsid" "$d/monmap"
    _ceph_do "$d" ceph-mon --mkfs -i a --monmap "$d/monmap" --keyring "$d/keyring" -c "$conf"
    ceph_start_daemon "$d" mon
    _ceph_do "$d" ceph -c "$conf" osd create
    mkdir -p "$d/osd.0"
    _ceph_do "$d" ceph-osd -i 0 --mkfs -c "$conf"
    ceph_start_daemon "$d" osd
    _ceph_do "$d" ceph -c "$conf" osd pool create rbd 8
    _ceph_do "$d" ceph -c "$conf" osd pool application enable rbd rbd
    [ -z "${CEPH_IMG_SIZE-256M}" ] || _ceph_do "$d" rbd -c "$conf" create --size "${CEPH_IMG_SIZE-256M}" rbd/img0
    export CEPH_CONF=$conf CEPH_FSID=$fsid CEPH_PORT=$port
    _ceph_starting=""
    log "ceph: up in $((SECONDS - t0))s: mon pid $(ceph_pid "$d" mon) on 127.0.0.1:$port, osd pid $(ceph_pid "$d" osd), conf $conf"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    trap '[ -z "$_ceph_starting" ] || ceph_stop "$_ceph_starting"; rm -rf "$CI_LOG_DIR"' EXIT
    [ $# -ge 2 ] || { echo "usage: $0 start DIR [PORT] | stop DIR | pause|resume DIR [mon|osd] | restart DIR mon|osd | status DIR" >&2; exit 2; }
    case $1 in
        start)
            ceph_start "$2" "${3:-}"
            printf 'CEPH_CONF=%s\nCEPH_FSID=%s\nCEPH_PORT=%s\n' "$CEPH_CONF" "$CEPH_FSID" "$CEPH_PORT" ;;
        stop) ceph_stop "$2" ;;
        pause) ceph_pause "$2" "${3:-}" ;;
        resume) ceph_resume "$2" "${3:-}" ;;
        restart)
            case ${3:-} in mon|osd) ;; *) echo "usage: $0 restart DIR mon|osd" >&2; exit 2 ;; esac
            ceph_stop_daemon "$2" "$3"
            ceph_start_daemon "$2" "$3" ;;
        status)
            rc=0
            for w in mon osd; do
                if p=$(ceph_pid "$2" "$w"); then echo "$w: pid $p"; else echo "$w: not running"; rc=1; fi
            done
            [ "$rc" != 0 ] || timeout 10 ceph -c "$2/ceph.conf" osd stat || rc=1
            exit "$rc" ;;
        *) echo "usage: $0 start DIR [PORT] | stop DIR | pause|resume DIR [mon|osd] | restart DIR mon|osd | status DIR" >&2; exit 2 ;;
    esac
fi
