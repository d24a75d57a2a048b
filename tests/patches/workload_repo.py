"""A git repository holding a copy of the workload code, for the tests of code patches.

``make_repo`` builds it with a search space whose ``code_patch`` knob takes the given values, so
the patches apply to a committed tree whatever the state of this checkout; ``diff_patch`` writes
``workloads/patches/<name>.diff`` from a real edit (``git diff``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import git
import yaml

from infrarsi.patches import PATCH_KNOB

ROOT = Path(__file__).resolve().parents[2]
MODEL = "workloads/models/dense/model.py"
FAST = {"zero_stage": 0, "micro_batch_size": 8, "activation_checkpointing": "none", "dtype": "fp32"}


def commit(repo: git.Repo, msg: str) -> None:
    repo.git.add("-A")
    repo.git.commit("-q", "-m", msg, "--no-verify")


def diff_patch(repo: git.Repo, name: str, old: str, new: str, path: str = MODEL) -> None:
    """Write workloads/patches/<name>.diff with `git diff` of an edit, then undo the edit."""
    f = Path(str(repo.working_tree_dir)) / path
    text = f.read_text() if f.exists() else ""
    assert old in text
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(text.replace(old, new, 1) if old else new)
    out = Path(str(repo.working_tree_dir)) / "workloads/patches" / f"{name}.diff"
    if not text:
        repo.git.add("-N", path)
    out.write_text(repo.git.diff(path) + "\n")
    if text:
        repo.git.checkout("--", path)
    else:
        repo.git.rm("--cached", "-q", path)
        f.unlink()


def make_repo(tmp: Path, values: list[str], *, steps: tuple[int, int] = (1, 3)) -> Path:
    """A git repo with the workload code, ``workloads/dense_debug.yaml`` (short) and a space whose
    ``code_patch`` knob takes ``values``; the patches ``boom`` and ``outside`` are generated."""
    root = tmp / "repo"
    shutil.copytree(
        ROOT / "workloads", root / "workloads", ignore=shutil.ignore_patterns("__pycache__")
    )
    (root / "search_spaces").mkdir()
    space = yaml.safe_load((ROOT / "search_spaces/deepspeed_dense.yaml").read_text())
    space["knobs"] = [k for k in space["knobs"] if k["name"] != PATCH_KNOB]
    space["knobs"].append({"name": PATCH_KNOB, "type": "choice", "values": values})
    (root / "search_spaces/deepspeed_dense.yaml").write_text(yaml.safe_dump(space, sort_keys=False))
    wl = yaml.safe_load((ROOT / "workloads/dense_debug.yaml").read_text())
    wl["steps"] = {"warmup": steps[0], "measured": steps[1]}
    (root / "workloads/dense_debug.yaml").write_text(yaml.safe_dump(wl, sort_keys=False))
    repo = git.Repo.init(root)
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "test")
        cw.set_value("user", "email", "test@example.com")
    commit(repo, "workload")
    diff_patch(
        repo,
        "boom",
        "    c, s = cos[: x.shape[-2]], sin[: x.shape[-2]]\n",
        '    raise RuntimeError("boom patch is applied")\n',
    )
    diff_patch(repo, "outside", "", "print('not workload code')\n", path="infrarsi_hack.py")
    commit(repo, "patches")
    return root


def conflicting_pair(root: Path) -> None:
    """Patches ``twice`` and ``plus_one`` edit the same line of the model (each applies alone),
    and ``ident`` an unrelated line."""
    repo = git.Repo(root)
    line = "    out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)\n"
    diff_patch(repo, "twice", line, line.replace(".flatten(-2)", ".flatten(-2) * 2"))
    diff_patch(repo, "plus_one", line, line.replace(".flatten(-2)", ".flatten(-2) + 1"))
    diff_patch(repo, "ident", "class RMSNorm(nn.Module):\n", "class RMSNorm(nn.Module):  # norm\n")
    commit(repo, "more patches")
