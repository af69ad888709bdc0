# shellcheck shell=sh
# Guest side of ci/scenarios/pollux-modes.sh: the kernel NVMe/TCP host against pollux
# instances on the host, one per reactor mode (adaptive on guest port 4420, hybrid on 4421,
# interrupt on 4422; PORTS names others, e.g. the busy-poll target alone on 4420), each
# serving a simulated SSD (lognormal 80 us reads) and a fast one (fixed 10 us). Verified I/O through each proves completions arrive in every mode.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
nqn=${NQN:?}

for port in ${PORTS:-4420 4421 4422}; do
    step "connect-$port"
    dev=$(host_connect "$nqn" "$port" --nr-io-queues=1)
    ctrl=${dev%n*}
    nvme list-ns "$ctrl" | grep -qE '\]:0x2$' || die "namespace 2 missing on port $port"
    fast=${ctrl}n2
    step "fio-sim-$port"
    fio_verify "$dev" 4k 4M
    fio_verify "$dev" 128k 8M
    step "fio-fast-$port"
    [ -b "$fast" ] || die "no block device $fast for namespace 2"
    fio_verify "$fast" 4k 4M
    step "qd1-latency-$port"
    # A functional sanity line only: TCG distorts every absolute figure.
    fio --name=lat --filename="$dev" --rw=randread --bs=4k --direct=1 --ioengine=psync \
        --runtime=3 --time_based --output-format=terse --terse-version=3 |
        awk -F';' '{ printf "QD1 randread via port '"$port"': %s IOPS, clat mean %s us\n", $8, $16 }'
    host_disconnect "$nqn"
done
step end
