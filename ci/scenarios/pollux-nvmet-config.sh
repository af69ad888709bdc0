#!/bin/bash
# Scenario pollux-nvmet-config (issue 51): one nvmetcli config (ci/fixtures/nvmetcli-config.json:
# two ports, ANA groups 1 and 2 with the namespace's group listed on port 2 only, a referral,
# an allowed host, a file namespace with its UUID and NGUID) served by Linux nvmet in the
# guest, built from it as `nvmetcli restore` does (ci/nvmet-configfs.py), and by pollux on the
# host (`pollux --nvmet-config`). The guest's Linux host asks both the same questions (the
# discovery log, Identify Controller and Namespace, each path's ANA state, fio verify) and
# the answers must match: ci/guest/guest.d/pollux-nvmet-config.sh.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
need_pollux

p1=$(free_port) p2=$(free_port)
host=nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-0000000000a1
sub=nqn.2016-06.io.spdk:cnode1
share=$CI_LOG_DIR/share
rm -rf "$share"
mkdir -p "$share"
img=$CI_LOG_DIR/ns1.img
truncate -s 32M "$img"
sed -e "s/@PORT1@/$p1/; s/@PORT2@/$p2/; s#@FILE@#$img#" "$CI_REPO/ci/fixtures/nvmetcli-config.json" > "$CI_LOG_DIR/config.json"
# The guest's nvmet serves the same config from its own file (on tmpfs, which has no
# O_DIRECT: read through the page cache, which no host can tell).
sed -e "s/@PORT1@/$p1/; s/@PORT2@/$p2/; s#@FILE@#/tmp/ns1.img#" "$CI_REPO/ci/fixtures/nvmetcli-config.json" > "$CI_LOG_DIR/guest-config.json"
python3 "$CI_REPO/ci/nvmet-configfs.py" --buffered-io "$CI_LOG_DIR/guest-config.json" > "$share/nvmet.sh" ||
    fail "ci/nvmet-configfs.py failed"
start_pollux_with "$p2" --nvmet-config "$CI_LOG_DIR/config.json" -r none
run_guest pollux-nvmet-config.sh --timeout 480 --share "$share" --guestfwd "$p1=$p1" --guestfwd "$p2=$p2" \
    --env "SUB=$sub" --env "HOST_NQN=$host" --env "P1=$p1" --env "P2=$p2" ||
    fail "pollux-nvmet-config guest failed (pollux log: $POLLUX_LOG)"
stop_pollux || fail "pollux did not stop cleanly on SIGTERM"
log "PASS"
