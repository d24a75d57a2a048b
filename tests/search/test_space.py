"""SearchSpace: loading, validation errors, `when`, constraints, enumeration, sampling."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from malformed import JUNK, PROPERTY
from space_strategies import fuzz_space

from infrarsi.errors import ExpressionError, SearchSpaceError
from infrarsi.search import SearchSpace

ROOT = Path(__file__).resolve().parents[2]
DENSE = ROOT / "search_spaces" / "deepspeed_dense.yaml"
MOE = ROOT / "search_spaces" / "deepspeed_moe.yaml"

SMALL = """
name: small
knobs:
  - name: stage
    type: choice
    values: [0, 1, 3]
    memory: saver
  - name: mbs
    type: int
    values: [1, 2, 4]
    memory: hungry
  - name: offload
    type: bool
    memory: saver
    when: "stage >= 1"
  - name: offload_param
    type: bool
    when: "offload and stage == 3"
  - name: lr
    type: float
    range: [0.0001, 0.01]
    log: true
    grid: 3
constraints:
  - "not (mbs == 4 and stage == 0)"
"""


def brute_force(space: SearchSpace) -> set[str]:
    """Every valid config by brute force: product of all values, resolve, filter."""
    out = set()
    for values in itertools.product(*(k.values for k in space.knobs)):
        cfg = space.resolve(space.as_config(values))
        if not space.violated(cfg):
            out.add(space.key(cfg))
    return out


def test_small_space_enumeration_by_hand() -> None:
    space = SearchSpace.from_yaml(SMALL)
    rows = space.enumerate()
    assert rows is not None
    # stage 0: mbs {1,2} (4 excluded), offload off  -> 2 ; stage 1: 3 mbs x 2 offload -> 6 ;
    # stage 3: 3 mbs x (offload off: 1 + offload on: 2 offload_param) -> 9 ; times 3 lr values.
    assert len(rows) == (2 + 6 + 9) * 3
    assert {space.key(r) for r in rows} == brute_force(space)
    for r in rows:
        if r["stage"] == 0:
            assert r["offload"] is False and r["offload_param"] is False
        if not r["offload"]:
            assert r["offload_param"] is False
    assert space.knob("lr").values == pytest.approx((1e-4, 1e-3, 1e-2))


@pytest.mark.parametrize("path", [DENSE, MOE])
def test_shipped_spaces_enumerate_exactly(path: Path) -> None:
    space = SearchSpace.from_yaml(path)
    rows = space.enumerate()
    assert rows is not None
    keys = [space.key(r) for r in rows]
    assert len(keys) == len(set(keys))
    assert set(keys) == brute_force(space)
    assert all(space.is_valid(r) for r in rows[:: max(1, len(rows) // 200)])


def test_dense_space_when_and_constraint() -> None:
    space = SearchSpace.from_yaml(str(DENSE))
    rows = space.enumerate()
    assert rows is not None
    assert all(r["offload_param"] is False for r in rows if r["zero_stage"] != 3)
    assert all(r["reduce_bucket_size"] == "auto" for r in rows if r["zero_stage"] == 0)
    assert any(r["offload_param"] for r in rows)
    assert not any(
        r["offload_optimizer"] and r["dtype"] == "bf16" and r["zero_stage"] == 0 for r in rows
    )


def test_validate_fills_defaults_and_resets_inactive_knobs() -> None:
    space = SearchSpace.from_yaml(DENSE)
    full = space.validate({"zero_stage": 0, "offload_optimizer": True, "micro_batch_size": "4"})
    assert list(full) == space.names
    assert full["offload_optimizer"] is False  # inactive at ZeRO-0: holds its default
    assert full["micro_batch_size"] == 4
    assert full["activation_checkpointing"] == "none"


def test_validate_errors_name_the_rule() -> None:
    space = SearchSpace.from_yaml(SMALL)
    with pytest.raises(SearchSpaceError, match=r"knob 'mbs'.*one of \[1, 2, 4\]; got 3"):
        space.validate({"mbs": 3})
    with pytest.raises(SearchSpaceError, match=r"'pp'.*Known knobs"):
        space.validate({"pp": 2})
    with pytest.raises(
        SearchSpaceError, match="breaks constraint 'not \\(mbs == 4 and stage == 0\\)'"
    ):
        space.validate({"mbs": 4, "stage": 0})


BAD = [
    (
        "knobs:\n  - name: a\n    type: integer\n    values: [1]\n",
        "knob 'a'",
        "'type' must be one of",
    ),
    (
        "knobs:\n  - name: a\n    type: int\n    values: [1, 2]\n    default: 3\n",
        "knob 'a'",
        "'default' must be one of",
    ),
    (
        "knobs:\n  - name: a\n    type: int\n    values: [1, 2]\n  - name: a\n    type: bool\n",
        "knob 'a'",
        "unique",
    ),
    ("knobs:\n  - name: a\n    type: int\n    vals: [1]\n", "knob 'a'", "unknown key(s) ['vals']"),
    ("knobs:\n  - name: a\n    type: int\n    range: [5, 1]\n", "knob 'a'", "`lo < hi` must hold"),
    ("knobs:\n  - name: a\n    type: int\n    values: [1, 1.5]\n", "knob 'a'", "must be integers"),
    (
        "knobs:\n  - name: a\n    type: bool\n    memory: greedy\n",
        "knob 'a'",
        "'memory' must be one of",
    ),
    (
        "knobs:\n  - name: a\n    type: bool\n    speed: fast\n",
        "knob 'a'",
        "'speed' must be one of",
    ),
    (
        "knobs:\n  - name: a\n    type: bool\n    when: 'b'\n  - name: b\n    type: bool\n    when: 'a'\n",
        "knob '",
        "cycle",
    ),
    (
        "knobs:\n  - name: a\n    type: bool\n    when: 'a'\n",
        "knob 'a'",
        "refer to the knob itself",
    ),
    ("knobs:\n  - name: a\n    type: int\n    values: []\n", "knob 'a'", "non-empty 'values'"),
    (
        "knobs:\n  - name: a\n    type: int\n    range: [0, 8]\n    log: true\n",
        "knob 'a'",
        "log range needs lo > 0",
    ),
    ("knobz: []\n", "<text>", "unknown top-level key"),
    (
        "objective: throughput\nknobs:\n  - name: a\n    type: bool\n",
        "'objective'",
        "must be one of",
    ),
]


@pytest.mark.parametrize(("text", "where", "rule"), BAD)
def test_yaml_errors_name_file_knob_and_rule(
    text: str, where: str, rule: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad_space.yaml"
    path.write_text(text)
    with pytest.raises(SearchSpaceError) as info:
        SearchSpace.from_yaml(path)
    msg = str(info.value)
    assert str(path) in msg
    assert where.replace("<text>", str(path)) in msg
    assert rule in msg


def test_injection_in_yaml_names_file_knob_and_expression(tmp_path: Path) -> None:
    path = tmp_path / "evil.yaml"
    path.write_text(
        "knobs:\n  - name: a\n    type: bool\n    when: \"__import__('os').system('echo hi')\"\n"
    )
    with pytest.raises(ExpressionError) as info:
        SearchSpace.from_yaml(path)
    msg = str(info.value)
    assert str(path) in msg and "knob 'a'" in msg and "__import__('os')" in msg
    path.write_text('knobs:\n  - name: a\n    type: bool\nconstraints:\n  - "a.__class__ == 1"\n')
    with pytest.raises(ExpressionError, match=r"constraints\[0\].*attribute access"):
        SearchSpace.from_yaml(path)


def test_sample_and_neighbours_are_valid() -> None:
    space = SearchSpace.from_yaml(DENSE)
    rng = np.random.default_rng(0)
    samples = space.sample(rng, 50)
    assert len(samples) == 50
    assert all(space.is_valid(c) for c in samples)
    base = space.validate({"zero_stage": 3, "micro_batch_size": 1})
    nbs = space.neighbours(base)
    assert nbs and all(space.is_valid(c) for c in nbs)
    assert all(sum(base[k] != c[k] for k in space.names) >= 1 for c in nbs)
    assert any(c["zero_stage"] == 0 and c["offload_param"] is False for c in nbs)


def test_large_space_is_not_enumerated() -> None:
    knobs = "\n".join(
        f"  - name: k{i}\n    type: int\n    values: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"
        for i in range(7)
    )
    space = SearchSpace.from_yaml(f"name: big\nknobs:\n{knobs}\n")
    assert space.enumerate() is None
    assert len(space.sample(np.random.default_rng(0), 5)) == 5


SHORT_CIRCUIT = """
name: short_circuit
knobs:
  - {name: tp, type: int, values: [1, 2, 4, 8], memory: saver}
  - {name: pp, type: int, values: [1, 2, 4], memory: saver}
  - {name: micro_batch_size, type: int, values: [1, 2, 4, 8], memory: hungry}
constraints:
  - "tp * pp <= 16"
  - "256 % (micro_batch_size * (16 // (tp * pp))) == 0"
"""


def _short_circuit_space():
    return SearchSpace.from_dict(yaml.safe_load(SHORT_CIRCUIT), file="short_circuit.yaml")


def test_constraints_short_circuit_and_unevaluable_counts_as_violated() -> None:
    space = _short_circuit_space()
    bad = {"tp": 8, "pp": 4, "micro_batch_size": 1}  # the second constraint divides by zero here
    assert space.violated(bad) == ["tp * pp <= 16"]
    assert not space.is_valid(bad)
    with pytest.raises(SearchSpaceError, match=r"tp \* pp <= 16"):
        space.validate(bad)
    configs = space.enumerate()
    assert configs and all(c["tp"] * c["pp"] <= 16 for c in configs)
    assert all(not space.violated(c) for c in space.sample(np.random.default_rng(0), n=20))
    assert all(
        c["tp"] * c["pp"] <= 16 for c in space.neighbours({"tp": 4, "pp": 4, "micro_batch_size": 1})
    )


def test_unevaluable_constraint_alone_is_violated_with_a_clear_error() -> None:
    raw = yaml.safe_load(SHORT_CIRCUIT)
    raw["constraints"] = raw["constraints"][1:]  # no guard: 16 // 32 == 0, then modulo by zero
    space = SearchSpace.from_dict(raw, file="short_circuit.yaml")
    cfg = {"tp": 8, "pp": 4, "micro_batch_size": 1}
    assert space.violated(cfg) == [raw["constraints"][0]]
    with pytest.raises(SearchSpaceError, match=r"cannot be evaluated.*modulo by zero"):
        space.validate(cfg)
    assert all(c["tp"] * c["pp"] <= 16 for c in space.enumerate() or [])


def test_pairing_repairs_skip_configs_whose_constraint_cannot_be_evaluated() -> None:
    from infrarsi.search.pairing import repairs

    space = _short_circuit_space()
    reps = repairs(space, space.validate({"tp": 4, "pp": 4, "micro_batch_size": 8}), max_steps=2)
    assert all(r.config["tp"] * r.config["pp"] <= 16 for r in reps)


def test_optimizer_reaches_pairing_on_the_short_circuit_space() -> None:
    from infrarsi.search import Optimizer, Outcome

    space = _short_circuit_space()

    def run(c):
        mem = 40.0 * c["micro_batch_size"] / (c["tp"] * c["pp"])
        if mem > 10.0:
            return Outcome(status="oom")
        return Outcome(
            status="ok",
            step_time=(1 + 2.0 / c["micro_batch_size"]) * (1 + 0.1 * c["tp"] + 0.05 * c["pp"]),
            peak_memory=mem,
        )

    opt = Optimizer(
        space, memory_capacity=10.0, seed=0, baseline={"tp": 1, "pp": 1, "micro_batch_size": 1}
    )
    for _ in range(20):
        cfg = opt.ask()
        assert cfg["tp"] * cfg["pp"] <= 16
        opt.tell(cfg, run(cfg))


def test_restrict_pins_the_other_knobs_at_the_baseline_and_keeps_constraints() -> None:
    space = _short_circuit_space()
    scoped = space.restrict(["micro_batch_size"], {"tp": 4, "pp": 4, "micro_batch_size": 1})
    configs = scoped.enumerate() or []
    assert {(c["tp"], c["pp"]) for c in configs} == {(4, 4)}
    assert sorted(c["micro_batch_size"] for c in configs) == [1, 2, 4, 8]
    assert SearchSpace.from_yaml(scoped.source).names == space.names
    with pytest.raises(SearchSpaceError):
        scoped.validate({"tp": 2, "pp": 4, "micro_batch_size": 1})
    with pytest.raises(SearchSpaceError, match="'nope'"):
        space.restrict(["nope"], {"tp": 1, "pp": 1, "micro_batch_size": 1})


# ------------------------------------------------------------------ property-based: bad YAML
KNOB_FIELDS = [
    "name",
    "type",
    "values",
    "range",
    "log",
    "memory",
    "when",
    "default",
    "grid",
    "bogus",
    3,
]
WHERE = (
    "knob '",
    "knobs[",
    "'knobs'",
    "constraints",
    "'name'",
    "'objective'",
    "'description'",
    "top-level",
    "valid YAML",
    "a search space must be a mapping",
)
"""Every error names one of these places (with the file)."""


@st.composite
def malformed_space(draw: st.DrawFn) -> dict:
    """SMALL with one part replaced by junk, a knob duplicated, or the whole document junk."""
    raw = yaml.safe_load(SMALL)
    kind = draw(
        st.sampled_from(["top", "knob_field", "knob", "constraint", "duplicate", "document"])
    )
    if kind == "top":
        raw[
            draw(
                st.sampled_from(
                    ["name", "objective", "knobs", "constraints", "description", "extra", 7]
                )
            )
        ] = draw(JUNK)
    elif kind == "knob_field":
        knob = raw["knobs"][draw(st.integers(0, len(raw["knobs"]) - 1))]
        knob[draw(st.sampled_from(KNOB_FIELDS))] = draw(JUNK)
    elif kind == "knob":
        raw["knobs"][draw(st.integers(0, len(raw["knobs"]) - 1))] = draw(JUNK)
    elif kind == "constraint":
        raw["constraints"].append(draw(JUNK))
    elif kind == "duplicate":
        raw["knobs"].append(dict(raw["knobs"][draw(st.integers(0, len(raw["knobs"]) - 1))]))
    else:
        return {"document": draw(JUNK)}
    return raw


@PROPERTY
@given(raw=malformed_space())
def test_malformed_space_yaml_is_refused_naming_file_and_field_or_loads_usable(
    raw: dict, tmp_path: Path
) -> None:
    """Any malformed space either is refused with a ``SearchSpaceError`` that names the file, the
    place and the rule, or (when the junk happens to be valid) loads into a usable space."""
    path = tmp_path / "mutated_space.yaml"
    path.write_text(yaml.safe_dump(raw.get("document", raw), sort_keys=False))
    try:
        space = SearchSpace.from_yaml(path)
    except SearchSpaceError as e:
        msg = str(e)
        assert str(path) in msg and "rule:" in msg, msg
        assert any(w in msg for w in WHERE), msg
        return
    rng = np.random.default_rng(0)
    configs = (space.enumerate() or []) + space.sample(rng, 3)
    for c in configs[:20]:
        assert space.validate(c) == c
        assert all(not space.violated(n) for n in space.neighbours(c))


def test_unevaluable_when_means_inactive_everywhere() -> None:
    """A ``when`` that cannot be evaluated for a config (here 8 // a with a = 0) does not hold:
    the knob is inactive, in enumeration, sampling, neighbours and validation alike."""
    space = SearchSpace.from_yaml(
        "name: w\nknobs:\n  - {name: a, type: int, values: [1, 0, 2]}\n"
        "  - {name: b, type: bool, when: '8 // a > 2'}\n"
    )
    rows = space.enumerate() or []
    assert sorted((r["a"], r["b"]) for r in rows) == [
        (0, False),
        (1, False),
        (1, True),
        (2, False),
        (2, True),
    ]
    assert space.validate({"a": 0, "b": True}) == {"a": 0, "b": False}
    assert space.active({"a": 0, "b": False}) == {"a": True, "b": False}
    assert all(c["b"] is False for c in space.sample(np.random.default_rng(0), 30) if c["a"] == 0)
    assert {"a": 0, "b": False} in space.neighbours({"a": 1, "b": True})


def test_value_dependent_errors_at_the_defaults_do_not_refuse_the_space() -> None:
    """Only a type mismatch at the defaults is refused at load; a division by zero there makes the
    default config invalid (the constraint counts as violated), not the space."""
    space = SearchSpace.from_yaml(
        "name: z\nknobs:\n  - {name: a, type: int, values: [0, 1]}\nconstraints:\n  - '1 / a > 0'\n"
    )
    assert space.violated({"a": 0}) == ["1 / a > 0"] and space.enumerate() == [{"a": 1}]
    with pytest.raises(ExpressionError, match="TypeError"):
        SearchSpace.from_yaml(
            "name: z\nknobs:\n  - {name: a, type: choice, values: [x, 1]}\n"
            "constraints:\n  - 'a < 3'\n"
        )


@pytest.mark.parametrize(
    ("entry", "rule"),
    [
        ("{name: if, type: bool}", "Python keyword"),
        ("{name: 'true', type: bool}", "Python keyword"),
        ("{name: a, type: choice, values: [1, 1.0]}", "distinct"),
        ("{name: a, type: choice, values: [true, 1]}", "distinct"),
        ("{name: a, type: float, values: [.nan, 1.0]}", "finite"),
        ("{name: a, type: float, range: [0, .inf]}", "finite"),
        ("{name: a, type: float, range: [-1.0e+308, 1.0e+308]}", "too wide"),
        ("{name: a, type: float, range: [0, 1], grid: 100000000}", "from 2 to 1024"),
        ("{name: a, type: int, values: [1, 2], grid: 4}", "'grid' sets the points of a 'range'"),
        ("{name: a, type: bool, log: true}", "'log' needs a numeric knob"),
        ("{name: a, type: choice, values: [2020-01-01, x]}", "numbers, strings or booleans"),
    ],
)
def test_knob_entry_rules(entry: str, rule: str) -> None:
    with pytest.raises(SearchSpaceError, match=re.escape(rule)) as e:
        SearchSpace.from_dict(yaml.safe_load(f"name: s\nknobs:\n  - {entry}\n"), file="s.yaml")
    assert "s.yaml" in str(e.value)


def test_name_and_description_must_be_strings() -> None:
    with pytest.raises(SearchSpaceError, match="'name': rule: must be a string"):
        SearchSpace.from_dict(
            {"name": [1], "knobs": [{"name": "a", "type": "bool"}]}, file="s.yaml"
        )
    with pytest.raises(SearchSpaceError, match="'description': rule: must be a string"):
        SearchSpace.from_dict(
            {"description": {"x": 1}, "knobs": [{"name": "a", "type": "bool"}]}, file="s.yaml"
        )


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(text=fuzz_space(), seed=st.integers(0, 3))
def test_one_rule_for_constraints_everywhere(text: str, seed: int) -> None:
    """On random spaces whose constraints and ``when`` conditions may divide by zero or compare a
    number with a string: enumeration, validation, sampling, neighbours and pairing's repairs all
    agree on which configs are valid (constraints in YAML order, short-circuit, an unevaluable
    one violated; an unevaluable ``when`` does not hold)."""
    from infrarsi.search.pairing import repairs

    try:
        space = SearchSpace.from_yaml(text)
    except SearchSpaceError:
        assume(False)
    valid = {space.key(r) for r in space.enumerate() or []}
    assert valid == brute_force(space)
    for values in itertools.islice(itertools.product(*(k.values for k in space.knobs)), 300):
        cfg = space.resolve(space.as_config(values))
        assert space.is_valid(cfg) == (space.key(cfg) in valid)
        if space.violated(cfg):
            with pytest.raises(SearchSpaceError, match="breaks constraint"):
                space.validate(cfg)
    for c in space.sample(np.random.default_rng(seed), 10):
        assert space.key(c) in valid
        assert all(space.key(n) in valid for n in space.neighbours(c))
        assert all(space.key(r.config) in valid for r in repairs(space, c, max_steps=2))


def test_knob_distance_counts_the_knobs_set_differently() -> None:
    from infrarsi.search.space import knob_distance

    assert knob_distance({"a": 1, "b": 2}, {"a": 1, "b": 3}, ["a", "b"]) == 1
    assert knob_distance({"a": 1}, {"a": 1, "b": 3}, ["a", "b"]) == 1  # missing: None
    assert knob_distance({"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 9}, ["a", "b"]) == 0
