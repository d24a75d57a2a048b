"""Dense Llama-style family (RMSNorm, RoPE, SwiGLU, causal attention)."""

from .model import FLAVOURS, ModelArgs, Transformer

__all__ = ["FLAVOURS", "ModelArgs", "Transformer"]
