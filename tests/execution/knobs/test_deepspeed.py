"""The knob -> DeepSpeed translation (pure logic, no DeepSpeed run)."""

from __future__ import annotations

import pytest

from infrarsi.errors import KnobError, WorkloadError
from infrarsi.execution.knobs.deepspeed import auto_bucket_elements, build_trial
from infrarsi.execution.knobs.registry import (
    KNOB_HANDLERS,
    KNOBS,
    KnobContext,
    TrialBuild,
    check_handlers,
    check_space,
    integer,
    knob_defaults,
    register_knob,
    unregister_knob,
)
from infrarsi.search import SearchSpace
from infrarsi.workload import Workload

N_DENSE = 5_243_136


@pytest.fixture()
def wl(repo_root) -> Workload:
    return Workload.from_yaml(repo_root / "workloads/dense_debug.yaml")


@pytest.mark.parametrize("space", ["deepspeed_dense.yaml", "deepspeed_moe.yaml"])
def test_every_space_knob_has_a_handler(repo_root, space):
    sp = SearchSpace.from_yaml(repo_root / "search_spaces" / space)
    names = [k.name for k in sp.knobs]
    check_handlers(names)
    assert set(names) <= set(KNOB_HANDLERS)


@pytest.mark.parametrize("mbs,accum", [(1, 8), (2, 4), (4, 2), (8, 1)])
def test_accumulation_derived_from_global_batch(wl, mbs, accum):
    b = build_trial(wl, {"micro_batch_size": mbs}, 2, N_DENSE, 256)
    ds = b.ds_config
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (mbs, accum)
    assert ds["train_batch_size"] == 16 == mbs * accum * 2


def test_indivisible_micro_batch_names_the_values(wl):
    with pytest.raises(KnobError, match=r"micro_batch_size.*16.*3 x 2"):
        build_trial(wl, {"micro_batch_size": 3}, 2, N_DENSE, 256)
    with pytest.raises(WorkloadError, match="world size 3"):
        build_trial(wl, {}, 3, N_DENSE, 256)


def test_auto_buckets_are_sized_to_the_model(wl):
    b = build_trial(wl, {"zero_stage": 2, "reduce_bucket_size": "auto"}, 2, N_DENSE, 256)
    z = b.ds_config["zero_optimization"]
    assert z["reduce_bucket_size"] == N_DENSE == z["allgather_bucket_size"]
    assert z["reduce_bucket_size"] < 500_000_000
    assert auto_bucket_elements(8_000_000_000) == 500_000_000
    assert auto_bucket_elements(10) == 1_000_000
    b = build_trial(wl, {"zero_stage": 1, "reduce_bucket_size": 500000}, 2, N_DENSE, 256)
    assert b.ds_config["zero_optimization"]["reduce_bucket_size"] == 500000


def test_full_translation_of_a_config(wl):
    cfg = {
        "zero_stage": 3,
        "micro_batch_size": 2,
        "activation_checkpointing": "full",
        "dtype": "bf16",
        "offload_optimizer": True,
        "offload_param": True,
        "overlap_comm": True,
        "optimizer_impl": "adamw_fused",
        "threads_per_worker": 2,
    }
    b = build_trial(wl, cfg, 2, N_DENSE, 256)
    z = b.ds_config["zero_optimization"]
    assert z["stage"] == 3 and z["overlap_comm"] is True
    assert z["offload_optimizer"]["device"] == "cpu" and z["offload_param"]["device"] == "cpu"
    assert b.ds_config["bf16"] == {"enabled": True}
    assert b.model_options["activation_checkpointing"] == "full"
    assert b.runtime["optimizer_impl"] == "adamw_fused" and b.runtime["threads_per_worker"] == 2
    assert b.env["OMP_NUM_THREADS"] == "2"
    assert "optimizer" not in b.ds_config  # the harness builds the torch AdamW


def test_defaults_when_a_knob_is_missing(wl):
    b = build_trial(wl, {}, 2, N_DENSE, 256)
    assert b.ds_config["zero_optimization"]["stage"] == knob_defaults()["zero_stage"] == 0
    assert "bf16" not in b.ds_config
    assert b.model_options["expert_parallel"] is False


@pytest.mark.parametrize(
    "cfg,match",
    [
        ({"offload_param": True, "zero_stage": 2}, "zero_stage == 3"),
        ({"offload_optimizer": True, "zero_stage": 0}, "zero_stage >= 1"),
        ({"expert_parallel": True, "zero_stage": 3}, "zero_stage=3"),
        ({"dtype": "fp16"}, "fp32 or bf16"),
        ({"activation_checkpointing": "some"}, "none, selective or full"),
        ({"optimizer_impl": "sgd"}, "adamw"),
        ({"no_such_knob": 1}, "Known knobs"),
        ({"reduce_bucket_size": "big", "zero_stage": 1}, "reduce_bucket_size"),
    ],
)
def test_bad_values_raise_knob_errors(wl, cfg, match):
    with pytest.raises(KnobError, match=match):
        build_trial(wl, cfg, 2, N_DENSE, 256)


def test_expert_parallel_sets_ep_size(repo_root):
    wl = Workload.from_yaml(repo_root / "workloads/moe_debug.yaml")
    b = build_trial(wl, {"expert_parallel": True, "zero_stage": 2}, 2, 9_447_680, 256)
    assert b.model_options["ep_size"] == 2


def test_the_handlers_that_read_the_zero_stage_run_after_it(wl):
    """``after=("zero_stage",)`` orders the handlers, whatever order the config lists its knobs in."""
    for name in ("offload_optimizer", "offload_param", "expert_parallel"):
        assert KNOBS[name].after == ("zero_stage",)
    b = build_trial(
        wl, {"offload_param": True, "offload_optimizer": True, "zero_stage": 3}, 2, N_DENSE, 256
    )
    assert b.ds_config["zero_optimization"]["offload_param"]["device"] == "cpu"


def test_a_new_knob_is_one_yaml_entry_and_one_registered_function(wl, tmp_path):
    """Adding a knob touches two places: an entry in a space YAML and one registered handler.
    The space passes the registry check, ``ask()``-style configs of it build, and the value lands
    in the trial's DeepSpeed config (the dict ``deepspeed.initialize`` gets), where DeepSpeed's
    own parser (``DeepSpeedConfig``, the engine's ``_config``) reads it."""
    import torch.distributed
    from deepspeed.runtime.config import DeepSpeedConfig

    path = tmp_path / "space.yaml"
    path.write_text(
        "name: s\nobjective: step_time\nknobs:\n"
        "  - {name: zero_stage, type: choice, values: [0, 2], memory: saver}\n"
        "  - {name: test_clip_norm, type: int, values: [0, 1, 5]}\n"
    )

    @register_knob("test_clip_norm", values=integer(lo=0), default=0, after=("zero_stage",))
    def clip_norm_handler(value: int, build: TrialBuild, ctx: KnobContext) -> None:
        """Clips the gradient norm at this value. Sets ``gradient_clipping``."""
        build.ds_config["gradient_clipping"] = float(value)

    try:
        space = SearchSpace.from_yaml(path)
        check_space(space)
        configs = space.enumerate()
        assert configs and len(configs) == 6
        for cfg in configs:
            ds = build_trial(wl, cfg, 2, N_DENSE, 256).ds_config
            assert ds["gradient_clipping"] == float(cfg["test_clip_norm"])
            assert ds["zero_optimization"]["stage"] == cfg["zero_stage"]
        assert (
            build_trial(wl, {}, 2, N_DENSE, 256).ds_config["gradient_clipping"] == 0.0
        )  # the default
        # DeepSpeed checks the batch sizes against its world size (1 without a process group)
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        engine_config = DeepSpeedConfig(
            build_trial(wl, {"test_clip_norm": 5}, world, N_DENSE, 256).ds_config
        )
        assert engine_config.gradient_clipping == 5.0 and engine_config.zero_optimization_stage == 0
    finally:
        unregister_knob("test_clip_norm")
    assert "test_clip_norm" not in KNOB_HANDLERS
    with pytest.raises(KnobError, match=r"test_clip_norm.*have no handler"):
        check_space(SearchSpace.from_yaml(path))
