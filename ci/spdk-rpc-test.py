#!/usr/bin/env python3
"""SPDK's own RPC client against pollux (issue 51): the `spdk` package's JSONRPCClient (what
SPDK's scripts/rpc.py runs) and its `spdk-rpc` command drive a pollux process over its
control socket as they drive nvmf_tgt.

The sequence SPDK users run (a malloc bdev, a subsystem with ANA reporting, a listener, a
namespace, a host), then I/O on the namespace (`pollux perf --verify`), SPDK's shapes of
nvmf_get_subsystems / nvmf_get_transports / bdev_get_bdevs, SPDK's error codes for bad
input with the target's state unchanged, `pollux ctl save` writing what the methods did
into a conf file that `pollux --check` accepts and a fresh pollux serves, and the tear-down.

usage: spdk-rpc-test.py POLLUX_BIN (with the spdk package importable: ci/test installs it
in a virtual environment)
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import zlib

from benchlib import free_port
from spdk.rpc.client import JSONRPCClient, JSONRPCException

POLLUX = os.path.abspath(sys.argv[1])
NQN = "nqn.2016-06.io.spdk:cnode1"
HOST = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-0000000000a1"
HOST2 = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-0000000000a2"
checks = {"passed": 0, "failed": 0}


def check(what, ok, detail=""):
    if ok:
        checks["passed"] += 1
        print(f"spdk-rpc: ok   {what}")
    else:
        checks["failed"] += 1
        print(f"spdk-rpc: FAIL {what} {detail}")
    return ok


def expect_error(c, what, code, method, **params):
    try:
        r = c.call(method, params)
        check(what, False, f"answered {r!r}")
    except JSONRPCException as e:
        # The client raises with SPDK's message: "request: ...\nGot JSON-RPC error response\n
        # response:\n{ code, message }".
        text = str(e)
        check(what, f'"code": {code}' in text, text.replace("\n", " ")[:300])


def start(conf_path, sock, port):
    log = open(conf_path + ".log", "w")
    p = subprocess.Popen([POLLUX, "--config", conf_path], stdout=log, stderr=log)
    t0 = time.time()
    while time.time() - t0 < 20:
        if os.path.exists(sock):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                return p
            except OSError:
                pass
        if p.poll() is not None:
            break
        time.sleep(0.05)
    raise SystemExit(f"spdk-rpc: pollux did not come up (see {conf_path}.log)")


def stop(p):
    p.terminate()
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()


def bare_target(work, name):
    """A pollux with only a control socket and one listener (which serves no subsystem), as
    an SPDK target starts before its RPC calls: (process, socket, listener port)."""
    sock, port = os.path.join(work, f"{name}.sock"), free_port()
    conf = os.path.join(work, f"{name}.toml")
    with open(conf, "w") as f:
        f.write(f'[reactors]\ncores = [0]\n\n[control]\nsocket = "{sock}"\n\n[[listener]]\naddress = "127.0.0.1:{port}"\n')
    return start(conf, sock, port), sock, port


def perf_verify(port, seconds="1", host=HOST, extra=(), nqn=NQN):
    r = subprocess.run([POLLUX, "perf", "-r", f"trtype:tcp traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn} hostnqn:{host}",
                        "-w", "randrw", "-q", "8", "-t", seconds, "--verify", "--no-pin", *extra],
                       capture_output=True, text=True, timeout=120)
    return r.returncode == 0, (r.stdout + r.stderr)[-600:]


def dhchap_key_file(path):
    """A DH-HMAC-CHAP secret as `nvme gen-dhchap-key` writes it (DHHC-1, no transform: 32
    random bytes and their CRC-32, base64), in an owner-only file."""
    import base64
    secret = os.urandom(32)
    text = "DHHC-1:00:" + base64.b64encode(secret + zlib.crc32(secret).to_bytes(4, "little")).decode() + ":"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    return path


def main():
    work = tempfile.mkdtemp(prefix="pollux-spdk-rpc-")
    target, sock, port = bare_target(work, "spdk")
    io_port = free_port()
    try:
        c = JSONRPCClient(sock, timeout=30)
        v = c.call("spdk_get_version")
        check("spdk_get_version has SPDK's fields", v.get("fields", {}).get("major") == 26, v)
        methods = c.call("rpc_get_methods")
        check("rpc_get_methods lists nvmf_create_subsystem", "nvmf_create_subsystem" in methods)
        check("framework_wait_init", c.call("framework_wait_init") is True)
        check("nvmf_get_transports before creating one: []", c.call("nvmf_get_transports") == [])
        check("nvmf_create_transport TCP", c.call("nvmf_create_transport", {"trtype": "TCP", "max_queue_depth": 128}) is True)
        expect_error(c, "a second TCP transport is refused", -32602, "nvmf_create_transport", trtype="TCP")
        expect_error(c, "RDMA is refused", -32602, "nvmf_create_transport", trtype="RDMA")
        t = c.call("nvmf_get_transports")
        check("nvmf_get_transports: TCP with its sizes", len(t) == 1 and t[0]["trtype"] == "TCP" and t[0]["in_capsule_data_size"] > 0, t)

        name = c.call("bdev_malloc_create", {"name": "Malloc0", "num_blocks": 32768, "block_size": 512})
        check("bdev_malloc_create answers its name", name == "Malloc0", name)
        auto = c.call("bdev_malloc_create", {"num_blocks": 2048, "block_size": 4096})
        check("a malloc bdev without a name gets MallocN", auto.startswith("Malloc"), auto)
        expect_error(c, "a bdev name used twice is refused", -32602, "bdev_malloc_create", name="Malloc0", num_blocks=8, block_size=512)
        expect_error(c, "a block size pollux cannot serve is refused", -32602, "bdev_malloc_create", name="M9", num_blocks=8, block_size=520)

        check("nvmf_create_subsystem", c.call("nvmf_create_subsystem", {
            "nqn": NQN, "serial_number": "SPDK00000000000001", "model_number": "pollux via SPDK RPC",
            "allow_any_host": False, "ana_reporting": True, "max_namespaces": 32}) is True)
        expect_error(c, "a subsystem created twice is refused", -32602, "nvmf_create_subsystem", nqn=NQN)
        expect_error(c, "nvmf_create_subsystem without nqn", -32602, "nvmf_create_subsystem", serial_number="X")
        la = {"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": str(io_port)}
        check("nvmf_subsystem_add_listener (a new address)", c.call("nvmf_subsystem_add_listener", {"nqn": NQN, "listen_address": la}) is True)
        check("nvmf_subsystem_add_ns answers the NSID", c.call("nvmf_subsystem_add_ns", {"nqn": NQN, "namespace": {"bdev_name": "Malloc0", "anagrpid": 1}}) == 1)
        expect_error(c, "a namespace on a bdev that does not exist", -32602, "nvmf_subsystem_add_ns", nqn=NQN, namespace={"bdev_name": "nope"})
        expect_error(c, "a bdev attached twice", -32602, "nvmf_subsystem_add_ns", nqn=NQN, namespace={"bdev_name": "Malloc0"})
        check("nvmf_subsystem_add_host", c.call("nvmf_subsystem_add_host", {"nqn": NQN, "host": HOST}) is True)
        expect_error(c, "a keyring key name (no keyring yet) is refused", -32602, "nvmf_subsystem_add_host", nqn=NQN, host=HOST + "x", dhchap_key="key0")

        # A host with a DH-HMAC-CHAP key from SPDK's keyring (ceph-nvmeof's way).
        key = dhchap_key_file(os.path.join(work, "host2.key"))
        check("keyring_file_add_key", c.call("keyring_file_add_key", {"name": "key0", "path": key}) is True)
        loose = os.path.join(work, "loose.key")
        with open(loose, "w") as f:
            f.write(open(key).read())
        os.chmod(loose, 0o644)
        expect_error(c, "a key file others may read is refused", -32602, "keyring_file_add_key", name="key1", path=loose)
        keys = c.call("keyring_get_keys")
        check("keyring_get_keys: the name and path, not the key", keys == [{"name": "key0", "path": key, "removed": False, "probed": True, "refcnt": 1}], keys)
        check("nvmf_subsystem_add_host with dhchap_key", c.call("nvmf_subsystem_add_host", {"nqn": NQN, "host": HOST2, "dhchap_key": "key0"}) is True)
        ok, out = perf_verify(io_port, "0.5", HOST2, ("--dhchap-key-file", key))
        check("that host authenticates (DH-HMAC-CHAP) and does verified I/O", ok, out)
        ok, _ = perf_verify(io_port, "0.5", HOST2)
        check("without its key it is refused", not ok)

        subs = c.call("nvmf_get_subsystems")
        mine = [s for s in subs if s["nqn"] == NQN]
        check("nvmf_get_subsystems lists the discovery subsystem first", subs[0]["subtype"] == "Discovery", subs[0])
        ok = (len(mine) == 1 and mine[0]["subtype"] == "NVMe" and mine[0]["serial_number"] == "SPDK00000000000001"
              and mine[0]["listen_addresses"] == [{"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": str(io_port)}]
              and mine[0]["hosts"] == [{"nqn": HOST}, {"nqn": HOST2}]
              and [(n["nsid"], n["bdev_name"], n["anagrpid"]) for n in mine[0]["namespaces"]] == [(1, "Malloc0", 1)])
        check("nvmf_get_subsystems in SPDK's shape", ok, json.dumps(mine))
        bdevs = {b["name"]: b for b in c.call("bdev_get_bdevs")}
        check("bdev_get_bdevs: Malloc0 claimed, 32768 blocks of 512", bdevs.get("Malloc0", {}).get("claimed") is True
              and bdevs["Malloc0"]["num_blocks"] == 32768 and bdevs["Malloc0"]["block_size"] == 512, bdevs.get("Malloc0"))
        listeners = c.call("nvmf_subsystem_get_listeners", {"nqn": NQN})
        check("nvmf_subsystem_get_listeners", len(listeners) == 1 and listeners[0]["address"]["trsvcid"] == str(io_port), listeners)

        ok, out = perf_verify(io_port)
        check("the host does verified I/O on the namespace the methods made", ok, out)
        st = c.call("bdev_get_iostat", {"name": "Malloc0"})["bdevs"]
        check("bdev_get_iostat counts the host's reads and writes", len(st) == 1 and st[0]["num_read_ops"] > 0
              and st[0]["num_write_ops"] > 0 and st[0]["bytes_written"] >= 512 * st[0]["num_write_ops"], st)
        check("bdev_set_qos_limit on the attached bdev", c.call("bdev_set_qos_limit", {"name": "Malloc0", "rw_ios_per_sec": 20000, "w_mbytes_per_sec": 50}) is True)
        r = subprocess.run([POLLUX, "ctl", "--socket", sock, "--json", "subsystems"], capture_output=True, text=True, timeout=30)
        qos = [n.get("qos") for s in json.loads(r.stdout) if s["nqn"] == NQN for n in s["namespaces"]]
        check("the namespace has those limits", qos and qos[0] and qos[0].get("iops") == 20000 and qos[0].get("write_mbps") == 50, qos)
        check("0 removes them", c.call("bdev_set_qos_limit", {"name": "Malloc0", "rw_ios_per_sec": 0, "w_mbytes_per_sec": 0}) is True)
        expect_error(c, "QoS on a bdev not attached is refused", -32602, "bdev_set_qos_limit", name=auto, rw_ios_per_sec=1000)
        idle = subprocess.Popen([POLLUX, "perf", "-r", f"trtype:tcp traddr:127.0.0.1 trsvcid:{io_port} subnqn:{NQN} hostnqn:{HOST}",
                                 "-w", "idle", "-t", "3", "--no-pin"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ctrls = []
        for _ in range(50):
            ctrls = c.call("nvmf_subsystem_get_controllers", {"nqn": NQN})
            if ctrls:
                break
            time.sleep(0.05)
        check("nvmf_subsystem_get_controllers shows the connected host", len(ctrls) == 1 and ctrls[0]["hostnqn"] == HOST
              and ctrls[0]["num_io_qpairs"] >= 1, ctrls)
        qp = c.call("nvmf_subsystem_get_qpairs", {"nqn": NQN})
        check("nvmf_subsystem_get_qpairs: its admin and I/O queues, through the listener they came by",
              ctrls and sorted(q["qid"] for q in qp) == list(range(ctrls[0]["num_io_qpairs"] + 1))
              and all(q["cntlid"] == ctrls[0]["cntlid"] and q["listen_address"]["trsvcid"] == str(io_port) for q in qp), qp)
        stats = c.call("nvmf_get_stats")
        groups = stats.get("poll_groups", [])
        check("nvmf_get_stats: a poll group per reactor, the host's queues among them",
              groups and sum(g["current_admin_qpairs"] for g in groups) >= 1
              and sum(g["current_io_qpairs"] for g in groups) >= 1 and groups[0]["name"].startswith("nvmf_tgt_poll_group_"), stats)
        idle.wait(timeout=30)
        check("nvmf_subsystem_listener_set_ana_state", c.call("nvmf_subsystem_listener_set_ana_state", {
            "nqn": NQN, "listen_address": la, "ana_state": "non_optimized", "anagrpid": 1}) is True)
        states = c.call("nvmf_subsystem_get_listeners", {"nqn": NQN})[0]["ana_states"]
        check("the listener reports the group non_optimized", states == [{"ana_group": 1, "ana_state": "non_optimized"}], states)
        check("log_set_level DEBUG", c.call("log_set_level", {"level": "DEBUG"}) is True)
        check("log_get_level", c.call("log_get_level") == "DEBUG")
        c.call("log_set_level", {"level": "INFO"})
        # The subsystem is only on the listener SPDK's methods named.
        r = subprocess.run([POLLUX, "perf", "-r", f"trtype:tcp traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN} hostnqn:{HOST}",
                            "-t", "0.2", "--no-pin", "--timeout", "3"], capture_output=True, text=True, timeout=60)
        check("not served on the other listener", r.returncode != 0, r.stdout[-200:])

        # Bad input leaves the state as it was.
        expect_error(c, "an unknown method: -32601", -32601, "nvmf_no_such_method")
        expect_error(c, "a param of the wrong type", -32602, "nvmf_subsystem_allow_any_host", nqn=NQN, allow_any_host="yes")
        after = [s for s in c.call("nvmf_get_subsystems") if s["nqn"] == NQN]
        check("refused calls changed nothing", after == mine, json.dumps(after))

        # The same over SPDK's command line (rpc.py).
        cli = shutil.which("spdk-rpc") or os.path.join(os.path.dirname(sys.executable), "spdk-rpc")
        r = subprocess.run([cli, "-s", sock, "nvmf_get_subsystems"], capture_output=True, text=True, timeout=60)
        check("spdk-rpc (rpc.py) nvmf_get_subsystems", r.returncode == 0 and NQN in r.stdout, (r.stdout + r.stderr)[-300:])
        r = subprocess.run([cli, "-s", sock, "bdev_null_create", "Null0", "64", "4096"], capture_output=True, text=True, timeout=60)
        check("spdk-rpc bdev_null_create Null0 64 4096", r.returncode == 0 and "Null0" in r.stdout, (r.stdout + r.stderr)[-300:])
        r = subprocess.run([cli, "-s", sock, "nvmf_subsystem_add_ns", NQN, "Null0"], capture_output=True, text=True, timeout=60)
        ns = [(n["nsid"], n["bdev_name"]) for s in c.call("nvmf_get_subsystems") if s["nqn"] == NQN for n in s["namespaces"]]
        check("spdk-rpc nvmf_subsystem_add_ns NQN Null0", r.returncode == 0 and (2, "Null0") in ns, (r.stdout + r.stderr)[-300:] + str(ns))

        # What the methods did is a run-time change like pollux's own: saved into a conf.
        saved = os.path.join(work, "saved.toml")
        r = subprocess.run([POLLUX, "ctl", "--socket", sock, "save", "--to", saved], capture_output=True, text=True, timeout=30)
        check("pollux ctl save", r.returncode == 0, r.stderr)
        text = open(saved).read() if os.path.exists(saved) else ""
        check("the saved conf has the subsystem, its listener and namespaces", NQN in text and f"127.0.0.1:{io_port}" in text
              and "ram" in text and "null" in text, text[-800:])
        r = subprocess.run([POLLUX, "--check", saved], capture_output=True, text=True, timeout=30)
        check("pollux --check accepts the saved conf", r.returncode == 0, r.stdout + r.stderr)

        # Tear-down in SPDK's order.
        check("nvmf_subsystem_remove_ns 2", c.call("nvmf_subsystem_remove_ns", {"nqn": NQN, "nsid": 2}) is True)
        check("bdev_null_delete", c.call("bdev_null_delete", {"name": "Null0"}) is True)
        check("nvmf_subsystem_remove_listener", c.call("nvmf_subsystem_remove_listener", {"nqn": NQN, "listen_address": la}) is True)
        check("nvmf_delete_subsystem", c.call("nvmf_delete_subsystem", {"nqn": NQN}) is True)
        check("the subsystem is gone", all(s["nqn"] != NQN for s in c.call("nvmf_get_subsystems")))
        check("Malloc0 is free again", c.call("bdev_get_bdevs", {"name": "Malloc0"})[0]["claimed"] is False)
        check("bdev_malloc_delete", c.call("bdev_malloc_delete", {"name": "Malloc0"}) is True)
        c.close()
    finally:
        stop(target)

    # A fresh pollux serves what was saved.
    fresh_sock = os.path.join(work, "fresh.sock")
    text = open(saved).read().replace(sock, fresh_sock)
    with open(saved, "w") as f:
        f.write(text)
    target = start(saved, fresh_sock, io_port)
    try:
        ok, out = perf_verify(io_port, "0.5")
        check("a fresh pollux from the saved conf serves the namespace", ok, out)
        c = JSONRPCClient(fresh_sock, timeout=30)
        mine = [s for s in c.call("nvmf_get_subsystems") if s["nqn"] == NQN]
        check("and reports it through SPDK's method", len(mine) == 1 and len(mine[0]["namespaces"]) == 2, json.dumps(mine))
        c.close()
    finally:
        stop(target)
    spdk_configs(work)
    spdk_framework(work)
    nvmet_configs(work)
    rbd_bdevs(work)
    shutil.rmtree(work, ignore_errors=True)
    print(f"{checks['passed']} passed, {checks['failed']} failed")
    sys.exit(1 if checks["failed"] else 0)


# The keys spdk_top (SPDK v26.05 app/spdk_top) decodes strictly: an object with a key it
# does not know, or without one it needs, fails its whole view.
TOP_THREAD_KEYS = {"name", "id", "cpumask", "busy", "idle", "active_pollers_count", "timed_pollers_count", "paused_pollers_count"}
TOP_CORE_KEYS = {"lcore", "busy", "idle", "irq", "sys", "usr", "in_interrupt", "lw_threads", "tid", "numa_id"}
TOP_LW_THREAD_KEYS = {"name", "id", "cpumask", "elapsed"}
TOP_POLLER_KEYS = {"name", "state", "id", "run_count", "busy_count"}


def spdk_framework(work):
    """spdk_top's methods (framework_get_reactors, thread_get_stats, thread_get_pollers,
    framework_get_scheduler) in the shapes it decodes, each pollux reactor an SPDK reactor
    with one thread; SPDK's spdk_top itself where an SPDK build is at hand (SPDK_DIR). And
    nvmf_set_config's DH-HMAC-CHAP digests and groups: the subsystems' from then on, used
    by the next authentication and written back by save_config."""
    sock, port = os.path.join(work, "fw.sock"), free_port()
    conf = os.path.join(work, "fw.toml")
    with open(conf, "w") as f:
        f.write(f'[reactors]\ncores = [0, 1]\nmode = "interrupt"\n\n[control]\nsocket = "{sock}"\n\n[[listener]]\naddress = "127.0.0.1:{port}"\n')
    target = start(conf, sock, port)
    try:
        c = JSONRPCClient(sock, timeout=30)
        r = c.call("framework_get_reactors")
        cores = r.get("reactors", [])
        check("framework_get_reactors: a reactor per pollux reactor, in spdk_top's keys",
              r.get("tick_rate") == 10**9 and r.get("pid") == target.pid and [x["lcore"] for x in cores] == [0, 1]
              and all(set(x) == TOP_CORE_KEYS and len(x["lw_threads"]) == 1 and set(x["lw_threads"][0]) == TOP_LW_THREAD_KEYS
                      and x["in_interrupt"] is True and x["tid"] > 0 for x in cores), r)
        st = c.call("thread_get_stats")
        threads = st.get("threads", [])
        check("thread_get_stats: the same threads, in spdk_top's keys",
              [t["name"] for t in threads] == ["nvmf_tgt_poll_group_000", "nvmf_tgt_poll_group_001"]
              and [t["id"] for t in threads] == [x["lw_threads"][0]["id"] for x in cores]
              and all(set(t) == TOP_THREAD_KEYS and t["cpumask"] == str(1 << i) for i, t in enumerate(threads)), st)
        pl = c.call("thread_get_pollers")
        check("thread_get_pollers: each thread's poller, waiting in interrupt mode",
              all(len(t["active_pollers"]) == 1 and set(t["active_pollers"][0]) == TOP_POLLER_KEYS
                  and t["active_pollers"][0]["state"] == "waiting" and t["timed_pollers"] == [] == t["paused_pollers"]
                  for t in pl.get("threads", [])) and len(pl.get("threads", [])) == 2, pl)
        sc = c.call("framework_get_scheduler")
        check("framework_get_scheduler", sc.get("scheduler_name") == "static" and "scheduler_period" in sc, sc)
        expect_error(c, "framework_get_reactors takes no params", -32602, "framework_get_reactors", x=1)
        # A reactor switched to busy-poll shows so.
        for i in (0, 1):
            subprocess.run([POLLUX, "ctl", "--socket", sock, "set-mode", str(i), "poll"], capture_output=True, timeout=30)
        cores = c.call("framework_get_reactors")["reactors"]
        pl = c.call("thread_get_pollers")["threads"]
        check("a reactor in busy-poll: not in interrupt, its poller running",
              all(x["in_interrupt"] is False for x in cores) and all(t["active_pollers"][0]["state"] == "running" for t in pl), (cores, pl))
        for i in (0, 1):
            subprocess.run([POLLUX, "ctl", "--socket", sock, "set-mode", str(i), "interrupt"], capture_output=True, timeout=30)

        top = os.path.join(os.environ.get("SPDK_DIR", "/tmp/anchors/spdk"), "build/bin/spdk_top")
        if os.access(top, os.X_OK) and shutil.which("script"):
            out = os.path.join(work, "spdk_top.out")
            # The cores tab, the pollers tab, the threads tab again (its first frame comes
            # before spdk_top has read the cores: core -1, as with SPDK's own target), quit.
            keys = subprocess.Popen(["sh", "-c", "sleep 3; printf 3; sleep 3; printf 2; sleep 3; printf 1; sleep 3; printf q"],
                                    stdout=subprocess.PIPE)
            subprocess.run(["script", "-qfec", f"stty cols 200 rows 50; {top} -r {sock}", out], stdin=keys.stdout,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "TERM": "xterm"}, timeout=60)
            keys.wait()
            import re
            screen = re.sub(r"\x1b(\[[0-9;?]*[a-zA-Z]|\([0B])", " ", open(out, errors="replace").read())
            screen = " ".join(screen.split())
            check("SPDK's spdk_top shows pollux's threads on their cores, the cores in interrupt mode, the pollers",
                  re.search(r"nvmf_tgt_poll_group_000 0 1 ", screen) and re.search(r"nvmf_tgt_poll_group_001 1 1 ", screen)
                  and re.search(r"(^| )1 1 1 \d+ \d+ [\d.]+ Idle Yes ", screen)
                  and "pollux_reactor_interrupt Active nvmf_tgt_poll_group_001" in screen, screen[-1200:])
        else:
            print("spdk-rpc: spdk_top not built here (SPDK_DIR): SPDK's own viewer not run")

        # nvmf_set_config: DH-HMAC-CHAP digests and groups for the target's subsystems.
        expect_error(c, "nvmf_set_config with admin command passthrough: refused", -32602, "nvmf_set_config",
                     admin_cmd_passthru={"identify_ctrlr": True})
        expect_error(c, "nvmf_set_config with an unknown digest: refused", -32602, "nvmf_set_config", dhchap_digests=["md5"])
        check("nvmf_set_config dhchap_digests, dhchap_dhgroups", c.call("nvmf_set_config", {
            "dhchap_digests": ["sha512"], "dhchap_dhgroups": ["ffdhe3072"]}) is True)
        key = dhchap_key_file(os.path.join(work, "fw-host.key"))
        c.call("keyring_file_add_key", {"name": "fwkey", "path": key})
        c.call("bdev_malloc_create", {"name": "Malloc9", "num_blocks": 8192, "block_size": 512})
        c.call("nvmf_create_subsystem", {"nqn": NQN})
        c.call("nvmf_subsystem_add_ns", {"nqn": NQN, "namespace": {"bdev_name": "Malloc9"}})
        c.call("nvmf_subsystem_add_listener", {"nqn": NQN, "listen_address": {"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": str(port)}})
        c.call("nvmf_subsystem_add_host", {"nqn": NQN, "host": HOST2, "dhchap_key": "fwkey"})
        perf = subprocess.Popen([POLLUX, "perf", "-r", f"trtype:tcp traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN} hostnqn:{HOST2}",
                                 "-w", "randrw", "-q", "4", "-t", "4", "--verify", "--no-pin", "--dhchap-key-file", key],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ctrls, t0 = [], time.time()
        # Until its admin queue has authenticated (the controller exists from the Connect).
        while time.time() - t0 < 20 and not (ctrls and "auth" in ctrls[0]):
            ctrls = c.call("nvmf_subsystem_get_controllers", {"nqn": NQN})
            time.sleep(0.1)
        out, _ = perf.communicate(timeout=60)
        check("the host authenticated with the digest and group nvmf_set_config left, in SPDK's auth shape",
              ctrls and ctrls[0].get("auth") == {"state": "completed", "digest": "sha512", "dhgroup": "ffdhe3072"}, ctrls)
        check("and did verified I/O", perf.returncode == 0, out[-400:])
        doc = c.call("save_config")
        sets = [e["params"] for sub in doc["subsystems"] for e in sub["config"] if e["method"] == "nvmf_set_config"]
        check("save_config writes nvmf_set_config back", sets == [{"dhchap_digests": ["sha512"], "dhchap_dhgroups": ["ffdhe3072"]}], sets)
        expect_error(c, "nvmf_set_config with an unknown discovery_filter: refused", -32602, "nvmf_set_config", discovery_filter="port")
        check("nvmf_set_config discovery_filter", c.call("nvmf_set_config", {"discovery_filter": "address,svcid"}) is True)
        doc = c.call("save_config")
        sets = [e["params"] for sub in doc["subsystems"] for e in sub["config"] if e["method"] == "nvmf_set_config"]
        check("and saved as [discovery] filter, written back", {"discovery_filter": "address,svcid"} in sets, sets)
        c.close()
    finally:
        stop(target)


def start_spdk_config(path, port, what):
    log = open(path + ".log", "w")
    p = subprocess.Popen([POLLUX, "--spdk-config", path], stdout=log, stderr=log)
    t0 = time.time()
    while time.time() - t0 < 20:
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            time.sleep(0.3)  # the config's calls follow the listeners
            return p
        except OSError:
            if p.poll() is not None:
                break
            time.sleep(0.05)
    stop(p)
    check(what, False, open(path + ".log").read()[-500:])
    return None


def spdk_configs(work):
    """SPDK JSON configs: one pollux writes (save_config) served by a fresh pollux, and one
    SPDK's own nvmf_tgt wrote (v26.05 save_config after rpc.py calls: a malloc and a null
    bdev, a subsystem with a host, two namespaces and a listener), served by pollux."""
    target, sock, _ = bare_target(work, "cfg")
    port = free_port()
    saved = os.path.join(work, "spdk.json")
    try:
        c = JSONRPCClient(sock, timeout=30)
        c.call("nvmf_create_transport", {"trtype": "TCP"})
        c.call("bdev_malloc_create", {"name": "Malloc7", "num_blocks": 16384, "block_size": 4096})
        c.call("nvmf_create_subsystem", {"nqn": NQN, "allow_any_host": True})
        c.call("nvmf_subsystem_add_ns", {"nqn": NQN, "namespace": {"bdev_name": "Malloc7"}})
        c.call("nvmf_subsystem_add_listener", {"nqn": NQN, "listen_address": {"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": str(port)}})
        doc = c.call("save_config")
        methods = [e["method"] for sub in doc["subsystems"] for e in sub["config"]]
        check("save_config: bdev and nvmf calls in SPDK's form", "bdev_malloc_create" in methods and methods.index("nvmf_create_subsystem") < methods.index("nvmf_subsystem_add_ns") < methods.index("nvmf_subsystem_add_listener"), methods)
        r = subprocess.run([POLLUX, "ctl", "--socket", sock, "save", "--spdk-config", saved], capture_output=True, text=True, timeout=30)
        check("pollux ctl save --spdk-config", r.returncode == 0 and os.path.exists(saved), r.stderr)
        c.close()
    finally:
        stop(target)
    target = start_spdk_config(saved, port, "pollux --spdk-config (its own save) starts")
    if target:
        try:
            ok, out = perf_verify(port, "0.5")
            check("pollux --spdk-config serves what save_config wrote", ok, out)
        finally:
            stop(target)

    # A config SPDK's nvmf_tgt wrote, its listener moved to a free port.
    here = os.path.dirname(os.path.abspath(__file__))
    doc = json.load(open(os.path.join(here, "fixtures", "spdk-v26.05-nvmf_tgt-save_config.json")))
    port2 = free_port()
    for sub in doc["subsystems"]:
        for e in sub.get("config") or []:
            if e["method"] == "nvmf_subsystem_add_listener":
                e["params"]["listen_address"]["trsvcid"] = str(port2)
    theirs = os.path.join(work, "nvmf_tgt.json")
    json.dump(doc, open(theirs, "w"))
    target = start_spdk_config(theirs, port2, "pollux --spdk-config (nvmf_tgt's save_config) starts")
    if target:
        try:
            ok, out = perf_verify(port2, "0.5")
            check("pollux serves the config SPDK's nvmf_tgt saved (the allowed host, verified I/O)", ok, out)
            ok, _ = perf_verify(port2, "0.3", HOST2)
            check("and refuses a host it does not list", not ok)
        finally:
            stop(target)
    # pollux convert --from spdk: the conf that serves it, written while the port it names
    # is held by another process (the SPDK target still serving, say); the conf validates,
    # names that port, and a pollux from it serves the allowed host.
    holder = socket.socket()
    # The stopped target's connections may linger in TIME_WAIT on that port.
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", port2))
    holder.listen()
    r = subprocess.run([POLLUX, "convert", "--from", "spdk", theirs], capture_output=True, text=True, timeout=120)
    holder.close()
    converted = os.path.join(work, "converted.toml")
    with open(converted, "w") as f:
        f.write(r.stdout)
    check("pollux convert --from spdk, its port held by another process", r.returncode == 0
          and f'"127.0.0.1:{port2}"' in r.stdout and "nqn.2016-06.io.spdk:cnode1" in r.stdout
          and r.stdout.count("[[subsystem.namespace]]") == 2 and "sock_impl_set_options" in r.stdout, (r.stdout + r.stderr)[-800:])
    r = subprocess.run([POLLUX, "--check", converted], capture_output=True, text=True, timeout=60)
    check("pollux --check accepts the converted conf", r.returncode == 0, r.stdout + r.stderr)
    log = open(converted + ".log", "w")
    target = subprocess.Popen([POLLUX, "--config", converted, "-r", "none"], stdout=log, stderr=log)
    try:
        t0 = time.time()
        while time.time() - t0 < 20:
            try:
                socket.create_connection(("127.0.0.1", port2)).close()
                break
            except OSError:
                time.sleep(0.05)
        ok, out = perf_verify(port2, "0.5")
        check("a pollux from the converted conf serves the allowed host (verified I/O)", ok, out)
    finally:
        stop(target)
    bad = os.path.join(work, "bad.json")
    with open(bad, "w") as f:
        json.dump({"subsystems": [{"subsystem": "nvmf", "config": [{"method": "nvmf_no_such", "params": {}}]}]}, f)
    r = subprocess.run([POLLUX, "convert", "--from", "spdk", bad], capture_output=True, text=True, timeout=60)
    check("convert refuses a method pollux lacks, naming it", r.returncode == 2 and "nvmf_no_such" in r.stderr, r.stderr)

    # The same file through rpc.py's own load_config (the client replays it, checking every
    # method against rpc_get_methods) into a running pollux, and rpc.py's save_config back.
    target, sock3, _ = bare_target(work, "load")
    try:
        cli = shutil.which("spdk-rpc") or os.path.join(os.path.dirname(sys.executable), "spdk-rpc")
        with open(theirs) as f:
            r = subprocess.run([cli, "-s", sock3, "load_config"], stdin=f, capture_output=True, text=True, timeout=60)
        check("rpc.py load_config of nvmf_tgt's config", r.returncode == 0, (r.stdout + r.stderr)[-500:])
        ok, out = perf_verify(port2, "0.5")
        check("and the host does verified I/O on it", ok, out)
        r = subprocess.run([cli, "-s", sock3, "save_config"], capture_output=True, text=True, timeout=60)
        saved2 = json.loads(r.stdout) if r.returncode == 0 else {}
        names = [e["params"].get("name") for sub in saved2.get("subsystems", []) for e in sub.get("config") or [] if e["method"].startswith("bdev_")]
        check("rpc.py save_config: SPDK's bdev names kept", r.returncode == 0 and "Malloc0" in names and "Null0" in names, (r.stdout + r.stderr)[-500:])
    finally:
        stop(target)

    # A method pollux does not have is refused by name; nothing is served.
    doc["subsystems"].append({"subsystem": "lvol", "config": [{"method": "bdev_lvol_create_lvstore", "params": {"bdev_name": "Malloc0", "lvs_name": "lvs"}}]})
    bad = os.path.join(work, "bad.json")
    json.dump(doc, open(bad, "w"))
    r = subprocess.run([POLLUX, "--spdk-config", bad], capture_output=True, text=True, timeout=30)
    check("a config with a method pollux lacks is refused, naming it", r.returncode == 2 and "bdev_lvol_create_lvstore" in r.stderr + r.stdout, (r.stderr + r.stdout)[-300:])


def nvmet_configs(work):
    """An nvmetcli config.json (Linux nvmet's, as nvmetcli saves it: two ports, ANA group 2
    non-optimized on the second, a referral, a subsystem with an allowed host and a namespace
    on a file) served by pollux; `pollux ctl export-nvmet` writes it back, and that serves
    the same; `pollux convert --from nvmet` prints the conf."""
    here = os.path.dirname(os.path.abspath(__file__))
    img = os.path.join(work, "nvmet.img")
    with open(img, "wb") as f:
        f.truncate(64 << 20)
    p1, p2 = free_port(), free_port()
    text = open(os.path.join(here, "fixtures", "nvmetcli-config.json")).read()
    text = text.replace("@PORT1@", str(p1)).replace("@PORT2@", str(p2)).replace("@FILE@", img)
    cfg = os.path.join(work, "nvmet.json")
    with open(cfg, "w") as f:
        f.write(text)
    r = subprocess.run([POLLUX, "convert", "--from", "nvmet", cfg], capture_output=True, text=True, timeout=30)
    check("pollux convert --from nvmet", r.returncode == 0 and "[[subsystem]]" in r.stdout and "ana = { 2 = \"non-optimized\" }" in r.stdout, (r.stdout + r.stderr)[-600:])
    for what, path in (("nvmetcli's config", cfg), ("the exported config", os.path.join(work, "exported.json"))):
        log = open(path + ".log", "w")
        # nvmetcli's config has no place for a control socket: `-r` names one, as for SPDK's
        # nvmf_tgt (never the machine's default one, which another target may hold).
        sock = os.path.join(work, "nvmet.sock")
        target = subprocess.Popen([POLLUX, "--nvmet-config", path, "-r", sock], stdout=log, stderr=log)
        try:
            up = False
            for _ in range(200):
                try:
                    socket.create_connection(("127.0.0.1", p2)).close()
                    up = True
                    break
                except OSError:
                    if target.poll() is not None:
                        break
                    time.sleep(0.05)
            check(f"pollux --nvmet-config ({what}) starts", up, open(path + ".log").read()[-400:])
            if not up:
                continue
            # The namespace is in ANA group 2, which port 1 does not list: Linux nvmet reports
            # it inaccessible there (every group but 1 starts so on a port), so pollux does.
            ok, out = perf_verify(p2, "0.4")
            check(f"{what}: the allowed host does verified I/O through port 2 (group 2 non-optimized)", ok, out)
            ok, out = perf_verify(p1, "0.3")
            check(f"{what}: through port 1, which lists only group 1, ANA Inaccessible as with nvmet",
                  not ok and "Asymmetric Access Inaccessible" in out, out)
            ok, _ = perf_verify(p1, "0.3", HOST2)
            check(f"{what}: a host not allowed is refused", not ok)
            if path == cfg:
                r = subprocess.run([POLLUX, "ctl", "--socket", sock, "export-nvmet", os.path.join(work, "exported.json")],
                                   capture_output=True, text=True, timeout=30)
                check("pollux ctl export-nvmet", r.returncode == 0, r.stdout + r.stderr)
                exported = json.load(open(os.path.join(work, "exported.json")))
                ns = exported["subsystems"][0]["namespaces"][0]
                check("the export has nvmetcli's shape", ns["device"]["path"] == img and ns["ana_grpid"] == 2
                      and [p["addr"]["trsvcid"] for p in exported["ports"]] == [str(p1), str(p2)], json.dumps(exported)[:600])
        finally:
            stop(target)


def rbd_bdevs(work):
    """Ceph's NVMe-oF gateway's sequence through SPDK's client against a real cluster
    (ci/ceph.sh): a cluster registered by name, an image made a bdev (its size read from the
    cluster), attached as a namespace that serves verified I/O, written out by save_config as
    SPDK's calls and served again from them; a cluster in use cannot be unregistered; the
    bdev deleted takes its namespace. Skipped (saying so) without Ceph, unless
    POLLUX_REQUIRE_CEPH is set."""
    have = all(shutil.which(c) for c in ("ceph-mon", "ceph-osd", "rbd")) and os.path.exists(
        "/usr/lib/x86_64-linux-gnu/librbd.so.1")
    if not have:
        if os.environ.get("POLLUX_REQUIRE_CEPH"):
            check("Ceph is installed (POLLUX_REQUIRE_CEPH)", False)
        else:
            print("spdk-rpc: no Ceph on this machine: the rbd bdev checks are not run")
        return
    here = os.path.dirname(os.path.abspath(__file__))
    cdir = os.path.join(work, "ceph")
    r = subprocess.run(["bash", os.path.join(here, "ceph.sh"), "start", cdir], capture_output=True, text=True,
                       timeout=180, env=dict(os.environ, CEPH_IMG_SIZE="64M"))
    if not check("a one-node Ceph cluster (ci/ceph.sh)", r.returncode == 0, (r.stdout + r.stderr)[-600:]):
        return
    conf = os.path.join(cdir, "ceph.conf")
    nqn = "nqn.2016-06.io.spdk:rbd1"
    target, sock, _ = bare_target(work, "rbd")
    port = free_port()
    try:
        c = JSONRPCClient(sock, timeout=60)
        c.call("nvmf_create_transport", {"trtype": "TCP"})
        check("bdev_rbd_register_cluster", c.call("bdev_rbd_register_cluster", {
            "name": "cluster_a", "user_id": "admin", "config_file": conf}) == "cluster_a")
        info = c.call("bdev_rbd_get_clusters_info", {"name": "cluster_a"})
        check("bdev_rbd_get_clusters_info", info.get("config_file") == conf, info)
        expect_error(c, "librados settings as key-values are refused, naming the conf file way", -32602,
                     "bdev_rbd_register_cluster", name="cluster_b", config_param={"mon_host": "127.0.0.1"})
        name = c.call("bdev_rbd_create", {"pool_name": "rbd", "rbd_name": "img0", "block_size": 4096,
                                          "cluster_name": "cluster_a"})
        check("bdev_rbd_create answers CephN", name.startswith("Ceph"), name)
        b = c.call("bdev_get_bdevs", {"name": name})[0]
        check("the bdev has the image's size and SPDK's product name",
              b["num_blocks"] == (64 << 20) // 4096 and b["product_name"] == "Ceph Rbd Disk", b)
        expect_error(c, "an image that does not exist is refused", -32602, "bdev_rbd_create",
                     pool_name="rbd", rbd_name="nope", block_size=4096, cluster_name="cluster_a")
        c.call("nvmf_create_subsystem", {"nqn": nqn, "allow_any_host": True})
        nsid = c.call("nvmf_subsystem_add_ns", {"nqn": nqn, "namespace": {"bdev_name": name}})
        c.call("nvmf_subsystem_add_listener", {"nqn": nqn, "listen_address": {
            "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": str(port)}})
        ok, out = perf_verify(port, nqn=nqn)
        check("the rbd namespace serves verified I/O", ok, out)
        expect_error(c, "a cluster in use cannot be unregistered", -32602, "bdev_rbd_unregister_cluster", name="cluster_a")
        saved = c.call("save_config")
        calls = [x["method"] for s in saved["subsystems"] if s["subsystem"] == "bdev" for x in s["config"]]
        check("save_config: the cluster registered, then the image", calls.index("bdev_rbd_register_cluster")
              < calls.index("bdev_rbd_create"), calls)
        path = os.path.join(work, "rbd-saved.json")
        with open(path, "w") as f:
            json.dump(saved, f)
        check("bdev_rbd_delete", c.call("bdev_rbd_delete", {"name": name}) is True)
        gone = [s for s in c.call("nvmf_get_subsystems") if s["nqn"] == nqn]
        check("and its namespace is gone", gone and not gone[0]["namespaces"], gone)
        check("bdev_rbd_unregister_cluster", c.call("bdev_rbd_unregister_cluster", {"name": "cluster_a"}) is True)
        c.close()
    finally:
        stop(target)
    # The saved config served by a fresh pollux (its listener on another port).
    p2 = free_port()
    with open(path) as f:
        text = f.read().replace(f'"trsvcid": "{port}"', f'"trsvcid": "{p2}"')
    with open(path, "w") as f:
        f.write(text)
    log = open(path + ".log", "w")
    t2 = subprocess.Popen([POLLUX, "--spdk-config", path, "-r", os.path.join(work, "rbd2.sock")], stdout=log, stderr=log)
    try:
        up = wait_port(p2, t2)
        check("pollux --spdk-config serves the saved rbd bdev", up, open(path + ".log").read()[-400:])
        if up:
            ok, out = perf_verify(p2, nqn=nqn)
            check("and it serves verified I/O", ok, out)
    finally:
        stop(t2)
        subprocess.run(["bash", os.path.join(here, "ceph.sh"), "stop", cdir], capture_output=True, timeout=120)


def wait_port(port, proc):
    for _ in range(400):
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            return True
        except OSError:
            if proc.poll() is not None:
                return False
            time.sleep(0.05)
    return False


if __name__ == "__main__":
    main()
