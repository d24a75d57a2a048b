"""``InfrarsiSearcher`` in a real Ray Tune run (outcomes follow ``Outcome.from_row``, tests/search/test_outcome.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from infrarsi.errors import ConfigError
from infrarsi.integrations.ray_tune import InfrarsiSearcher, oom_as_result
from infrarsi.search import Optimizer, Outcome, SearchSpace

CAPACITY = 1000.0
SPACE = """
name: toy
objective: step_time
knobs:
  - name: zero_stage
    type: choice
    values: [0, 1]
    memory: saver
  - name: micro_batch_size
    type: int
    values: [1, 2, 4, 8]
    memory: hungry
  - name: checkpointing
    type: bool
    memory: saver
"""
BASELINE = {"zero_stage": 0, "micro_batch_size": 8, "checkpointing": False}  # OOMs: asked first


def make_trainable(capacity: float):  # type: ignore[no-untyped-def]
    """A toy trainable: synthetic step time and memory; ZeRO-1 'crashes' (raises) at micro-batch
    <= 2; over the capacity, ZeRO-0 raises ``torch.OutOfMemoryError`` (as a real job would) and
    ZeRO-1 reports ``oom``. Built in a closure so Ray pickles it by value (tests/ is not
    importable on workers)."""

    def toy_trainable(config: dict) -> None:
        import torch
        from ray import tune

        mbs, ckpt, zero = config["micro_batch_size"], config["checkpointing"], config["zero_stage"]
        if zero == 1 and mbs <= 2:
            raise RuntimeError("toy crash")
        memory = 300.0 + mbs * (40.0 if ckpt else 120.0) - 100.0 * zero
        if memory > capacity and zero == 0:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if memory > capacity:  # Tune needs the metric in every result: nan when not ok
            tune.report({"status": "oom", "step_time_s": math.nan, "peak_memory_bytes": capacity})
            return
        step = 10.0 / (1 + mbs) * (1.3 if ckpt else 1.0) * (1.1 if zero else 1.0)
        tune.report({"status": "ok", "step_time_s": step, "peak_memory_bytes": memory})

    return toy_trainable


def _searcher() -> InfrarsiSearcher:
    return InfrarsiSearcher(
        SearchSpace.from_yaml(SPACE), memory_capacity=CAPACITY, seed=0, baseline=BASELINE
    )


def test_metric_and_mode_are_checked() -> None:
    from infrarsi.errors import ConfigError

    with pytest.raises(ConfigError, match="mode must be 'min'"):
        InfrarsiSearcher(SPACE, memory_capacity=CAPACITY, mode="max")
    with pytest.raises(ConfigError, match="metric must be one of"):
        _searcher().set_search_properties("loss", "min", {})


def test_trial_results_are_told_through_outcome_from_row() -> None:
    s = _searcher()
    results = [
        None,
        {"status": "oom", "step_time_s": math.nan, "peak_memory_bytes": 2 * CAPACITY},
        {"step_time_s": 1.5, "peak_memory_bytes": 400.0},
        {"status": "ok", "step_time_s": math.nan},
    ]
    for i, result in enumerate(results):
        s.suggest(f"t{i}")
        s.on_trial_complete(f"t{i}", result, error=result is None)
    told = [o.outcome for o in s.optimizer.observations]
    assert [o.status for o in told] == ["failed", "oom", "ok", "failed"]
    assert told[1].peak_memory == 2 * CAPACITY and told[2].step_time == 1.5
    assert told == [Outcome(status="failed")] + [
        Outcome.from_row(r) for r in results[1:] if r is not None
    ]


def test_save_restore_round_trip(tmp_path: Path) -> None:
    s = _searcher()
    for i in range(4):
        cfg = s.suggest(f"t{i}")
        s.on_trial_complete(
            f"t{i}", {"status": "ok", "step_time_s": 1.0 + i, "peak_memory_bytes": 500.0}
        )
        assert cfg is not None
    s.suggest("pending")
    s.save(str(tmp_path / "s.json"))
    r = InfrarsiSearcher(SPACE, memory_capacity=CAPACITY)
    r.restore(str(tmp_path / "s.json"))
    assert r.told == 4 and set(r.live) == {"pending"}
    assert len(r.optimizer.observations) == len(s.optimizer.observations) == 4
    assert r.suggest("next") == s.suggest("next")


@pytest.mark.integration
def test_tuner_run_sees_oom_as_censored_and_raise_as_failed(ray_local: str, tmp_path: Path) -> None:
    """A reported oom and a raised ``torch.OutOfMemoryError`` (through ``oom_as_result``) are both
    told as censored ``oom``; any other exception as ``failed``."""
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter

    searcher = _searcher()
    trainable = oom_as_result(make_trainable(CAPACITY))
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=ConcurrencyLimiter(searcher, max_concurrent=1),
            num_samples=7,
            metric="step_time_s",
            mode="min",
        ),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path),
            name="toy",
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )
    grid = tuner.fit()
    assert len(grid) == 7 and grid.errors  # the raising trial errored in Tune
    # The searcher object inside Tune is a copy: read its saved state from the experiment dir.
    seen = InfrarsiSearcher(SPACE, memory_capacity=CAPACITY)
    seen.restore_from_dir(str(tmp_path / "toy"))
    opt: Optimizer = seen.optimizer
    statuses = [o.outcome.status for o in opt.observations]
    assert seen.told == 7 and not seen.live
    oom = [o for o in opt.observations if o.outcome.status == "oom"]
    # the baseline raised torch.OutOfMemoryError: told oom (no CUDA here, so no peak: the capacity is its bound)
    assert oom and oom[0].config == BASELINE and oom[0].outcome.peak_memory is None
    assert all(
        o.outcome.peak_memory in (None, CAPACITY) for o in oom
    )  # a reported oom: censored at capacity
    assert all(o.outcome.extra["memory_censored"] for o in oom)
    failed = [o for o in opt.observations if o.outcome.status == "failed"]
    assert failed and all(
        o.config["zero_stage"] == 1 and o.config["micro_batch_size"] <= 2 for o in failed
    )
    assert statuses.count("ok") == 7 - len(oom) - len(failed)
    best = opt.best()
    assert best is not None and best not in [o.config for o in oom + failed]

    # Tuner.restore brings the pickled searcher back and re-runs the errored trial.
    restored = tune.Tuner.restore(str(tmp_path / "toy"), trainable=trainable, restart_errored=True)
    restored.fit()
    again = InfrarsiSearcher(SPACE, memory_capacity=CAPACITY)
    again.restore_from_dir(str(tmp_path / "toy"))
    assert again.told >= seen.told and len(again.optimizer.observations) >= len(opt.observations)


def test_oom_as_result_reports_an_out_of_memory_error_and_raises_anything_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wrapper's logic without a Tune session: ``tune.report`` is captured (the real Tuner run
    above checks what the searcher makes of it)."""
    import torch
    from ray import tune

    reported: list[dict] = []
    monkeypatch.setattr(tune, "report", reported.append)

    def job(config: dict) -> str:
        if config["fail"] == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if config["fail"] == "host":
            raise MemoryError("host")
        if config["fail"] == "crash":
            raise RuntimeError("crash")
        return "done"

    wrapped = oom_as_result(job)
    assert wrapped.__name__ == "job" and wrapped({"fail": None}) == "done" and not reported
    assert wrapped({"fail": "oom"}) is None and wrapped({"fail": "host"}) is None
    assert [r["status"] for r in reported] == ["oom", "oom"]
    assert all(math.isnan(r["step_time_s"]) and r["peak_memory_bytes"] is None for r in reported)
    assert "OutOfMemoryError" in reported[0]["error"]
    assert (
        Outcome.from_row(reported[0]).status == "oom"
        and Outcome.from_row(reported[0]).extra["memory_censored"]
    )
    with pytest.raises(RuntimeError, match="crash"):
        wrapped({"fail": "crash"})
    assert len(reported) == 2


def test_oom_as_result_refuses_a_trainable_class() -> None:
    from ray import tune

    class Job(tune.Trainable):
        def step(self) -> dict:
            return {}

    with pytest.raises(ConfigError, match="function trainable"):
        oom_as_result(Job)  # type: ignore[arg-type]


def test_restore_refuses_a_file_that_is_not_a_saved_state(tmp_path: Path) -> None:
    from infrarsi.errors import ConfigError

    bad = tmp_path / "state.pkl"
    bad.write_bytes(b"\x80\x04not json")
    s = InfrarsiSearcher(SearchSpace.from_yaml(SPACE), memory_capacity=CAPACITY)
    with pytest.raises(ConfigError, match=r"state\.pkl"):
        s.restore(str(bad))
