#!/usr/bin/env python3
"""An nvmetcli config (the config.json `nvmetcli save` writes) as a POSIX sh script that
builds the same Linux nvmet target in configfs, step for step as `nvmetcli restore` does
(hosts, subsystems with their attributes, namespaces and allowed hosts, ports with their
address, parameters, ANA groups, referrals and subsystem links). For guests that have the
kernel's nvmet but no Python (ci/scenarios/pollux-nvmet-config.sh).

usage: nvmet-configfs.py [--buffered-io] CONFIG.json > nvmet.sh
  --buffered-io  every namespace read through the page cache (its `buffered_io`): for files
                 on a guest's tmpfs, which has no O_DIRECT (nvmet's default for files)
"""
import json
import shlex
import sys

C = "/sys/kernel/config/nvmet"


def main():
    args = sys.argv[1:]
    buffered = "--buffered-io" in args
    args = [a for a in args if a != "--buffered-io"]
    cfg = json.load(open(args[0]))
    out = ["# made by ci/nvmet-configfs.py from " + args[0],
           "w() { printf '%s' \"$2\" > \"$1\" || die \"nvmet configfs: cannot write $2 to $1\"; }",
           "d() { mkdir \"$1\" || die \"nvmet configfs: cannot make $1\"; }",
           "l() { ln -s \"$1\" \"$2\" || die \"nvmet configfs: cannot link $2\"; }"]
    q = shlex.quote
    for h in cfg.get("hosts", []):
        path = f"{C}/hosts/{h['nqn']}"
        out.append(f"d {q(path)}")
        for k, v in h.get("dhchap", {}).items():
            out.append(f"w {q(path + '/dhchap_' + k)} {q(str(v))}")
    for s in cfg.get("subsystems", []):
        path = f"{C}/subsystems/{s['nqn']}"
        out.append(f"d {q(path)}")
        for k, v in s.get("attr", {}).items():
            out.append(f"w {q(path + '/attr_' + k)} {q(str(v))}")
        for n in s.get("namespaces", []):
            ns = f"{path}/namespaces/{n['nsid']}"
            out.append(f"d {q(ns)}")
            for k, v in n.get("device", {}).items():
                if v != "":
                    out.append(f"w {q(ns + '/device_' + k)} {q(str(v))}")
            if buffered:
                out.append(f"w {q(ns + '/buffered_io')} 1")
            if "ana_grpid" in n:
                out.append(f"w {q(ns + '/ana_grpid')} {q(str(n['ana_grpid']))}")
            out.append(f"w {q(ns + '/enable')} {q(str(n.get('enable', 1)))}")
        for h in s.get("allowed_hosts", []):
            out.append(f"l {q(C + '/hosts/' + h)} {q(path + '/allowed_hosts/' + h)}")
    for p in cfg.get("ports", []):
        path = f"{C}/ports/{p['portid']}"
        out.append(f"d {q(path)}")
        for k, v in p.get("addr", {}).items():
            out.append(f"w {q(path + '/addr_' + k)} {q(str(v))}")
        for k, v in p.get("param", {}).items():
            out.append(f"w {q(path + '/param_' + k)} {q(str(v))}")
        for g in p.get("ana_groups", []):
            gp = f"{path}/ana_groups/{g['grpid']}"
            if g["grpid"] != 1:
                out.append(f"d {q(gp)}")
            out.append(f"w {q(gp + '/ana_state')} {q(g['ana']['state'])}")
        for r in p.get("referrals", []):
            rp = f"{path}/referrals/{r['name']}"
            out.append(f"d {q(rp)}")
            for k, v in r.get("addr", {}).items():
                # A referral's portid is nvmetcli's bookkeeping, not an attribute everywhere.
                out.append(f"[ ! -e {q(rp + '/addr_' + k)} ] || w {q(rp + '/addr_' + k)} {q(str(v))}")
            out.append(f"w {q(rp + '/enable')} {q(str(r.get('enable', 1)))}")
        for s in p.get("subsystems", []):
            out.append(f"l {q(C + '/subsystems/' + s)} {q(path + '/subsystems/' + s)}")
    print("\n".join(out))


if __name__ == "__main__":
    main()
