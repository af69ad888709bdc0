#!/bin/bash
# Scenario nvmet-loop: the kernel's own NVMe/TCP target (nvmet-tcp, a brd
# ramdisk namespace) and the kernel NVMe/TCP host, both inside one guest.
# Checks the harness and the reference pair that pollux is held to:
# discover, connect with 2 I/O queues (exactly 3 TCP connections), fio
# randwrite 4k QD16 with crc32c verify over 32 MiB, disconnect.
# Steps and checks: ci/guest/guest.d/nvmet-loop.sh.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"

# ~25 s on an idle 2-core machine; the margin is for a busy one.
run_guest nvmet-loop.sh --timeout 240 --env NQN=nqn.2024-01.io.pollux.ci:nvmet-loop --env PORT=4420 ||
    fail "nvmet-loop guest failed"
log "PASS"
