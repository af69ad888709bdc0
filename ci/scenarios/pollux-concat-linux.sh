#!/bin/bash
# Scenario pollux-concat-linux: secure channel concatenation (TP 8018) between the Linux
# host and pollux: `nvme connect --concat` authenticates the admin queue with DH-HMAC-CHAP
# over plain TCP asking for a new PSK, the kernel derives the generated PSK
# (NVMe1G01 <hostnqn> <subnqn> <digest>) and tlshd secures new TLS connections for the
# admin and both I/O queues with it. The guest is the 6.18 kernel from trixie-backports
# (the first Debian kernel whose host and target agree on the generated PSK's derivation:
# 6.15 to 6.17 encode its HKDF label otherwise) with Debian 13's nvme-cli 2.13 (--concat)
# and tlshd; CONCAT_KERNEL=7.3 takes trixie-backports' newest line instead (the strongest
# Linux host Debian offers; prepared only on demand: ci/guest/setup.sh 7.3). Cases
# (ci/guest/guest.d/pollux-concat-linux.sh): connect --concat with 2 I/O queues, every
# queue TLS with the generated key, fio verify 4k and 128k; re-authentication (a write to
# sysfs dhchap_secret) replaces the generated PSK (REPLACETLSPSK) and I/O goes on;
# disconnect; concatenation to a subsystem without secure_concat, through a listener
# without TLS, and with a wrong key are refused and leave nothing connected. pollux's log
# must name the generated PSK, its replacement and the refusals, and hold no key.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
# The guest kernel series (ci/guest/kernels.sh): 6.18 or later.
kernel=${CONCAT_KERNEL:-6.18}
case $kernel in
    6.18 | 7.3) ;;
    *) fail "CONCAT_KERNEL=$kernel: concatenation wants the 6.18 or the 7.3 guest" ;;
esac
need_pollux
ensure_debs nvme-cli busybox-static

port=$(free_port)
port_plain=$(free_port)
sub=nqn.2026-12.io.pollux.ci:concat
plain=nqn.2026-12.io.pollux.ci:noconcat
host=nqn.2014-08.org.nvmexpress:uuid:3f6a1c2e-9d4b-4e7f-8a0c-5b2d7e9f1a3c
keys=$CI_LOG_DIR/keys
rm -rf "$keys"
mkdir -p "$keys"
chmod 700 "$keys"

# key NAME: a DH-HMAC-CHAP secret of the host (SHA-256 transform) in keys/NAME.key, printed.
key() {
    (umask 077 && nvme gen-dhchap-key --hmac=1 --nqn="$host" > "$keys/$1.key") ||
        fail "nvme gen-dhchap-key --hmac=1 failed"
    grep -qE '^DHHC-1:01:[A-Za-z0-9+/]+={0,2}:$' "$keys/$1.key" || fail "not a key: $(cat "$keys/$1.key")"
    cat "$keys/$1.key"
}
k=$(key host)
kwrong=$(key wrong)

conf=$CI_LOG_DIR/pollux.toml
cat > "$conf" <<TOML
[reactors]
cores = [0]
mode = "interrupt"

# Concatenation: the first admin connection is plain TCP, the rest TLS.
[[listener]]
address = "127.0.0.1:$port"
tls = "allowed"

[[listener]]
address = "127.0.0.1:$port_plain"
tls = "none"

[control]
socket = "$CI_LOG_DIR/pollux.sock"

[[subsystem]]
nqn = "$sub"
secure_concat = true
hosts = [{ nqn = "$host", dhchap_key_file = "$keys/host.key" }]
dhchap_hashes = ["sha256", "sha384"]
dhchap_dh_groups = ["ffdhe2048", "ffdhe3072"]

[[subsystem.namespace]]
nsid = 1
block_size = 4096
backend = { ram = { size = "64MiB" } }

[[subsystem]]
nqn = "$plain"
hosts = [{ nqn = "$host", dhchap_key_file = "$keys/host.key" }]
dhchap_hashes = ["sha256"]
dhchap_dh_groups = ["ffdhe2048"]

[[subsystem.namespace]]
nsid = 1
backend = { ram = { size = "16MiB" } }
TOML
start_pollux "$conf" "$port"

log "guest kernel: $kernel ($(cat "$GUEST_WORK/k-$kernel/kver" 2>/dev/null || echo "not prepared: ci/guest/setup.sh $kernel"))"
run_guest pollux-concat-linux.sh --kernel "$kernel" --timeout 600 --guestfwd "4420=$port" \
    --guestfwd "4421=$port_plain" \
    --env "SUB=$sub" --env "PLAIN=$plain" --env "HOSTNQN=$host" --env "KEY=$k" --env "KWRONG=$kwrong" ||
    fail "pollux-concat-linux guest failed (console $CI_LOG_DIR/guest-pollux-concat-linux.log)"

# What pollux saw: PSKs generated, one replaced, refusals with their reason; never a key.
grep -E "concatenation|authenticat|TLS" "$POLLUX_LOG" | tail -30 || true
grep -q "secure channel concatenation: PSK generated.*replaced=false" "$POLLUX_LOG" ||
    fail "pollux logged no generated PSK"
grep -q "secure channel concatenation: PSK generated.*replaced=true" "$POLLUX_LOG" ||
    fail "pollux logged no replaced PSK (re-authentication over TLS)"
grep -q "concatenation asked: the subsystem does not allow it" "$POLLUX_LOG" ||
    fail "pollux logged no refusal for $plain"
grep -q "concatenation asked: the listener takes no TLS connections" "$POLLUX_LOG" ||
    fail "pollux logged no refusal on the plain listener"
for s in "$k" "$kwrong"; do
    b64=${s#DHHC-1:01:}
    b64=${b64%:}
    if grep -qF "${b64:0:24}" "$POLLUX_LOG"; then fail "pollux's log holds a key"; fi
done
stop_pollux || fail "pollux did not stop cleanly"
log "PASS"
