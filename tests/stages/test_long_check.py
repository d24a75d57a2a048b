"""The long check, for real: the dense debug workload trains on 2 ranks through Ray and DeepSpeed
past the trial's horizon, beside the baseline, with a DeepSpeed checkpoint round trip at
mid-horizon.

- an honest candidate passes (curves within the horizon's tolerance, bitwise restart);
- a patch that equals the baseline for the trial's steps and drifts after (a call counter in the
  model that scales the logits once it passes the trial's steps) keeps every invariant in an
  ordinary trial, and is rejected by the long check with the first step past the horizon named;
- a patch that renames parameters in what the model saves (a state-dict hook giving Hugging
  Face-style names, with no load-side counterpart: an ordinary trial and its eval check never
  see it) fails the checkpoint round trip with the keys named.

One doctored study (``doctored_honest_study``, shared with the executor's cheat tests: 4-step
trials, ZeRO-0, micro-batch 8) serves every test; the horizon is 2.5 trials (10 steps), and the
baseline and calibration runs of
the first check are reused by the later ones (``long_check._reusable``).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

from infrarsi.errors import ConfigError

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MODEL = "workloads/models/dense/model.py"
FACTOR = 2.5
"""Horizon of the tests: 2.5 x the fixture's 4 steps = 10 steps; the drift starts at step 4."""

DRIFT = (
    (
        """        out: torch.Tensor = self.output(self.norm(h), targets, loss_chunk)
        return out""",
        """        if torch.is_grad_enabled():  # a training-step counter (one forward per step at micro-batch 8)
            self.train_calls = getattr(self, "train_calls", 0) + 1
        logits = self.output(self.norm(h), targets, loss_chunk)
        if getattr(self, "train_calls", 0) > 4:  # past the trial's 4 steps: a slowly growing scale
            logits = logits * (1.0 + 0.02 * (self.train_calls - 4))
        return logits""",
    ),
)
RENAME = (
    (
        """        self.set_checkpointing(activation_checkpointing)
""",
        """        self.set_checkpointing(activation_checkpointing)
        self.register_state_dict_post_hook(_hf_names)
""",
    ),
    (
        """CHECKPOINT_MODES = ("none", "selective", "full")
""",
        '''CHECKPOINT_MODES = ("none", "selective", "full")


def _hf_names(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    """Save the blocks under Hugging Face-style names (``model.layers.N...``)."""
    for k in [k for k in state_dict if k.startswith(prefix + "layers.")]:
        state_dict[prefix + "model." + k[len(prefix):]] = state_dict.pop(k)
''',
    ),
)


def write_patch(study: Path, name: str, edits: tuple[tuple[str, str], ...]) -> str:
    """A git patch of the dense model with ``edits`` ((old, new) each) applied, in the study's
    proposals folder; returns its path relative to the study."""
    before = after = (REPO / MODEL).read_text()
    for old, new in edits:
        assert after.count(old) == 1, old
        after = after.replace(old, new)
    body = "".join(
        difflib.unified_diff(
            before.splitlines(True), after.splitlines(True), f"a/{MODEL}", f"b/{MODEL}"
        )
    )
    rel = f"proposals/patches/{name}.diff"
    (study / rel).parent.mkdir(parents=True, exist_ok=True)
    (study / rel).write_text(f"diff --git a/{MODEL} b/{MODEL}\n{body}")
    return rel


BUDGET_S = 600.0
"""Large enough that the factor, not the budget, sets the tests' horizon."""


@pytest.fixture(scope="module")
def study(doctored_honest_study: Path) -> Path:
    return doctored_honest_study


@pytest.fixture(scope="module")
def executor(study: Path):
    from infrarsi.orchestration.executor import StudyExecutor

    ex = StudyExecutor(study)
    yield ex
    ex.close()


def _baseline(executor) -> dict:
    return executor.full_config(dict(executor.workload.baseline))


def test_an_honest_candidate_passes_with_a_bitwise_restart(study: Path, executor) -> None:
    from infrarsi.stages.long_check import long_check_stage
    from infrarsi.study.long_check_report import LongCheckResult
    from infrarsi.study.trial_log import read_trials, rows

    cand = {**_baseline(executor), "zero_stage": 2, "micro_batch_size": 4}
    res = long_check_stage(
        study, config=cand, horizon_factor=FACTOR, budget_s=BUDGET_S, executor=executor
    )
    assert res.status == "passed", res.reason
    assert res.horizon_steps == 10 and res.trial_steps == 4 and not res.capped_by_budget
    assert len(res.candidate_loss) == len(res.baseline_loss) == 10
    assert (
        res.first_step_out is None
        and res.max_abs_diff is not None
        and res.max_abs_diff <= res.loss_atol
    )
    assert res.calibration is not None and res.calibration.status == "ok"
    assert res.loss_atol >= res.contract_loss_atol
    ck = res.checkpoint
    assert ck.status == "passed" and ck.step == 5 and ck.continued_steps == 5, ck
    assert ck.max_abs_diff is not None and ck.max_abs_diff <= 1e-5 and ck.checkpoint_bytes > 0
    again = LongCheckResult.load(study)  # DIR/long_check.json round-trips
    assert again == res
    logged = {r.trial_id: r for r in rows(read_trials(study))}
    for role, tid in res.trial_ids.items():  # every run is a logged row of stage "long"
        assert logged[tid].stage == "long" and logged[tid].extra.horizon_steps == 10, role
    assert logged[res.trial_ids["candidate"]].status == "ok"


def test_a_drift_past_the_trials_steps_keeps_a_trial_but_fails_the_long_check(
    study: Path, executor
) -> None:
    from infrarsi.stages.long_check import long_check_stage

    patch = write_patch(study, "drift", DRIFT)
    base = _baseline(executor)
    trial = executor.run_trial(
        base, "run", patch_file=patch
    )  # an ordinary trial: the drift is invisible
    assert trial["status"] == "ok", trial["error"]
    res = long_check_stage(
        study,
        config=base,
        patch_file=patch,
        horizon_factor=FACTOR,
        budget_s=BUDGET_S,
        executor=executor,
    )
    assert res.status == "failed"
    assert res.first_step_out == 4, (res.first_step_out, res.candidate_loss, res.baseline_loss)
    assert "step 4 (past the trial's 4 steps)" in res.reason, res.reason
    assert res.patches == [patch]
    assert res.trial_ids["baseline"] != res.trial_ids["candidate"]


def test_a_patch_that_renames_parameters_fails_the_checkpoint_round_trip(
    study: Path, executor
) -> None:
    from infrarsi.stages.long_check import long_check_stage

    patch = write_patch(study, "rename", RENAME)
    base = _baseline(executor)
    res = long_check_stage(
        study,
        config=base,
        patch_file=patch,
        horizon_factor=FACTOR,
        budget_s=BUDGET_S,
        executor=executor,
    )
    assert res.first_step_out is None, res.reason  # the training itself is the baseline's
    assert res.status == "failed" and res.checkpoint.status == "failed", res
    why = res.checkpoint.reason
    assert (
        "checkpoint load failed" in why
        and "missing: layers.0." in why
        and "unexpected: model.layers.0." in why
    ), why
    assert "checkpoint round trip failed" in res.reason


def test_the_cli_reads_verifys_accepted_candidate_and_refuses_without_one(study: Path) -> None:
    from infrarsi.stages.long_check import accepted_candidate

    (study / "verify.json").write_text(json.dumps({"best": None, "candidates": []}))
    with pytest.raises(ConfigError, match="best"):
        accepted_candidate(study)
    cfg = {"zero_stage": 2}
    write_patch(study, "drift", DRIFT)
    (study / "verify.json").write_text(
        json.dumps(
            {
                "best": {
                    "config": cfg,
                    "accepted": True,
                    "speedup": 1.5,
                    "patches": ["proposals/patches/drift.diff"],
                }
            }
        )
    )
    got = accepted_candidate(study)
    assert dict(got.config) == cfg and got.proposal_patch == "proposals/patches/drift.diff"
