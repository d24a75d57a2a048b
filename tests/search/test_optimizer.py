"""``Optimizer`` (``optimizer.py``): ask/tell semantics, exclusions, batches, settings, save/restore, fuzzed
spaces, no Ray import. The schedule, the pickers, the models and the history have their own test files."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import Phase, assume, event, given, settings
from hypothesis import strategies as st
from search_synthetic import (
    BASELINE,
    CAPACITY,
    CHEAP,
    DENSE,
    TINY,
    TINY_CAP,
    memory_bytes,
    run,
    step_time_s,
    tiny_run,
)
from space_strategies import fuzz_space

from infrarsi.errors import SearchSpaceError, UserInputError
from infrarsi.search import (
    Optimizer,
    OptimizerSettings,
    Outcome,
    SearchExhausted,
    SearchSpace,
    WarmStartOrigin,
)
from infrarsi.search.settings import DEFAULT_SETTINGS


def test_import_does_not_load_ray() -> None:
    code = (
        "import sys; from infrarsi.search import SearchSpace, Optimizer, Outcome; "
        "import infrarsi.search.optimizer, infrarsi.search.acquisition; "
        "print('ray' in sys.modules or any(m.startswith('ray.') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_oom_and_failed_configs_are_never_proposed_again() -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=1, settings=OptimizerSettings(n_init=3))
    bad: set[str] = set()
    seen: list[str] = []
    for i in range(12):
        cfg = opt.ask()
        key = space.key(cfg)
        assert key not in bad
        if key in seen and opt.last_ask_info.phase != "replicate":
            # besides the incumbent's replicate, an ok config comes back only when its one measurement
            # was left out as a slow outlier (models/outliers.py), or when every untried config is
            # judged unlikely to run
            trimmed = {space.key(opt.observations[j].config) for j in opt.models.time_outliers}
            untried = [space.as_config(v) for v in space.enumerate_values() or []]
            untried = [c for c in untried if space.key(c) not in seen and space.key(c) not in bad]
            p = opt.predict(untried)
            assert (
                key in trimmed
                or float((p["p_fit"] * p["p_ok"]).max()) < DEFAULT_SETTINGS.repeat_below_p
            )
        seen.append(key)
        out = tiny_run(cfg)
        if out.status == "ok" and i % 4 == 3:
            out = Outcome(status="invariant_violation")
        if out.status != "ok":
            bad.add(key)
        opt.tell(cfg, out)
    assert any(tiny_run(space.as_config(json.loads(k))).status == "oom" for k in bad)


def test_after_every_config_is_tried_only_ok_ones_come_back() -> None:
    space = SearchSpace.from_yaml(
        "name: t\nknobs:\n  - name: a\n    type: int\n    values: [1, 2, 3]\n"
    )
    opt = Optimizer(space, memory_capacity=10.0, seed=0, settings=OptimizerSettings(n_init=2))
    for _ in range(3):
        c = opt.ask()
        opt.tell(
            c,
            Outcome(status="oom")
            if c["a"] == 3
            else Outcome(status="ok", step_time=float(c["a"]), peak_memory=float(c["a"])),
        )
    assert opt.ask()["a"] in (1, 2)


def test_a_replicate_beats_an_untried_config_that_surely_ooms() -> None:
    """Tiny space: once only configs far over the capacity are left untried, the optimizer re-runs a
    config told ok (a replicate sharpens best()) instead of burning a trial on a near-certain OOM."""
    space = SearchSpace.from_yaml(
        "name: t\nknobs:\n  - name: mbs\n    type: int\n    values: [1, 2, 4, 8, 16, 32]\n"
        "    memory: hungry\n"
    )
    opt = Optimizer(space, memory_capacity=10.0, seed=0, settings=OptimizerSettings(n_init=2))
    for m in (1, 2, 4, 8):  # memory 2.5 m: mbs 4 fits, mbs 8 is a measured OOM
        out = (
            Outcome(status="ok", step_time=1.0 + 1.0 / m, peak_memory=2.5 * m)
            if 2.5 * m <= 10.0
            else Outcome(status="oom", peak_memory=2.5 * m)
        )
        opt.tell({"mbs": m}, out)
    p_fit = opt.predict([{"mbs": 16}, {"mbs": 32}])["p_fit"]
    assert p_fit.max() < 0.05  # the memory model knows 16 and 32 cannot fit
    c = opt.ask()
    assert c["mbs"] in (1, 2, 4)


def test_exhausted_space_raises() -> None:
    space = SearchSpace.from_yaml("name: t\nknobs:\n  - name: a\n    type: bool\n")
    opt = Optimizer(space, memory_capacity=1.0, seed=0)
    for _ in range(2):
        c = opt.ask()
        opt.tell(c, Outcome(status="failed"))
    with pytest.raises(SearchExhausted):
        opt.ask()


def test_batch_ask_returns_distinct_valid_configs() -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=2, settings=OptimizerSettings(n_init=4))
    batch = opt.ask(4)
    assert isinstance(batch, list) and len(batch) == 4
    for c in batch:
        opt.tell(c, tiny_run(c))
    batch = opt.ask(3)  # model-based batch (qLogNEI) with pending configs
    keys = {space.key(c) for c in batch}
    assert len(keys) == 3 and all(space.is_valid(c) for c in batch)
    assert isinstance(opt.last_ask_info, list) and len(opt.last_ask_info) == 3
    single = opt.ask()  # with three trials pending
    assert space.key(single) not in keys


def test_save_restore_gives_identical_next_ask(tmp_path) -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=3, settings=OptimizerSettings(n_init=3))
    for _ in range(6):
        c = opt.ask()
        opt.tell(c, tiny_run(c))
    path = tmp_path / "opt.json"
    opt.save(path)
    restored = Optimizer.load(path)
    a, b = opt.ask(), restored.ask()
    assert a == b
    assert opt.last_ask_info.phase == restored.last_ask_info.phase
    state = json.loads(path.read_text())
    other = Optimizer(space, memory_capacity=TINY_CAP, seed=3, settings=OptimizerSettings(n_init=3))
    other.load_state_dict(state)
    assert other.ask() == a


def test_invariant_violation_pattern_is_avoided() -> None:
    space = SearchSpace.from_yaml(DENSE)
    opt = Optimizer(space, memory_capacity=CAPACITY, seed=0)
    bf16 = [space.validate({"dtype": "bf16", "zero_stage": z}) for z in (0, 1, 2)]
    fp32 = [space.validate({"dtype": "fp32", "zero_stage": z}) for z in (0, 1, 2)]
    for c in bf16:
        opt.tell(c, Outcome(status="invariant_violation"))
    for c in fp32:
        opt.tell(c, run(c))
    pred = opt.predict(
        [
            space.validate({"dtype": "bf16", "zero_stage": 3}),
            space.validate({"dtype": "fp32", "zero_stage": 3}),
        ]
    )
    assert pred["p_ok"][0] < 0.5 < pred["p_ok"][1]
    assert set(pred) >= {"step_time_mean_s", "memory_mean_bytes", "p_fit", "p_ok"}
    asked = opt.ask(3)
    assert all(c["dtype"] == "fp32" for c in asked)


def test_all_oom_start_still_asks_and_learns_memory() -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=0, settings=OptimizerSettings(n_init=2))
    big = [c for c in space.enumerate() if tiny_run(c).status == "oom"]  # type: ignore[union-attr]
    for c in big[:3]:
        opt.tell(c, Outcome(status="oom", peak_memory=TINY_CAP * 1.01))
    c = opt.ask()
    assert space.key(c) not in {space.key(b) for b in big[:3]}
    assert opt.best() is None


@pytest.mark.parametrize("censoring", [True, False])
def test_ablation_switches_run(censoring: bool) -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(
        space,
        memory_capacity=TINY_CAP,
        seed=4,
        settings=OptimizerSettings(n_init=3, censoring=censoring, pairing=False),
    )
    for _ in range(7):
        c = opt.ask()
        opt.tell(c, tiny_run(c))
    assert opt.best() is not None


@pytest.mark.integration
def test_memory_cliff_near_optimum_within_24_tells() -> None:
    space = SearchSpace.from_yaml(DENSE)
    feasible = [c for c in space.enumerate() if memory_bytes(c) <= CAPACITY]  # type: ignore[union-attr]
    oracle = min(step_time_s(c) for c in feasible)
    opt = Optimizer(space, memory_capacity=CAPACITY, seed=0, baseline=BASELINE)
    ooms = 0
    for _ in range(24):
        c = opt.ask()
        out = run(c)
        ooms += out.status == "oom"
        opt.tell(c, out)
    best = opt.best()
    assert best is not None
    assert step_time_s(best) / oracle <= 1.2
    assert ooms <= 8
    assert math.isfinite(opt.predict([best])["step_time_mean_s"][0])


def test_asks_with_trials_pending_do_not_depend_on_the_string_hash_seed() -> None:
    """Same seed and same tells, same asks, in another process too: the pending configs reach the
    acquisition in an order that does not follow Python's per-process string hashing."""
    import os
    from pathlib import Path

    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import torch; torch.set_num_threads(1)\n"
        "from search_synthetic import TINY, TINY_CAP, tiny_run\n"
        "from infrarsi.search import Optimizer, OptimizerSettings, SearchSpace\n"
        "opt = Optimizer(SearchSpace.from_yaml(TINY), memory_capacity=TINY_CAP, seed=4,\n"
        "                settings=OptimizerSettings(n_init=3))\n"
        "running, asked = [opt.ask() for _ in range(3)], []\n"
        "for _ in range(5):\n"
        "    c = opt.ask(); asked.append(c); running.append(c); done = running.pop(0); opt.tell(done, tiny_run(done))\n"
        "print(json.dumps(asked, sort_keys=True))\n"
    )
    here = str(Path(__file__).resolve().parent)
    outs = [
        subprocess.run(
            [sys.executable, "-c", code, here],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": str(h)},
        ).stdout
        for h in (1, 2, 3)
    ]
    assert outs[0] and outs[0] == outs[1] == outs[2]


def test_a_space_too_large_to_enumerate_is_sampled_and_still_starts_from_the_baseline() -> None:
    """10^12 configs: no enumeration (``space.enumerate()`` is None); candidates are sampled per
    ask plus the anchors, and every ask is valid, never a failed config, and new unless it is the
    incumbent's replicate."""
    knobs = "\n".join(
        f"  - name: k{i}\n    type: int\n    values: [{', '.join(str(v) for v in range(10))}]"
        + ("\n    memory: hungry" if i == 0 else "")
        for i in range(12)
    )
    space = SearchSpace.from_yaml(
        f'name: huge\nknobs:\n{knobs}\nconstraints:\n  - "k1 + k2 <= 15"\n'
    )
    assert space.enumerate() is None
    baseline = {f"k{i}": 0 for i in range(12)}
    opt = Optimizer(
        space,
        memory_capacity=10.0,
        seed=0,
        baseline=baseline,
        settings=OptimizerSettings(candidate_cap=400),
    )
    seen, failed = set(), set()
    for i in range(8):
        c = opt.ask()
        if i == 0:
            assert c == space.validate(baseline) and opt.last_ask_info.phase == "baseline"
        assert space.is_valid(c) and space.key(c) not in failed
        # new, unless it re-measures the incumbent (intensification)
        assert space.key(c) not in seen or opt.last_ask_info.phase == "replicate"
        if c["k3"] == 9:
            failed.add(space.key(c))
            opt.tell(c, Outcome(status="failed"))
            continue
        seen.add(space.key(c))
        mem = 2.0 + c["k0"]
        opt.tell(
            c,
            Outcome(status="oom")
            if mem > 10.0
            else Outcome(
                status="ok",
                step_time=1.0 + sum((c[f"k{j}"] - 4) ** 2 for j in range(12)) / 50,
                peak_memory=mem,
            ),
        )
    assert opt.best() is not None


def test_settings_survive_save_and_restore_and_give_the_same_next_asks(tmp_path) -> None:
    """A variant (non-default settings) is rebuilt exactly from its saved state."""
    space = SearchSpace.from_yaml(DENSE)
    variant = OptimizerSettings(
        local_every=3,
        local_radius=1,
        acquisition_config_sd=0.02,
        design_rule="maximin",
        outlier_min_points=4,
        time_gp_iters=(100, 40, 6),
    )
    opt = Optimizer(
        space,
        memory_capacity=CAPACITY,
        seed=7,
        baseline=BASELINE,
        settings=replace(variant, n_init=4),
    )
    for _ in range(7):
        c = opt.ask()
        opt.tell(c, run(c))
    opt.save(tmp_path / "opt.json")
    restored = Optimizer.load(tmp_path / "opt.json")
    assert restored.settings == opt.settings and restored.settings != OptimizerSettings(n_init=4)
    for _ in range(3):
        a, b = opt.ask(), restored.ask()
        assert a == b and opt.last_ask_info == restored.last_ask_info
        opt.tell(a, run(a))
        restored.tell(b, run(b))


def test_unknown_options_and_bad_settings_are_user_input_errors() -> None:
    space = SearchSpace.from_yaml(TINY)
    with pytest.raises(UserInputError, match="local_every"):
        Optimizer(space, memory_capacity=TINY_CAP, settings=OptimizerSettings(local_every=-1))
    with pytest.raises(UserInputError, match="ask"):
        Optimizer(space, memory_capacity=TINY_CAP).ask(0)
    with pytest.raises(
        TypeError, match="n_init"
    ):  # a tunable is a setting, not a constructor option
        Optimizer(space, memory_capacity=TINY_CAP, n_init=3)  # type: ignore[call-arg]


def test_the_warm_start_queue_is_saved_and_restored() -> None:
    space = SearchSpace.from_yaml(TINY)
    warm = [{"stage": 1, "mbs": 4}, {"stage": 0, "mbs": 2}, {"stage": 2, "mbs": 8}]
    opt = Optimizer(
        space,
        memory_capacity=TINY_CAP,
        seed=1,
        initial_configs=warm,
        initial_origins=[WarmStartOrigin(source_study=s) for s in "abc"],
    )
    for _ in range(2):  # the default config (the baseline), then the first warm-start config
        c = opt.ask()
        opt.tell(c, tiny_run(c))
    restored = Optimizer.from_state(json.loads(json.dumps(opt.state_dict())))
    assert restored.initial_queue == opt.initial_queue and len(opt.initial_queue) == 2
    for _ in range(3):
        a, b = opt.ask(), restored.ask()
        assert a == b and opt.last_ask_info == restored.last_ask_info
        opt.tell(a, tiny_run(a))
        restored.tell(b, tiny_run(b))
    assert [
        i.warm_start_origin.source_study for i in opt.ask_infos.values() if i.phase == "warm_start"
    ] == ["a", "b", "c"]


# ------------------------------------------------------------------------ fuzz: ask never raises


def _fuzz_outcome(draw: st.DrawFn, capacity: float) -> Outcome:
    status = draw(
        st.sampled_from(
            ["ok", "ok", "ok", "oom", "failed", "timeout", "nan", "invariant_violation"]
        )
    )
    if status == "ok":
        return Outcome(
            status="ok",
            step_time=draw(st.floats(1e-3, 1e3)),
            peak_memory=draw(st.one_of(st.none(), st.floats(1e-2 * capacity, 3 * capacity))),
        )
    if status == "oom":
        return Outcome(
            status="oom", peak_memory=draw(st.one_of(st.none(), st.floats(capacity, 4 * capacity)))
        )
    return Outcome(status=status)


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
)  # no shrinking: a failing example is printed as drawn
@given(text=fuzz_space(), data=st.data())
def test_fuzz_ask_never_raises_on_valid_spaces(text: str, data: st.DataObject) -> None:
    """Random valid spaces, random outcomes told back: ``ask`` hands out valid configs and raises
    only ``SearchExhausted``, and only when every valid config has been told a failure."""
    try:
        space = SearchSpace.from_yaml(text)
    except SearchSpaceError:  # e.g. a type mismatch at the defaults: refused at load, by design
        assume(False)
    capacity = 1e9
    rows = space.enumerate()
    baseline = data.draw(st.sampled_from(rows)) if rows and data.draw(st.booleans()) else None
    few = data.draw(
        st.booleans()
    )  # a small cap: the sampled-pool path with its anchors and pairing
    cheap = replace(CHEAP, candidate_cap=8, enumeration_limit=16) if few else CHEAP
    warm = data.draw(st.lists(st.sampled_from(rows), max_size=3)) if rows else []
    opt = Optimizer(
        space,
        memory_capacity=capacity,
        seed=data.draw(st.integers(0, 3)),
        baseline=baseline,
        settings=cheap,
        initial_configs=[*warm, {"no_such_knob": 1}],
    )
    failed: set[str] = set()
    for step in range(data.draw(st.integers(4, 9))):
        if step == 3:  # saved and restored mid-search: it goes on as if nothing happened
            opt = Optimizer.from_state(json.loads(json.dumps(opt.state_dict())))
        n = data.draw(st.sampled_from([None, None, None, 2]))
        try:
            asked = opt.ask(n)
        except SearchExhausted:
            assert rows is not None and {space.key(r) for r in rows} <= failed | set(opt.pending)
            event("exhausted")
            return
        event(f"phase {opt.last_ask_info.phase if n is None else opt.last_ask_info[0].phase}")
        for cfg in [asked] if n is None else asked:
            assert space.validate(cfg) == cfg, cfg
            assert space.key(cfg) not in failed
            outcome = _fuzz_outcome(data.draw, capacity)
            opt.tell(cfg, outcome)
            if outcome.status != "ok":
                failed.add(space.key(cfg))
    best = opt.best()
    assert best is None or space.validate(best) == best


BEST_SPACE = """
name: toy
knobs:
  - {name: a, type: int, values: [1, 2, 3, 4, 5, 6]}
  - {name: b, type: int, values: [1, 2, 3, 4]}
"""


def _disagreeing(confidence: float) -> Optimizer:
    """A smooth toy told with 3% noise, then a config measured three times at 2.5 s (truth 2.3 s)
    and its neighbour measured once at 2.45 s (truth 2.6 s: a lucky draw)."""
    space = SearchSpace.from_yaml(BEST_SPACE)
    opt = Optimizer(
        space, memory_capacity=100.0, seed=0, settings=OptimizerSettings(best_confidence=confidence)
    )
    rng = np.random.default_rng(1)

    def truth(c: dict[str, int]) -> float:
        return 2.0 + 0.3 * c["a"] + 0.2 * (c["b"] - 2) ** 2

    for c in ({"a": a, "b": b} for a in (1, 2, 3, 4) for b in (1, 2, 3, 4)):
        if c not in ({"a": 1, "b": 2}, {"a": 2, "b": 2}):
            noisy = truth(c) * math.exp(0.03 * rng.standard_normal())
            opt.tell(c, Outcome("ok", step_time=noisy, peak_memory=50.0))
    for t in (2.5, 2.52, 2.49):
        opt.tell({"a": 1, "b": 2}, Outcome("ok", step_time=t, peak_memory=50.0))
    opt.tell({"a": 2, "b": 2}, Outcome("ok", step_time=2.45, peak_memory=50.0))
    return opt


def test_best_names_its_evidence_when_the_posterior_and_the_measurements_disagree() -> None:
    """The thrice-measured config has the best posterior mean, the once-measured one the best
    measurement: the posterior is confident here (its neighbours are slow), so it wins; asked for
    certainty, the measured-fastest wins. Either way the record names both and says why."""
    confident = _disagreeing(0.9)
    choice = confident.best_choice()
    assert choice is not None and confident.best() == choice.config == {"a": 1, "b": 2}
    assert choice.reason == "posterior_confident_measured_slower"
    assert (choice.n_measured, choice.measured_median_s) == (3, 2.5)
    assert choice.alternative is not None and choice.alternative.config == {"a": 2, "b": 2}
    assert (choice.alternative.n_measured, choice.alternative.measured_median_s) == (1, 2.45)
    assert choice.posterior_mean_s is not None and choice.alternative.posterior_mean_s is not None
    assert choice.posterior_mean_s < choice.alternative.posterior_mean_s
    assert choice.p_measured_slower is not None and choice.p_measured_slower >= 0.9
    assert confident.models.incumbent(confident.history) == choice.config  # ask's incumbent

    certain = _disagreeing(1.0)
    strict = certain.best_choice()
    assert strict is not None and certain.best() == strict.config == {"a": 2, "b": 2}
    assert strict.reason == "measured_faster_posterior_uncertain"
    assert strict.alternative is not None and strict.alternative.config == {"a": 1, "b": 2}
    assert certain.models.incumbent(certain.history) == {"a": 1, "b": 2}  # unchanged


def test_best_choice_does_not_change_the_next_ask() -> None:
    space = SearchSpace.from_yaml(TINY)
    a = Optimizer(space, memory_capacity=TINY_CAP, seed=3, settings=CHEAP)
    b = Optimizer(space, memory_capacity=TINY_CAP, seed=3, settings=CHEAP)
    for _ in range(6):
        ca, cb = a.ask(), b.ask()
        assert ca == cb
        a.tell(ca, tiny_run(ca))
        b.tell(cb, tiny_run(cb))
        a.best_choice()
    assert a.ask() == b.ask()


def test_best_before_a_model_is_the_fastest_measurement() -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=0)
    assert opt.best() is None and opt.best_choice() is None
    c = space.validate({"stage": 1, "mbs": 2})
    opt.tell(c, tiny_run(c))
    choice = opt.best_choice()
    assert choice is not None and choice.reason == "measured_only" and opt.best() == c
