#!/bin/bash
# Scenario control (host only, no guest): pollux with [control] socket and metrics.
# `pollux ctl` commands and their output (set-mode effects seen in `ctl reactors`, errors
# for bad requests), the socket's 0600 mode, a second pollux on the same socket refused,
# controllers and IOPS while `pollux perf` loads the target, the Prometheus endpoint with
# curl, `pollux top` in tmux (capture-pane shows the reactors and their modes; q quits),
# and the socket file removed at stop.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
need_pollux
ensure_debs tmux curl

tmp=$(mktemp -d /tmp/pollux-ctl.XXXXXX)
tmux_sock=pollux-ci-$$
cleanup() {
    tmux -L "$tmux_sock" kill-server 2>/dev/null || true
    ci_cleanup
    rm -rf "$tmp"
}
trap cleanup EXIT

sock=$tmp/ctl.sock
port=$(free_port)
mport=$(free_port)
nqn=nqn.2026-11.io.pollux.ci:ctl
write_conf() { # FILE PORT METRICS_PORT
    cat > "$1" <<TOML
[reactors]
cores = [0, 1]
mode = "adaptive"

[[listener]]
address = "127.0.0.1:$2"

[control]
socket = "$sock"
metrics = "127.0.0.1:$3"

[[subsystem]]
nqn = "$nqn"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = { ram = { size = "64MiB" } }
TOML
}
conf=$CI_LOG_DIR/control.toml
write_conf "$conf" "$port" "$mport"
start_pollux "$conf" "$port"

ctl() { "$POLLUX_BIN" ctl --config "$conf" "$@"; }
# row R: the `ctl reactors --wide` row of reactor R as "MODE ADAPTIVE BUDGET".
row() { ctl reactors --wide | awk -v r="$1" '$1 == r { print $3, $4, $5 }'; }
expect() { # WHAT GOT WANT
    [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"
    log "ok: $1: $2"
}

# ---- the socket
[ -S "$sock" ] || fail "no control socket at $sock"
expect "socket mode" "$(stat -c %a "$sock")" 600
out=$(ctl version) || fail "ctl version failed"
grep -qE '^pollux [0-9]+\.[0-9]+\.[0-9]+ \(commit [0-9a-z-]+\) +uptime [0-9]+s +reactors 2 ' <<<"$out" || fail "ctl version: $out"
log "ok: $out"
conf2=$CI_LOG_DIR/second.toml
write_conf "$conf2" "$(free_port)" "$(free_port)"
rc=0
out=$(timeout 20 "$POLLUX_BIN" --config "$conf2" 2>&1) || rc=$?
expect "second pollux on the same socket exits" "$rc" 1
grep -q "another pollux is already serving the control socket" <<<"$out" || fail "second pollux: $out"
ctl version >/dev/null || fail "the first pollux stopped answering"

# ---- reactors and mode changes
expect "reactor 0 at start" "$(row 0)" "interrupt on 0.30"
expect "reactor 1 at start" "$(row 1)" "interrupt on 0.30"
out=$(ctl set-mode 1 poll)
expect "set-mode 1 poll" "$out" "reactor 1: mode poll, adaptive off, cpu budget 0.30"
expect "reactor 1 after set-mode poll" "$(row 1)" "poll off 0.30"
expect "reactor 0 untouched" "$(row 0)" "interrupt on 0.30"
ctl set-mode 0 hybrid >/dev/null
expect "reactor 0 after set-mode hybrid" "$(row 0)" "hybrid off 0.30"
ctl set-cpu-budget 0 0.5 >/dev/null
ctl set-mode 0 adaptive >/dev/null
row0=$(row 0)
[[ "$row0" =~ ^(poll|hybrid|interrupt)\ on\ 0\.50$ ]] || fail "reactor 0 after adaptive: $row0"
log "ok: reactor 0 adaptive again: $row0"
ctl --json reactors | grep '"mode": "poll"' >/dev/null || fail "ctl --json reactors shows no poll reactor"
for bad in "set-mode 9 poll" "set-mode 0 turbo" "set-cpu-budget 0 1.5" "set-cpu-budget 0 0"; do
    rc=0
    # shellcheck disable=SC2086 # split on purpose
    err=$(ctl $bad 2>&1 >/dev/null) || rc=$?
    expect "ctl $bad exit status" "$rc" 2
    grep -q "JSON-RPC error -32602" <<<"$err" || fail "ctl $bad: $err"
done
expect "reactor 1 unchanged by bad requests" "$(row 1)" "poll off 0.30"

# ---- subsystems, controllers and IOPS under load
ctl subsystems | grep "^$nqn" >/dev/null || fail "ctl subsystems does not list $nqn"
expect "controllers before load" "$(ctl controllers)" "no controllers"
"$POLLUX_BIN" perf -r "trtype:tcp traddr:127.0.0.1 trsvcid:$port subnqn:$nqn" -q 4 -w randrw \
    -t 6 --no-pin --conns-per-core 2 >"$CI_LOG_DIR/perf.log" 2>&1 &
perf=$!
ci_track "$perf"
sleep 3
ctrls=$(ctl controllers)
log "under load:"$'\n'"$ctrls"
grep -q "$nqn" <<<"$ctrls" || fail "ctl controllers shows no controller of $nqn under load"
ctl subsystems | grep "controllers 1" >/dev/null || fail "ctl subsystems does not count the controller"
iops=$(ctl --json reactors | awk -F': ' '/"iops"/ { gsub(",", "", $2); s += $2 } END { printf "%d", s }')
[ "$iops" -gt 0 ] || fail "no IOPS reported under load"
log "ok: $iops IOPS over both reactors"

# ---- metrics
metrics=$(curl -sSf "http://127.0.0.1:$mport/metrics") || fail "GET /metrics failed"
for want in 'pollux_reactor_mode{reactor="1",mode="poll"} 1' \
    "pollux_subsystem_controllers{subsystem=\"$nqn\"} 1" \
    '# TYPE pollux_reactor_cpu_seconds_total counter' \
    "pollux_namespace_read_commands_total{subsystem=\"$nqn\",nsid=\"1\"} "; do
    grep -qF "$want" <<<"$metrics" || fail "metrics lack: $want"
done
log "ok: metrics ($(grep -vc '^#' <<<"$metrics") samples)"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$mport/nope")
expect "GET /nope" "$code" 404
wait "$perf" || fail "pollux perf failed: $(tail -5 "$CI_LOG_DIR/perf.log")"

# ---- pollux top, as a person would use it
tmux -L "$tmux_sock" new-session -d -s top -x 150 -y 40 \
    "$POLLUX_BIN top --socket $sock 2>$CI_LOG_DIR/top.err"
screen=""
for _ in $(seq 50); do
    sleep 0.2
    screen=$(tmux -L "$tmux_sock" capture-pane -p -t top 2>/dev/null || true)
    grep -q "Controllers" <<<"$screen" && grep -qE '^│ *1 ' <<<"$screen" && break
done
printf '%s\n' "$screen" > "$CI_LOG_DIR/top.screen"
grep -q "Reactors" <<<"$screen" || fail "top shows no Reactors table (see top.screen)"
grep -qE '^│ *1 +- +poll +fixed' <<<"$screen" || grep -qE '^│ *1 +1 +poll +fixed' <<<"$screen" ||
    fail "top does not show reactor 1 polling (see top.screen)"
grep -qE '^│ *0 +[-0-9]+ +(poll|hybrid|interrupt) +adaptive' <<<"$screen" ||
    fail "top does not show reactor 0 adaptive (see top.screen)"
grep -q "$nqn" <<<"$screen" || fail "top does not show the subsystem (see top.screen)"
log "ok: top shows the reactors and their modes"
tmux -L "$tmux_sock" send-keys -t top q
for _ in $(seq 25); do
    tmux -L "$tmux_sock" has-session -t top 2>/dev/null || break
    sleep 0.2
done
tmux -L "$tmux_sock" has-session -t top 2>/dev/null && fail "top did not quit on q"
log "ok: q quits top"

stop_pollux || fail "pollux did not stop cleanly"
[ -e "$sock" ] && fail "the control socket outlived pollux"
log "PASS"
