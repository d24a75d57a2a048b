"""The ask schedule (``schedule.py``): ``next_phase`` as a table, and the schedule an ``Optimizer`` keeps."""

from __future__ import annotations

from dataclasses import replace

import pytest
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

from infrarsi.errors import UserInputError
from infrarsi.search import Optimizer, OptimizerSettings, SearchSpace, WarmStartOrigin
from infrarsi.search.ask_info import Phase
from infrarsi.search.schedule import Turn, next_phase

# a model-phase turn past the design: time model ready, nothing pending, a single ask, no local turn
PAST_DESIGN = Turn(
    baseline_due=False,
    warm_starts_due=False,
    distinct_seen=6,
    design_size=4,
    time_model_ready=True,
    has_prior=False,
    pending=0,
    prior_picked=False,
    single=True,
    last_of_batch=True,
    local_turn=False,
)


@pytest.mark.parametrize(
    ("changes", "phase"),
    [
        ({}, Phase.BO),
        ({"baseline_due": True}, Phase.BASELINE),
        (
            {"baseline_due": True, "warm_starts_due": True},
            Phase.BASELINE,
        ),  # the baseline's ask holds no warm start
        ({"warm_starts_due": True}, Phase.WARM_START),
        (
            {"warm_starts_due": True, "distinct_seen": 1},
            Phase.WARM_START,
        ),  # warm starts come before the design
        ({"distinct_seen": 3}, Phase.DESIGN),
        (
            {"time_model_ready": False},
            Phase.DESIGN,
        ),  # the design goes on until a step-time model exists
        (
            {"distinct_seen": 3, "has_prior": True},
            Phase.DESIGN,
        ),  # nothing pending: the sequential schedule
        (
            {"distinct_seen": 3, "has_prior": True, "pending": 2},
            Phase.BO_PRIOR,
        ),  # the first wave's prior pick
        (
            {"distinct_seen": 3, "has_prior": True, "pending": 2, "prior_picked": True},
            Phase.DESIGN,
        ),  # once
        (
            {"time_model_ready": False, "has_prior": True, "pending": 2, "prior_picked": True},
            Phase.BO_PRIOR,
        ),
        ({"local_turn": True}, Phase.REPLICATE),
        (
            {"local_turn": True, "distinct_seen": 5},
            Phase.BO_LOCAL,
        ),  # replicates wait for two configs past the design
        ({"local_turn": True, "single": False}, Phase.BO_LOCAL),  # the last pick of a batch: local
        (
            {"local_turn": True, "single": False, "last_of_batch": False},
            Phase.BO,
        ),  # a batch's other picks
        ({"single": False, "last_of_batch": False}, Phase.BO),
        ({"local_turn": True, "explore_turn": True}, Phase.EXPLORE),  # before the replicate
        ({"local_turn": True, "explore_turn": True, "single": False}, Phase.EXPLORE),
        (
            {"local_turn": True, "explore_turn": True, "single": False, "last_of_batch": False},
            Phase.BO,
        ),
        ({"local_turn": True, "explore_turn": True, "distinct_seen": 3}, Phase.DESIGN),
    ],
)
def test_next_phase_follows_the_schedule(changes: dict[str, object], phase: Phase) -> None:
    assert next_phase(replace(PAST_DESIGN, **changes)) is phase  # type: ignore[arg-type]


def test_phases_keep_their_strings() -> None:
    """Logs, saved states and reports hold the phase strings; a ``Phase`` is equal to its string."""
    assert [p.value for p in Phase] == [
        "baseline",
        "warm_start",
        "design",
        "bo",
        "bo-local",
        "explore",
        "bo-prior",
        "replicate",
        "repair",
        "proposal",
    ]
    assert (
        Phase.BO_LOCAL == "bo-local"
        and f"{Phase.WARM_START}" == "warm_start"
        and Phase("repair") is Phase.REPAIR
    )


def test_baseline_first_then_design_and_info() -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(
        space, memory_capacity=TINY_CAP, seed=0, baseline={"stage": 2, "mbs": 1, "ckpt": True}
    )
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
    opt = Optimizer(
        space, memory_capacity=TINY_CAP, seed=0, baseline=base, settings=OptimizerSettings(n_init=4)
    )
    for _ in range(3):
        opt.tell(base, tiny_run(base))
    phases = []
    for _ in range(3):
        c = opt.ask()
        phases.append(opt.last_ask_info.phase)
        opt.tell(c, tiny_run(c))
    assert phases == ["design"] * 3


def test_local_steps_stay_near_the_incumbent() -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(
        space, memory_capacity=TINY_CAP, seed=5, settings=OptimizerSettings(n_init=3, local_every=2)
    )
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


@pytest.mark.parametrize("rule", ["near", "far", "batch"])
def test_exploring_turns_try_a_value_or_a_region_never_measured(rule: str) -> None:
    """Every ``explore_every``-th local turn asks, with ``explore_rule="near"``, a neighbour of the
    incumbent holding a knob value no config within ``local_radius`` of it was measured with,
    with ``"far"`` a config more than ``local_radius`` changes from every config tried, and with
    ``"batch"`` a config never tried."""
    space = SearchSpace.from_yaml(TINY)
    settings = OptimizerSettings(
        n_init=3, local_every=2, explore_every=2, explore_rule=rule, local_radius=1
    )
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=5, settings=settings)

    def changes(a: dict, b: dict) -> int:
        return sum(a[k] != b[k] for k in space.names)

    explored = 0
    for _ in range(9):  # exploring turns at the 4th and 8th asks
        c = opt.ask()
        info = opt.last_ask_info
        assert (info.phase == "explore") <= (opt.n_asks % 4 == 0)  # every 2nd local turn
        if info.phase == "explore":
            explored += 1
            tried = [o.config for o in opt.observations]
            if rule == "far":
                assert min(changes(c, t) for t in tried) > 1
            elif rule == "batch":
                assert min(changes(c, t) for t in tried) >= 1
            else:
                inc = opt.models.incumbent(opt.history)
                assert inc is not None and changes(c, inc) <= 1
                (knob,) = [k for k in space.names if c[k] != inc[k]]
                # the value is new where the incumbent is
                assert all(t[knob] != c[knob] for t in tried if changes(t, inc) <= 1)
        opt.tell(c, tiny_run(c))
    assert explored >= 1
    assert Optimizer.from_state(opt.state_dict()).settings.explore_rule == rule


@pytest.mark.parametrize("intensify", [True, False])
def test_an_incumbent_measured_once_is_re_measured_on_a_local_turn(intensify: bool) -> None:
    """SMAC-style intensification: while the posterior-best config has a single trusted
    measurement, the local step re-runs it (a lucky draw must not decide best())."""
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(
        space,
        memory_capacity=TINY_CAP,
        seed=5,
        settings=OptimizerSettings(n_init=3, local_every=2, intensify=intensify),
    )
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
    opt = Optimizer(
        space, memory_capacity=TINY_CAP, seed=5, settings=OptimizerSettings(n_init=3, local_every=2)
    )
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


def test_with_a_prior_the_first_wave_of_pending_trials_holds_the_priors_pick() -> None:
    """Trials asked before any result (a cluster's first wave): the analytic prior, the only model
    there is, gets a pick in that wave (``bo-prior``: fast by the prior and likely to fit), and the
    picks after the design, while fewer than two results are in, are the prior's too. One at a
    time (nothing pending) the schedule is the sequential one: no ``bo-prior`` asks."""
    space = SearchSpace.from_yaml(DENSE)
    opt = Optimizer(
        space,
        memory_capacity=CAPACITY,
        seed=3,
        baseline=BASELINE,
        prior=SyntheticPrior(),
        settings=OptimizerSettings(n_init=4),
    )
    wave = [opt.ask() for _ in range(4)]
    phases = [opt.info(c).phase for c in wave]  # type: ignore[union-attr]
    assert phases == ["baseline", "bo-prior", "design", "design"]
    pick = wave[1]
    assert (
        step_time_s(pick) < step_time_s(space.validate(BASELINE)) and memory_bytes(pick) <= CAPACITY
    )
    opt.tell(
        wave[0], run(wave[0])
    )  # one result, three pending: the design is asked, no time model yet
    nxt = opt.ask()
    assert opt.last_ask_info.phase == "bo-prior" and space.key(nxt) not in {
        space.key(c) for c in wave
    }  # type: ignore[union-attr]

    seq = Optimizer(
        space,
        memory_capacity=CAPACITY,
        seed=3,
        baseline=BASELINE,
        prior=SyntheticPrior(),
        settings=OptimizerSettings(n_init=4),
    )
    for _ in range(7):
        c = seq.ask()
        assert seq.last_ask_info.phase != "bo-prior"  # type: ignore[union-attr]
        seq.tell(c, run(c))


def test_initial_configs_come_after_the_baseline_in_order_each_once() -> None:
    space = SearchSpace.from_yaml(TINY)
    base = {"stage": 2, "mbs": 1, "ckpt": True}
    warm = [
        {"stage": 1, "mbs": 4, "ckpt": True},
        {"stage": 9},
        {"stage": 1, "mbs": 4, "ckpt": True},
        {"stage": 2, "mbs": 2},
        {"stage": 0, "mbs": 8},
    ]
    origins = [
        WarmStartOrigin(source_study="a", relative_step_time=0.5),
        None,
        None,
        WarmStartOrigin(trial_id="t2"),
    ]
    opt = Optimizer(
        space,
        memory_capacity=TINY_CAP,
        seed=0,
        baseline=base,
        initial_configs=warm,
        initial_origins=origins,
        settings=OptimizerSettings(n_init=3),
    )
    # the invalid config (stage 9) and the repeat are dropped; the rest keep their order and origins
    assert [c for c, _ in opt.initial_queue] == [space.validate(warm[i]) for i in (0, 3, 4)]
    assert opt.ask() == base and opt.last_ask_info.phase == "baseline"
    opt.tell(base, tiny_run(base))
    opt.tell(warm[3], tiny_run(space.validate(warm[3])))  # measured before its turn: skipped
    first = opt.ask()
    assert first == space.validate(warm[0])
    info = opt.last_ask_info
    assert (info.config, info.phase, info.ask_index, info.warm_start_origin, info.repair_of) == (
        first,
        "warm_start",
        1,
        origins[0],
        None,
    )
    assert info.p_fit is not None  # checked against this study's memory model before it is asked
    batch = opt.ask(2)  # the last queued config, then the optimizer's own
    assert batch[0] == space.validate(warm[4]) and [i.phase for i in opt.last_ask_info] == [
        "warm_start",
        "bo",
    ]
    assert opt.initial_queue == [] and len({space.key(c) for c in [first, *batch]}) == 3
    with pytest.raises(UserInputError, match="initial_origins"):
        Optimizer(
            space, memory_capacity=TINY_CAP, initial_configs=[base], initial_origins=[None, None]
        )
