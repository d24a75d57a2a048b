"""The ask schedule: which phase picks the next config, stated in one place (``next_phase``).

An ask fills its configs one pick at a time; before each pick the optimizer states what it knows
as a ``Turn`` and ``next_phase`` names the phase whose picker (``pickers``) makes it:

1. the baseline, first, when nothing is told or pending;
2. the warm-start configs (``initial_configs``), in order, each once;
3. a space-filling design until ``design_size`` distinct configs are told or pending and a
   step-time model exists; with an analytic prior and trials pending, the prior's own pick
   (``bo-prior``) once in the first wave, and for every design turn after the design is complete;
4. then, on an exploring local turn (every ``explore_every``-th local turn), the acquisition's
   best among the incumbent's neighbours holding a knob value never measured near it, among
   configs far from every config tried, or the last pick of a greedy batch (``explore_rule``;
   ``explore``), as the ask's last pick;
5. else, on a local turn (every ``local_every``-th ask) of a single ask, a replicate of an
   incumbent measured once (``intensify``) once the design is two configs past its size, else the
   acquisition's best near the incumbent (``bo-local``);
6. otherwise the constrained acquisition's best (``bo``; a batch: qLogNEI).

A picker may end in another phase than the one named: a replicate with no unconfirmed incumbent
falls back to ``bo-local``, as does an exploring turn with nothing untried where it looks, a
local turn with no neighbour to ``bo``, and a pick unlikely to fit is
asked as its memory-saving repair (``repair``). The function is pure: same turn, same phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from infrarsi.search.ask_info import Phase

if TYPE_CHECKING:
    from infrarsi.search.history import History
    from infrarsi.search.settings import OptimizerSettings


@dataclass(frozen=True)
class Turn:
    """What the schedule reads before one pick."""

    baseline_due: bool
    """Nothing is told or pending (this ask's earlier picks included) and the baseline is valid."""
    warm_starts_due: bool
    """Warm-start configs are queued and this is the warm starts' part of the ask: they come
    before its model picks (an ask that starts with the baseline holds none)."""
    distinct_seen: int
    """Distinct configs told or pending (replicates count once)."""
    design_size: int
    """Distinct configs the design fills (``n_init``, or ``transfer_n_init`` under a bank transfer)."""
    time_model_ready: bool
    """Whether a step-time model exists (two trusted ok step times)."""
    has_prior: bool
    """Whether the optimizer has an analytic prior."""
    pending: int
    """Configs pending, this ask's earlier picks included."""
    prior_picked: bool
    """Whether a ``bo-prior`` pick was ever made."""
    single: bool
    """This is the only pick of a single-config ask (``ask()`` or ``ask(1)``)."""
    last_of_batch: bool
    """This pick is the last one the ask still needs (a local turn narrows it to the incumbent's neighbours)."""
    local_turn: bool
    """This ask is a local turn (every ``local_every``-th ask)."""
    explore_turn: bool = False
    """This ask is an exploring local turn (every ``explore_every``-th local turn)."""

    @classmethod
    def of(
        cls,
        history: History,
        settings: OptimizerSettings,
        *,
        taken: set[str],
        design_size: int,
        time_model_ready: bool,
        has_prior: bool,
        baseline_due: bool,
        warm_turn: bool,
        remaining: int,
        model_picks: int,
    ) -> Turn:
        """The turn before a pick of an ask: ``taken`` are the keys pending (this ask's earlier
        picks included), ``warm_turn`` whether this is the warm starts' part of the ask,
        ``remaining`` the picks the ask still needs and ``model_picks`` those made by the models."""
        every, explore = settings.local_every, settings.explore_every
        local_turn = bool(every) and history.n_asks % every == every - 1
        return cls(
            baseline_due=baseline_due,
            warm_starts_due=warm_turn and bool(history.warm_queue),
            distinct_seen=len(history.seen_keys() | taken),
            design_size=design_size,
            time_model_ready=time_model_ready,
            has_prior=has_prior,
            pending=len(taken),
            prior_picked=any(i.phase == Phase.BO_PRIOR for i in history.ask_infos.values()),
            single=remaining == 1 and model_picks == 0,
            last_of_batch=remaining - model_picks == 1,
            local_turn=local_turn,
            explore_turn=local_turn
            and bool(explore)
            and (history.n_asks // every) % explore == explore - 1,
        )


def next_phase(turn: Turn) -> Phase:
    """The phase whose picker makes the next pick (the module docstring states the schedule)."""
    if turn.baseline_due:
        return Phase.BASELINE
    if turn.warm_starts_due:
        return Phase.WARM_START
    design_done = turn.distinct_seen >= turn.design_size
    if not design_done or not turn.time_model_ready:
        # with trials pending the first wave is asked before any result: the prior, the only model
        # there is, gets its pick within that wave (once), and every pick past a complete design
        if turn.has_prior and turn.pending and (design_done or not turn.prior_picked):
            return Phase.BO_PRIOR
        return Phase.DESIGN
    if turn.last_of_batch and turn.explore_turn:
        return Phase.EXPLORE
    if turn.single and turn.local_turn and turn.distinct_seen >= turn.design_size + 2:
        return Phase.REPLICATE
    if turn.last_of_batch and turn.local_turn:
        return Phase.BO_LOCAL
    return Phase.BO
