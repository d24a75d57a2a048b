"""Tests of the Hugging Face example job (``examples/hf_job.py``).

Llama and Mixtral from a config, the same weights in every build context, checkpointing that
changes memory and not the numbers, and ``hf_llama_debug`` tuned end to end on 2 CPU ranks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from infrarsi.execution import end_checks, rank_setup
from infrarsi.execution.counters import HarnessCounters
from infrarsi.execution.job_loader import check_job, import_entry, preflight
from infrarsi.job import JobContext, ModelShape
from infrarsi.workload import Workload

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
ENTRY = "hf_job:make_job"
VOCAB = 256
LLAMA: dict[str, Any] = {
    "arch": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "vocab_size": VOCAB,
}
MIXTRAL = {**LLAMA, "arch": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}
SEQ = 16


def _module() -> Any:
    make_job = import_entry(EXAMPLES, ENTRY)  # the harness's own import path
    return sys.modules[make_job.__module__]


def _job(args: dict[str, Any], checkpointing: str | None = None, seq_len: int = SEQ):
    options = {} if checkpointing is None else {"activation_checkpointing": checkpointing}
    ctx = JobContext(
        args=args, options=options, device="cpu", rank=0, world_size=1, seq_len=seq_len
    )
    return check_job(import_entry(EXAMPLES, ENTRY)(ctx), ENTRY)


def _built(job: Any, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    return job.build_model()


def _tokens(rows: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (rows, SEQ), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    ("args", "cls", "shape"),
    [
        (LLAMA, "LlamaForCausalLM", ModelShape(n_layers=2, dim=64, vocab_size=256, n_heads=4)),
        (
            MIXTRAL,
            "MixtralForCausalLM",
            ModelShape(
                n_layers=2,
                dim=64,
                vocab_size=256,
                n_heads=4,
                num_experts=4,
                top_k=2,
                expert_hidden=96,
            ),
        ),
    ],
    ids=["llama", "mixtral"],
)
def test_builds_the_model_of_its_config_in_fp32_with_logits_over_the_vocabulary(
    args, cls, shape
) -> None:
    job = _job(args)
    assert job.shape == shape
    model = _built(job)
    assert type(model).__name__ == cls and model.training
    assert model.config._attn_implementation == "sdpa" and model.config.use_cache is False
    assert model.config.max_position_embeddings == SEQ  # defaults to data.seq_len
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    logits = job.forward(model, _tokens())
    assert logits.shape == (3, SEQ, 256) and logits.dtype == torch.float32
    # transformers' own init: N(0, initializer_range) matrices, unit norms (not the constructors' kaiming)
    q = model.model.layers[0].self_attn.q_proj.weight
    assert abs(float(q.detach().std()) - model.config.initializer_range) < 0.003
    assert torch.equal(model.model.norm.weight, torch.ones(64))


def test_bad_args_are_errors_naming_the_field() -> None:
    with pytest.raises(ValueError, match="hiden_size"):
        _job({**LLAMA, "hiden_size": 64})
    with pytest.raises(ValueError, match="arch must be one of llama, mixtral"):
        _job({**LLAMA, "arch": "gpt2"})
    with pytest.raises(ValueError, match=r"shorter than data\.seq_len"):
        _job({**LLAMA, "max_position_embeddings": 8})
    with pytest.raises(ValueError, match="none, selective or full"):
        _job(LLAMA, "most").build_model()


def test_the_harness_counts_every_token_forward_feeds() -> None:
    """``forward`` passes the ids positionally: the harness's forward pre-hook sees them."""
    job = _job(LLAMA)
    model = _built(job)
    counters = HarnessCounters().attach(model)
    counters.begin_step()
    job.forward(model, _tokens(rows=5))
    assert (counters.step_tokens, counters.step_rows) == (5 * SEQ, 5)
    counters.detach()


@pytest.mark.parametrize("args", [LLAMA, MIXTRAL], ids=["llama", "mixtral"])
def test_the_same_seed_gives_the_same_weights_in_every_build_context(args) -> None:
    job = _job(args)
    whole = _built(job)
    with rank_setup.build_context("cpu", {"zero_optimization": {"stage": 2}}):
        placed = _built(job)
    assert all(
        torch.equal(a, b) for a, b in zip(whole.parameters(), placed.parameters(), strict=True)
    )
    assert not all(
        torch.equal(a, b)
        for a, b in zip(whole.parameters(), _built(job, seed=1).parameters(), strict=True)
    )
    # parameters created in bf16 (what zero.Init does for a bf16 trial) get the fp32 draws, rounded
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        low = _built(job)
    finally:
        torch.set_default_dtype(prev)
    assert all(
        b.dtype == torch.bfloat16 and torch.equal(a.to(torch.bfloat16), b)
        for a, b in zip(whole.parameters(), low.parameters(), strict=True)
    )
    # on the meta device nothing is drawn
    with torch.device("meta"):
        meta = _built(job)
    assert all(p.is_meta for p in meta.parameters())


def test_the_reference_build_fills_from_the_trained_weights_and_evaluates_alike() -> None:
    """``build_reference`` (the eval check's untouched model): parameters on meta, real RoPE
    buffers, the RNG untouched; loaded with the trained values it gives the same logits."""
    job = _job(LLAMA)
    trained = _built(job, seed=3)
    state = torch.random.get_rng_state()
    reference = end_checks.build_reference(job.build_model, "cpu")
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(p.is_meta for p in reference.parameters())
    assert all(not b.is_meta for b in reference.buffers())
    end_checks.checksum_and_load(trained, reference=reference, device="cpu")
    x = _tokens()
    with torch.no_grad():
        assert torch.equal(job.forward(reference, x), job.forward(trained.eval(), x))


def _saved_tensors_and_grads(job: Any) -> tuple[int, list[torch.Tensor]]:
    model = _built(job)
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = job.forward(model, _tokens())
    torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), _tokens(seed=2).reshape(-1)
    ).backward()
    return saved[0], [p.grad for p in model.parameters()]  # every parameter gets a gradient


@pytest.mark.parametrize("args", [LLAMA, MIXTRAL], ids=["llama", "mixtral"])
def test_checkpointing_saves_fewer_activations_and_changes_no_number(args) -> None:
    got = {
        mode: _saved_tensors_and_grads(_job(args, mode)) for mode in ("none", "selective", "full")
    }
    assert got["none"][0] > got["selective"][0] > got["full"][0]
    for mode in ("selective", "full"):
        assert all(
            torch.allclose(a, b, rtol=1e-5, atol=1e-8)
            for a, b in zip(got["none"][1], got[mode][1], strict=True)
        ), mode
    assert _saved_tensors_and_grads(_job(args))[0] == got["none"][0]  # no option: none


@pytest.mark.parametrize("args", [LLAMA, MIXTRAL], ids=["llama", "mixtral"])
def test_the_fused_loss_is_the_harness_loss_and_gradients_without_the_whole_logits(args) -> None:
    """``fused_loss`` (the ``fused_loss_tokens`` knob) gives the mean cross-entropy of
    ``forward``'s logits and the same gradients, whole or a chunk of tokens at a time (a chunk
    that does not divide the tokens included); the plain forward and the parameter names are
    transformers' own."""
    job = _job(args)
    assert job.fused_loss is not None
    inputs, targets = _tokens(rows=2, seed=3), _tokens(rows=2, seed=4)
    runs = {}
    for chunk in (None, 0, 5):
        model = _built(job)
        if chunk is None:
            loss = torch.nn.functional.cross_entropy(
                job.forward(model, inputs).reshape(-1, VOCAB), targets.reshape(-1)
            )
        else:
            loss = job.fused_loss(model, inputs, targets, chunk)
        loss.backward()
        runs[chunk] = (loss.detach(), [p.grad.clone() for p in model.parameters()])
    plain_loss, plain_grads = runs[None]
    for chunk in (0, 5):
        loss, grads = runs[chunk]
        assert torch.allclose(loss, plain_loss, rtol=1e-6), chunk
        assert all(
            torch.allclose(a, b, rtol=1e-5, atol=1e-7)
            for a, b in zip(plain_grads, grads, strict=True)
        ), chunk
    model = _built(job)
    plain_cls = getattr(transformers, type(model).__name__)
    assert type(model) is plain_cls and type(model.lm_head) is torch.nn.Linear
    assert list(model.state_dict()) == list(plain_cls(model.config).state_dict())


@pytest.mark.parametrize("name", ["hf_llama_debug", "hf_mixtral_debug"])
def test_preflight_accepts_the_hf_workloads(name: str) -> None:
    wl = Workload.from_yaml(ROOT / "workloads" / f"{name}.yaml")
    job = preflight(wl)
    assert job.shape.vocab_size == wl.model.args["vocab_size"] == 4096
    assert job.shape.n_layers == 2 and job.shape.dim == 128
    assert (
        _module().make_config(wl.model.args, wl.data.seq_len).max_position_embeddings
        >= wl.data.seq_len
    )


# ----------------------------------------------------------------------------- integration
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_zero3_trains_hf_llama_exactly_like_zero2_and_checkpointing_changes_no_number() -> None:
    """2 gloo ranks through ``run_rank``: the ZeRO-3 build inside ``zero.Init`` (bf16) starts from
    the weights the ZeRO-2 whole build rounds to bf16, with fp32 RoPE frequencies, and trains
    bitwise alike; the three checkpointing modes give the same numbers (fp32); the fused loss
    under ZeRO-3 trains like the logits path to fp32 rounding."""
    from tests.execution.spawn_harness import make_spec, run_specs

    cfgs = [
        {"zero_stage": 2, "micro_batch_size": 2, "dtype": "bf16"},
        {"zero_stage": 3, "micro_batch_size": 2, "dtype": "bf16"},
        {
            "zero_stage": 2,
            "micro_batch_size": 2,
            "dtype": "fp32",
            "activation_checkpointing": "none",
        },
        {
            "zero_stage": 2,
            "micro_batch_size": 2,
            "dtype": "fp32",
            "activation_checkpointing": "selective",
        },
        {
            "zero_stage": 2,
            "micro_batch_size": 2,
            "dtype": "fp32",
            "activation_checkpointing": "full",
        },
        {  # the fused loss, lm_head's weight gathered by ZeRO-3 in its own forward
            "zero_stage": 3,
            "micro_batch_size": 2,
            "dtype": "fp32",
            "activation_checkpointing": "none",
            "fused_loss_tokens": 1000,
        },
    ]
    specs = []
    for i, c in enumerate(cfgs):
        spec = make_spec("workloads/hf_llama_debug.yaml", c, warmup=0, measured=2, trial_id=str(i))
        spec["code_dir"] = str(EXAMPLES)
        specs.append(spec)
    z2, z3, none, sel, full, fused = run_specs(specs)
    every = z2 + z3 + none + sel + full + fused
    assert [r["status"] for r in every] == ["ok"] * 12, [r["error"][-800:] for r in every]
    assert all(r["tokens_seen"] == [2048, 2048] for r in every)
    for a, b in ((z2, z3), (none, sel), (none, full)):
        assert a[0]["loss"] == b[0]["loss"]
        assert a[0]["param_checksum"] == b[0]["param_checksum"] == b[1]["param_checksum"]
        assert a[0]["eval_loss"] == b[0]["eval_loss"]
    # the same training to fp32 rounding of the chunked sums (2048 tokens in chunks of 1000)
    assert fused[0]["loss"] == pytest.approx(none[0]["loss"], rel=1e-5)
    assert fused[0]["eval_loss"] == pytest.approx(none[0]["eval_loss"], rel=1e-5)


SMALL_SPACE = {
    "name": "hf-debug-test",
    "objective": "step_time",
    "knobs": [
        {"name": "zero_stage", "type": "choice", "values": [0, 1, 2, 3], "memory": "saver"},
        {"name": "micro_batch_size", "type": "int", "values": [1, 2, 4, 8], "memory": "hungry"},
        {
            "name": "activation_checkpointing",
            "type": "choice",
            "values": ["none", "selective", "full"],
            "memory": "saver",
        },
    ],
}
"""The knobs of ``search_spaces/deepspeed_dense.yaml`` that keep a warm worker group warm and the
numbers fp32 (no ``threads_per_worker``, whose change restarts the workers, no bf16, which the
fp32 baseline's loss tolerance stops): the test's time goes to trials, not to cold starts."""


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_hf_llama_debug_tunes_end_to_end_on_two_cpu_ranks(ray_local, tmp_path: Path) -> None:
    """init, doctor, run, verify and report of ``hf_llama_debug`` through the real stack (Ray Tune,
    2 DeepSpeed ranks per trial, the HF job imported from examples/), on a small budget: steps cut
    to 1 + 2, three knobs of its search space, 3 run trials, verify 1 candidate x 2 pairs."""
    from infrarsi.stages.tune import tune_stage
    from infrarsi.study.trial_log import read_trials, rows

    data = yaml.safe_load((ROOT / "workloads" / "hf_llama_debug.yaml").read_text())
    data["steps"] = {"warmup": 1, "measured": 2}
    data["model"]["code_dir"] = str(EXAMPLES)
    data["baseline"].pop("dtype")
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SMALL_SPACE))
    data["search_space"] = str(space)
    path = tmp_path / "hf_llama_short.yaml"
    path.write_text(yaml.safe_dump(data))
    study = tmp_path / "study"
    out = tune_stage(
        path,
        study,
        trials=3,
        top_k=1,
        pairs=2,
        rounds=1,
        doctor_repeats=2,
        address=ray_local,
        progress=False,
        bank="off",
    )
    got = rows(read_trials(study))
    run = [r for r in got if r.stage == "run"]
    assert len(run) == 3
    assert [r for r in run if r.status == "ok"], [(r.status, r.error) for r in run]
    assert all(r.tokens_per_step == 2048 for r in got if r.status == "ok")
    verify = json.loads((study / "verify.json").read_text())
    assert verify["candidates"] and "best" in verify
    assert [r for r in got if r.stage == "verify" and r.status == "ok"]
    assert "hf_llama_debug" in (study / "report.md").read_text()
    assert out["report_html"].endswith("report.html")
