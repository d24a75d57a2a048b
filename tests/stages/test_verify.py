"""verify: candidates are knobs with their patches; what verify measures is what apply promotes.

The whole path an agent takes, on a small job of our own in its own git repository: three
proposals through ``propose``, one ``run``, ``verify``, the long check, ``apply``. The job wastes a wait in every
forward; an honest patch removes it, a cheat removes it and skips a layer."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import git
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

JOB = textwrap.dedent('''\
    """A two-layer toy LM that waits in every forward (the waste an honest patch removes)."""
    import time

    import torch
    from torch import nn

    from infrarsi.job import JobContext, ModelShape, TokenBatch, TrainingJob

    VOCAB = 64
    WAIT_S = 0.06


    class PaddedLM(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, dim)
            self.mix1 = nn.Linear(dim, dim)
            self.mix2 = nn.Linear(dim, dim)
            self.head = nn.Linear(dim, VOCAB)

        def forward(self, tokens):
            time.sleep(WAIT_S)
            h = torch.tanh(self.mix1(self.embed(tokens)))
            h = torch.tanh(self.mix2(h))
            return self.head(h)


    def make_job(ctx: JobContext) -> TrainingJob:
        def global_batch(step: int, rows: int) -> TokenBatch:
            g = torch.Generator().manual_seed(1000 + step)
            x = (torch.randint(0, VOCAB, (rows, 1), generator=g) + torch.arange(ctx.seq_len + 1)) % VOCAB
            return TokenBatch(x[:, :-1], x[:, 1:])

        return TrainingJob(build_model=lambda: PaddedLM(16), shape=ModelShape(n_layers=2, dim=16, vocab_size=VOCAB),
                           global_batch=global_batch)
''')
# The wait dwarfs the toy's compute, so the honest patch is the fastest by far even on a loaded machine.
HONEST = ("WAIT_S = 0.06\n", "WAIT_S = 0.0\n")
CHEAT_SKIP = ("        h = torch.tanh(self.mix2(h))\n", "")


def _job_repo(tmp: Path) -> tuple[Path, Path]:
    repo_dir = tmp / "repo"
    (repo_dir / "my_job").mkdir(parents=True)
    (repo_dir / "my_job" / "padded_job.py").write_text(JOB)
    wl = {
        "name": "padded",
        "model": {"entry_point": "padded_job:make_job", "code_dir": "my_job"},
        "data": {"seq_len": 16},
        "tokens_per_step": 16 * 16,
        "steps": {"warmup": 1, "measured": 2},
        "resources": {"workers": 2, "device": "cpu"},
        "baseline": {
            "zero_stage": 2,
            "micro_batch_size": 2,
            "activation_checkpointing": "none",
            "dtype": "fp32",
        },
        "search_space": str(ROOT / "search_spaces" / "deepspeed_dense.yaml"),
    }
    (repo_dir / "padded.yaml").write_text(yaml.safe_dump(wl, sort_keys=False))
    repo = git.Repo.init(repo_dir, initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "Test")
        cw.set_value("user", "email", "test@example.com")
    repo.index.add(["my_job/padded_job.py", "padded.yaml"])
    repo.index.commit("the team's job")
    return repo_dir, repo_dir / "padded.yaml"


def _patch(repo_dir: Path, out: Path, *edits: tuple[str, str]) -> Path:
    f = repo_dir / "my_job" / "padded_job.py"
    before = f.read_text()
    text = before
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    f.write_text(text)
    out.write_text(git.Repo(repo_dir).git.diff() + "\n")
    f.write_text(before)
    return out


@pytest.mark.integration
def test_what_verify_measures_is_what_apply_promotes(tmp_path: Path, ray_local: str) -> None:
    from infrarsi.stages.apply import apply
    from infrarsi.stages.doctor import doctor_stage
    from infrarsi.stages.init import init_stage
    from infrarsi.stages.long_check import accepted_candidate, long_check_stage
    from infrarsi.stages.propose import propose
    from infrarsi.stages.run import run_stage
    from infrarsi.stages.verify import verify_stage
    from infrarsi.study.candidate import Candidate, file_sha256
    from infrarsi.study.trial_log import read_trials, rows

    repo_dir, workload = _job_repo(tmp_path)
    honest = _patch(repo_dir, tmp_path / "no_wait.diff", HONEST)
    cheat = _patch(repo_dir, tmp_path / "no_wait_skip_layer.diff", HONEST, CHEAT_SKIP)
    study = tmp_path / "study"
    init_stage(workload, study, editable_globs=["my_job/**"], trials=3, bank="off")
    doctor_stage(study, repeats=2, honest_change=False)
    fast = {"micro_batch_size": 4}  # half the forwards per step, so half the waits
    p_cheat = propose(study, fast, why="skip the wait and a layer", patch=cheat)
    propose(study, fast, why="micro-batch 4")
    p_honest = propose(study, {}, why="the wait does nothing", patch=honest)
    summary = run_stage(study, progress=False)

    run = {r.extra.proposal["proposal_id"]: r for r in rows(read_trials(study)) if r.stage == "run"}
    assert run["prop-0001"].status == "invariant_violation"
    assert run["prop-0002"].status == "ok" and run["prop-0003"].status == "ok"
    assert run["prop-0003"].patches == [p_honest.patch] and run["prop-0003"].patch_sha256 == [
        file_sha256(honest)
    ]
    # Defect 3: a patch with the baseline's knobs is the run's best, named with its patch.
    assert summary["best_patches"][0]["path"] == p_honest.patch

    out = verify_stage(study, top_k=3, pairs=3, rounds=2)
    by_patch = {tuple(p["path"] for p in c["patches"]): c for c in out["candidates"]}
    # Defect 1: the cheat is never a candidate, although its knobs are the same as prop-0002's.
    assert set(by_patch) == {(), (p_honest.patch,)} and p_cheat.patch not in json.dumps(
        out["candidates"]
    )
    # Defect 2: verify ran each candidate with exactly its patches, and its rows say so.
    log = {r.trial_id: r for r in rows(read_trials(study))}
    for c in out["candidates"]:
        ran = {Candidate.from_row(log[t]).key for t in c["trial_ids"]}
        assert ran == {Candidate.from_dict(c).key}, c["trial_ids"]
    best = out["best"]
    assert best is not None and best["patches"][0]["path"] == p_honest.patch, out
    assert best["patches"][0]["sha256"] == file_sha256(honest)
    assert best["ci_coverage"] == pytest.approx(0.96875) and "96.9%" in best["ci_method"]

    # Past the trial's horizon: the honest patch trains like the baseline and restarts cleanly.
    checked = long_check_stage(study, candidate=accepted_candidate(study))
    assert checked.passed, checked.reason
    assert checked.candidate_key == Candidate.from_dict(best).key and checked.patches == [
        p_honest.patch
    ]
    res = apply(study, repo_dir, branch="tuned")
    code = git.Repo(repo_dir).git.show("tuned:my_job/padded_job.py")
    assert "WAIT_S = 0.0\n" in code and "self.mix2(h)" in code  # the honest patch, not the cheat's
    assert "my_job/padded_job.py" in res.files


def test_the_measured_fastest_joins_the_posteriors_picks() -> None:
    """The posterior ranks a thrice-measured config first and a once-measured faster one last:
    verify runs the posterior's top-k and the measured-fastest, so paired runs settle it."""
    from infrarsi.stages.verify import rank_candidates

    keys = ["slow_thrice", "mid", "other", "fast_once"]
    smoothed = {"slow_thrice": 2.48, "mid": 2.50, "other": 2.55, "fast_once": 2.60}
    observed = {"slow_thrice": 2.50, "mid": 2.52, "other": 2.56, "fast_once": 2.45}
    counts = {"slow_thrice": 3, "mid": 1, "other": 1, "fast_once": 1}
    assert rank_candidates(keys, smoothed, observed, counts, 2) == [
        ("slow_thrice", ["posterior"]),
        ("mid", ["posterior"]),
        ("fast_once", ["measured"]),
    ]
    # agreement: no extra candidate; the top one is named by both
    observed["fast_once"] = 2.9
    assert rank_candidates(keys, smoothed, observed, counts, 2) == [
        ("slow_thrice", ["posterior", "measured"]),
        ("mid", ["posterior"]),
    ]
    # a tie on the measured median goes to the config measured more often
    observed["mid"] = 2.50
    assert rank_candidates(keys, smoothed, observed, counts, 1)[0][1] == ["posterior", "measured"]
    assert rank_candidates([], {}, {}, {}, 3) == []
