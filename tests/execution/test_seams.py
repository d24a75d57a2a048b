"""The honest seams, and the test-only cheat seams (``tests/cheats.py``) that replace them: a cheat
changes what the workload controls, and the harness counters see it (single process, real torch
optimizer; the multi-rank runs are in the stages tests)."""

from __future__ import annotations

import torch
from torch import nn

from infrarsi.execution.counters import HarnessCounters
from infrarsi.execution.data_sources import MarkovSource
from infrarsi.execution.seams import HONEST
from tests.cheats import CHEATS


def _batches(mbs: int = 4):
    return MarkovSource(4096, 32, 0).rank_micro_batches(0, 16, 0, 2, mbs)


def seams_for(name: str | None):
    return HONEST if name is None else CHEATS[name]


def test_each_cheat_replaces_one_honest_seam():
    assert set(CHEATS) == {
        "skip_optimizer_steps",
        "shrink_batch",
        "fake_loss",
        "fewer_tokens",
        "skip_allreduce",
    }
    fields = ("fetch", "report_loss", "optimizer_step", "configure_engine")
    for name, seams in CHEATS.items():
        assert sum(getattr(seams, f) is not getattr(HONEST, f) for f in fields) == 1, name


def test_data_cheats_are_seen_by_the_token_counter():
    model = nn.Embedding(4096, 8)
    counters = HarnessCounters().attach(model)
    for name, want_rows, want_tokens in [
        (None, 8, 256),
        ("shrink_batch", 4, 128),
        ("fewer_tokens", 8, 128),
    ]:
        counters.begin_step()
        for b in seams_for(name).fetch(_batches()):
            model(b.inputs)
        assert (counters.step_rows, counters.step_tokens) == (want_rows, want_tokens), name
    counters.detach()


def test_fake_loss_differs_from_the_truth():
    loss = torch.tensor(5.0)
    assert float(seams_for("fake_loss").report_loss(loss)) != 5.0
    assert float(HONEST.report_loss(loss)) == 5.0


class _Engine:
    """Stands in for the DeepSpeed engine: its step() steps the real torch optimizer."""

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        self.opt = opt
        self.enable_backward_allreduce = True

    def step(self) -> None:
        self.opt.step()


def test_skipped_optimizer_steps_are_not_counted_and_do_not_update():
    p = nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p], lr=0.1)
    counters = HarnessCounters()
    counters.watch_optimizer(opt)
    eng = _Engine(opt)
    steps = []
    for step in range(4):
        p.grad = torch.ones(3)
        counters.begin_step()
        before = p.detach().clone()
        seams_for("skip_optimizer_steps").optimizer_step(eng, opt, step, True)
        steps.append(counters.end_step())
        assert torch.equal(before, p.detach()) == (step % 2 == 1)
    assert steps == [1, 0, 1, 0]
    assert "step" not in opt.__dict__  # the real step method is restored


def test_skip_allreduce_turns_off_the_engine_reduction():
    eng = _Engine(torch.optim.AdamW([nn.Parameter(torch.ones(1))]))
    seams_for("skip_allreduce").configure_engine(eng)
    assert eng.enable_backward_allreduce is False
