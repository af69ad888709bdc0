# shellcheck shell=sh
# Guest side of ci/scenarios/pollux-rbd.sh: the kernel host's native multipath across two
# pollux gateways in front of Ceph RBD images. Namespace 1 is optimized on gateway A
# (4420), namespace 2 on gateway B (4421). 10.0.2.100:9000 is a relay that kills ("kill")
# or restarts ("restart") A, or pauses ("pause") and resumes ("resume") the cluster, at
# once, and answers.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
sub=${SUB:?}
S=/mnt/host
touch $S/.rw 2>/dev/null || die "the host share is not mounted read-write (boot.sh --share)"
report=$S/rbd.txt
[ "$(cat /sys/module/nvme_core/parameters/multipath 2>/dev/null)" = Y ] ||
    die "the guest kernel's nvme_core has no native multipath"

relay() {
    r=$(echo "$1" | nc "$HOST_ADDR" 9000) || die "relay $1 failed"
    [ "$r" = "$2" ] || die "relay $1 answered '$r'"
}
# ns_path PORT NSID: the hidden path device of namespace NSID through the gateway on PORT.
ns_path() {
    c=$(ctrl_on "$1") || return 1
    for p in /sys/block/nvme*c"${c#nvme}"n"$2"; do
        [ -e "$p" ] && { echo "${p##*/}"; return 0; }
    done
    return 1
}
# md5 DEV: the checksum of its first 32 MiB, read around the page cache.
md5() { dd if="$1" bs=1M count=32 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1; }
# fio_bg DEV SECS NAME: fio verify in the background for SECS seconds.
fio_bg() {
    fio --name="$3" --filename="$1" --rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=8 \
        --size=32M --time_based --runtime="$2" --verify=crc32c --verify_backlog=64 --verify_fatal=1 \
        --eta=never --output="/tmp/$3.out" &
    fio_pid=$!
}
fio_done() {
    wait "$fio_pid" || { cat "/tmp/$1.out"; die "fio verify failed ($1)"; }
    grep -q 'err= 0' "/tmp/$1.out" || { cat "/tmp/$1.out"; die "fio reported an error ($1)"; }
    grep -E '^ +clat \((u|m)sec\)' "/tmp/$1.out" | head -1 | sed "s/^/$1: fio write completion latency: /" | tee -a "$report"
}

step discover
host_discover 4420 | grep -q "subnqn: *$sub" || die "A's discovery log lacks $sub"

step connect-a
# A keep-alive timeout of 3 s (Linux's default is 5 s): how soon the host gives up on a
# gateway that is silent without closing its connections (the pause-a step).
dev=$(host_connect "$sub" 4420 --nr-io-queues=2 --reconnect-delay=1 --ctrl-loss-tmo=300 --keep-alive-tmo=3)
n1=${dev%n*}n1 n2=${dev%n*}n2
n=0
until [ -b "$n2" ]; do sleep 0.2; n=$((n + 1)); [ $n -lt 100 ] || die "no namespace 2 ($n2)"; done
nvme id-ns "$n1" | grep -E '^(nsze|nguid|eui64) ' | tee /tmp/id-a
ca=$(ctrl_on 4420)
nvme id-ctrl "/dev/$ca" | grep -qE '^vwc +: 0(x0)?$' || die "an rbd namespace without write_cache reports no volatile write cache"

step fio-verify
fio_verify "$n1" 4k 16M
fio_verify "$n1" 128k 32M
fio_verify "$n2" 4k 8M

step connect-b
timeout 60 nvme connect -t tcp -n "$sub" -a "$HOST_ADDR" -s 4421 --nr-io-queues=2 --reconnect-delay=1 \
    --ctrl-loss-tmo=300 --keep-alive-tmo=3 >&2 || die "nvme connect to gateway B failed"
n=0
until b1=$(ns_path 4421 1) && b2=$(ns_path 4421 2); do
    sleep 0.5; n=$((n + 1)); [ $n -lt 40 ] || die "no paths through B"
done
a1=$(ns_path 4420 1) a2=$(ns_path 4420 2) || die "no paths through A"
nvme list-subsys "$n1" | tee /tmp/subsys
[ "$(grep -c ' live' /tmp/subsys)" -ge 2 ] || die "nvme list-subsys does not show two live paths"
for p in "$a1:optimized" "$b1:non-optimized" "$a2:non-optimized" "$b2:optimized"; do
    s=$(cat "/sys/block/${p%%:*}/ana_state")
    [ "$s" = "${p#*:}" ] || die "${p%%:*} is $s, not ${p#*:}"
done
echo "paths: ns1 A $a1 (optimized) B $b1; ns2 A $a2, B $b2 (optimized)"

step load-sharing
i_a1=$(ios "$a1") i_b2=$(ios "$b2") i_b1=$(ios "$b1") i_a2=$(ios "$a2")
for d in "$n1" "$n2"; do
    fio --name=share --filename="$d" --rw=randread --bs=4k --direct=1 --ioengine=libaio --iodepth=8 \
        --size=16M --time_based --runtime=5 --eta=never --output=/dev/null &
done
wait
echo "load sharing: A carried $(($(ios "$a1") - i_a1)) I/Os of ns1, B $(($(ios "$b2") - i_b2)) of ns2;" \
    "non-optimized paths $(($(ios "$b1") - i_b1)) and $(($(ios "$a2") - i_a2))" | tee -a "$report"
[ "$(ios "$a1")" -gt $((i_a1 + 100)) ] || die "namespace 1's I/O did not go through A"
[ "$(ios "$b2")" -gt $((i_b2 + 100)) ] || die "namespace 2's I/O did not go through B"

step kill-a
fio_bg "$n1" 25 kill
sleep 8
b0=$(ios "$b1")
t0=$(ms)
relay kill killed
until [ "$(ios "$b1")" -gt "$b0" ]; do
    [ $(($(ms) - t0)) -lt 90000 ] || die "no I/O through B within 90 s of the kill"
    sleep 0.02
done
echo "FAILOVER: first I/O completed through B $(($(ms) - t0)) ms after SIGKILL of A" | tee -a "$report"
fio_done kill
sum_b=$(md5 "$n1")
echo "namespace 1 read through B: $sum_b"

step restart-a
t2=$(ms)
relay restart restarted
n=0
until [ "$(cat /sys/class/nvme/"$ca"/state 2>/dev/null)" = live ]; do
    sleep 0.1; n=$((n + 1)); [ $n -lt 900 ] || die "the host never reconnected to A ($(cat /sys/class/nvme/"$ca"/state))"
done
echo "FAILOVER: the host reconnected A's path by itself $(($(ms) - t2)) ms after A restarted" | tee -a "$report"
n=0
until [ "$(cat "/sys/block/$a1/ana_state" 2>/dev/null)" = optimized ]; do
    sleep 0.1; n=$((n + 1)); [ $n -lt 300 ] || die "A's path for namespace 1 is not optimized again"
done
i=$(ios "$a1")
sum_a=$(md5 "$n1")
[ "$(ios "$a1")" -gt "$i" ] || die "the read after A returned did not go through A"
[ "$sum_a" = "$sum_b" ] || die "namespace 1 reads $sum_a through A and $sum_b through B"
echo "namespace 1 reads the same through both gateways: $sum_a" | tee -a "$report"

step pause-a
# A paused with writes in flight (a hung VM): the host's keep-alive to A lapses and it moves
# the I/O to B, which fenced A meanwhile and took its group. When A runs again it finds
# itself fenced, re-executes itself and rejoins; after the failback delay its path is
# optimized again.
fio_bg "$n1" 30 pause
sleep 8
b0=$(ios "$b1")
t0=$(ms)
relay stop stopped
until [ "$(ios "$b1")" -gt "$b0" ]; do
    [ $(($(ms) - t0)) -lt 90000 ] || die "no I/O through B within 90 s of pausing A"
    sleep 0.02
done
echo "PAUSE: first I/O completed through B $(($(ms) - t0)) ms after SIGSTOP of A" | tee -a "$report"
sleep 5
t2=$(ms)
relay cont continued
fio_done pause
# A re-executed itself (a new process) and B gave its group back: the relay says when.
relay rejoined rejoined
echo "PAUSE: A rejoined its group (a new process, its group given back) $(($(ms) - t2)) ms after SIGCONT" | tee -a "$report"
n=0
until [ "$(cat "/sys/block/$a1/ana_state" 2>/dev/null)" = optimized ] &&
    [ "$(cat /sys/class/nvme/"$ca"/state 2>/dev/null)" = live ]; do
    sleep 0.1; n=$((n + 1)); [ $n -lt 900 ] || die "A's path for namespace 1 is not optimized again after its fence"
done
echo "PAUSE: A's path is optimized again $(($(ms) - t2)) ms after SIGCONT" | tee -a "$report"
# What fio verified through B reads back through A (the end compares it with rbd export).
i=$(ios "$a1")
md5 "$n1" >/dev/null
[ "$(ios "$a1")" -gt "$i" ] || die "the read after A rejoined did not go through A"

step cluster-outage
fio_bg "$n2" 30 outage
sleep 5
t0=$(ms)
relay pause paused
sleep 15
relay resume resumed
c0=$(ios "$b2")
until [ "$(ios "$b2")" -gt "$c0" ]; do
    [ $(($(ms) - t0)) -lt 90000 ] || die "no I/O after the cluster returned"
    sleep 0.05
done
echo "OUTAGE: I/O resumed $(($(ms) - t0)) ms after the cluster stopped answering (15 s)" | tee -a "$report"
fio_done outage

step checksums
md5 "$n1" > $S/md5-n1
md5 "$n2" > $S/md5-n2
disconnect "$sub"
step end
