"""The rank actor's handling of shipped code: a package from the object store replaces the
driver's folder, even where that folder does not exist."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from infrarsi.execution.code_package import pack
from infrarsi.execution.job_loader import import_entry
from infrarsi.execution.worker import _local_code


@pytest.mark.integration
def test_a_shipped_job_imports_from_this_nodes_copy_when_the_drivers_folder_is_gone(
    ray_local, tmp_path: Path
) -> None:
    import ray

    folder = tmp_path / "driver_side_job"
    (folder / "shipped_job_pkg").mkdir(parents=True)
    (folder / "shipped_job_pkg" / "__init__.py").write_text(
        "def make_job(ctx):\n    return 'from the package'\n"
    )
    pkg = pack(folder)
    spec = {
        "code_dir": str(folder),
        "reference_code_dir": str(folder),
        "trial_id": "t",
        "code_package": {"digest": pkg.digest, "ref": ray.put(pkg.data), "source": pkg.source},
        "reference_code_package": {
            "digest": pkg.digest,
            "ref": ray.put(pkg.data),
            "source": pkg.source,
        },
    }
    shutil.rmtree(folder)  # as on a node that never had it
    local = _local_code(spec)
    assert local["code_dir"] == local["reference_code_dir"] != str(folder)
    assert Path(local["code_dir"]).name == pkg.digest
    assert import_entry(local["code_dir"], "shipped_job_pkg:make_job")(None) == "from the package"
    assert spec["code_dir"] == str(folder)  # the caller's spec is left as it was
