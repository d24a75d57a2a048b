"""Feasibility model: logistic blame capped by the deterministic-culprit model."""

from __future__ import annotations

import math

import pytest

from infrarsi.search.models.feasibility import FeasibilityModel
from infrarsi.search.settings import DEFAULT_SETTINGS

FAILURE_WEIGHT = DEFAULT_SETTINGS.failure_weight
CULPRIT_PRIOR = DEFAULT_SETTINGS.culprit_prior
BASE_FAILURE_RATE = DEFAULT_SETTINGS.feasibility_base_failure_rate

BASE = {"zero": 3, "mbs": 1, "ckpt": "full", "dtype": "fp32", "offload": False}


def cfg(**kw):
    return {**BASE, **kw}


def test_no_failure_means_no_penalty() -> None:
    m = FeasibilityModel()
    m.add(BASE, failed=False)
    assert m.p_ok([cfg(dtype="bf16")]).tolist() == [1.0]


def test_one_failure_shares_its_blame_among_the_values_never_seen_completing() -> None:
    m = FeasibilityModel()
    m.add(BASE, failed=False)
    w = FAILURE_WEIGHT["invariant_violation"]
    m.add(cfg(dtype="bf16", ckpt="none"), failed=True, weight=w)
    share = w / 2  # bf16 and ckpt=none are the suspects; zero, mbs and offload were seen completing
    blame = m.blame()
    assert blame["dtype='bf16'"] == pytest.approx(share / (share + CULPRIT_PRIOR))
    assert "zero=3" not in blame and "mbs=1" not in blame
    p_bf16, p_none, p_base = m.p_ok([cfg(dtype="bf16", mbs=4), cfg(ckpt="none"), BASE])
    assert p_bf16 < 0.5 and p_none < 0.5
    assert p_base > 0.8  # only the logistic part, which still spreads some blame, touches it


def test_successes_exonerate_bystanders_and_blame_concentrates_on_the_culprit() -> None:
    m = FeasibilityModel()
    m.add(BASE, failed=False)
    m.add(cfg(dtype="bf16", ckpt="none"), failed=True, weight=3.0)
    before = m.p_ok([cfg(dtype="bf16")])[0]
    m.add(cfg(ckpt="none", mbs=2), failed=False)  # ckpt=none completes: not the culprit
    after_bf16, after_none = m.p_ok([cfg(dtype="bf16"), cfg(ckpt="none", mbs=4)])
    assert after_bf16 < before
    assert "ckpt='none'" not in m.blame()
    assert after_none > 0.8 > 0.5 > after_bf16


def test_a_failure_with_no_suspect_is_transient() -> None:
    m = FeasibilityModel()
    m.add(BASE, failed=False)
    m.add(cfg(mbs=2), failed=False)
    m.add(
        cfg(mbs=2), failed=True, weight=FAILURE_WEIGHT["failed"]
    )  # a crash of a config that also ran fine
    assert m.blame() == {}


def test_an_oom_exonerates_nothing() -> None:
    m = FeasibilityModel()
    m.add(BASE, failed=False)
    m.add(
        cfg(dtype="bf16", mbs=8), failed=False, completed=False
    )  # an OOM: never reached the loss check
    m.add(cfg(dtype="bf16"), failed=True, weight=3.0)
    assert m.blame()["dtype='bf16'"] == pytest.approx(3.0 / (3.0 + CULPRIT_PRIOR))
    m.clear()
    assert m.blame() == {} and not m.exonerated


def test_the_batched_p_ok_matches_one_config_at_a_time() -> None:
    """``p_ok`` scores whole candidate sets a knob at a time; it must give what the per-config
    formula gives, keep ``True`` apart from ``1``, and fall back for mixed key orders."""
    import itertools

    import numpy as np

    m = FeasibilityModel()
    m.add(BASE, failed=False)
    m.add(cfg(dtype="bf16", mbs=4), failed=True, weight=FAILURE_WEIGHT["nan"])
    m.add(cfg(offload=True, zero=1), failed=True)
    m.add(cfg(mbs=4), failed=False)
    grid = [
        cfg(zero=z, mbs=b, dtype=d, offload=o)
        for z, b, d, o in itertools.product(
            [1, 3], [1, 4, True], ["fp32", "bf16"], [False, True, 1]
        )
    ]
    got = m.p_ok(grid)
    want = np.array([m.p_ok([c])[0] for c in grid])  # one config: the batched path on n = 1
    assert np.allclose(got, want, rtol=0, atol=1e-12)
    m.p_ok(grid[:1])  # fitted
    coef, blame, base = m._coef or {}, m.blame(), BASE_FAILURE_RATE
    for c, p in zip(grid, got, strict=True):  # the formula, written out per config
        z = m._bias + sum(coef.get(f"{k}={v!r}", 0.0) for k, v in c.items())
        logistic = min(1.0, (1.0 - 1.0 / (1.0 + math.exp(-z))) / (1.0 - base))
        assert p == pytest.approx(
            min(logistic, math.prod(1.0 - blame.get(f"{k}={v!r}", 0.0) for k, v in c.items())),
            rel=1e-12,
        )
    one, true = m.p_ok([cfg(mbs=1), cfg(mbs=True)])  # equal and same hash, but other values
    assert one != true and one == m.p_ok([cfg(mbs=1)])[0] and true == m.p_ok([cfg(mbs=True)])[0]
    reordered = [dict(reversed(list(c.items()))) if i % 2 else c for i, c in enumerate(grid)]
    assert np.allclose(
        m.p_ok(reordered), got, rtol=0, atol=1e-12
    )  # the one-config-at-a-time fallback agrees
