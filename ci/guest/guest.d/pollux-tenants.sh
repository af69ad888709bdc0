# shellcheck shell=sh
# Guest side of ci/scenarios/pollux-tenants.sh: host masking seen by the kernel NVMe/TCP
# host. The guest is two hosts of one subsystem (nvme connect --hostnqn A, then B: two
# controllers of one NVMe subsystem, native multipath). Namespace 1 is attached to A only:
# B's controller does not list it, has no path or block device of it and reads a zero-filled
# Identify Namespace; the host side attaches it to B (ns-add-host): B's controller rescans
# and gets a path that serves A's data; then detaches it (ns-remove-host): it vanishes from
# B and stays on A. Host and guest take turns through the read-write 9p share (g-<step>,
# h-<step>).
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
sub=${SUB:?} host_a=${HOST_A:?} id_a=${HOSTID_A:?} host_b=${HOST_B:?} id_b=${HOSTID_B:?}
S=/mnt/host
touch $S/.rw 2>/dev/null || die "the host share is not mounted read-write (boot.sh --share)"

# ctrl_of_host NQN: the controller (nvmeN) connected as host NQN.
ctrl_of_host() {
    for c in /sys/class/nvme/nvme*; do
        [ "$(cat "$c/hostnqn" 2>/dev/null)" = "$1" ] && { echo "${c##*/}"; return 0; }
    done
    return 1
}

# ns_disk CTRL NSID: the disk of namespace NSID on controller CTRL: its path (nvmeXcYnZ,
# native multipath) or its own block device (nvmeYnZ). The name's last number is the
# namespace head's instance, not the NSID: the disk's nsid attribute says which.
ns_disk() {
    for d in /sys/class/nvme/"$1"/nvme*n*; do
        [ -e "$d/nsid" ] || continue
        [ "$(cat "$d/nsid")" = "$2" ] && { echo "${d##*/}"; return 0; }
    done
    return 1
}

# lists CTRL NSID: CTRL's Active Namespace ID list (what pollux answers) holds NSID.
lists() { nvme list-ns "/dev/$1" 2>/dev/null | grep -qE "\]:0x$2\$"; }

# id_nsze CTRL NSID: NSZE of Identify Namespace NSID through CTRL (0: inactive NSID).
id_nsze() {
    nvme id-ns "/dev/$1" -n "$2" > /tmp/idns 2>&1 || { cat /tmp/idns; die "nvme id-ns /dev/$1 -n $2"; }
    sed -n 's/^nsze *: *//p' /tmp/idns
}

# md5_of DEV: md5 of DEV's first MiB, read with O_DIRECT.
md5_of() { dd if="$1" bs=64k count=16 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1; }

step connect-a
timeout 60 nvme connect -t tcp -n "$sub" -a "$HOST_ADDR" -s 4420 --hostnqn="$host_a" --hostid="$id_a" \
    --nr-io-queues=2 >&2 || die "nvme connect as host A"
n=0
until ctrl_a=$(ctrl_of_host "$host_a") && ns_disk "$ctrl_a" 1 >/dev/null && ns_disk "$ctrl_a" 2 >/dev/null; do
    sleep 0.5; n=$((n + 1)); [ $n -lt 40 ] || die "host A's controller lacks namespace 1 or 2"
done
a1=$(ns_disk "$ctrl_a" 1)
dev1=/dev/$(echo "$a1" | sed 's/c[0-9]*n/n/')   # the namespace's block device (its head)
i=0
until [ -b "$dev1" ]; do sleep 0.2; i=$((i + 1)); [ $i -lt 50 ] || die "no block device $dev1"; done
lists "$ctrl_a" 1 || die "$ctrl_a does not list namespace 1"
roundtrip "$dev1"                                 # leaves /tmp/pat in its first MiB
want=$(md5sum < /tmp/pat | cut -d' ' -f1)
echo "host A ($ctrl_a): namespace 1 is $a1, $dev1"

step connect-b
# nvme-cli 2.4 refuses a second connection to the same address and subsystem whatever
# its host NQN ("already connected", --duplicate-connect or not): host B goes through
# /dev/nvme-fabrics itself, as nvme-cli would.
fabrics_add "transport=tcp,traddr=$HOST_ADDR,trsvcid=4420,nqn=$sub,hostnqn=$host_b,hostid=$id_b,nr_io_queues=2" >&2 ||
    die "nvme connect as host B (nvme-fabrics)"
n=0
until ctrl_b=$(ctrl_of_host "$host_b") && ns_disk "$ctrl_b" 2 >/dev/null; do
    sleep 0.5; n=$((n + 1)); [ $n -lt 40 ] || die "host B's controller lacks namespace 2"
done
nvme list-subsys "$dev1" || true
echo "host B: $ctrl_b"

step masked
nvme list-ns "/dev/$ctrl_b"
lists "$ctrl_b" 2 || die "$ctrl_b does not list namespace 2"
if lists "$ctrl_b" 1; then die "$ctrl_b lists namespace 1, which is host A's only"; fi
if d=$(ns_disk "$ctrl_b" 1); then die "$ctrl_b has $d of namespace 1, which is host A's only"; fi
# Assigned first: a failing $(...) inside a test would go unnoticed.
nsze_b=$(id_nsze "$ctrl_b" 1)
nsze_a=$(id_nsze "$ctrl_a" 1)
[ "$nsze_b" = 0 ] || { cat /tmp/idns; die "Identify Namespace 1 through $ctrl_b is not zero-filled (nsze $nsze_b)"; }
case $nsze_a in "" | 0) die "Identify Namespace 1 through $ctrl_a is empty" ;; esac
[ "$(md5_of "$dev1")" = "$want" ] || die "namespace 1 does not read back through host A"
echo "namespace 1: on $ctrl_a, not on $ctrl_b"

step attach
kmark attach
turn attach
kwait attach "nvme $ctrl_b: rescanning namespaces" 30
n=0
until lists "$ctrl_b" 1 && b1=$(ns_disk "$ctrl_b" 1); do
    sleep 0.5; n=$((n + 1)); [ $n -lt 60 ] || die "namespace 1 never appeared on $ctrl_b"
done
echo "namespace 1 appeared on $ctrl_b as $b1 without reconnecting"
nsze_b=$(id_nsze "$ctrl_b" 1)
[ "$nsze_b" = "$nsze_a" ] || die "Identify Namespace 1 through $ctrl_b says nsze $nsze_b, through $ctrl_a $nsze_a"
if ksince attach | grep -q "nvme $ctrl_a: rescanning"; then die "$ctrl_a rescanned, its namespaces did not change"; fi
# B's path serves it, with A's data: round-robin over both paths, reads must pass through B's.
if [ "$b1" != "${b1#*c}" ]; then
    subsys=${b1%%c*}
    echo round-robin > "/sys/class/nvme-subsystem/nvme-subsys${subsys#nvme}/iopolicy" ||
        die "cannot set the round-robin I/O policy"
    before=$(ios "$b1")
    for _ in 1 2 3 4; do
        [ "$(md5_of "$dev1")" = "$want" ] || die "namespace 1 reads other data with $ctrl_b's path"
    done
    [ "$(ios "$b1")" -gt "$before" ] || die "no read went through $ctrl_b's path $b1"
    echo "$b1 served $(($(ios "$b1") - before)) I/Os of A's data"
else
    [ "$(md5_of "/dev/$b1")" = "$want" ] || die "/dev/$b1 does not read A's data"
fi

step detach
kmark detach
turn detach
kwait detach "nvme $ctrl_b: rescanning namespaces" 30
n=0
while lists "$ctrl_b" 1 || ns_disk "$ctrl_b" 1 >/dev/null; do
    sleep 0.5; n=$((n + 1)); [ $n -lt 60 ] || die "namespace 1 did not vanish from $ctrl_b"
done
echo "namespace 1 vanished from $ctrl_b"
nsze_b=$(id_nsze "$ctrl_b" 1)
[ "$nsze_b" = 0 ] || die "Identify Namespace 1 through $ctrl_b is not zero-filled again (nsze $nsze_b)"
if ksince detach | grep -q "nvme $ctrl_a: rescanning"; then die "$ctrl_a rescanned, its namespaces did not change"; fi
lists "$ctrl_a" 1 || die "$ctrl_a lost namespace 1"
ns_disk "$ctrl_a" 1 >/dev/null || die "$ctrl_a has no disk of namespace 1 any more"
[ "$(md5_of "$dev1")" = "$want" ] || die "namespace 1 does not read back through host A after the detach"
lists "$ctrl_b" 2 || die "$ctrl_b lost namespace 2"
echo "namespace 1 stays on $ctrl_a with its data; $ctrl_b keeps namespace 2"

step disconnect
host_disconnect "$sub"
step end
