"""The seams a workload's test-only ``variant`` hook names."""

from __future__ import annotations

import pytest
import torch

from infrarsi.errors import JobError
from infrarsi.execution.rank_loop import _seams
from infrarsi.execution.seams import HONEST
from infrarsi.workload import Workload


def _with_variant(variant: str | None) -> Workload:
    return Workload.from_dict(
        {
            "name": "w",
            "model": {"family": "dense"},
            "tokens_per_step": 256,
            "data": {"seq_len": 32},
            "variant": variant,
        }
    )


def test_the_variant_hook_imports_the_seams_it_names() -> None:
    from tests import cheats

    assert _seams(_with_variant(None)) is HONEST
    assert _seams(_with_variant("tests.cheats:fake_loss")) is cheats.fake_loss
    with pytest.raises(
        JobError, match=r"names an infrarsi.execution.seams.Seams; 'tests.cheats:CHEATS' is dict"
    ):
        _seams(_with_variant("tests.cheats:CHEATS"))


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_zero3_built_under_zero_init_trains_exactly_like_zero2_in_bf16() -> None:
    """Under ZeRO-3 the model is built inside ``deepspeed.zero.Init``: each parameter is created
    bf16 and partitioned as soon as its module is built. It must start from the very weights
    ZeRO-2's whole build rounds to bf16 (draws in fp32, no bf16 RoPE tables) and so train
    bitwise alike: the same losses, checksum and eval loss (2 gloo ranks). A third run adds
    ``loss_chunk_tokens`` (the harness's loss 64 tokens at a time, 4 chunks per micro-batch): the
    same first loss and, within bf16 rounding of the logit gradient, the same training. That run
    also sets a knob registered outside the package (``test_grad_clip``, a clipping norm no
    gradient reaches): its value reaches the config the ranks' engine was built from. A fourth
    adds ``fused_loss_tokens`` (the output projection and loss fused 64 tokens at a time inside
    the output module, its weight gathered by ZeRO-3 there) and pins attention to the math kernel
    (``attention_backend``; the others run CPU flash attention): the same first loss and
    training, within bf16 rounding. A last pair runs ``float8_linear`` under ZeRO-2 (torchao's
    float8 matmuls, on the CPU's float8 kernel, through DeepSpeed's bf16 engine) beside plain
    ZeRO-2 on a 64-wide model (the CPU's float8 kernel took 190 s on the debug model's two
    steps, against 1.3 s here): another arithmetic, so a first loss close to ZeRO-2's but not
    equal, and the end checks still run."""
    from tests.execution.spawn_harness import REPO, make_spec, run_specs

    knob = "test_grad_clip"  # registered by the ranks only (importing it here would register it in this process)

    cfgs = [
        {"zero_stage": 2, "micro_batch_size": 2, "dtype": "bf16"},
        {"zero_stage": 3, "micro_batch_size": 2, "dtype": "bf16"},
        {
            "zero_stage": 3,
            "micro_batch_size": 2,
            "dtype": "bf16",
            "loss_chunk_tokens": 64,
            knob: 1.0e6,
        },
        {
            "zero_stage": 3,
            "micro_batch_size": 2,
            "dtype": "bf16",
            "fused_loss_tokens": 64,
            "attention_backend": "math",
        },
    ]
    specs = [
        make_spec("workloads/dense_debug.yaml", c, warmup=0, measured=2, trial_id=str(i))
        for i, c in enumerate(cfgs)
    ]
    small = Workload.from_yaml(REPO / "workloads/dense_debug.yaml").to_yaml_dict()
    small["model"]["overrides"] = {"dim": 64, "n_layers": 2, "ffn_hidden": 192, "vocab_size": 512}
    small.update(data={**small["data"], "seq_len": 32}, tokens_per_step=256)
    specs += [
        make_spec(small, {**cfgs[0], "float8_linear": on}, warmup=0, measured=2, trial_id=f"f8{on}")
        for on in (False, True)
    ]
    z2, z3, chunked, fused, small_z2, f8 = run_specs(
        specs, knob_modules=("tests.execution.knobs.grad_clip_knob",)
    )
    assert [r["ds_config"]["gradient_clipping"] for r in z3 + chunked] == [0.0, 0.0, 1.0e6, 1.0e6]
    every = z2 + z3 + chunked + fused + small_z2 + f8
    assert [r["status"] for r in every] == ["ok"] * 12, [r["error"][-500:] for r in every]
    assert f8[0]["loss"][0] != small_z2[0]["loss"][0]  # float8 ran: another arithmetic
    assert f8[0]["loss"] == pytest.approx(small_z2[0]["loss"], rel=1e-2)
    assert f8[0]["eval_loss"] == pytest.approx(small_z2[0]["eval_loss"], rel=1e-2)
    # the math kernel's bf16 rounding differs from flash's: measured 1.3e-6 relative at step 0
    assert fused[0]["loss"][0] == pytest.approx(z3[0]["loss"][0], rel=1e-5)
    assert fused[0]["loss"] == pytest.approx(z3[0]["loss"], rel=1e-4)
    assert z3[0]["loss"] == z2[0]["loss"]
    assert z3[0]["param_checksum"] == z2[0]["param_checksum"]
    assert z3[0]["eval_loss"] == z2[0]["eval_loss"]
    assert chunked[0]["loss"][0] == pytest.approx(z3[0]["loss"][0], rel=1e-6)
    assert chunked[0]["loss"] == pytest.approx(z3[0]["loss"], rel=1e-4)
    assert chunked[0]["loss"][1] != chunked[0]["loss"][0]  # it trained


def test_the_fused_loss_knob_needs_a_job_that_gives_one() -> None:
    from infrarsi.execution.rank_loop import _fused_loss
    from infrarsi.job import ModelShape, TrainingJob

    shape = ModelShape(n_layers=1, dim=8, vocab_size=16, n_heads=1)
    plain = TrainingJob(build_model=lambda: torch.nn.Linear(1, 1), shape=shape)
    assert _fused_loss(plain, 0) is None  # off: whatever the job gives
    with pytest.raises(JobError, match=r"gives no TrainingJob\.fused_loss"):
        _fused_loss(plain, 64)

    def fused(*_: object) -> torch.Tensor:
        return torch.zeros(())

    own = TrainingJob(build_model=plain.build_model, shape=shape, fused_loss=fused, loss=fused)
    with pytest.raises(JobError, match="a loss of its own"):
        _fused_loss(own, 64)
