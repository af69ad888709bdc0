#!/usr/bin/python3
"""The platform's own wake-up cost, for ci/bench modes: a 64-byte TCP ping-pong on loopback
between two processes that both busy-poll (non-blocking recv in a loop; server on core
SERVER_CORE, client on core CLIENT_CORE), after gaps of 0, 1 ms, 100 ms and 1 s without
traffic. No pollux involved: what an isolated I/O costs here whatever the reactor does.

    bench-pingpong.py OUT.json [CLIENT_CORE SERVER_CORE]
"""

import json
import os
import socket
import statistics
import sys
import time


def main(argv):
    out = argv[1]
    cc, sc = (int(argv[2]), int(argv[3])) if len(argv) > 3 else (0, 1)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {sc})
        c, _ = srv.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.setblocking(False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                d = c.recv(4096)
                if not d:
                    break
                c.send(d)
            except BlockingIOError:
                pass
        os._exit(0)
    os.sched_setaffinity(0, {cc})
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setblocking(False)
    res = []
    for gap, n in ((0.0, 200), (0.001, 100), (0.1, 10), (1.0, 4)):
        lat = []
        for _ in range(n):
            end = time.perf_counter() + gap
            while time.perf_counter() < end:
                pass
            t0 = time.perf_counter()
            s.send(b"x" * 64)
            while True:
                try:
                    if s.recv(4096):
                        break
                except BlockingIOError:
                    pass
            lat.append((time.perf_counter() - t0) * 1e6)
        res.append({"gap_ms": gap * 1000, "samples": n, "p50_us": statistics.median(lat), "min_us": min(lat)})
        print(f"loopback ping-pong after {gap * 1000:6.1f} ms idle: p50 {statistics.median(lat):7.1f} us", file=sys.stderr)
    s.close()
    os.waitpid(pid, 0)
    with open(out, "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
