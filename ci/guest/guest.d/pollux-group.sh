# shellcheck shell=sh
# Guest side of ci/scenarios/pollux-group.sh (6.12 guest kernel): the kernel's nvme-tcp
# host connects to gateway C of a gateway group (10.0.2.100:4420) with the DH-HMAC-CHAP key
# given to gateway A, runs fio verify, writes the checksum of what it read to the share
# (/mnt/host/md5), and disconnects. Env: SUB, HOSTNQN, KEY.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
port=4420
hostid=${HOSTNQN##*:uuid:}

step kernel
case $(uname -r) in 6.12.*) ;; *) die "this is $(uname -r), not the 6.12 guest" ;; esac
echo 10 > /sys/module/nvme_core/parameters/admin_timeout

step connect-through-c
kmark connect
dev=$(host_connect "$SUB" "$port" --hostnqn="$HOSTNQN" --hostid="$hostid" --nr-io-queues=2 --dhchap-secret="$KEY")
kwait connect "qid 0: authenticated" 10
echo "connected: $dev"

step fio
fio_verify "$dev" 4k 16M
dd if="$dev" bs=1M count=16 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1 > /mnt/host/md5

step disconnect
disconnect "$SUB"
nothing_connected "$port"

step end
