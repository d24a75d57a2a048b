"""The soak's Ray cluster: a ``ray.cluster_utils.Cluster`` in a child process, and the ``infrarsi`` CLI run against it.

The child process owns the cluster (a head without CPUs or ``memory`` and ``workers`` raylets)
and takes commands on its stdin, so the soak can SIGKILL a worker raylet mid-run and get a fresh
one of the same size. ``cli`` runs ``python -m infrarsi ...`` with the soak's environment (no Ray
token auth, no experience bank, this repository importable).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

_CLUSTER = r"""
import json, sys
from ray.cluster_utils import Cluster
cpus = int(sys.argv[1]); n = int(sys.argv[2])
c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "memory": 0}, connect=False)
workers = {}
for _ in range(n):
    node = c.add_node(num_cpus=cpus); workers[node.node_id] = node
c.wait_for_nodes()
def say(**kw): print(json.dumps(kw), flush=True)
say(address=c.address, head=c.head_node.node_id, workers=sorted(workers))
try:
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "remove":
            node = workers.pop(cmd["node_id"], None)
            if node is None:
                say(ok=False, error="unknown or head node"); continue
            c.remove_node(node, allow_graceful=False)
            new = c.add_node(num_cpus=cpus); workers[new.node_id] = new
            c.wait_for_nodes()
            say(ok=True, removed=cmd["node_id"], added=new.node_id, workers=sorted(workers))
        elif cmd["op"] == "quit":
            break
finally:
    c.shutdown()
"""


class LocalCluster:
    """A ``ray.cluster_utils.Cluster`` (head without CPUs + ``workers`` raylets) in a child process."""

    def __init__(self, workers: int = 2, cpus: int = 2) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CLUSTER, str(cpus), str(workers)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=soak_env(),
        )
        first = self._answer()
        self.address: str = first["address"]
        self.head: str = first["head"]
        self.workers: list[str] = list(first["workers"])

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the soak's Ray cluster process ended")
        return dict(json.loads(line))

    def remove(self, node_id: str) -> dict[str, Any]:
        """SIGKILL a worker raylet and its processes; a fresh raylet of the same size replaces it."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": "remove", "node_id": node_id}) + "\n")
        self.proc.stdin.flush()
        ans = self._answer()
        if ans.get("ok"):
            self.workers = list(ans["workers"])
        return ans

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def soak_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "PYTHONUNBUFFERED": "1",
        "INFRARSI_BANK": "off",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT),
    }


def cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "infrarsi", *args],
        capture_output=True,
        text=True,
        env=soak_env(),
        timeout=timeout,
        cwd=ROOT,
    )
    if r.returncode != 0:
        raise RuntimeError(f"infrarsi {' '.join(args)} exited {r.returncode}: {r.stderr[-3000:]}")
    return r
