"""Mixtral-style MoE family: a top-k router over SwiGLU experts in every block.

``model.py`` is single-device code; ``expert_parallel.py`` shards the experts over ranks and
exchanges tokens with ``all_to_all_single``.
"""

from .model import FLAVOURS, GroupedExperts, MoELayer, build_moe_transformer

__all__ = ["FLAVOURS", "GroupedExperts", "MoELayer", "build_moe_transformer"]
