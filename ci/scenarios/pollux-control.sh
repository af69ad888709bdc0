#!/bin/bash
# Scenario pollux-control: runtime configuration through the control socket, seen by the
# guest's kernel NVMe/TCP host: a namespace added while fio verify runs appears without a
# reconnect (AER), an added listener shows in discovery and serves, a removed host loses its
# controller and is refused, a reload (SIGHUP) with a changed conf applies and a broken one
# changes nothing, and `pollux ctl save` then a restart from the saved file gives the same
# discovery log. Guest side: ci/guest/guest.d/pollux-control.sh.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
need_pollux

sub1=nqn.2026-11.io.pollux.ci:ctl1
sub2=nqn.2026-11.io.pollux.ci:ctl2
hostid=7d1e5c1a-2f5b-4d8e-9b44-3a2f1c0d9e71
allowed=nqn.2014-08.org.nvmexpress:uuid:$hostid
p1=$(free_port) p2=$(free_port) pd=$(free_port)
share=$CI_LOG_DIR/share
mkdir -p "$share"
sock=$CI_LOG_DIR/pollux.sock
conf=$CI_LOG_DIR/pollux.toml
write_conf() {  # write_conf EXTRA_NS_TOML
    cat > "$conf" <<TOML
[reactors]
cores = [0, 1]

[control]
socket = "$sock"

[[listener]]
address = "127.0.0.1:$p1"

[[listener]]
address = "127.0.0.1:$pd"

[[subsystem]]
nqn = "$sub1"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = { ram = { size = "64MiB" } }
$1
[[subsystem]]
nqn = "$sub2"
# Two hosts: removing one must leave a subsystem that admits someone (a conf rule).
hosts = ["$allowed", "nqn.2014-08.org.nvmexpress:uuid:7d1e5c1a-2f5b-4d8e-9b44-3a2f1c0d9e72"]

[[subsystem.namespace]]
nsid = 1
backend = { ram = { size = "16MiB" } }
TOML
}
ctl() { "$POLLUX_BIN" ctl --socket "$sock" "$@"; }

write_conf ""
start_pollux "$conf" "$p1"
run_guest pollux-control.sh --timeout 600 --share "$share" --guestfwd "4420=$p1" --guestfwd "4421=$p2" \
    --guestfwd "8009=$pd" --env "SUB1=$sub1" --env "SUB2=$sub2" --env "ALLOWED_HOST=$allowed" \
    --env "ALLOWED_HOSTID=$hostid" --env "PORT2=$p2" &
guest=$!
ci_track "$guest"

wait_guest add-ns
ctl add-namespace --nqn "$sub1" --nsid 2 --ram 32MiB || fail "ctl add-namespace"
# A bad request is refused with a clear message and changes nothing.
if out=$(ctl call add_namespace "{\"nqn\":\"$sub1\",\"nsid\":2,\"backend\":{\"ram\":{\"size\":\"1MiB\"}}}" 2>&1); then
    fail "a duplicate nsid was accepted"
fi
log "refused as expected: $out"
answer add-ns

wait_guest add-listener
ctl add-listener --address "127.0.0.1:$p2" || fail "ctl add-listener"
answer add-listener

wait_guest remove-host
ctl call remove_host "{\"nqn\":\"$sub2\",\"host\":\"$allowed\"}" || fail "ctl remove_host"
answer remove-host

wait_guest reload
# The file gets namespace 3 (and keeps what the control socket added, as `ctl save` would).
ctl save || fail "ctl save"
grep -q "nsid = 2" "$conf" || fail "ctl save did not write namespace 2 to $conf"
cp "$conf" "$CI_LOG_DIR/good.toml"
printf '\n[[subsystem.namespace]]\nbogus = 1\n' >> "$conf"
before=$(ctl --json subsystems)
if out=$(ctl reload 2>&1); then fail "a broken conf was applied"; fi
echo "$out" | grep -q "pollux.toml:" || fail "the refusal does not name file:line:column: $out"
[ "$(ctl --json subsystems)" = "$before" ] || fail "a refused reload changed the running state"
log "broken conf refused: $out"
# Namespace 3 goes after namespace 2 in sub1 (sub1's namespaces end where sub2's table starts).
python3 - "$CI_LOG_DIR/good.toml" "$conf" "$sub2" <<'PY'
import sys
src, dst, sub2 = sys.argv[1:]
t = open(src).read()
i = t.index('nqn = "%s"' % sub2)
i = t.rindex("[[subsystem]]", 0, i)
ns3 = '[[subsystem.namespace]]\nnsid = 3\nbackend = { ram = { size = "8MiB" } }\n\n'
open(dst, "w").write(t[:i] + ns3 + t[i:])
PY
kill -HUP "$POLLUX_PID"
answer reload

wait_guest restart
ctl save "$CI_LOG_DIR/saved.toml" || fail "ctl save PATH"
stop_pollux || fail "pollux did not stop cleanly"
start_pollux "$CI_LOG_DIR/saved.toml" "$p1"
answer restart

wait "$guest" || fail "pollux-control guest failed"
grep -q "SIGHUP: configuration reloaded" "$CI_LOG_DIR"/pollux.log || fail "no reload logged"
stop_pollux || fail "pollux did not stop cleanly"
log "PASS"
