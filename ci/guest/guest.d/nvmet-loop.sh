# shellcheck shell=sh
# Guest side of ci/scenarios/nvmet-loop.sh: the kernel nvmet-tcp target and
# the kernel nvme-tcp host in this one guest, over 127.0.0.1. Proves the
# guest tooling (nvme-cli, fio, modules) against a reference target before
# anything is pointed at pollux.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
nqn=${NQN:-nqn.2024-01.io.pollux.ci:nvmet-loop}
port=${PORT:-4420}

step nvmet-setup
nvmet_setup 127.0.0.1 "$port" "$nqn" 64

step discover
discover 127.0.0.1 "$port"

step connect
dev=$(connect "$nqn" 127.0.0.1 "$port" --nr-io-queues=2)
echo "connected: $dev"
nvme list

step tcp-connections
# One admin queue + --nr-io-queues=2 I/O queues, each its own connection.
n=$(tcp_established "$port")
echo "ESTABLISHED connections to :$port: $n"
[ "$n" = 3 ] || die "expected 3 TCP connections (admin + 2 I/O), found $n"

step fio-verify
fio_verify "$dev" 4k 32M

step disconnect
disconnect "$nqn"
[ "$(tcp_established "$port")" = 0 ] || die "connections to :$port left after disconnect"

step end
