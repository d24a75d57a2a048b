"""docs/KNOBS.md is generated from the knob registry, and the committed file is never stale."""

from __future__ import annotations

from pathlib import Path

from infrarsi.execution.knobs.docs import (
    COMMAND,
    KNOBS_MD,
    main,
    package_knobs,
    render,
    space_table,
)
from infrarsi.execution.knobs.registry import (
    KNOBS,
    KnobContext,
    TrialBuild,
    handler_order,
    register_knob,
    unregister_knob,
)


def test_the_committed_knobs_page_is_the_generated_one() -> None:
    assert KNOBS_MD.read_text() == render(), (
        f"{KNOBS_MD} is stale: a knob's registration changed. Regenerate it with `{COMMAND}` "
        f"(from the repository root, PYTHONPATH=.) and commit it."
    )


def test_the_page_has_a_row_per_registered_knob_in_handler_order() -> None:
    text = render()
    rows = [line.split("|")[1].strip(" `") for line in text.splitlines() if line.startswith("| `")]
    assert rows == package_knobs() and set(package_knobs()) <= set(handler_order())
    assert {n for n in KNOBS if KNOBS[n].handler.__module__.startswith("infrarsi.")} == set(rows)
    assert "## Adding a knob" in text and "Two places" in text


def test_a_knob_registered_outside_the_package_is_not_on_its_page() -> None:
    def handler(value: object, build: TrialBuild, ctx: KnobContext) -> None:
        """Applies nothing (a test knob)."""

    register_knob("test_outside")(handler)
    try:
        assert "test_outside" in handler_order() and "`test_outside`" not in render()
    finally:
        unregister_knob("test_outside")


def test_the_space_table_lists_the_values_each_space_searches(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "name: a\nobjective: step_time\nknobs:\n"
        "  - {name: zero_stage, type: choice, values: [0, 3], memory: saver}\n"
    )
    (tmp_path / "b.yaml").write_text(
        "name: b\nobjective: step_time\nknobs:\n"
        "  - {name: zero_stage, type: choice, values: [0, 3], memory: saver}\n"
    )
    (tmp_path / "c.yaml").write_text(
        "name: c\nobjective: step_time\nknobs:\n"
        "  - {name: zero_stage, type: choice, values: [0, 3], memory: saver, speed: slower}\n"
    )
    lines = space_table(tmp_path)
    assert "  - `a.yaml`, `b.yaml`: 0, 3 (default 0; memory saver; speed neutral)" in lines
    assert "  - `c.yaml`: 0, 3 (default 0; memory saver; speed slower)" in lines


def test_check_mode_reports_a_stale_page_and_writes_nothing(
    monkeypatch, tmp_path: Path, capsys
) -> None:
    stale = tmp_path / "KNOBS.md"
    stale.write_text("old\n")
    monkeypatch.setattr("infrarsi.execution.knobs.docs.KNOBS_MD", stale)
    assert main(["--check"]) == 1
    assert COMMAND in capsys.readouterr().err and stale.read_text() == "old\n"
    assert main([]) == 0 and main(["--check"]) == 0
    assert stale.read_text() == render()
