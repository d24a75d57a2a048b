"""Search strategies compared with infrarsi in ``benchmarks/search_efficiency.py``.

Every peer has the same ask/tell surface (``benchmarks.peers.base.Peer``): ``ask() -> config``,
``tell(config, Observation)``, ``best() -> config | None``. ``PEERS`` maps a name to a factory
``(space, memory_capacity_bytes, seed, baseline) -> Peer``.
"""

from __future__ import annotations

from benchmarks.peers.base import Observation, Peer, PeerFactory
from benchmarks.peers.grid import GridPeer
from benchmarks.peers.ramp import RampPeer
from benchmarks.peers.random_search import RandomPeer


def _ax(space, cap, seed, baseline):  # type: ignore[no-untyped-def]
    from benchmarks.peers.ax_peer import AxPeer

    return AxPeer(space, cap, seed, baseline)


def _optuna(space, cap, seed, baseline):  # type: ignore[no-untyped-def]
    from benchmarks.peers.optuna_peer import OptunaPeer

    return OptunaPeer(space, cap, seed, baseline)


PEERS: dict[str, PeerFactory] = {
    "random": RandomPeer,
    "grid": GridPeer,
    "ramp": RampPeer,
    "ax": _ax,
    "optuna_tpe": _optuna,
}
"""Peer name -> factory ``(space, memory_capacity_bytes, seed, baseline) -> Peer``."""

__all__ = ["PEERS", "Observation", "Peer", "PeerFactory"]
