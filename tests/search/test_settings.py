"""``OptimizerSettings``: defaults, validation and the JSON round trip."""

from __future__ import annotations

import dataclasses
import json

import pytest

from infrarsi.errors import UserInputError
from infrarsi.search import OptimizerSettings
from infrarsi.search.settings import DEFAULT_SETTINGS


def test_every_field_has_a_docstring() -> None:
    import ast
    import inspect

    from infrarsi.search import settings

    tree = ast.parse(inspect.getsource(settings))
    cls = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "OptimizerSettings"
    )
    documented = {
        a.target.id
        for a, nxt in zip(cls.body, cls.body[1:], strict=False)
        if isinstance(a, ast.AnnAssign)
        and isinstance(a.target, ast.Name)
        and isinstance(nxt, ast.Expr)
        and isinstance(nxt.value, ast.Constant)
    }
    assert documented == {f.name for f in dataclasses.fields(OptimizerSettings)}


def test_round_trip_through_json_and_defaults() -> None:
    variant = dataclasses.replace(
        DEFAULT_SETTINGS,
        local_radius=3,
        time_gp_iters=(10, 5, 1),
        design_rule="maximin",
        explore_every=2,
        explore_rule="far",
        warm_start_rule="mapped",
        failure_weight={**DEFAULT_SETTINGS.failure_weight, "nan": 5.0},
    )
    raw = json.loads(json.dumps(variant.to_dict()))
    assert OptimizerSettings.from_dict(raw) == variant
    assert OptimizerSettings.from_dict({}) == OptimizerSettings() == DEFAULT_SETTINGS
    assert DEFAULT_SETTINGS.candidate_cap == 20_000 and DEFAULT_SETTINGS.n_init is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("candidate_cap", 1),
        ("local_every", -1),
        ("repeat_below_p", 1.5),
        ("transfer_trust_p", 0.0),
        ("prior_time_noise_sd", 0.0),
        ("time_gp_iters", (1, 2)),
        ("design_rule", "random"),
        ("time_kernel", "linear"),
        ("explore_rule", "everywhere"),
        ("explore_every", -2),
        ("explore_batch", 0),
        ("warm_start_rule", "clone"),
        ("censoring", "yes"),
        ("failure_weight", {"failed": 1.0}),
        ("num_threads", 0),
        ("n_init", "4"),
    ],
)
def test_bad_values_are_user_input_errors(field: str, value: object) -> None:
    with pytest.raises(UserInputError, match=f"OptimizerSettings.{field}: rule"):
        OptimizerSettings(**{field: value})


def test_unknown_settings_are_refused() -> None:
    with pytest.raises(UserInputError, match="unknown setting"):
        OptimizerSettings.from_dict({"local_radiuss": 3})
