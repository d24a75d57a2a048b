"""The knob registry: one declaration per knob, its order, and the search-space check against it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import infrarsi.execution.surrogate.backend  # noqa: F401  (registers the surrogate knobs)
from infrarsi.cli import app
from infrarsi.errors import KnobError, UserInputError
from infrarsi.execution.knobs.registry import (
    KNOB_HANDLERS,
    KNOB_PROCESS_ENV,
    KNOBS,
    KnobContext,
    TrialBuild,
    boolean,
    check_space,
    checked_by,
    either,
    handler_order,
    integer,
    knob_defaults,
    one_of,
    process_env,
    register_knob,
    unregister_knob,
)
from infrarsi.knob_names import BUILTIN_KNOBS
from infrarsi.search import SearchSpace

ROOT = Path(__file__).resolve().parents[3]


def _noop(value: object, build: TrialBuild, ctx: KnobContext) -> None:
    """Applies nothing (a test knob)."""


@pytest.fixture()
def scratch() -> Iterator[list[str]]:
    """Names the test registers; each is unregistered afterwards."""
    names: list[str] = []
    yield names
    for n in names:
        if n in KNOBS:
            unregister_knob(n)


def _register(names: list[str], name: str, **kw: object) -> None:
    def handler(value: object, build: TrialBuild, ctx: KnobContext) -> None:
        """Applies nothing (a test knob)."""

    register_knob(name, **kw)(handler)  # type: ignore[arg-type]
    names.append(name)


def _space(tmp_path: Path, knobs: str) -> SearchSpace:
    path = tmp_path / "space.yaml"
    path.write_text(f"name: s\nobjective: step_time\nknobs:\n{knobs}")
    return SearchSpace.from_yaml(path)


def test_value_rules_accept_what_their_text_says() -> None:
    assert one_of(0, 1).accepts(1) and one_of(0, 1).accepts(1.0) and not one_of(0, 1).accepts(True)
    assert not one_of("a").accepts("b") and one_of("a").text == "a"
    assert integer(lo=1).accepts(4) and not integer(lo=1).accepts(0) and not integer().accepts(2.5)
    assert not integer().accepts("4") and not integer().accepts(False)
    assert boolean().accepts(False) and not boolean().accepts(0)
    rule = either(one_of("auto"), integer(lo=1))
    assert (
        rule.accepts("auto") and rule.accepts(500) and not rule.accepts("big") and "or" in rule.text
    )

    def positive(v: object) -> None:
        if not isinstance(v, int) or v <= 0:
            raise ValueError(v)

    assert checked_by(positive, "a positive int").accepts(3) and not checked_by(
        positive, "x"
    ).accepts(-1)


def test_every_builtin_name_is_registered_once() -> None:
    assert set(BUILTIN_KNOBS) <= set(KNOBS)
    assert len(set(BUILTIN_KNOBS)) == len(BUILTIN_KNOBS)
    for name in BUILTIN_KNOBS:
        spec = KNOBS[name]
        assert spec.doc and spec.doc.endswith("."), (
            name
        )  # the documentation line docs/KNOBS.md shows
        assert not spec.has_default or spec.values.accepts(spec.default), name


def test_registered_defaults_and_views_derive_from_the_declarations() -> None:
    defaults = knob_defaults()
    assert defaults["zero_stage"] == 0 and defaults["reduce_bucket_size"] == "auto"
    assert "tp" not in defaults  # registered without a default: skipped unless a config sets it
    assert KNOB_HANDLERS["zero_stage"] is KNOBS["zero_stage"].handler
    assert set(KNOB_PROCESS_ENV) == {"threads_per_worker"}
    assert process_env({"threads_per_worker": 2, "zero_stage": 1}) == {"OMP_NUM_THREADS": "2"}
    with pytest.raises(KnobError, match="threads_per_worker"):
        process_env({"threads_per_worker": "many"})


def test_a_duplicate_a_bad_default_and_a_bad_tag_are_refused(scratch: list[str]) -> None:
    with pytest.raises(KnobError, match="already has a handler"):
        register_knob("zero_stage")(_noop)
    with pytest.raises(KnobError, match="default 7 is not one of 0, 1"):
        register_knob("test_bad_default", values=one_of(0, 1), default=7)(_noop)
    with pytest.raises(KnobError, match="memory='thrifty'"):
        register_knob("test_bad_tag", memory="thrifty")(_noop)  # type: ignore[arg-type]
    with pytest.raises(KnobError, match="speed='quick'"):
        register_knob("test_bad_tag", speed="quick")(_noop)  # type: ignore[arg-type]
    with pytest.raises(KnobError, match="names the knob itself"):
        register_knob("test_self", after=("test_self",))(_noop)
    assert not {"test_bad_default", "test_bad_tag", "test_self"} & set(KNOBS)


def test_handlers_run_in_a_stable_topological_order(scratch: list[str]) -> None:
    _register(scratch, "test_c", after=("test_b",))  # waits for a knob registered later
    _register(scratch, "test_a")
    _register(scratch, "test_b", after="zero_stage")  # one name, as a plain string
    order = handler_order()
    assert order.index("zero_stage") < order.index("test_b") < order.index("test_c")
    assert order.index("test_a") < order.index("test_b")  # ties keep registration order
    assert handler_order() == order  # deterministic
    assert order.index("zero_stage") < order.index("offload_optimizer")


def test_an_after_cycle_is_an_error_and_registers_nothing(scratch: list[str]) -> None:
    _register(scratch, "test_x", after=("test_y",))
    with pytest.raises(KnobError, match="cycle"):
        register_knob("test_y", after=("test_x",))(_noop)
    assert "test_y" not in KNOBS
    handler_order()  # the registry is still consistent


def test_unregistering_an_unknown_knob_is_an_error() -> None:
    with pytest.raises(KnobError, match="not registered"):
        unregister_knob("no_such_knob")


@pytest.mark.parametrize(
    "path", sorted((ROOT / "search_spaces").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_repository_space_passes_the_registry_check(path: Path) -> None:
    check_space(SearchSpace.from_yaml(path))


def test_a_value_the_handler_rejects_names_file_knob_rule_and_fix(tmp_path: Path) -> None:
    space = _space(
        tmp_path,
        "  - {name: zero_stage, type: choice, values: [0, 2, 4]}\n"
        "  - {name: dtype, type: choice, values: [fp32, fp16]}\n",
    )
    with pytest.raises(KnobError) as e:
        check_space(space)
    msg = str(e.value)
    assert str(tmp_path / "space.yaml") in msg
    assert "knob 'zero_stage': value(s) [4]" in msg and "one of 0, 1, 2, 3" in msg
    assert "knob 'dtype': value(s) ['fp16']" in msg and "Fix:" in msg
    assert isinstance(e.value, UserInputError)  # exit code 2 in the CLI


def test_a_missing_handler_lists_the_known_knobs(tmp_path: Path) -> None:
    with pytest.raises(
        KnobError, match=r"\['warp_drive'\] have no handler\. Known knobs: .*zero_stage"
    ):
        check_space(_space(tmp_path, "  - {name: warp_drive, type: bool}\n"))


def test_a_memory_tag_opposite_to_the_registration_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        KnobError, match="`memory: hungry` contradicts the handler's registered memory tag 'saver'"
    ):
        check_space(
            _space(
                tmp_path, "  - {name: zero_stage, type: choice, values: [3, 0], memory: hungry}\n"
            )
        )
    # neutral (out of pairing) is always allowed, and so is a tag on a knob registered neutral
    check_space(
        _space(
            tmp_path,
            "  - {name: zero_stage, type: choice, values: [0, 3]}\n"
            "  - {name: dtype, type: choice, values: [bf16, fp32], memory: hungry}\n",
        )
    )


def test_a_speed_tag_opposite_to_the_registration_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        KnobError, match="`speed: faster` contradicts the handler's registered speed tag 'slower'"
    ):
        check_space(
            _space(
                tmp_path, "  - {name: zero_stage, type: choice, values: [0, 3], speed: faster}\n"
            )
        )
    # the registered direction, neutral, and either way on a knob registered neutral (dtype: bf16
    # is the faster on GPUs, not always on CPUs) are allowed
    check_space(
        _space(
            tmp_path,
            "  - {name: zero_stage, type: choice, values: [0, 3], speed: slower}\n"
            "  - {name: micro_batch_size, type: int, values: [1, 8], speed: neutral}\n"
            "  - {name: dtype, type: choice, values: [bf16, fp32], speed: slower}\n",
        )
    )


def test_the_space_default_wins_over_the_registered_one(tmp_path: Path) -> None:
    space = _space(
        tmp_path,
        "  - {name: reduce_bucket_size, type: choice, values: [500000, 5000000], default: 5000000}\n",
    )
    check_space(space)  # the registered default ('auto') is not among the values: no error
    assert space.default_config()["reduce_bucket_size"] == 5000000


def test_init_exits_2_on_a_space_its_handlers_reject(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: s\nobjective: step_time\nknobs:\n  - {name: micro_batch_size, type: int, values: [0, 1]}\n"
    )
    res = CliRunner().invoke(
        app,
        [
            "init",
            str(ROOT / "workloads" / "dense_debug.yaml"),
            "--study",
            str(tmp_path / "s"),
            "--space",
            str(bad),
        ],
    )
    assert res.exit_code == 2, res.output
    flat = " ".join(res.output.split())
    assert "micro_batch_size" in flat and "integer >= 1" in flat
    assert not (tmp_path / "s" / "contract.yaml").exists()
