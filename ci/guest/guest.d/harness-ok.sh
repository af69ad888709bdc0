# shellcheck shell=sh
# Guest side of ci/scenarios/harness.sh, the passing half: what the pollux
# scenarios rely on besides nvme-cli. Needs GPORT (--env) forwarded to a
# host server that greets each connection with "hello-from-host", and
# --share-ro of a folder holding share-check.txt.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh

step env
[ -n "${GPORT:-}" ] || die "GPORT not passed with --env"
[ "${ENV_QUOTED:-}" = "it's  spaced" ] || die "--env value mangled: '${ENV_QUOTED:-}'"

step share-ro
[ "$(cat /mnt/host/share-check.txt 2>/dev/null)" = "${SHARE_TOKEN:-}" ] ||
    die "/mnt/host/share-check.txt does not hold the token"
touch /mnt/host/written 2>/dev/null && die "read-only share is writable"

step guestfwd-3-connections
# NVMe/TCP opens a connection per queue: three at once must each reach the
# host server through their own relay.
for i in 1 2 3; do
    (sleep 4 | nc "$HOST_ADDR" "$GPORT" > "/tmp/conn$i" 2>&1) &
done
n=0 tries=0
while [ "$tries" -lt 20 ]; do
    n=$(tcp_established "$GPORT")
    [ "$n" = 3 ] && break
    sleep 0.2
    tries=$((tries + 1))
done
[ "$n" = 3 ] || die "expected 3 established connections to $HOST_ADDR:$GPORT, found $n"
wait
for i in 1 2 3; do
    grep -q hello-from-host "/tmp/conn$i" || die "connection $i got no greeting: $(cat "/tmp/conn$i")"
done
echo "3 concurrent connections through guestfwd, each greeted"

step end
