"""The knob names declared once: each a distinct identifier, each registered by a handler."""

from __future__ import annotations

import ast
from pathlib import Path

import infrarsi.execution.surrogate.backend  # noqa: F401  (registers the surrogate knobs)
from infrarsi import knob_names
from infrarsi.execution.knobs.registry import KNOBS

ROOT = Path(__file__).resolve().parents[1]


def test_every_name_is_a_distinct_registered_identifier() -> None:
    names = knob_names.BUILTIN_KNOBS
    assert len(set(names)) == len(names)
    assert all(n.isidentifier() for n in names)
    assert set(names) <= set(KNOBS)
    constants = {v for k, v in vars(knob_names).items() if k.isupper() and isinstance(v, str)}
    assert constants == set(names)


def test_the_module_imports_nothing_so_the_search_core_may_use_it() -> None:
    tree = ast.parse((ROOT / "infrarsi" / "knob_names.py").read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in imports)


def test_the_prior_and_the_surrogate_read_knobs_by_these_names() -> None:
    for rel in ("infrarsi/search/priors/transformer.py", "infrarsi/execution/surrogate/model.py"):
        text = (ROOT / rel).read_text()
        for name in ("zero_stage", "micro_batch_size", "activation_checkpointing"):
            assert f'"{name}"' not in text, (
                f"{rel}: use infrarsi.knob_names instead of the literal {name!r}"
            )
