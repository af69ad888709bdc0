# shellcheck shell=sh
# Guest side of ci/scenarios/perf-nvmet.sh: pollux perf, the NVMe/TCP initiator of
# ci/bench, against the Linux kernel's own target (nvmet-tcp exporting a brd ramdisk) in
# this guest, over 127.0.0.1:
#   1. --verify (every block written carries its LBA and a generation; every read is
#      checked) with 4 KiB in-capsule writes, with 64 KiB writes (R2T + H2CData) and header
#      and data digests, and with SQ flow control kept on (--sqflow: completions in
#      response capsules instead of C2HData SUCCESS), and at QD1, where reads are
#      received in place;
#   2. QD1 4k random-read latency of pollux perf and of fio through the kernel host on the
#      same target, one after the other; the host compares them.
# Reports go to the share as perf-NAME.json and fio-qd1.json.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
nqn=${NQN:-nqn.2024-01.io.pollux.ci:perf-nvmet}
port=${PORT:-4420}
P=/mnt/host/pollux
[ -x "$P" ] || die "no $P (boot.sh --share DIR with the pollux binary in it)"
share=/mnt/host
trid="trtype:tcp traddr:127.0.0.1 trsvcid:$port subnqn:$nqn"

# perf NAME ARGS...: pollux perf with --json into the share; it must exit 0 and count I/O.
perf() {
    name=$1
    shift
    out=$share/perf-$name.json
    echo "pollux perf $*"
    "$P" perf -r "$trid" --no-pin --json "$@" > "$out" 2> "/tmp/perf-$name.err" ||
        { cat "/tmp/perf-$name.err" "$out"; die "pollux perf $name failed"; }
    grep -q '"ios":[1-9]' "$out" || { cat "$out"; die "pollux perf $name counted no I/O"; }
    sed 's/,"latency_ns".*//' "$out"
}

# verified NAME: the verify run checked blocks.
verified() {
    grep -q '"verified_blocks":[1-9]' "$share/perf-$1.json" ||
        { cat "$share/perf-$1.json"; die "pollux perf $1 verified no block"; }
}

step nvmet-setup
nvmet_setup 127.0.0.1 "$port" "$nqn" 64

step perf-verify-4k
perf verify-4k -w randrw -q 8 -o 4096 -t 3 --span 16MiB --verify
verified verify-4k

step perf-verify-64k-digests
perf verify-64k-digests -w randrw -q 4 -o 64K -t 3 --span 16MiB --verify --hdgst --ddgst
verified verify-64k-digests

step perf-verify-sqflow
perf verify-sqflow -w randrw -q 8 -o 4096 -t 2 --span 16MiB --verify --sqflow
verified verify-sqflow

# A read alone in flight is received straight into its buffer (HostQueue::fill_in_place),
# its header checked against the bytes expected; anything else the kernel sends goes the
# usual way. Verified with and without SQ flow control (SUCCESS or a response capsule
# after the data), and with header digests (the full header parse).
step perf-verify-qd1-in-place
for v in "qd1 " "qd1-sqflow --sqflow" "qd1-hdgst --hdgst --ddgst"; do
    name=verify-${v%% *}
    # shellcheck disable=SC2086 # the options after the name split on purpose
    perf "$name" -w randrw -q 1 -o 8192 -t 2 --span 16MiB --verify ${v#* }
    verified "$name"
    grep -q '"in_place_reads":[1-9]' "$share/perf-$name.json" ||
        { cat "$share/perf-$name.json"; die "pollux perf $name received no read in place"; }
done

step latency-perf
perf qd1 -w randread -q 1 -o 4096 -t 4 --warmup 1 --span 64MiB

step latency-fio
dev=$(connect "$nqn" 127.0.0.1 "$port")
fio --name=qd1 --filename="$dev" --rw=randread --bs=4k --iodepth=1 --size=64M --direct=1 \
    --ioengine=libaio --time_based --runtime=4 --ramp_time=1 --lat_percentiles=1 \
    --output-format=json --output=/tmp/fio-qd1.json > /dev/null 2>&1 ||
    { cat /tmp/fio-qd1.json 2>/dev/null; die "fio randread qd1 on $dev failed"; }
cp /tmp/fio-qd1.json "$share/"
disconnect "$nqn"

step end
