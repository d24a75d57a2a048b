"""Every stage end to end on the simulated ``surrogate`` backend (real Ray Tune, real Arrow log,
real BoTorch models; only the trial is analytic), plus re-running each stage from the directory
alone and resuming a study killed with SIGKILL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infrarsi.study.trial_log import read_trials, rows

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "stages" / "surrogate_small.yaml"


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "infrarsi", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        **kw,
    )


def test_all_stages_then_each_stage_again_from_the_directory(tmp_path: Path) -> None:
    from infrarsi.stages.tune import tune_stage

    study = tmp_path / "study"
    out = tune_stage(
        FIXTURE, study, trials=6, top_k=2, pairs=2, rounds=1, doctor_repeats=2, progress=False
    )
    for name in ("contract.yaml", "doctor.json", "verify.json", "report.md", "report.html"):
        assert (study / name).exists(), name
    got = rows(read_trials(study))
    stages = {r.stage for r in got}
    assert {"doctor", "run", "verify"} <= stages
    assert len([r for r in got if r.stage == "run"]) == 6
    assert all(r.simulated for r in got)
    verify = json.loads((study / "verify.json").read_text())
    assert set(verify) >= {"best", "candidates"}
    assert out["report_html"].endswith("report.html")

    # Each stage re-runs from the directory alone, through the CLI, in a fresh process; --json
    # prints one JSON object on stdout (the progress bars go to stderr).
    r = _cli("report", str(study), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["html"].endswith("report.html")
    r = _cli("verify", str(study), "--top-k", "1", "--pairs", "2", "--rounds", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert set(json.loads(r.stdout)) >= {"best", "candidates"}
    # Quiet by default: a progress bar and the result table, no Ray Tune banner, results path,
    # TensorBoard hint or double concurrency limit warning, no per-trial log lines.
    r = _cli("run", str(study), "--trials", "7", "--resume")
    assert r.returncode == 0, r.stderr
    said = r.stdout + r.stderr
    for noise in (
        "View detailed results",
        "tensorboard",
        "max_concurrent_trials",
        "Configuration for experiment",
        "trial.start",
        "trial.end",
    ):
        assert noise.lower() not in said.lower(), (noise, said)
    assert len(said.strip().splitlines()) <= 15, said
    assert len([x for x in rows(read_trials(study)) if x.stage == "run"]) == 7
    # ... and the study's log holds every event as JSON lines, the run's trials included (they
    # end in the executor actor), with the Ray session's logs (the ranks' stdout) beside it.
    events = [
        json.loads(line) for line in (study / "logs" / "infrarsi.jsonl").read_text().splitlines()
    ]
    assert {"trial.start", "trial.end", "run.start"} <= {e["event"] for e in events}
    assert any(
        e["event"] == "trial.end" and e.get("trial_id", "").startswith("run-") for e in events
    )
    assert (study / "logs" / "ray").is_dir()
    # -v brings the events back to the terminal (stderr), stdout still the one JSON object.
    r = _cli("-v", "doctor", str(study), "--repeats", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert "trial.start" in r.stderr and "trial.end" in r.stderr
    assert "noise_margin" in json.loads(r.stdout)
    # Without --resume, run refuses to silently mix with an existing search.
    r = _cli("run", str(study), "--trials", "8")
    assert r.returncode == 1 and "--resume" in r.stderr


def test_the_report_draws_the_peak_memory_the_optimizer_predicted(tmp_path: Path) -> None:
    """init, doctor, run and report through the stage functions: each run trial logs the ask's
    ``AskInfo`` (through Ray Tune's config), and the report draws its predicted peak memory
    against the measured one."""
    from infrarsi.search import AskInfo
    from infrarsi.stages.doctor import doctor_stage
    from infrarsi.stages.init import init_stage
    from infrarsi.stages.report import write_report
    from infrarsi.stages.run import run_stage

    study = tmp_path / "study"
    init_stage(FIXTURE, study, trials=3)
    doctor_stage(study, repeats=2)
    run_stage(study, trials=3, progress=False)
    run_rows = [r for r in rows(read_trials(study)) if r.stage == "run"]
    assert len(run_rows) == 3
    infos = [AskInfo.from_dict(r.extra.ask_info) for r in run_rows]
    assert all(i.config == r.config for i, r in zip(infos, run_rows, strict=True))
    assert all(i.predicted_peak_memory_bytes and i.predicted_peak_memory_bytes > 0 for i in infos)
    out = write_report(study)
    assert "predicted_vs_measured" in {p.stem for p in out.figures}
    assert "predicted vs measured: nothing to draw" not in out.markdown.read_text()
