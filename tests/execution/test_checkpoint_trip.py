"""A horizon trial and its checkpoint round trip (``rank_loop`` with ``steps`` and
``checkpoint_step``; ``checkpoint_trip``): steps past the workload's count get the harness's
deterministic batches, and a ZeRO-3 engine rebuilt under ``zero.Init`` from a mid-run checkpoint
continues exactly like the uninterrupted run. The load error of a model whose names changed is
described with its keys."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from infrarsi.execution.checkpoint_trip import describe_load_error


def test_the_batches_past_the_workloads_steps_are_the_sources_by_step_rank_and_micro_batch() -> (
    None
):
    from infrarsi.execution.data_sources import MarkovSource
    from infrarsi.execution.rank_setup import plan_batches

    src = MarkovSource(vocab_size=64, seq_len=8, seed=7)
    long = plan_batches(src, 12, 8, rank=1, world=2, micro_batch_size=2, device="cpu")
    again = plan_batches(
        MarkovSource(vocab_size=64, seq_len=8, seed=7),
        12,
        8,
        rank=1,
        world=2,
        micro_batch_size=2,
        device="cpu",
    )
    assert len(long) == 12 and all(len(mbs) == 2 for mbs in long)
    for step in (3, 11):  # inside and past a 4-step trial
        want = src.rank_micro_batches(step, 8, 1, 2, 2)
        for got, ref, rep in zip(long[step], want, again[step], strict=True):
            assert torch.equal(got.inputs, ref.inputs) and torch.equal(got.inputs, rep.inputs)
    assert not torch.equal(long[10][0].inputs, long[11][0].inputs)


def test_a_renamed_parameter_is_named_in_the_load_error() -> None:
    class Old(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(2, 2)

    class New(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.out_proj = nn.Linear(2, 2)

    with pytest.raises(RuntimeError) as e:
        New().load_state_dict(Old().state_dict())
    why = describe_load_error(e.value)
    assert (
        "2 parameter(s) of the rebuilt model are not in the checkpoint (missing: out_proj.weight, out_proj.bias)"
        in why
    )
    assert "(unexpected: proj.weight, proj.bias)" in why
    assert describe_load_error(OSError("disk gone")) == "checkpoint load failed: OSError: disk gone"


@pytest.mark.integration
def test_a_zero3_checkpoint_round_trip_past_the_trials_steps_continues_bitwise() -> None:
    from tests.execution.spawn_harness import make_spec, run_specs

    spec = make_spec("workloads/dense_debug.yaml", {"zero_stage": 3, "micro_batch_size": 8})
    spec.update(steps=5, checkpoint_step=3)  # the workload's trial is 1 + 3 steps
    ((r0, r1),) = run_specs([spec])
    assert r0["status"] == "ok", r0["error"][-2000:]
    assert len(r0["loss"]) == 5 and r0["optimizer_steps"] == 5 and r0["tokens_seen"] == [2048] * 5
    trip = r0["checkpoint"]
    assert trip["step"] == 3 and not trip["error"] and not trip["skipped"], trip
    assert trip["loss"] == r0["loss"][3:], (trip["loss"], r0["loss"][3:])  # fp32 on CPU: bitwise
    assert trip["save_s"] > 0 and trip["checkpoint_bytes"] > 0
    assert r1["checkpoint"]["loss"] == trip["loss"]
    assert r0["eval_loss"] is not None  # the uninterrupted run's end checks ran before the restart
