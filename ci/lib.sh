# shellcheck shell=bash
# Host-side helpers for ci/test and ci/scenarios/*.sh (bash; source it).
#
#   log MSG...                 "[name +Ns] MSG" on stderr
#   fail MSG...                log "FAIL: MSG", exit 1 (cleanup runs)
#   ensure_debs PKG...         apt-get install what is missing (quiet)
#   free_port                  print an unused 127.0.0.1 TCP port
#   run_guest SCRIPT [boot.sh options...]
#                              boot the guest with guest.d/SCRIPT; returns
#                              the guest's rc (124 timeout); on failure logs
#                              the failed step and the console tail.
#                              --kernel 6.12 boots the 6.12 guest kernel
#                              (NVMe DH-HMAC-CHAP in host and nvmet, NVMe/TCP
#                              TLS; Debian 13's tnvme, tlshd and keyctl in
#                              its image) instead of the default 6.1;
#                              --kernel 6.18 the same with trixie-backports'
#                              6.18 (also secure channel concatenation,
#                              nvme connect --concat); --kernel 7.3 its
#                              newest line, after ci/guest/setup.sh 7.3
#                              (ci/guest/kernels.sh)
#   need_pollux                fail unless $POLLUX_BIN is an executable
#   start_pollux CONF [PORT]   start $POLLUX_BIN --config CONF, wait for PORT
#   stop_pollux                SIGTERM, wait, SIGKILL; rc 0 only on exit 0
#   start_side_pollux NAME CONF PORT
#                              another pollux (pid in $CI_LOG_DIR/NAME.pid, log
#                              pollux-NAME.log) in its own session, so that a
#                              relay may SIGKILL and restart it; waits until
#                              PORT listens (30 s)
#   stop_side_pollux NAME      SIGKILL it (call it from the scenario's EXIT trap)
#   ci_track PID               have ci_cleanup kill this background process
#   ci_tagged_pids             print PIDs of live processes this scenario started
#
# Sourcing it also installs an EXIT/INT/TERM trap that kills, by PID,
# everything the scenario started (see ci_cleanup). A scenario that needs its
# own exit trap calls ci_cleanup from it.

CI_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CI_NAME=${CI_NAME:-$(basename "$0" .sh)}
CI_LOG_DIR=${CI_LOG_DIR:-$CI_REPO/build/ci-logs/$CI_NAME}
POLLUX_BIN=${POLLUX_BIN:-$CI_REPO/build/release/pollux}
export GUEST_WORK=${GUEST_WORK:-$CI_REPO/build/guest}
# Seconds a guest may run before QEMU is killed (run_guest --timeout wins).
GUEST_TIMEOUT=${GUEST_TIMEOUT:-300}
POLLUX_START_TIMEOUT=${POLLUX_START_TIMEOUT:-20}
POLLUX_STOP_TIMEOUT=${POLLUX_STOP_TIMEOUT:-10}
# Every process a scenario starts inherits this tag in its environment, also
# those that leave our process group (slirp's nc relays call setsid):
# ci_cleanup finds the stragglers by it.
CI_RUN_TAG="ci-$$-$(date +%s%N)"
export CI_RUN_TAG
_ci_t0=$SECONDS
# Each run starts with an empty log folder: what is there is this run's.
rm -rf "$CI_LOG_DIR"
mkdir -p "$CI_LOG_DIR"
_ci_pids=()          # background processes we started
_ci_pidfiles=()      # QEMU pidfiles (boot.sh --pidfile)
_ci_apt_updated=""
_ci_guest_log=""     # console of the guest run_guest is waiting for
_ci_last_guest_log="" # console of the last guest run_guest started
POLLUX_PID="" POLLUX_LOG="" POLLUX_PORT=""

# _ci_forget PID: drop a reaped PID from the cleanup list (it may be reused).
_ci_forget() {
    local p keep=()
    for p in "${_ci_pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
    _ci_pids=("${keep[@]}")
}

log() {
    printf '[%s +%ss] %s\n' "$CI_NAME" "$((SECONDS - _ci_t0))" "$*" >&2
}

fail() {
    log "FAIL: $*"
    exit 1
}

# ensure_debs PKG...: install the Debian packages that are not installed;
# apt-get update runs once, and only when something is missing.
ensure_debs() {
    local p missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' ||
            missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing ${missing[*]}"
    # apt's chatter (debconf notes included) is shown only if it fails.
    local out=$CI_LOG_DIR/apt.log
    if [ -z "$_ci_apt_updated" ]; then
        apt-get update -qq >"$out" 2>&1 || { cat "$out" >&2; fail "apt-get update failed"; }
        _ci_apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >"$out" 2>&1 || { cat "$out" >&2; fail "apt-get install ${missing[*]} failed"; }
}

# free_port: print a 127.0.0.1 TCP port that no socket uses (any state,
# from /proc/net/tcp{,6}) and that this scenario has not handed out yet.
# Call it as $(free_port); the port is free now, not reserved.
free_port() {
    local used p i
    mkdir -p "$CI_LOG_DIR"
    used=$(awk 'FNR > 1 { split($2, a, ":"); print a[2] }' /proc/net/tcp /proc/net/tcp6 2>/dev/null |
           while read -r h; do echo $((16#$h)); done)
    for i in $(seq 200); do
        p=$((20000 + RANDOM % 40000))
        grep -qx "$p" <<<"$used" && continue
        grep -qsx "$p" "$CI_LOG_DIR/.ports" && continue
        echo "$p" >> "$CI_LOG_DIR/.ports"
        echo "$p"
        return 0
    done
    fail "free_port: no free port after $i tries"
}

# _step_of LOG: the last "STEP: name" of a guest console log.
_step_of() {
    tr -d '\r' < "$1" | sed -n 's/^STEP: \([^ ]*\).*/\1/p' | tail -1
}

# run_guest SCRIPT [boot.sh options...]: boot the guest running
# guest.d/SCRIPT, with the console in $CI_LOG_DIR/guest-SCRIPT[.N].log
# (CI_VERBOSE=1 also streams it). The guest kernel is 6.1 unless the
# options say --kernel SERIES (boot.sh --help; 6.12 for in-band
# authentication and TLS, 6.18 also for secure channel concatenation). Returns the guest's exit status (124 on timeout, 125 if
# QEMU died without one). On failure it logs the step the guest was in, its
# FAIL: line and the last 60 console lines.
run_guest() {
    local rc=0
    _run_guest_once "$@" || rc=$?
    # QEMU under TCG very rarely hangs before the guest kernel reaches /init (seen once in a
    # few hundred boots here): no GUEST-INIT line at all. That is not a result of the test,
    # so boot once more. A guest that hangs inside its script has printed GUEST-INIT and
    # still fails.
    # (grep reads the whole console, without -q: a grep that quits at its first match
    # leaves tr to die of SIGPIPE, which under a scenario's pipefail makes the test false.)
    if [ "$rc" = 124 ] && ! tr -d '\r' < "$_ci_last_guest_log" 2>/dev/null | grep '^GUEST-INIT' >/dev/null; then
        log "guest $1: QEMU never reached the guest's init (a TCG boot hang, not a test result): booting it once more"
        rc=0
        _run_guest_once "$@" || rc=$?
    else
        # The guest kernel itself died under TCG before the script's first step (seen: an
        # int3 oops in sched_clock_cpu while the 6.12 kernel booted, once twice in a row):
        # no step of the test ran, so its result says nothing about pollux. Boot again, up
        # to three boots in all.
        local boots=1
        while [ "$rc" != 0 ] && [ "$boots" -lt 3 ] && _crashed_before_first_step; do
            boots=$((boots + 1))
            log "guest $1: the guest kernel crashed before the script's first step (console $_ci_last_guest_log): boot $boots of at most 3"
            rc=0
            _run_guest_once "$@" || rc=$?
        done
    fi
    return "$rc"
}

# _crashed_before_first_step: the last guest console shows a kernel crash and no step.
_crashed_before_first_step() {
    [ -z "$(_step_of "$_ci_last_guest_log")" ] &&
        tr -d '\r' < "$_ci_last_guest_log" 2>/dev/null |
        grep -E 'Oops|BUG:|Kernel panic|general protection fault|int3' >/dev/null
}

_run_guest_once() {
    local script=$1 rc=0 n=1 log pidf bpid step t0=$SECONDS to=$GUEST_TIMEOUT a prev=""
    shift
    for a in "$@"; do [ "$prev" = --timeout ] && to=$a; prev=$a; done
    mkdir -p "$CI_LOG_DIR"
    log=$CI_LOG_DIR/guest-${script%.sh}.log
    while [ -e "$log" ]; do n=$((n + 1)); log=$CI_LOG_DIR/guest-${script%.sh}.$n.log; done
    pidf=$log.qemu.pid
    _ci_last_guest_log=$log
    local quiet=(--quiet)
    [ "${CI_VERBOSE:-}" = 1 ] && quiet=()
    log "guest $script: booting (timeout ${to}s, console $log)"
    # In the background and waited for: a trap can then interrupt the wait
    # (bash runs traps only between foreground commands).
    "$CI_REPO/ci/guest/boot.sh" "${quiet[@]}" --script "$script" --log "$log" \
        --pidfile "$pidf" --timeout "$GUEST_TIMEOUT" "$@" &
    bpid=$!
    _ci_pids+=("$bpid")
    _ci_pidfiles+=("$pidf")
    _ci_guest_log=$log
    wait "$bpid" || rc=$?
    _ci_guest_log=""
    _ci_forget "$bpid"
    step=$(_step_of "$log")
    if [ "$rc" = 0 ]; then
        log "guest $script: passed in $((SECONDS - t0))s (last step ${step:-none})"
        return 0
    fi
    case $rc in
        124) log "guest $script: TIMED OUT after $((SECONDS - t0))s in step '${step:-before any step}'" ;;
        125) log "guest $script: QEMU ended without a guest result, in step '${step:-before any step}'" ;;
        *) log "guest $script: FAILED (rc=$rc) in step '${step:-before any step}' after $((SECONDS - t0))s" ;;
    esac
    tr -d '\r' < "$log" | grep '^FAIL:' | tail -3 | sed 's/^/    /' >&2 || true
    echo "    ---- last 60 console lines ($log) ----" >&2
    tr -d '\r' < "$log" | tail -60 | sed 's/^/    | /' >&2
    return "$rc"
}

# need_pollux: fail the scenario, saying why, when there is no pollux binary
# (typically: the cargo-build-release step failed). Call it before using
# $POLLUX_BIN directly (--check); start_pollux checks by itself.
# ensure_spdk_client: SPDK's own Python RPC client (the `spdk` package, what SPDK's rpc.py
# runs) in build/spdk-venv; prints the path of its spdk-rpc command.
ensure_spdk_client() {
    ensure_debs python3-venv >&2 || return
    local venv=$CI_REPO/build/spdk-venv
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv" >&2 || return
    "$venv/bin/python" -c 'import spdk.rpc.client' 2>/dev/null ||
        "$venv/bin/pip" install -q 'spdk==26.9' >&2 || return
    echo "$venv/bin/spdk-rpc"
}

need_pollux() {
    [ -x "$POLLUX_BIN" ] || fail "no pollux binary at $POLLUX_BIN (did cargo build --release fail?)"
}

# _conf_port CONF: the TCP port a pollux conf listens on, guessed from a
# 'listen = "ADDR:PORT"'-like or 'port = N' line; 4420 (NVMe/TCP) else.
_conf_port() {
    local p
    p=$(sed -nE 's/^[[:space:]]*(listen|listen_addr|address|addr|bind)[[:space:]]*=[[:space:]]*"[^"]*:([0-9]+)".*/\2/p' "$1" | head -1)
    [ -n "$p" ] || p=$(sed -nE 's/^[[:space:]]*(port|trsvcid)[[:space:]]*=[[:space:]]*"?([0-9]+).*/\2/p' "$1" | head -1)
    echo "${p:-4420}"
}

_pollux_tail() {
    echo "    ---- last 40 lines of $POLLUX_LOG ----" >&2
    tail -40 "$POLLUX_LOG" 2>/dev/null | sed 's/^/    | /' >&2
}

# start_pollux CONF [PORT]: start "$POLLUX_BIN --config CONF" in the
# background (stdout+stderr to $CI_LOG_DIR/pollux[.N].log) and wait until
# 127.0.0.1:PORT accepts a TCP connection (PORT: as _conf_port reads it from
# CONF). Sets POLLUX_PID, POLLUX_LOG, POLLUX_PORT. Fails the scenario with
# the log tail if pollux exits or is not listening in POLLUX_START_TIMEOUT.
# Run it in the scenario's shell, not in $(...): stop_pollux must be able
# to wait for the process.
start_side_pollux() {
    local name=$1 conf=$2 port=$3 n=0
    NO_COLOR=1 setsid "$POLLUX_BIN" --config "$conf" >>"$CI_LOG_DIR/pollux-$name.log" 2>&1 </dev/null &
    echo $! > "$CI_LOG_DIR/$name.pid"
    until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
        sleep 0.1; n=$((n + 1)); [ $n -lt 300 ] || fail "pollux $name did not listen on $port within 30 s"
    done
}

stop_side_pollux() {
    local f=$CI_LOG_DIR/$1.pid
    [ -s "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null
    rm -f "$f"
}

start_pollux() {
    local conf=$1
    [ -f "$conf" ] || fail "start_pollux: no conf file $conf"
    start_pollux_with "${2:-$(_conf_port "$conf")}" --config "$conf"
}

# start_pollux_with PORT ARGS...: start_pollux for `pollux ARGS...` (--spdk-config FILE,
# --nvmet-config FILE), listening on PORT.
start_pollux_with() {
    local n=1 deadline
    need_pollux
    [ -z "$POLLUX_PID" ] || fail "start_pollux: pollux already running (pid $POLLUX_PID)"
    POLLUX_PORT=$1
    shift
    mkdir -p "$CI_LOG_DIR"
    POLLUX_LOG=$CI_LOG_DIR/pollux.log
    while [ -e "$POLLUX_LOG" ]; do n=$((n + 1)); POLLUX_LOG=$CI_LOG_DIR/pollux.$n.log; done
    # NO_COLOR: plain log files (tracing colours its output even into a file).
    NO_COLOR=1 "$POLLUX_BIN" "$@" >"$POLLUX_LOG" 2>&1 </dev/null &
    POLLUX_PID=$!
    _ci_pids+=("$POLLUX_PID")
    log "pollux: pid $POLLUX_PID, $*, port $POLLUX_PORT, log $POLLUX_LOG"
    deadline=$((SECONDS + POLLUX_START_TIMEOUT))
    while :; do
        if ! kill -0 "$POLLUX_PID" 2>/dev/null; then
            local rc=0
            wait "$POLLUX_PID" || rc=$?
            _ci_forget "$POLLUX_PID"
            POLLUX_PID=""
            _pollux_tail
            fail "pollux exited (rc=$rc) before listening on $POLLUX_PORT"
        fi
        # A bare TCP connect: pollux must cope with a peer that sends nothing.
        if (exec 3<>"/dev/tcp/127.0.0.1/$POLLUX_PORT") 2>/dev/null; then
            log "pollux: listening on 127.0.0.1:$POLLUX_PORT"
            return 0
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            _pollux_tail
            fail "pollux not listening on 127.0.0.1:$POLLUX_PORT after ${POLLUX_START_TIMEOUT}s"
        fi
        sleep 0.2
    done
}

# stop_pollux: SIGTERM the pollux of start_pollux, wait up to
# POLLUX_STOP_TIMEOUT seconds, then SIGKILL. Returns 0 only if pollux exited
# 0 on its own after SIGTERM (the contract); logs the log tail otherwise.
stop_pollux() {
    local pid=$POLLUX_PID rc=0 deadline
    [ -n "$pid" ] || return 0
    POLLUX_PID=""
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + POLLUX_STOP_TIMEOUT))
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        _ci_forget "$pid"
        log "pollux: still running ${POLLUX_STOP_TIMEOUT}s after SIGTERM: killed"
        _pollux_tail
        return 1
    fi
    wait "$pid" || rc=$?
    _ci_forget "$pid"
    if [ "$rc" != 0 ]; then
        log "pollux: exited $rc after SIGTERM (want 0)"
        _pollux_tail
        return 1
    fi
    log "pollux: stopped cleanly"
    return 0
}

# _kill_pid PID: TERM, up to 5 s, then KILL.
_kill_pid() {
    kill -TERM "$1" 2>/dev/null || return 0
    for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null || true
}

# ci_track PID: kill PID (a background process of ours) at cleanup.
ci_track() {
    _ci_pids+=("$1")
}

# ci_tagged_pids: the live processes that carry this scenario's CI_RUN_TAG
# (everything it started, however detached), this shell excepted.
ci_tagged_pids() {
    local f p
    for f in /proc/[0-9]*/environ; do
        p=${f#/proc/}
        p=${p%/environ}
        { [ "$p" = $$ ] || [ "$p" = "$BASHPID" ]; } && continue
        grep -qzx "CI_RUN_TAG=$CI_RUN_TAG" "$f" 2>/dev/null && echo "$p"
    done
    return 0
}

# ci_cleanup: kill everything this scenario started, by PID: the recorded
# background processes (boot.sh kills its own QEMU and relays), the QEMUs
# of the recorded pidfiles, then any process still carrying CI_RUN_TAG.
ci_cleanup() {
    local p f c
    for p in "${_ci_pids[@]}"; do _kill_pid "$p"; done
    for f in "${_ci_pidfiles[@]}"; do
        [ -s "$f" ] && _kill_pid "$(cat "$f")"
        rm -f "$f"
    done
    for p in $(ci_tagged_pids); do
        c=$(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | cut -c1-60)
        kill -KILL "$p" 2>/dev/null && log "cleanup: killed straggler $p ($c)"
    done
    return 0
}

trap ci_cleanup EXIT
_ci_interrupted() {
    log "interrupted"
    if [ -n "$_ci_guest_log" ] && [ -f "$_ci_guest_log" ]; then
        log "guest was in step '$(_step_of "$_ci_guest_log")'; last console lines ($_ci_guest_log):"
        tr -d '\r' < "$_ci_guest_log" | tail -20 | sed 's/^/    | /' >&2
    fi
    exit 143
}
trap _ci_interrupted INT TERM HUP

# Host and guest taking turns through files in the guest's read-write 9p share ($share):
# the guest writes g-STEP (guest lib `turn`), the host answers h-STEP once it has done its
# part. wait_guest STEP waits for the guest (background pid $guest) to reach STEP.
# shellcheck disable=SC2154 # $share and $guest are the calling scenario's
wait_guest() {
    local deadline=$((SECONDS + 300))
    while [ ! -e "$share/g-$1" ]; do
        kill -0 "$guest" 2>/dev/null || { wait "$guest" || true; fail "the guest ended before step $1"; }
        [ $SECONDS -lt $deadline ] || fail "the guest never reached step $1"
        sleep 0.3
    done
}
# answer STEP: let the guest go on past STEP.
# shellcheck disable=SC2154 # $share is the calling scenario's
answer() { : > "$share/h-$1"; }
