#!/bin/bash
# Scenario harness: tests the test harness itself, so that a green pollux
# scenario means something. Checks that
#  - --env, --share-ro and several concurrent guest->host connections
#    through one --guestfwd work (each connection its own relay),
#  - a failing guest step is reported with its name, the guest's FAIL line
#    and the console tail,
#  - --nvme IMG --iommu gives a controller the guest can bind to vfio-pci,
#  - a hung guest is killed at its timeout, leaving no QEMU and no relay,
#  - a guest kernel that crashes before the first step is booted again, three
#    boots in all, and then fails,
#  - the 6.12 guest's Debian 13 userland (/trixie: nvme-cli 2.13, tlshd,
#    keyctl) runs, and its kernel has what NVMe/TCP TLS needs (kTLS, the
#    .nvme keyring, nvme-fabrics' tls options, the handshake netlink family
#    tlshd listens on); a PSK from nvme gen-tls-key is derived and inserted
#    into .nvme (guest.d/trixie-smoke.sh);
#  - the same of the 6.18 guest (trixie-backports' kernel, Debian 13's
#    userland), whose kernel and nvme-cli also offer secure channel
#    concatenation (nvme connect --concat).
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
ensure_debs busybox-static   # the host-side greeting server

tmp=$CI_LOG_DIR/tmp
mkdir -p "$tmp/share"
token=$(date +%s%N)
echo "$token" > "$tmp/share/share-check.txt"
printf '#!/bin/sh\necho hello-from-host\nsleep 5\n' > "$tmp/greet.sh"
chmod +x "$tmp/greet.sh"
hport=$(free_port)
busybox nc -ll -p "$hport" -e "$tmp/greet.sh" >"$tmp/greeter.log" 2>&1 &
ci_track $!
for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$hport") 2>/dev/null && break; sleep 0.1; done

log "case 1: env, share-ro, 3 connections through guestfwd 4420=$hport"
run_guest harness-ok.sh --timeout 120 --guestfwd "4420=$hport" --share-ro "$tmp/share" \
    --env GPORT=4420 --env "ENV_QUOTED=it's  spaced" --env "SHARE_TOKEN=$token" ||
    fail "harness-ok guest failed"

log "case 2: --nvme + --iommu: the NVMe controller moves to vfio-pci"
truncate -s 64M "$tmp/nvme.img"
run_guest harness-vfio.sh --timeout 120 --nvme "$tmp/nvme.img" --iommu ||
    fail "harness-vfio guest failed"
rm -f "$tmp/nvme.img"

log "case 3: a failing guest step must be named, with the console tail"
rc=0
run_guest harness-fail.sh --timeout 120 2>"$tmp/fail-report.txt" || rc=$?
cat "$tmp/fail-report.txt" >&2
[ "$rc" = 1 ] || fail "failing guest: run_guest returned $rc, want 1"
grep -q "FAILED (rc=1) in step 'expected-failure'" "$tmp/fail-report.txt" ||
    fail "run_guest did not name the failed step"
grep -q 'FAIL: \[expected-failure\] fio on /dev/nvme9n9 failed' "$tmp/fail-report.txt" ||
    fail "run_guest did not show the guest's FAIL line"
{ grep -q 'last 60 console lines' "$tmp/fail-report.txt" &&
  grep -q '| GUEST-RC=1' "$tmp/fail-report.txt"; } ||
    fail "run_guest did not show the console tail"

log "case 4: a hung guest is killed at its 20 s timeout"
rc=0 t0=$SECONDS
run_guest harness-hang.sh --timeout 20 2>"$tmp/hang-report.txt" || rc=$?
took=$((SECONDS - t0))
cat "$tmp/hang-report.txt" >&2
[ "$rc" = 124 ] || fail "hung guest: run_guest returned $rc, want 124"
[ "$took" -le 35 ] || fail "hung guest took ${took}s to be killed (timeout 20 s)"
grep -q "TIMED OUT .* in step 'expected-hang'" "$tmp/hang-report.txt" ||
    fail "run_guest did not name the step the guest hung in"
log "case 5: a guest kernel that crashes before the first step is booted three times in all"
rc=0
run_guest harness-crash.sh --timeout 60 2>"$tmp/crash-report.txt" || rc=$?
cat "$tmp/crash-report.txt" >&2
[ "$rc" != 0 ] || fail "crashing guest: run_guest returned 0"
grep "boot 3 of at most 3" "$tmp/crash-report.txt" >/dev/null ||
    fail "run_guest did not boot the crashed guest three times"
if [ ! -e "$CI_LOG_DIR/guest-harness-crash.3.log" ] || [ -e "$CI_LOG_DIR/guest-harness-crash.4.log" ]; then
    fail "want exactly three consoles of the crashing guest"
fi

log "case 6: the 6.12 guest's trixie tools (nvme-cli 2.13, tlshd, keyctl) and TLS kernel options"
run_guest trixie-smoke.sh --kernel 6.12 --timeout 120 ||
    fail "trixie-smoke guest failed"

log "case 7: the same of the 6.18 guest, and secure channel concatenation (concat, --concat)"
run_guest trixie-smoke.sh --kernel 6.18 --timeout 120 ||
    fail "trixie-smoke 6.18 guest failed"

# Only the greeting server may remain of what this scenario started.
left=$(ci_tagged_pids | while read -r p; do
    c=$(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null) || continue
    case $c in *"-p $hport -e"*) ;; *) echo "$p: $c" ;; esac
done)
[ -z "$left" ] || fail "processes left after the timeout: $left"
log "PASS"
