# shellcheck shell=sh
# Guest side of ci/scenarios/pollux-nvmet-config.sh: the Linux kernel's nvmet-tcp, built here
# from the nvmetcli config the host's pollux serves too (/mnt/host/nvmet.sh, made by
# ci/nvmet-configfs.py as `nvmetcli restore` would), and the Linux host asked the same
# questions of both: the discovery log through port 2, Identify Controller and Namespace,
# the namespace's identifiers, the ANA state of its path through each port, and fio verify.
# The answers must be the same. nvmet on 127.0.0.1:P1/P2 here, pollux on HOST_ADDR:P1/P2.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
sub=${SUB:?} host=${HOST_NQN:?} p1=${P1:?} p2=${P2:?}

step nvmet-setup
dd if=/dev/zero of=/tmp/ns1.img bs=1M count=32 2>/dev/null || die "cannot make /tmp/ns1.img"
modprobe nvmet-tcp || die "modprobe nvmet-tcp"
# shellcheck disable=SC1091
. /mnt/host/nvmet.sh

# path_state PORT: the ANA state of the path through PORT (native multipath's sysfs).
path_state() {
    for c in /sys/class/nvme/nvme*; do
        grep -q "trsvcid=$1" "$c/address" 2>/dev/null || continue
        for p in /sys/block/"${c##*/}"c*n1 /sys/block/nvme*c"${c##*/nvme}"n1; do
            [ -e "$p/ana_state" ] && { cat "$p/ana_state"; return; }
        done
    done
    echo none
}

# record WHO ADDR: what the Linux host sees of the target at ADDR, in /tmp/WHO.rec.
record() {
    who=$1 addr=$2 f=/tmp/$1.rec
    step "$who-discover"
    out=$(timeout 30 nvme discover -t tcp -a "$addr" -s "$p2" --hostnqn="$host") ||
        die "$who: nvme discover through port $p2 failed"
    echo "$out"
    # Each entry as "subtype subnqn traddr:trsvcid", sorted; the discovery log of the port
    # (itself a target address) says 127.0.0.1 for both.
    echo "$out" | awk '
        { v = $0; sub(/^[a-z]+: */, "", v) }
        /^subtype/ { t = v } /^trsvcid/ { s = v } /^subnqn/ { n = v }
        /^traddr/ { print "disc " t " " n " " v ":" s }' | sort > "$f"
    step "$who-connect"
    dev=$(connect "$sub" "$addr" "$p2" --hostnqn="$host" --nr-io-queues=1)
    idc=$(nvme id-ctrl "${dev%n*}") || die "$who: id-ctrl"
    echo "$idc" | grep -E '^(sn|mn|subnqn|ver) ' | sed 's/ *: */ /; s/ *$//' >> "$f"
    ins=$(nvme id-ns "$dev") || die "$who: id-ns"
    echo "$ins" | grep -E '^(nsze|ncap|nguid|anagrpid|flbas) |in use' | sed 's/ *: */ /; s/ *$//' >> "$f"
    echo "uuid $(cat "/sys/block/${dev#/dev/}/uuid")" >> "$f"
    connect "$sub" "$addr" "$p1" --hostnqn="$host" --nr-io-queues=1 >/dev/null
    sleep 1
    echo "ana port2 $(path_state "$p2")" >> "$f"
    echo "ana port1 $(path_state "$p1")" >> "$f"
    step "$who-fio-verify"
    fio_verify "$dev" 4k 8M
    step "$who-disconnect"
    timeout 30 nvme disconnect -n "$sub" >&2 || die "$who: disconnect"
    sleep 0.5
    echo "---- $who"
    cat "$f"
}

record nvmet 127.0.0.1
record pollux "$HOST_ADDR"

step compare
if ! diff /tmp/nvmet.rec /tmp/pollux.rec; then
    die "pollux, serving the nvmetcli config, answers the Linux host otherwise than Linux nvmet (< nvmet, > pollux)"
fi
echo "pollux and Linux nvmet answer the same ($(wc -l < /tmp/nvmet.rec) facts)"
