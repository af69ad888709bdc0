#!/bin/bash
# Scenario pollux-auth: DH-HMAC-CHAP (NVMe 2.0 section 8.13) between the Linux
# 6.12 kernel's nvme-tcp host (run_guest --kernel 6.12; 6.1 has no
# CONFIG_NVME_HOST_AUTH) and pollux on the host. Keys come from nvme-cli's
# gen-dhchap-key on the host, in owner-only key files pollux reads; the guest
# gets the same secrets for nvme connect --dhchap-secret. Subsystems pin one
# hash and DH group each (the host offers all; pollux picks from its lists):
# sha256/null, sha384/ffdhe2048 (bidirectional), sha512/ffdhe3072. Cases: the
# right key connects (fio verify on 2 I/O queues), a wrong key, no key and a
# wrong controller key are refused and leave nothing connected, the keyed host's
# `nvme discover --dhchap-secret` authenticates to the discovery controller (a
# wrong secret is refused, a keyless host still discovers), a keyless host
# of an open subsystem still connects; a key rotated through pollux ctl
# (set_host_keys, triggered from the guest through a relay to a host-side
# script) is taken by the host's re-authentication (sysfs dhchap_secret) on the
# live controller, after which the old key is refused. pollux's log must name
# every outcome with the host NQN and must hold no key. POLLUX_AUTH_BIG_GROUPS=1
# adds sha512/ffdhe4096, ffdhe6144 and ffdhe8192 (TCG: the first use of each
# group costs the guest's kernel 2-12 s of self-test). Steps and checks:
# ci/guest/guest.d/pollux-auth.sh.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
need_pollux
ensure_debs nvme-cli busybox-static

p_io=$(free_port)
p_rot=$(free_port)
pfx=nqn.2026-11.io.pollux.ci
host=nqn.2014-08.org.nvmexpress:uuid:5d1c7a2e-8f3b-4c6d-9e0a-1b2c3d4e5f60
other=nqn.2014-08.org.nvmexpress:uuid:0b1e2d3c-4f5a-4b6c-8d7e-9f0a1b2c3d4e
keys=$CI_LOG_DIR/keys
rm -rf "$keys"
mkdir -p "$keys"
chmod 700 "$keys"

# key NAME HMAC SUBJECT-NQN: a secret in keys/NAME.key (mode 600), printed.
key() {
    (umask 077 && nvme gen-dhchap-key --hmac="$2" --nqn="$3" > "$keys/$1.key") ||
        fail "nvme gen-dhchap-key --hmac=$2 --nqn=$3 failed"
    grep -qE '^DHHC-1:0[0-3]:[A-Za-z0-9+/]+={0,2}:$' "$keys/$1.key" || fail "not a key: $(cat "$keys/$1.key")"
    cat "$keys/$1.key"
}
k256=$(key k256 1 "$host")
k384=$(key k384 2 "$host")
c384=$(key c384 3 "$pfx:s384")
k512=$(key k512 3 "$host")
krot=$(key krot 2 "$host")
kwrong=$(key kwrong 2 "$host")
cwrong=$(key cwrong 3 "$pfx:s384")

big=""
if [ "${POLLUX_AUTH_BIG_GROUPS:-0}" = 1 ]; then
    for g in 4096 6144 8192; do
        big+="
[[subsystem]]
nqn = \"$pfx:s$g\"
hosts = [{ nqn = \"$host\", dhchap_key_file = \"$keys/k512.key\" }]
dhchap_hashes = [\"sha512\"]
dhchap_dh_groups = [\"ffdhe$g\"]
[[subsystem.namespace]]
nsid = 1
backend = { ram = { size = \"16MiB\" } }
"
    done
fi

sock=$CI_LOG_DIR/pollux.sock
conf=$CI_LOG_DIR/pollux.toml
cat > "$conf" <<TOML
[reactors]
cores = [0, 1]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:$p_io"

[control]
socket = "$sock"

# The keyed host authenticates to the discovery controller too; others discover freely.
[discovery]
hosts = [{ nqn = "$host", dhchap_key_file = "$keys/k256.key" }]

[[subsystem]]
nqn = "$pfx:s256"
hosts = [{ nqn = "$host", dhchap_key_file = "$keys/k256.key" }]
dhchap_hashes = ["sha256"]
dhchap_dh_groups = ["null"]
[[subsystem.namespace]]
nsid = 1
backend = { ram = { size = "32MiB" } }

[[subsystem]]
nqn = "$pfx:s384"
hosts = [{ nqn = "$host", dhchap_key_file = "$keys/k384.key", dhchap_ctrl_key_file = "$keys/c384.key" }]
dhchap_hashes = ["sha384"]
dhchap_dh_groups = ["ffdhe2048"]
[[subsystem.namespace]]
nsid = 1
backend = { ram = { size = "64MiB" } }

[[subsystem]]
nqn = "$pfx:s512"
hosts = [{ nqn = "$host", dhchap_key_file = "$keys/k512.key" }]
dhchap_hashes = ["sha512"]
dhchap_dh_groups = ["ffdhe3072"]
[[subsystem.namespace]]
nsid = 1
backend = { ram = { size = "16MiB" } }

[[subsystem]]
nqn = "$pfx:open"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = { ram = { size = "16MiB" } }
$big
TOML
"$POLLUX_BIN" --check "$conf" || fail "pollux --check rejects the scenario conf"
# An open key file is refused, with the reason.
chmod 644 "$keys/k512.key"
if out=$("$POLLUX_BIN" --check "$conf" 2>&1); then fail "pollux --check took a key file others can read"; fi
grep -q "mode 0644" <<<"$out" || fail "open key file refused without the reason: $out"
chmod 600 "$keys/k512.key"
start_pollux "$conf" "$p_io"

# The rotation relay: a guest connection to 10.0.2.100:9000 runs this, which
# gives pollux the host's new key for s384 (the controller key stays) and the host's own
# hash and DH group there, SHA-512 and ffdhe3072 instead of the subsystem's SHA-384 and
# ffdhe2048: key, hash and group change on a live controller, as blktests nvme/045 does
# to nvmet, and the host's re-authentication must use all three.
rot=$CI_LOG_DIR/rotate.sh
cat > "$rot" <<SH
#!/bin/sh
"$POLLUX_BIN" ctl --socket "$sock" set-host-keys --nqn "$pfx:s384" --host "$host" \
    --dhchap-key-file "$keys/krot.key" --dhchap-ctrl-key-file "$keys/c384.key" \
    --dhchap-hashes sha512 --dhchap-dh-groups ffdhe3072 \
    >> "$CI_LOG_DIR/rotate.log" 2>&1 && echo rotated || echo rotate-failed
SH
chmod +x "$rot"
busybox nc -ll -p "$p_rot" -e "$rot" >"$CI_LOG_DIR/relay.log" 2>&1 &
ci_track $!

big_env=()
[ -z "$big" ] || big_env=(--env BIG_GROUPS=1)
run_guest pollux-auth.sh --kernel 6.12 --timeout 420 --guestfwd "4420=$p_io" --guestfwd "9000=$p_rot" \
    --env "PFX=$pfx" --env "HOSTNQN=$host" --env "OTHERNQN=$other" \
    --env "K256=$k256" --env "K384=$k384" --env "C384=$c384" --env "K512=$k512" \
    --env "KROT=$krot" --env "KWRONG=$kwrong" --env "CWRONG=$cwrong" "${big_env[@]}" ||
    fail "pollux-auth guest failed (pollux log: $POLLUX_LOG)"

grep -q "rotated" "$CI_LOG_DIR/relay.log" 2>/dev/null ||
    grep -q "^set-host-keys: changed subsystem $pfx:s384" "$CI_LOG_DIR/rotate.log" ||
    fail "the key was never rotated (rotate.log: $(cat "$CI_LOG_DIR/rotate.log" 2>/dev/null))"
# Every outcome in pollux's log, with the host NQN; never a key.
for want in "queue authenticated (DH-HMAC-CHAP) .*hash=sha256 dhgroup=null" \
    "queue authenticated (DH-HMAC-CHAP) .*hash=sha384 dhgroup=ffdhe2048 bidirectional=true" \
    "queue authenticated (DH-HMAC-CHAP) .*hash=sha512 dhgroup=ffdhe3072" \
    "queue authenticated (DH-HMAC-CHAP) .*qid=0 .*hash=sha512 dhgroup=ffdhe3072 bidirectional=true" \
    "authentication failed: the host's response does not match its key.*hostnqn=$host" \
    "queue authenticated (DH-HMAC-CHAP) .*qid=2 hostnqn=$host" \
    "connect refused\|authentication failed"; do
    grep -q -- "$want" "$POLLUX_LOG" || fail "pollux log lacks /$want/"
done
for k in "$k256" "$k384" "$c384" "$k512" "$krot" "$kwrong" "$cwrong"; do
    b=${k#DHHC-1:0?:}
    if grep -qF -- "${b:0:24}" "$POLLUX_LOG"; then fail "pollux's log holds a key"; fi
done
# pollux ctl save keeps the key files as files.
"$POLLUX_BIN" ctl --socket "$sock" save "$CI_LOG_DIR/saved.toml" >/dev/null || fail "pollux ctl save failed"
grep -q "dhchap_key_file = \"$keys/krot.key\"" "$CI_LOG_DIR/saved.toml" || fail "saved conf lost the rotated key file"
if grep -q "DHHC-1" "$CI_LOG_DIR/saved.toml"; then fail "saved conf holds a secret"; fi
stop_pollux || fail "pollux did not stop cleanly on SIGTERM"
log "PASS"
