"""The per-phase pickers (``pickers.py``): baseline, warm start (and its repair), replicate, the
acquisition's picks and memory-saver pairing before and after the pick."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from search_synthetic import (
    BASELINE,
    CAPACITY,
    CHEAP,
    DENSE,
    TINY,
    TINY_CAP,
    SyntheticPrior,
    memory_bytes,
    run,
    step_time_s,
    synthetic_source,
    tiny_run,
)

from infrarsi.errors import UserInputError
from infrarsi.search import Optimizer, OptimizerSettings, Outcome, SearchSpace, WarmStartOrigin
from infrarsi.search.ask_info import AskInfo, Phase
from infrarsi.search.pickers import Round
from infrarsi.search.settings import DEFAULT_SETTINGS
from infrarsi.search.transfer import TransferPrior


def test_the_baseline_is_available_only_on_an_empty_history_and_a_round_takes_each_pick() -> None:
    space = SearchSpace.from_yaml(TINY)
    base = space.validate({"stage": 2, "mbs": 1, "ckpt": True})
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=0, baseline=base)
    pk, h = opt.pickers, opt.history
    others = [c for c in space.enumerate() or [] if space.key(c) != space.key(base)]
    rnd = Round(taken=set(), failed=set())
    assert pk.baseline_available(h, rnd, [base, *others]) and not pk.baseline_available(
        h, rnd, others
    )
    info = pk.baseline(h)
    assert (info.config, info.phase, info.ask_index, info.p_fit) == (base, Phase.BASELINE, 0, None)
    rnd.add(info, space)
    assert rnd.taken == {space.key(base)} and rnd.infos == [info]
    assert not pk.baseline_available(h, rnd, [base])  # taken by this ask
    opt.tell(base, tiny_run(base))
    assert not pk.baseline_available(h, Round(taken=set(), failed=set()), [base])  # told


def test_a_warm_start_already_told_is_skipped_and_without_memory_knowledge_asked_as_given() -> None:
    space = SearchSpace.from_yaml(TINY)
    first, second = space.validate({"stage": 1, "mbs": 4}), space.validate({"stage": 0, "mbs": 2})
    opt = Optimizer(
        space,
        memory_capacity=TINY_CAP,
        seed=0,
        initial_configs=[first, second],
        initial_origins=[WarmStartOrigin(source_study="a")],
    )
    rnd = Round(taken={space.key(first)}, failed=set())
    assert (
        opt.pickers.warm_start(opt.history, rnd) is None
    )  # taken: skipped, and gone from the queue
    info = opt.pickers.warm_start(opt.history, rnd)
    assert info is not None and info.config == second and info.phase == Phase.WARM_START
    assert (
        info.p_fit is None and info.warm_start_origin is None
    )  # no prior, no memory model: not judged
    assert opt.history.warm_queue == [] and not rnd.warm_fitted


def test_no_replicate_without_intensify() -> None:
    space = SearchSpace.from_yaml(TINY)
    for intensify in (True, False):
        opt = Optimizer(
            space, memory_capacity=TINY_CAP, seed=0, settings=OptimizerSettings(intensify=intensify)
        )
        c = space.validate({"stage": 2, "mbs": 1, "ckpt": True})
        opt.tell(c, tiny_run(c))
        info = opt.pickers.replicate(opt.history, Round(taken=set(), failed=set()))
        assert (info is not None) == intensify
        if info is not None:
            assert info.config == c and info.phase == Phase.REPLICATE
        taken = Round(
            taken={space.key(c)}, failed=set()
        )  # a pending replicate is already re-measuring it
        assert opt.pickers.replicate(opt.history, taken) is None


def test_pairing_before_the_pick_repairs_a_fast_config_the_sample_cannot_fit() -> None:
    """A sampled pool holding only a fast config that cannot fit and a slow one that does: the
    fast one's best repair (outside the pool) is scored and, beating the slow one, asked instead,
    with its source recorded."""
    space = SearchSpace.from_yaml(DENSE)
    opt = Optimizer(
        space,
        memory_capacity=CAPACITY,
        seed=0,
        baseline=BASELINE,
        settings=OptimizerSettings(candidate_cap=40),
    )
    for _ in range(10):
        c = opt.ask()
        opt.tell(c, run(c))
    for over in (
        {"zero_stage": 0, "micro_batch_size": 8, "dtype": "fp32"},
        {"zero_stage": 0, "micro_batch_size": 4},
        {"zero_stage": 1, "micro_batch_size": 8, "dtype": "fp32"},
    ):  # OOMs teach the memory model
        v = space.validate({"activation_checkpointing": "none", "dtype": "bf16", **over})
        out = run(v)
        assert out.status == "oom"
        opt.tell(v, out)
    fast = space.validate(
        {
            "zero_stage": 0,
            "micro_batch_size": 8,
            "activation_checkpointing": "none",
            "dtype": "bf16",
        }
    )
    slow = space.validate(
        {
            "zero_stage": 3,
            "micro_batch_size": 1,
            "activation_checkpointing": "full",
            "offload_optimizer": True,
            "offload_param": True,
            "dtype": "fp32",
        }
    )
    assert memory_bytes(fast) > CAPACITY >= memory_bytes(slow) and step_time_s(fast) < step_time_s(
        slow
    )
    pool = [fast, slow]
    opt.models.fit(opt.history)  # as ask() does before scoring
    scores = opt.models.scores(opt.history, pool)
    assert scores.p_fit[0] < 0.5  # the memory model knows the fast one will not fit
    pick = int(scores.log_score.argmax())
    info = opt.pickers.pair_before_pick(opt.history, pool, scores, pick, excluded=set())
    assert info is not None
    c = info.config
    assert info.phase == "repair" and info.paired == "before_pick" and info.repair_of == fast
    assert space.key(c) not in {space.key(fast), space.key(slow)} and space.is_valid(c)
    assert info.p_fit >= 0.7 and info.log_acquisition > scores.log_score[pick]
    assert info.repair_moves and all(
        space.knob(m.split(":")[0]).memory != "neutral" for m in info.repair_moves
    )


@pytest.mark.parametrize("cap", [40, None])
def test_pairing_before_the_pick_runs_only_on_a_sampled_pool(cap: int | None) -> None:
    """Every repair asked before the pick is valid, fits by the model and records its source; when
    every config is scored (no cap), the repairs are in the pool already and it never fires."""
    space = SearchSpace.from_yaml(DENSE)
    opt = Optimizer(
        space,
        memory_capacity=CAPACITY,
        seed=1,
        baseline=BASELINE,
        settings=OptimizerSettings() if cap is None else OptimizerSettings(candidate_cap=cap),
    )
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


def test_a_warm_start_config_expected_not_to_fit_here_is_asked_as_its_memory_saving_repair() -> (
    None
):
    """A bank config measured on a larger card (or a smaller model) that this study's memory model
    expects to run out of memory is replaced by its best repair, which fits; the original never runs."""
    space = SearchSpace.from_yaml(TINY)
    too_big = space.validate({"stage": 0, "mbs": 8, "ckpt": False})
    assert tiny_run(too_big).status == "oom"
    opt = Optimizer(
        space,
        memory_capacity=TINY_CAP,
        seed=0,
        initial_configs=[too_big],
        initial_origins=[WarmStartOrigin(source_study="bigger-card")],
        settings=OptimizerSettings(n_init=3),
    )
    for c in (
        {"stage": 2, "mbs": 1, "ckpt": True},
        {"stage": 0, "mbs": 4, "ckpt": False},
        {"stage": 1, "mbs": 2, "ckpt": False},
        {"stage": 2, "mbs": 8, "ckpt": True},
    ):
        c = space.validate(c)
        opt.tell(c, tiny_run(c))
    asked = opt.ask()
    info = opt.last_ask_info
    assert space.key(asked) != space.key(too_big)
    assert info.phase == "warm_start" and info.repair_of == too_big and info.paired == "warm_start"
    assert (
        info.original_p_fit is not None and info.original_p_fit < DEFAULT_SETTINGS.pairing_trigger
    )
    assert info.repair_moves and info.warm_start_origin == WarmStartOrigin(
        source_study="bigger-card"
    )
    assert tiny_run(asked).status == "ok"
    assert opt.initial_queue == []


def test_a_pending_incumbent_is_not_asked_again_as_its_replicate() -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(
        space, memory_capacity=TINY_CAP, seed=5, settings=OptimizerSettings(n_init=3, local_every=2)
    )
    for _ in range(5):
        c = opt.ask()
        opt.tell(c, tiny_run(c))
    while opt.n_asks % 2 != 1:  # the next ask is a local turn
        c = opt.ask()
        opt.tell(c, tiny_run(c))
    inc = opt.models.incumbent(opt.history)  # the local step's incumbent
    assert inc is not None
    opt.pending[space.key(inc)] = dict(inc)  # its replicate is already running
    c = opt.ask()
    assert space.key(c) != space.key(inc) and opt.last_ask_info.phase != "replicate"


def test_a_replicate_that_failed_is_never_asked_again() -> None:
    """Intensification re-measures an incumbent with one ok measurement; when that replicate
    fails, the incumbent still has one ok measurement, but it must not be asked a third time."""
    space = SearchSpace.from_yaml(
        "name: r\nknobs:\n  - {name: a, type: int, values: [0, 1, 2]}\n"
        "  - {name: b, type: int, values: [0, 1]}\n"
    )
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


def test_a_replicate_that_cannot_change_the_decision_is_not_asked() -> None:
    """``replicate_min_p``: the incumbent is re-measured only while the runner-up may still be
    faster; far ahead of every other config it is not (0, the default, always re-measures)."""
    space = SearchSpace.from_yaml(TINY)
    told = [
        space.validate(c)
        for c in (
            {"stage": 0, "mbs": 8, "ckpt": True},  # 1.54 s, the fastest by far
            {"stage": 2, "mbs": 1, "ckpt": True},  # 4.2 s
            {"stage": 1, "mbs": 1, "ckpt": True},  # 3.7 s
            {"stage": 2, "mbs": 2, "ckpt": True},  # 3.0 s
            {"stage": 1, "mbs": 2, "ckpt": True},  # 2.6 s
        )
    ]
    got = {}
    for p in (0.0, 0.05):
        opt = Optimizer(
            space,
            memory_capacity=TINY_CAP,
            seed=0,
            settings=OptimizerSettings(replicate_min_p=p),
        )
        for c in told:
            opt.tell(c, tiny_run(c))
        assert opt.models.incumbent(opt.history) == told[0]
        got[p] = opt.pickers.replicate(opt.history, Round(taken=set(), failed=set()))
        assert opt.models.runner_up_p(opt.history, told[0]) < 0.05
    assert got[0.0] is not None and got[0.0].phase == Phase.REPLICATE
    assert got[0.05] is None
    with pytest.raises(UserInputError, match="replicate_min_p"):
        OptimizerSettings(replicate_min_p=1.5)


def _banked(
    rule: str, *, transfer: bool = True, **settings: Any
) -> tuple[Optimizer, list[dict[str, Any]]]:
    """An optimizer of the synthetic problem with a bank: a source study on hardware twice as slow
    (its trials, through ``TransferPrior``) and its three fastest configs queued as warm starts.
    The baseline is told."""
    space = SearchSpace.from_yaml(DENSE)
    rows = space.enumerate() or []
    cfgs = [c for c in rows[::7] if memory_bytes(c) <= CAPACITY][:24]
    times = [2.0 * step_time_s(c) for c in cfgs]
    source = synthetic_source(cfgs, times)
    queued = [cfgs[i] for i in sorted(range(len(cfgs)), key=times.__getitem__)[:3]]
    opt = Optimizer(
        space,
        memory_capacity=CAPACITY,
        seed=0,
        baseline=BASELINE,
        prior=SyntheticPrior(),
        settings=replace(CHEAP, warm_start_rule=rule, **settings),  # type: ignore[arg-type]
        transfer=TransferPrior((source,)) if transfer else None,
        initial_configs=queued,
        initial_origins=[WarmStartOrigin(source_study="src", trial_id=str(i)) for i in range(3)],
    )
    base = space.validate(BASELINE)
    opt.tell(base, run(base))
    return opt, queued


def _warm_asks(opt: Optimizer) -> list[tuple[dict[str, Any], WarmStartOrigin | None, bool]]:
    """Ask until the warm starts are done: each warm start's config, origin, and whether it is
    the best untried config by the prior's constrained log-EI at the time of its ask."""
    out = []
    while True:
        cfg = opt.ask()
        info = opt.last_ask_info
        assert isinstance(cfg, dict) and isinstance(info, AskInfo)
        if info.phase != Phase.WARM_START:
            return out
        seen = {opt.space.key(o.config) for o in opt.observations}
        configs, X = opt.pickers.candidates(opt.history, seen)
        scores = opt.models.prior_scores(opt.history, configs, X, opt.pickers.baseline_config)
        best = configs[int(np.argmax(scores.log_score))]
        out.append((cfg, info.warm_start_origin, opt.space.key(best) == opt.space.key(cfg)))
        opt.tell(cfg, run(cfg))


def test_mapped_warm_starts_ask_the_best_config_under_the_transferred_prior() -> None:
    """``warm_start_rule="mapped"``: each warm-start turn asks this study's best untried config
    under the prior column (the sources' coefficients and residual), not the bank's config; its
    origin says so and names the source. ``alternate`` maps its first and third turns and copies
    the bank's best config in the second (a mapped turn takes the last queued config's turn)."""
    opt, queued = _banked("mapped")
    asks = _warm_asks(opt)
    assert len(asks) == 3 and all(best for _, _, best in asks)
    assert [o for _, o, _ in asks] == [WarmStartOrigin(source_study="src", rule="mapped")] * 3
    assert {opt.space.key(c) for c, _, _ in asks} != {opt.space.key(c) for c in queued}

    opt, queued = _banked("alternate")
    asks = _warm_asks(opt)
    assert [None if o is None else o.rule for _, o, _ in asks] == ["mapped", "copy", "mapped"]
    assert asks[1][0] == queued[0] and asks[1][1] == WarmStartOrigin(
        source_study="src", trial_id="0"
    )
    assert asks[0][2] and asks[2][2]


def test_a_copy_turn_asks_the_queued_config_farthest_from_the_warm_starts_asked() -> None:
    """``warm_start_pool`` > 1: the first copy is the bank's best; each later one is the queued
    config with the fewest knob values in common with its nearest warm start asked (ties: the
    earlier). With a pool of 1 the queue is asked in its order."""
    opt, queued = _banked("copy")
    names = [k.name for k in opt.space.knobs]

    def dist(a: dict[str, Any], b: dict[str, Any]) -> int:
        return sum(a.get(n) != b.get(n) for n in names)

    asks = [c for c, _, _ in _warm_asks(opt)]
    assert asks[0] == queued[0] and sorted(map(opt.space.key, asks)) == sorted(
        map(opt.space.key, queued)
    )
    rest = queued[1:]
    want = max(range(2), key=lambda j: (dist(rest[j], queued[0]), -j))
    assert asks[1] == rest[want]

    opt, queued = _banked("copy", warm_start_pool=1)
    assert [c for c, _, _ in _warm_asks(opt)] == queued


def test_without_a_transfer_every_warm_start_turn_copies() -> None:
    opt, queued = _banked("mapped", transfer=False)
    asks = _warm_asks(opt)
    assert [c for c, _, _ in asks] == queued
    assert [o.rule for _, o, _ in asks if o is not None] == ["copy"] * 3


@pytest.mark.parametrize("rule", ["mapped", "alternate", "copy"])
def test_a_bank_ranked_down_to_weight_zero_loses_its_warm_starts_unless_they_are_copied(
    rule: str,
) -> None:
    """Once this study's trials ranked the transfer to weight 0, a warm-start turn under
    ``mapped`` or ``alternate`` is dropped (neither mapped nor that bank's config copied); under
    ``copy`` the bank's config is asked as before."""
    opt, queued = _banked(rule)
    assert opt.transfer is not None
    opt.transfer.centre_weight = opt.transfer.residual_weight = 0.0
    rnd = Round(taken=set(), failed=set(), warm_fitted=True)  # fitted: the weights stand
    info = opt.pickers.warm_start(opt.history, rnd)
    if rule == "copy":
        assert info is not None and info.config == queued[0]
    else:
        assert info is None
    assert [c for c, _ in opt.history.warm_queue] == queued[1:]
