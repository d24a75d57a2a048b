"""Before the timed steps: batches planned ahead, the model built on the rank's device, the harness's AdamW."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from infrarsi.execution import rank_setup
from infrarsi.execution.data_sources import MarkovSource


def test_batches_are_planned_before_the_clock_with_the_same_rows_as_the_source() -> None:
    src = MarkovSource(64, 8, seed=3)
    planned = rank_setup.plan_batches(src, 3, 8, rank=1, world=2, micro_batch_size=2, device="cpu")
    assert len(planned) == 3
    for step, mbs in enumerate(planned):
        expect = src.rank_micro_batches(step, 8, 1, 2, 2)
        assert [b.inputs.tolist() for b in mbs] == [b.inputs.tolist() for b in expect]
        assert all(not b.inputs.is_pinned() for b in mbs)  # pinned only for a cuda rank


def test_the_model_is_built_on_the_rank_device_unless_zero3_partitions_it() -> None:
    cfg0 = {"zero_optimization": {"stage": 2}}
    ctx = rank_setup.build_context("cpu", cfg0)
    assert isinstance(ctx, torch.device) and ctx.type == "cpu"
    # ZeRO-3 but not partitionable (expert parallelism slices the built experts): on the device
    ctx = rank_setup.build_context("cpu", {"zero_optimization": {"stage": 3}}, partitioned=False)
    assert isinstance(ctx, torch.device)


def test_every_module_draws_its_weights_in_its_own_init() -> None:
    """The same seed gives the same weights whether a model is built whole or its modules are
    built one by one (what zero.Init sees): no init pass over the finished model."""
    from workloads.models.dense.model import FeedForward, ModelArgs

    a = ModelArgs(dim=16, n_layers=2, ffn_hidden=24)
    torch.manual_seed(0)
    ffn = FeedForward(a)
    torch.manual_seed(0)
    w1 = torch.empty(24, 16)
    nn.init.normal_(w1, std=a.init_std)  # one draw per weight, in construction order
    assert torch.equal(ffn.w1.weight, w1)
    # a weight created in bf16 (as under zero.Init) gets the fp32 draw, rounded
    from workloads.models.dense.model import normal_init_

    torch.manual_seed(0)
    b = torch.empty(24, 16, dtype=torch.bfloat16)
    normal_init_(b, a.init_std)
    assert torch.equal(b, w1.to(torch.bfloat16))
    assert abs(float(ffn.w2.weight.std()) - a.init_std / 2) < 0.01


def test_the_optimizer_impl_knob_picks_adamw_loop_foreach_or_fused() -> None:
    optim = SimpleNamespace(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    params = [nn.Parameter(torch.zeros(4))]
    loop = rank_setup.make_optimizer("adamw", params, optim)
    foreach = rank_setup.make_optimizer("adamw_foreach", params, optim)
    fused = rank_setup.make_optimizer("adamw_fused", params, optim)
    assert isinstance(loop, torch.optim.AdamW)
    assert (loop.defaults["foreach"], foreach.defaults["foreach"], fused.defaults["fused"]) == (
        False,
        True,
        True,
    )
    assert loop.defaults["lr"] == 1e-3 and loop.defaults["betas"] == (0.9, 0.95)
