"""What the Python benchmarks of ci/bench share: a free loopback port, a pollux target
started and waited for until it listens, and stopped."""
import os
import socket
import subprocess
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start_target(pollux, cfg, port, logf, what, timeout=20.0):
    """Start `pollux -c cfg` (logs to the open file `logf`) and return once it accepts on
    `port`; exit naming `what` when it dies or does not listen within `timeout` s."""
    env = dict(os.environ, RUST_LOG="warn", NO_COLOR="1")
    target = subprocess.Popen([pollux, "-c", cfg], stdout=logf, stderr=logf, env=env)
    t0 = time.time()
    while True:
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            return target
        except OSError:
            if time.time() - t0 > timeout or target.poll() is not None:
                stop_target(target)
                raise SystemExit(f"{what}: the target did not come up (see {logf.name})")
            time.sleep(0.05)


def stop_target(target):
    """SIGTERM, then SIGKILL after 20 s."""
    if target.poll() is not None:
        return
    target.terminate()
    try:
        target.wait(timeout=20)
    except subprocess.TimeoutExpired:
        target.kill()
        target.wait()
