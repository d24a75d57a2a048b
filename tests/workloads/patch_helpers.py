"""Load the workload package twice: as committed, and with a shipped patch applied.

``patched_package(name, tmp)`` copies ``workloads/`` into ``tmp``, applies
``workloads/patches/<name>.diff`` there with ``git apply`` (no repository needed) and imports the
copy under a package name of its own, so a test can run the patched and the committed code side
by side in one process (the package uses relative imports only).
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import torch

ROOT = Path(__file__).resolve().parents[2]


def patch_path(name: str) -> Path:
    return ROOT / "workloads" / "patches" / f"{name}.diff"


def patched_package(name: str, tmp: Path) -> ModuleType:
    """The ``workloads`` package with patch ``name`` applied, imported as ``patched_<name>``."""
    dst = tmp / f"patched_{name}"
    shutil.copytree(
        ROOT / "workloads", dst / "workloads", ignore=shutil.ignore_patterns("__pycache__")
    )
    subprocess.run(
        ["git", "apply", str(patch_path(name))], cwd=dst, check=True, capture_output=True
    )
    alias = f"patched_{name.replace('-', '_').replace('.', '_')}"
    for k in [k for k in sys.modules if k == alias or k.startswith(alias + ".")]:
        del sys.modules[k]
    spec = importlib.util.spec_from_file_location(
        alias,
        dst / "workloads" / "__init__.py",
        submodule_search_locations=[str(dst / "workloads")],
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[alias] = mod
    spec.loader.exec_module(mod)
    return mod


def patched_module(name: str, tmp: Path, sub: str) -> ModuleType:
    """Module ``workloads.<sub>`` of the patched copy (e.g. ``models.moe.model``)."""
    pkg = patched_package(name, tmp)
    return importlib.import_module(f"{pkg.__name__}.{sub}")


def assert_same_loss_and_grads(ma: torch.nn.Module, mb: torch.nn.Module, vocab: int = 256) -> None:
    """One forward/backward of ``ma`` (the committed code) and ``mb`` (the patched) on the same
    tokens: the same loss, and the same gradient for every parameter, by name."""
    tokens = torch.randint(0, vocab, (2, 33), generator=torch.Generator().manual_seed(2))
    losses = []
    for m in (ma, mb):
        logits = m(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1)
        )
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=1e-6)
    ga = dict(ma.named_parameters())
    for n, p in mb.named_parameters():
        assert p.grad is not None
        torch.testing.assert_close(p.grad, ga[n].grad, rtol=1e-4, atol=1e-6, msg=n)
