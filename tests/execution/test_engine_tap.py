"""The tap's loss per step is the same quantity whatever the micro-batch split: a script's own loop
(each micro-batch's mean, token-weighted) and a Trainer's (losses already divided for the
accumulation, summed) both give the step's mean; the tap counts tokens and stops after its steps.
A restarted run passes over its first steps untrained and records the rest, as the uninterrupted
run recorded them.
One rank, a real gloo group, a stand-in engine (the DeepSpeed engine's calls only)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from infrarsi.execution.engine_tap import EngineTap, TrialComplete


@pytest.fixture(scope="module")
def one_rank_group() -> Iterator[None]:
    """A gloo group of one rank (the tap all-reduces each step); left as found."""
    if dist.is_initialized():
        yield
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class StandInEngine:
    """The engine calls the tap wraps: ``module``, ``basic_optimizer``, ``backward``, ``step`` and
    the accumulation boundary, as DeepSpeed's engine answers them."""

    def __init__(self, accumulation: int) -> None:
        torch.manual_seed(0)
        self.module = torch.nn.Embedding(32, 1)
        self.basic_optimizer = torch.optim.SGD(self.module.parameters(), lr=0.0)
        self.device = torch.device("cpu")
        self.accumulation, self.micro_steps = accumulation, 0

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return self.module(ids)

    def is_gradient_accumulation_boundary(self) -> bool:
        return (self.micro_steps + 1) % self.accumulation == 0

    def backward(self, loss: torch.Tensor, **_: object) -> None:
        loss.backward()

    def step(self) -> None:
        if self.is_gradient_accumulation_boundary():
            self.basic_optimizer.step()
            self.basic_optimizer.zero_grad()
        self.micro_steps += 1


def _train(accumulation: int, reduction: str, steps: int = 2) -> EngineTap:
    engine = StandInEngine(accumulation)
    tap = EngineTap(steps, "cpu", loss_reduction=reduction)  # type: ignore[arg-type]
    tap.attach(engine)
    ids = torch.arange(32).reshape(8, 4)  # one step: 8 sequences of 4 tokens
    rows = 8 // accumulation
    with pytest.raises(TrialComplete):
        for _ in range(steps + 1):
            for i in range(accumulation):
                loss = engine(ids[i * rows : (i + 1) * rows]).mean()
                engine.backward(
                    loss / accumulation if reduction == "step_sum" else loss
                )  # as a Trainer divides
                engine.step()
    tap.detach()
    return tap


@pytest.mark.parametrize("reduction", ["token_mean", "step_sum"])
def test_the_step_loss_does_not_depend_on_the_split(one_rank_group, reduction):
    whole, split = _train(1, reduction), _train(4, reduction)
    assert whole.record.loss == pytest.approx(
        split.record.loss, rel=1e-5
    )  # float32 means of different splits
    assert whole.record.loss == pytest.approx(
        _train(1, "token_mean").record.loss, rel=1e-5
    )  # float32 means of different splits
    assert split.record.tokens_seen == [32, 32] and split.record.sequences_seen == [8, 8]
    assert split.record.optimizer_steps == 2 and split.record.stop_kind == "done"
    # the same data in the same steps: the same digests, whatever the split
    assert whole.record.data_digests == split.record.data_digests and whole.record.data_digests[0]


def test_a_restarted_run_passes_over_its_first_steps_and_records_the_rest(one_rank_group):
    def run(tap: EngineTap, engine: StandInEngine, steps: int) -> None:
        tap.attach(engine)
        with pytest.raises(TrialComplete):
            for step in range(steps + 1):
                for i in range(2):  # accumulation 2: two micro-batches of 4 sequences per step
                    ids = (torch.arange(16).reshape(4, 4) + 7 * step + i) % 32
                    engine.backward(engine(ids).mean())
                    engine.step()
        tap.detach()

    full, saved_after = EngineTap(4, "cpu"), []
    full.after_step = saved_after.append
    run(full, StandInEngine(2), 4)
    engine = StandInEngine(2)
    resumed = EngineTap(2, "cpu", skip_steps=2)
    run(resumed, engine, 4)
    assert saved_after == [1, 2, 3]  # after each step that does not end the run
    assert resumed.skipped_steps == 2 and resumed.record.optimizer_steps == 2
    assert resumed.record.data_digests == full.record.data_digests[2:]
    assert resumed.record.loss == pytest.approx(full.record.loss[2:])
    assert engine.micro_steps == 8  # the skipped micro-steps counted as DeepSpeed's step would
