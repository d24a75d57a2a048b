"""The launcher's world for a script (``infrarsi.execution.script_launch``): its argv, and the
harness's ``deepspeed.initialize`` reaching the names accelerate and transformers bound earlier."""

from __future__ import annotations

from infrarsi.execution.script_launch import script_argv


def test_the_deepspeed_launcher_appends_local_rank_and_the_others_do_not() -> None:
    assert script_argv("t.py", ["--a", "1"], "deepspeed", 3) == [
        "t.py",
        "--a",
        "1",
        "--local_rank=3",
    ]
    assert script_argv("t.py", ["--a"], "torchrun", 3) == ["t.py", "--a"]
    assert script_argv("t.py", [], "python", 0) == ["t.py"]


def test_a_trainer_path_that_imported_initialize_earlier_reaches_the_harness(monkeypatch, tmp_path):
    """accelerate may hold ``deepspeed.initialize`` under its own name from an import made before the
    run (``from deepspeed import initialize as ds_initialize``): the run rebinds it, and undoes it."""
    import sys
    import types

    import deepspeed

    from infrarsi.execution import script_launch

    real = deepspeed.initialize
    fake = types.ModuleType("infrarsi_fake_accelerate.accelerator")
    fake.ds_initialize = real  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setattr(script_launch, "REBIND_PREFIXES", ("infrarsi_fake_accelerate",))
    with script_launch.launched(["x.py"], str(tmp_path), str(tmp_path), {}, object()):  # type: ignore[arg-type]
        assert fake.ds_initialize is script_launch._harness_initialize is deepspeed.initialize
    assert fake.ds_initialize is real and deepspeed.initialize is real
