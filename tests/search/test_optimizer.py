"""``Optimizer`` (``optimizer.py``): ask/tell semantics, exclusions, batches, settings, warm-start configs, stragglers, save/restore, no Ray import."""

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
    DENSE,
    TINY,
    TINY_CAP,
    SyntheticPrior,
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
    code = ("import sys; from infrarsi.search import SearchSpace, Optimizer, Outcome; "
            "import infrarsi.search.optimizer, infrarsi.search.acquisition; "
            "print('ray' in sys.modules or any(m.startswith('ray.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_baseline_first_then_design_and_info() -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=0, baseline={"stage": 2, "mbs": 1, "ckpt": True})
    first = opt.ask()
    assert first == {"stage": 2, "mbs": 1, "ckpt": True}
    assert opt.last_ask_info.phase == "baseline"
    opt.tell(first, tiny_run(first))
    second = opt.ask()
    assert second != first and opt.last_ask_info.phase == "design"
    assert opt.info(second).config == second
    assert opt.best() == first  # the only ok config


def test_baseline_replicates_do_not_use_up_the_design() -> None:
    """The doctor tells the baseline several times; the design still gets n_init - 1 new configs."""
    space = SearchSpace.from_yaml(TINY)
    base = {"stage": 2, "mbs": 1, "ckpt": True}
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=0, baseline=base, n_init=4)
    for _ in range(3):
        opt.tell(base, tiny_run(base))
    phases = []
    for _ in range(3):
        c = opt.ask()
        phases.append(opt.last_ask_info.phase)
        opt.tell(c, tiny_run(c))
    assert phases == ["design"] * 3


def test_oom_and_failed_configs_are_never_proposed_again() -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=1, n_init=3)
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
            trimmed = {space.key(opt.observations[j].config) for j in opt.time_outliers}
            untried = [space.as_config(v) for v in space.enumerate_values() or []]
            untried = [c for c in untried if space.key(c) not in seen and space.key(c) not in bad]
            p = opt.predict(untried)
            assert key in trimmed or float((p["p_fit"] * p["p_ok"]).max()) < DEFAULT_SETTINGS.repeat_below_p
        seen.append(key)
        out = tiny_run(cfg)
        if out.status == "ok" and i % 4 == 3:
            out = Outcome(status="invariant_violation")
        if out.status != "ok":
            bad.add(key)
        opt.tell(cfg, out)
    assert any(tiny_run(space.as_config(json.loads(k))).status == "oom" for k in bad)


def test_after_every_config_is_tried_only_ok_ones_come_back() -> None:
    space = SearchSpace.from_yaml("name: t\nknobs:\n  - name: a\n    type: int\n    values: [1, 2, 3]\n")
    opt = Optimizer(space, memory_capacity=10.0, seed=0, n_init=2)
    for _ in range(3):
        c = opt.ask()
        opt.tell(c, Outcome(status="oom") if c["a"] == 3 else Outcome(status="ok", step_time=float(c["a"]), peak_memory=float(c["a"])))
    assert opt.ask()["a"] in (1, 2)


def test_a_replicate_beats_an_untried_config_that_surely_ooms() -> None:
    """Tiny space: once only configs far over the capacity are left untried, the optimizer re-runs a
    config told ok (a replicate sharpens best()) instead of burning a trial on a near-certain OOM."""
    space = SearchSpace.from_yaml("name: t\nknobs:\n  - name: mbs\n    type: int\n    values: [1, 2, 4, 8, 16, 32]\n"
                                  "    memory: hungry\n")
    opt = Optimizer(space, memory_capacity=10.0, seed=0, n_init=2)
    for m in (1, 2, 4, 8):  # memory 2.5 m: mbs 4 fits, mbs 8 is a measured OOM
        out = (Outcome(status="ok", step_time=1.0 + 1.0 / m, peak_memory=2.5 * m) if 2.5 * m <= 10.0
               else Outcome(status="oom", peak_memory=2.5 * m))
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
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=2, n_init=4)
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
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=3, n_init=3)
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
    other = Optimizer(space, memory_capacity=TINY_CAP, seed=3, n_init=3)
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
    pred = opt.predict([space.validate({"dtype": "bf16", "zero_stage": 3}), space.validate({"dtype": "fp32", "zero_stage": 3})])
    assert pred["p_ok"][0] < 0.5 < pred["p_ok"][1]
    assert set(pred) >= {"step_time_mean_s", "memory_mean_bytes", "p_fit", "p_ok"}
    asked = opt.ask(3)
    assert all(c["dtype"] == "fp32" for c in asked)


def test_all_oom_start_still_asks_and_learns_memory() -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=0, n_init=2)
    big = [c for c in space.enumerate() if tiny_run(c).status == "oom"]  # type: ignore[union-attr]
    for c in big[:3]:
        opt.tell(c, Outcome(status="oom", peak_memory=TINY_CAP * 1.01))
    c = opt.ask()
    assert space.key(c) not in {space.key(b) for b in big[:3]}
    assert opt.best() is None


@pytest.mark.parametrize("censoring", [True, False])
def test_ablation_switches_run(censoring: bool) -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=4, n_init=3, censoring=censoring, pairing=False)
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


def test_local_steps_stay_near_the_incumbent() -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=5, n_init=3, local_every=2)
    phases = []
    for _ in range(9):
        c = opt.ask()
        info = opt.last_ask_info
        phases.append(info.phase)
        if info.phase == "bo-local":
            best = opt.best()
            assert best is not None
            assert sum(c[k] != best[k] for k in space.names) <= 2
        opt.tell(c, tiny_run(c))
    assert "bo-local" in phases


@pytest.mark.parametrize("intensify", [True, False])
def test_an_incumbent_measured_once_is_re_measured_on_a_local_turn(intensify: bool) -> None:
    """SMAC-style intensification: while the posterior-best config has a single trusted
    measurement, the local step re-runs it (a lucky draw must not decide best())."""
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=5, n_init=3, local_every=2, intensify=intensify)
    replicated = []
    for _ in range(12):
        c = opt.ask()
        info = opt.last_ask_info
        if info.phase == "replicate":
            replicated.append(space.key(c))
            told = [space.key(o.config) for o in opt.observations if o.outcome.status == "ok"]
            assert told.count(space.key(c)) == 1  # the incumbent, measured once so far
            assert c == opt.best()
            assert info.predicted_step_time_s > 0 and 0.0 <= info.p_fit <= 1.0
            assert opt.n_asks % 2 == 0  # a local turn (n_asks counts this ask)
        opt.tell(c, tiny_run(c))
    assert bool(replicated) == intensify
    assert len(set(replicated)) == len(replicated)  # a confirmed incumbent is not re-run again
    assert Optimizer.from_state(opt.state_dict()).settings.intensify == intensify


def test_single_asks_with_trials_pending_keep_the_local_turns_and_intensification() -> None:
    """Trials running at once (a cluster's slots, told oldest first): an ``ask()`` with three
    configs pending keeps the sequential schedule, local steps near the incumbent and the
    incumbent's replicate, and never returns a pending config."""
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=5, n_init=3, local_every=2)
    running = [opt.ask() for _ in range(3)]
    phases = []
    for _ in range(12):
        pending = set(opt.pending)
        c = opt.ask()
        info = opt.last_ask_info
        assert len(pending) == 3 and space.key(c) not in pending
        phases.append(info.phase)
        if info.phase in ("bo-local", "replicate"):
            assert opt.n_asks % 2 == 0  # a local turn (n_asks counts this ask)
            best = opt.best()
            assert best is not None and sum(c[k] != best[k] for k in space.names) <= 2
        if info.phase == "replicate":
            told = [space.key(o.config) for o in opt.observations if o.outcome.status == "ok"]
            assert told.count(space.key(c)) == 1 and c == opt.best()
        running.append(c)
        done = running.pop(0)
        opt.tell(done, tiny_run(done))
    assert "bo-local" in phases and "replicate" in phases


def test_asks_with_trials_pending_do_not_depend_on_the_string_hash_seed() -> None:
    """Same seed and same tells, same asks, in another process too: the pending configs reach the
    acquisition in an order that does not follow Python's per-process string hashing."""
    import os
    from pathlib import Path

    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import torch; torch.set_num_threads(1)\n"
            "from search_synthetic import TINY, TINY_CAP, tiny_run\n"
            "from infrarsi.search import Optimizer, SearchSpace\n"
            "opt = Optimizer(SearchSpace.from_yaml(TINY), memory_capacity=TINY_CAP, seed=4, n_init=3)\n"
            "running, asked = [opt.ask() for _ in range(3)], []\n"
            "for _ in range(5):\n"
            "    c = opt.ask(); asked.append(c); running.append(c); done = running.pop(0); opt.tell(done, tiny_run(done))\n"
            "print(json.dumps(asked, sort_keys=True))\n")
    here = str(Path(__file__).resolve().parent)
    outs = [subprocess.run([sys.executable, "-c", code, here], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(h)}).stdout for h in (1, 2, 3)]
    assert outs[0] and outs[0] == outs[1] == outs[2]


def test_a_pending_incumbent_is_not_asked_again_as_its_replicate() -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=5, n_init=3, local_every=2)
    for _ in range(5):
        c = opt.ask()
        opt.tell(c, tiny_run(c))
    while opt.n_asks % 2 != 1:  # the next ask is a local turn
        c = opt.ask()
        opt.tell(c, tiny_run(c))
    inc = opt.best()
    assert inc is not None
    opt.pending[space.key(inc)] = dict(inc)  # its replicate is already running
    c = opt.ask()
    assert space.key(c) != space.key(inc) and opt.last_ask_info.phase != "replicate"


def test_a_space_too_large_to_enumerate_is_sampled_and_still_starts_from_the_baseline() -> None:
    """10^12 configs: no enumeration (``space.enumerate()`` is None); candidates are sampled per
    ask plus the anchors, and every ask is valid, never a failed config, and new unless it is the
    incumbent's replicate."""
    knobs = "\n".join(f"  - name: k{i}\n    type: int\n    values: [{', '.join(str(v) for v in range(10))}]"
                      + ("\n    memory: hungry" if i == 0 else "") for i in range(12))
    space = SearchSpace.from_yaml(f"name: huge\nknobs:\n{knobs}\nconstraints:\n  - \"k1 + k2 <= 15\"\n")
    assert space.enumerate() is None
    baseline = {f"k{i}": 0 for i in range(12)}
    opt = Optimizer(space, memory_capacity=10.0, seed=0, baseline=baseline, candidate_cap=400)
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
        opt.tell(c, Outcome(status="oom") if mem > 10.0 else
                 Outcome(status="ok", step_time=1.0 + sum((c[f"k{j}"] - 4) ** 2 for j in range(12)) / 50, peak_memory=mem))
    assert opt.best() is not None


def test_pairing_before_the_pick_repairs_a_fast_config_the_sample_cannot_fit() -> None:
    """A sampled pool holding only a fast config that cannot fit and a slow one that does: the
    fast one's best repair (outside the pool) is scored and, beating the slow one, asked instead,
    with its source recorded."""
    space = SearchSpace.from_yaml(DENSE)
    opt = Optimizer(space, memory_capacity=CAPACITY, seed=0, baseline=BASELINE, candidate_cap=40)
    for _ in range(10):
        c = opt.ask()
        opt.tell(c, run(c))
    for over in ({"zero_stage": 0, "micro_batch_size": 8, "dtype": "fp32"}, {"zero_stage": 0, "micro_batch_size": 4},
                 {"zero_stage": 1, "micro_batch_size": 8, "dtype": "fp32"}):  # OOMs teach the memory model
        v = space.validate({"activation_checkpointing": "none", "dtype": "bf16", **over})
        out = run(v)
        assert out.status == "oom"
        opt.tell(v, out)
    fast = space.validate({"zero_stage": 0, "micro_batch_size": 8, "activation_checkpointing": "none", "dtype": "bf16"})
    slow = space.validate({"zero_stage": 3, "micro_batch_size": 1, "activation_checkpointing": "full",
                           "offload_optimizer": True, "offload_param": True, "dtype": "fp32"})
    assert memory_bytes(fast) > CAPACITY >= memory_bytes(slow) and step_time_s(fast) < step_time_s(slow)
    pool = [fast, slow]
    opt._fit()  # as ask() does before scoring
    scores = opt._scores(pool)
    assert scores.p_fit[0] < 0.5  # the memory model knows the fast one will not fit
    pick = int(scores.log_score.argmax())
    info = opt._pair_before_pick(pool, scores, pick, excluded=set())
    assert info is not None
    c = info.config
    assert info.phase == "repair" and info.paired == "before_pick" and info.repair_of == fast
    assert space.key(c) not in {space.key(fast), space.key(slow)} and space.is_valid(c)
    assert info.p_fit >= 0.7 and info.log_acquisition > scores.log_score[pick]
    assert info.repair_moves and all(space.knob(m.split(":")[0]).memory != "neutral" for m in info.repair_moves)


@pytest.mark.parametrize("cap", [40, None])
def test_pairing_before_the_pick_runs_only_on_a_sampled_pool(cap: int | None) -> None:
    """Every repair asked before the pick is valid, fits by the model and records its source; when
    every config is scored (no cap), the repairs are in the pool already and it never fires."""
    space = SearchSpace.from_yaml(DENSE)
    opt = Optimizer(space, memory_capacity=CAPACITY, seed=1, baseline=BASELINE,
                    **({} if cap is None else {"candidate_cap": cap}))
    fired = 0
    for _ in range(20):
        c = opt.ask()
        info = opt.last_ask_info
        if info.paired == "before_pick":
            fired += 1
            assert info.phase == "repair" and info.original_p_fit < 0.5 <= info.p_fit
            assert space.is_valid(c) and space.key(info.repair_of) != space.key(c)
        opt.tell(c, run(c))
    if cap is None:
        assert fired == 0


def test_settings_survive_save_and_restore_and_give_the_same_next_asks(tmp_path) -> None:
    """A variant (non-default settings) is rebuilt exactly from its saved state."""
    space = SearchSpace.from_yaml(DENSE)
    variant = OptimizerSettings(local_every=3, local_radius=1, acquisition_config_sd=0.02, design_rule="maximin",
                                outlier_min_points=4, time_gp_iters=(100, 40, 6))
    opt = Optimizer(space, memory_capacity=CAPACITY, seed=7, baseline=BASELINE, settings=variant, n_init=4)
    assert opt.settings == replace(variant, n_init=4)  # a keyword option fills the settings
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
        Optimizer(space, memory_capacity=TINY_CAP, local_every=-1)
    with pytest.raises(UserInputError, match="ask"):
        Optimizer(space, memory_capacity=TINY_CAP).ask(0)


def test_initial_configs_come_after_the_baseline_in_order_each_once() -> None:
    space = SearchSpace.from_yaml(TINY)
    base = {"stage": 2, "mbs": 1, "ckpt": True}
    warm = [{"stage": 1, "mbs": 4, "ckpt": True}, {"stage": 9}, {"stage": 1, "mbs": 4, "ckpt": True},
            {"stage": 2, "mbs": 2}, {"stage": 0, "mbs": 8}]
    origins = [WarmStartOrigin(source_study="a", relative_step_time=0.5), None, None, WarmStartOrigin(trial_id="t2")]
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=0, baseline=base, initial_configs=warm,
                    initial_origins=origins, n_init=3)
    # the invalid config (stage 9) and the repeat are dropped; the rest keep their order and origins
    assert [c for c, _ in opt.initial_queue] == [space.validate(warm[i]) for i in (0, 3, 4)]
    assert opt.ask() == base and opt.last_ask_info.phase == "baseline"
    opt.tell(base, tiny_run(base))
    opt.tell(warm[3], tiny_run(space.validate(warm[3])))  # measured before its turn: skipped
    first = opt.ask()
    assert first == space.validate(warm[0])
    info = opt.last_ask_info
    assert (info.config, info.phase, info.ask_index, info.warm_start_origin, info.repair_of) == (
        first, "warm_start", 1, origins[0], None)
    assert info.p_fit is not None  # checked against this study's memory model before it is asked
    batch = opt.ask(2)  # the last queued config, then the optimizer's own
    assert batch[0] == space.validate(warm[4]) and [i.phase for i in opt.last_ask_info] == ["warm_start", "bo"]
    assert opt.initial_queue == [] and len({space.key(c) for c in [first, *batch]}) == 3
    with pytest.raises(UserInputError, match="initial_origins"):
        Optimizer(space, memory_capacity=TINY_CAP, initial_configs=[base], initial_origins=[None, None])


def test_a_warm_start_config_expected_not_to_fit_here_is_asked_as_its_memory_saving_repair() -> None:
    """A bank config measured on a larger card (or a smaller model) that this study's memory model
    expects to run out of memory is replaced by its best repair, which fits; the original never runs."""
    space = SearchSpace.from_yaml(TINY)
    too_big = space.validate({"stage": 0, "mbs": 8, "ckpt": False})
    assert tiny_run(too_big).status == "oom"
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=0, initial_configs=[too_big],
                    initial_origins=[WarmStartOrigin(source_study="bigger-card")], n_init=3)
    for c in ({"stage": 2, "mbs": 1, "ckpt": True}, {"stage": 0, "mbs": 4, "ckpt": False},
              {"stage": 1, "mbs": 2, "ckpt": False}, {"stage": 2, "mbs": 8, "ckpt": True}):
        c = space.validate(c)
        opt.tell(c, tiny_run(c))
    asked = opt.ask()
    info = opt.last_ask_info
    assert space.key(asked) != space.key(too_big)
    assert info.phase == "warm_start" and info.repair_of == too_big and info.paired == "warm_start"
    assert info.original_p_fit is not None and info.original_p_fit < DEFAULT_SETTINGS.pairing_trigger
    assert info.repair_moves and info.warm_start_origin == WarmStartOrigin(source_study="bigger-card")
    assert tiny_run(asked).status == "ok"
    assert opt.initial_queue == []


def test_the_warm_start_queue_is_saved_and_restored() -> None:
    space = SearchSpace.from_yaml(TINY)
    warm = [{"stage": 1, "mbs": 4}, {"stage": 0, "mbs": 2}, {"stage": 2, "mbs": 8}]
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=1, initial_configs=warm,
                    initial_origins=[WarmStartOrigin(source_study=s) for s in "abc"])
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
    assert [i.warm_start_origin.source_study for i in opt.ask_infos.values() if i.phase == "warm_start"] == ["a", "b", "c"]


STRAGGLER_SPACE = """
name: toy
knobs:
  - {name: a, type: int, values: [1, 2, 3, 4, 5, 6]}
  - {name: b, type: int, values: [1, 2, 3, 4]}
"""


def _straggler_truth(c: dict[str, int]) -> float:
    return 2.0 + 0.5 * c["a"] + 0.3 * (c["b"] - 2) ** 2


def test_optimizer_leaves_a_straggler_out_and_may_measure_it_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    space = SearchSpace.from_yaml(STRAGGLER_SPACE)
    opt = Optimizer(space, memory_capacity=100.0, seed=0)
    rng = np.random.default_rng(0)
    configs = [{"a": a, "b": b} for a in (1, 3, 5, 6) for b in (1, 2, 4)]
    for i, c in enumerate(configs):
        t = _straggler_truth(c) * math.exp(0.01 * rng.standard_normal())
        if c == {"a": 1, "b": 2}:  # the fastest config, measured during a straggler
            t *= 1.5
            straggler = i
        opt.tell(c, Outcome("ok", step_time=t, peak_memory=50.0))
    # best() recommends only configs with a trusted measurement; the model ignores the slow one
    assert opt.best() == {"a": 1, "b": 1}
    assert opt.time_outliers == {straggler}
    pred = float(opt.predict([{"a": 1, "b": 2}])["step_time_mean_s"][0])
    assert abs(pred / _straggler_truth({"a": 1, "b": 2}) - 1) < 0.1  # not the straggler's 1.5x
    assert space.key({"a": 1, "b": 2}) not in opt._excluded()[1]  # it may be measured again
    opt.save(tmp_path / "s.json")
    again = Optimizer.load(tmp_path / "s.json")
    assert again.time_outliers == {straggler} and again.time_trim_key == opt.time_trim_key
    # a second slow measurement agrees with the first: neither is an outlier any more
    opt.tell({"a": 1, "b": 2}, Outcome("ok", step_time=_straggler_truth({"a": 1, "b": 2}) * 1.5, peak_memory=50.0))
    opt.best()
    assert opt.time_outliers == set()


CHEAP = OptimizerSettings(time_gp_iters=(15, 6, 3), memory_gp_iters=(15, 6, 3), prior_fit_iters=10,
                          design_pool=64, batch_choices=16, pair_source_scan=16, n_init=3)
"""Few L-BFGS iterations and small pools: the fuzz exercises the code paths, not the fit."""


def test_a_replicate_that_failed_is_never_asked_again() -> None:
    """Intensification re-measures an incumbent with one ok measurement; when that replicate
    fails, the incumbent still has one ok measurement, but it must not be asked a third time."""
    space = SearchSpace.from_yaml("name: r\nknobs:\n  - {name: a, type: int, values: [0, 1, 2]}\n"
                                  "  - {name: b, type: int, values: [0, 1]}\n")
    opt = Optimizer(space, memory_capacity=1e9, seed=0, settings=CHEAP)
    failed: set[str] = set()
    replicated = False
    for _ in range(11):
        cfg = opt.ask()
        assert space.key(cfg) not in failed, (cfg, opt.last_ask_info.phase)
        if opt.last_ask_info.phase == "replicate":
            replicated = True
            opt.tell(cfg, Outcome(status="failed"))
            failed.add(space.key(cfg))
        else:
            opt.tell(cfg, Outcome(status="ok", step_time=1.0 + 0.1 * cfg["a"] + 0.05 * cfg["b"]))
    assert replicated


# ------------------------------------------------------------------------ fuzz: ask never raises


def _fuzz_outcome(draw: st.DrawFn, capacity: float) -> Outcome:
    status = draw(st.sampled_from(["ok", "ok", "ok", "oom", "failed", "timeout", "nan", "invariant_violation"]))
    if status == "ok":
        return Outcome(status="ok", step_time=draw(st.floats(1e-3, 1e3)),
                       peak_memory=draw(st.one_of(st.none(), st.floats(1e-2 * capacity, 3 * capacity))))
    if status == "oom":
        return Outcome(status="oom", peak_memory=draw(st.one_of(st.none(), st.floats(capacity, 4 * capacity))))
    return Outcome(status=status)


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate])  # no shrinking: a failing example is printed as drawn
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
    few = data.draw(st.booleans())  # a small cap: the sampled-pool path with its anchors and pairing
    cheap = replace(CHEAP, candidate_cap=8, enumeration_limit=16) if few else CHEAP
    warm = data.draw(st.lists(st.sampled_from(rows), max_size=3)) if rows else []
    opt = Optimizer(space, memory_capacity=capacity, seed=data.draw(st.integers(0, 3)), baseline=baseline,
                    settings=cheap, initial_configs=[*warm, {"no_such_knob": 1}])
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


def test_with_a_prior_the_first_wave_of_pending_trials_holds_the_priors_pick() -> None:
    """Trials asked before any result (a cluster's first wave): the analytic prior, the only model
    there is, gets a pick in that wave (``bo-prior``: fast by the prior and likely to fit), and the
    picks after the design, while fewer than two results are in, are the prior's too. One at a
    time (nothing pending) the schedule is the sequential one: no ``bo-prior`` asks."""
    space = SearchSpace.from_yaml(DENSE)
    opt = Optimizer(space, memory_capacity=CAPACITY, seed=3, baseline=BASELINE, prior=SyntheticPrior(), n_init=4)
    wave = [opt.ask() for _ in range(4)]
    phases = [opt.info(c).phase for c in wave]  # type: ignore[union-attr]
    assert phases == ["baseline", "bo-prior", "design", "design"]
    pick = wave[1]
    assert step_time_s(pick) < step_time_s(space.validate(BASELINE)) and memory_bytes(pick) <= CAPACITY
    opt.tell(wave[0], run(wave[0]))  # one result, three pending: the design is asked, no time model yet
    nxt = opt.ask()
    assert opt.last_ask_info.phase == "bo-prior" and space.key(nxt) not in {space.key(c) for c in wave}  # type: ignore[union-attr]

    seq = Optimizer(space, memory_capacity=CAPACITY, seed=3, baseline=BASELINE, prior=SyntheticPrior(), n_init=4)
    for _ in range(7):
        c = seq.ask()
        assert seq.last_ask_info.phase != "bo-prior"  # type: ignore[union-attr]
        seq.tell(c, run(c))
