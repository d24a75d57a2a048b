"""What a user's training script's syntax tree tells, read without running it.

``read_script(path)`` parses the script (``ast``, never ``exec``) and returns a ``ScriptSource``:
how the script reaches its training engine (``ScriptKind``: its own ``deepspeed.initialize``, a
Hugging Face ``Trainer``, or plain torch) and the defaults of its own arguments (``argparse``
``add_argument`` calls and dataclass fields, the way ``HfArgumentParser`` scripts declare them).
``init --script`` reads the baseline's sequence length and step count from them; a rank uses the
kind to reach a ``Trainer`` script's ``TrainingArguments`` (``script_hf``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from infrarsi.errors import ConfigError

HF_NAMES = (
    "Trainer",
    "TrainingArguments",
    "HfArgumentParser",
    "Seq2SeqTrainer",
    "Seq2SeqTrainingArguments",
)
"""Names whose import from ``transformers`` marks a Hugging Face ``Trainer`` script."""

ScriptKind = Literal["deepspeed", "hf_trainer", "torch"]
"""How a script reaches its training engine: its own ``deepspeed.initialize`` call, a Hugging Face
``Trainer`` (through accelerate into ``deepspeed.initialize``), or plain torch (no DeepSpeed)."""


def option_name(opt: str) -> str:
    """A command-line option as a name: no leading dashes, ``_`` for ``-`` (``--max-steps`` -> ``max_steps``)."""
    return opt.lstrip("-").replace("-", "_")


@dataclass
class ScriptSource:
    """What the script's syntax tree tells, without running it."""

    kind: ScriptKind
    """How the script reaches its engine (``ScriptKind``)."""
    defaults: dict[str, Any]
    """Argument name (no dashes, ``_`` for ``-``) -> its default: ``argparse`` ``add_argument``
    calls and dataclass fields (``HfArgumentParser``) with a constant default."""


def read_script(path: Path) -> ScriptSource:
    """Parse ``path`` (never run it); ``ConfigError`` when it cannot be read or parsed."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as e:
        raise ConfigError(
            f"--script: script {str(path)!r}: rule: a Python file that parses; {type(e).__name__}: "
            f"{e}. Fix the script or the path"
        ) from None
    hf = deepspeed = False
    defaults: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "transformers":
            hf = hf or any(a.name in HF_NAMES for a in node.names)
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in HF_NAMES
            and isinstance(node.value, ast.Name)
            and node.value.id == "transformers"
        ):
            hf = True
        elif isinstance(node, ast.Import | ast.ImportFrom):
            mods = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            deepspeed = deepspeed or any(m.split(".")[0] == "deepspeed" for m in mods)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            names = [
                a.value
                for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str)
            ]
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            if isinstance(default, ast.Constant):
                for n in names:
                    if n.startswith("--"):
                        defaults.setdefault(option_name(n), default.value)
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.value is not None
        ):
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
                value = next((k.value for k in value.keywords if k.arg == "default"), None)  # type: ignore[assignment]
            if isinstance(value, ast.Constant):
                defaults.setdefault(node.target.id, value.value)
    kind: ScriptKind = "hf_trainer" if hf else "deepspeed" if deepspeed else "torch"
    return ScriptSource(kind=kind, defaults=defaults)


__all__ = ["HF_NAMES", "ScriptKind", "ScriptSource", "option_name", "read_script"]
