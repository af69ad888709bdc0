#!/bin/bash
# Scenario pollux-tls-linux: NVMe/TCP over TLS 1.3 with a PSK (NVMe/TCP 1.0 section 3.6.1,
# TP 8011) between the Linux host and pollux, as the README's TLS commands do it. The
# guest is the 6.12 kernel (CONFIG_NVME_TCP_TLS, kTLS) with Debian 13's nvme-cli 2.13 and
# tlshd (ci/guest/fetch-trixie.sh; Debian 12 has neither). The key is made on the host
# with `nvme gen-tls-key --hmac=1` into an owner-only file that pollux reads; the guest
# inserts the same key with `nvme check-tls-key --insert` (libnvme 1.13 derives the TLS PSK
# with its pre-1.16 HKDF label, so the host entry says tls_key_derivation =
# "libnvme-compat"). Cases (ci/guest/guest.d/pollux-tls-linux.sh): `nvme discover --tls`
# reports the listener's TREQ (required) and TSAS (TLS 1.3); `nvme connect --tls` with 2
# I/O queues, fio verify at 4k and 128k, disconnect; a wrong PSK and a plaintext connect
# to the TLS-required listener are refused and leave nothing connected. pollux's log must
# name the TLS handshakes and hold no key.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
need_pollux
ensure_debs nvme-cli busybox-static

port=$(free_port)
sub=nqn.2026-12.io.pollux.ci:tls
host=nqn.2014-08.org.nvmexpress:uuid:6b0e52a4-7c1d-4e8f-9a3b-2d4c6e8f0a1b
keys=$CI_LOG_DIR/keys
rm -rf "$keys"
mkdir -p "$keys"
chmod 700 "$keys"

# psk NAME: a configured PSK (hash 01, SHA-256) in keys/NAME.psk (mode 600), printed.
psk() {
    (umask 077 && nvme gen-tls-key --hmac=1 > "$keys/$1.psk") || fail "nvme gen-tls-key --hmac=1 failed"
    grep -qE '^NVMeTLSkey-1:01:[A-Za-z0-9+/]+={0,2}:$' "$keys/$1.psk" || fail "not a PSK: $(cat "$keys/$1.psk")"
    cat "$keys/$1.psk"
}
key=$(psk host)
kwrong=$(psk wrong)

conf=$CI_LOG_DIR/pollux.toml
cat > "$conf" <<TOML
[reactors]
cores = [0]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:$port"
tls = "required"

[control]
socket = "$CI_LOG_DIR/pollux.sock"

# The same key lets the host discover over TLS (its identity names the discovery NQN).
[discovery]
hosts = [{ nqn = "$host", tls_key_file = "$keys/host.psk", tls_key_derivation = "libnvme-compat" }]

[[subsystem]]
nqn = "$sub"
hosts = [{ nqn = "$host", tls_key_file = "$keys/host.psk", tls_key_derivation = "libnvme-compat" }]

[[subsystem.namespace]]
nsid = 1
block_size = 4096
backend = { ram = { size = "64MiB" } }
TOML
start_pollux "$conf" "$port"

run_guest pollux-tls-linux.sh --kernel 6.12 --timeout 600 --guestfwd "4420=$port" \
    --env "SUB=$sub" --env "HOSTNQN=$host" --env "KEY=$key" --env "KWRONG=$kwrong" ||
    fail "pollux-tls-linux guest failed (console $CI_LOG_DIR/guest-pollux-tls-linux.log)"

# What pollux saw: handshakes with the host's identity, the refusals, and never a key.
grep -E "TLS|tls" "$POLLUX_LOG" | grep -vi debug | tail -20 || true
grep -q "controller created .*hostnqn=$host" "$POLLUX_LOG" || fail "pollux logged no controller of $host"
for k in "$key" "$kwrong"; do
    b64=${k#NVMeTLSkey-1:01:}
    b64=${b64%:}
    if grep -qF "${b64:0:24}" "$POLLUX_LOG"; then fail "pollux's log holds a PSK"; fi
done
stop_pollux || fail "pollux did not stop cleanly"
log "PASS"
