"""A job's code folder shipped to ranks on other nodes, through Ray's object store.

The ranks import the job (``model.entry_point``, or the built-in ``workloads`` package, or a
patched worktree of either) from a folder. On the driver's node that folder is simply there; on
another node it is not. ``pack`` zips the folder's files (the ones git would commit when the folder
is in a git repository, else every file outside hidden folders and ``__pycache__``), addressed by
the SHA-256 of their names and contents; the driver ``ray.put``s the zip once per content, and each
rank ``materialize``s it into a content-addressed folder under its node's temporary directory
(once per node and content), then imports from there.

Ray's own ``runtime_env`` (``working_dir``/``py_modules``) fixes the code when an actor starts,
so a warm rank could not move from the baseline's code to a patched worktree in the next trial;
this ships per trial instead, and the rank processes stay warm.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from infrarsi.errors import JobError

MAX_BYTES = 256 << 20
"""Largest folder that ships (sum of file sizes): code, not data (``data.path`` must be on every node)."""
SKIP_DIRS = frozenset({"__pycache__", "node_modules"})
"""Folder names never shipped (besides hidden folders), when the folder is not in a git repository."""


@dataclass(frozen=True)
class CodePackage:
    """A code folder as one zip."""

    digest: str
    """SHA-256 (hex) of the files' relative paths and contents: the package's identity."""
    data: bytes
    """The zip."""
    source: str
    """The folder it was packed from, on the driver's node (for messages)."""
    files: int
    """Files in it."""


def list_files(folder: Path, include: Sequence[str] = ()) -> list[str]:
    """Relative paths of the files to ship, sorted: git's tracked and untracked-but-not-ignored
    files when ``folder`` is in a git work tree, else a walk without hidden folders and
    ``SKIP_DIRS``. ``include``: only these relative sub-folders (e.g. ``("workloads",)``)."""
    folder = folder.resolve()
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."],
            cwd=folder,
            capture_output=True,
            timeout=60,
            check=True,
        ).stdout
        names = sorted({n for n in out.decode("utf-8", "surrogateescape").split("\0") if n})
    except (OSError, subprocess.SubprocessError):
        names = []
        for root, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
            rel = Path(root).relative_to(folder)
            names += [str(rel / f) if str(rel) != "." else f for f in files]
        names.sort()
    if include:
        prefixes = tuple(p.rstrip("/") + "/" for p in include)
        names = [n for n in names if n.startswith(prefixes)]
    return [n for n in names if (folder / n).is_file() and not (folder / n).is_symlink()]


def fingerprint(folder: Path, names: Sequence[str]) -> tuple[tuple[str, int, int], ...]:
    """(path, size, mtime) of each file: cheap to compare, to repack only when something changed."""
    out = []
    for n in names:
        st = (folder / n).stat()
        out.append((n, st.st_size, st.st_mtime_ns))
    return tuple(out)


def pack(
    folder: str | Path, include: Sequence[str] = (), *, max_bytes: int = MAX_BYTES
) -> CodePackage:
    """Zip the code of ``folder`` (see ``list_files``); a ``JobError`` when it is larger than ``max_bytes``."""
    root = Path(folder).resolve()
    if not root.is_dir():
        raise JobError(
            f"code folder {root}: not a folder, so it cannot be shipped to the ranks' nodes."
        )
    names = list_files(root, include)
    total = sum((root / n).stat().st_size for n in names)
    if total > max_bytes:
        raise JobError(
            f"code folder {root}: {total / 2**20:.0f} MiB of files to ship to the ranks' nodes, over the "
            f"{max_bytes / 2**20:.0f} MiB limit. Fix: keep data out of model.code_dir (use data.path, on every "
            f"node), or list it in .gitignore."
        )
    h = hashlib.sha256()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for n in names:
            data = (root / n).read_bytes()
            h.update(
                n.encode("utf-8", "surrogateescape")
                + b"\0"
                + len(data).to_bytes(8, "little")
                + data
            )
            info = zipfile.ZipInfo(n, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return CodePackage(
        digest=h.hexdigest(), data=buf.getvalue(), source=str(root), files=len(names)
    )


def cache_root() -> Path:
    """Where ranks unpack shipped code on their node."""
    return Path(tempfile.gettempdir()) / "infrarsi-code"


def materialize(digest: str, data: bytes, root: Path | None = None) -> Path:
    """The folder holding package ``digest`` on this node, unpacked from ``data`` the first time
    (into a temporary folder, renamed into place: concurrent ranks never see half a package)."""
    root = root or cache_root()
    dest = root / digest
    if dest.is_dir():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{digest[:12]}.", dir=root))
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for name in z.namelist():
            target = (tmp / name).resolve()
            if not target.is_relative_to(tmp.resolve()):
                raise JobError(
                    f"shipped code {digest[:12]}: entry {name!r} leaves its folder; refusing to unpack it."
                )
        z.extractall(tmp)
    try:
        os.rename(tmp, dest)
    except OSError:  # another rank on this node got there first: use its copy
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return dest
