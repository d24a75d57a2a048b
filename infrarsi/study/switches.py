"""The switches that change how a study behaves, recorded in its contract, and their one parser.

``infrarsi init`` (and ``tune``) records them in ``contract.yaml`` under ``switches``; every later
stage reads them from the contract (``Contract.switches_in_force()``), never from the
environment. The environment variables only give the defaults at init time:

- ``analytic_prior`` (``--analytic-prior`` / ``--no-analytic-prior``): ``$INFRARSI_PRIOR``, else on;
- ``loss_guard`` (``--loss-guard`` / ``--no-loss-guard``): ``$INFRARSI_LOSS_GUARD``, else on;
- ``bank`` (``--bank DIR`` or ``--bank off``): ``$INFRARSI_BANK``, else ``~/.cache/infrarsi/bank``.

One word list decides on and off for all of them (``OFF_WORDS``, ``ON_WORDS``; case and
surrounding blanks ignored); a bank value that is not an off word is the bank's location (a local directory or a URI).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from infrarsi.errors import ConfigError

OFF_WORDS = ("off", "0", "false", "no", "none", "disabled")
"""Words that turn a switch off (also the bank: no warm start, finished studies not added)."""
ON_WORDS = ("on", "1", "true", "yes", "enabled")
"""Words that turn a boolean switch on."""
DEFAULT_BANK = "~/.cache/infrarsi/bank"
"""The experience bank's location when neither ``--bank`` nor ``$INFRARSI_BANK`` names one."""

PRIOR_ENV = "INFRARSI_PRIOR"
"""Default of ``analytic_prior`` at init."""
LOSS_GUARD_ENV = "INFRARSI_LOSS_GUARD"
"""Default of ``loss_guard`` at init."""
BANK_ENV = "INFRARSI_BANK"
"""Default of ``bank`` at init."""


def is_off(text: str) -> bool:
    """True when ``text`` is one of ``OFF_WORDS`` (case and blanks ignored)."""
    return text.strip().lower() in OFF_WORDS


def parse_switch(text: str, *, what: str) -> bool:
    """``ON_WORDS`` -> True, ``OFF_WORDS`` -> False; anything else is a ``ConfigError``."""
    word = text.strip().lower()
    if word in ON_WORDS:
        return True
    if word in OFF_WORDS:
        return False
    raise ConfigError(
        f"{what}: rule: one of {', '.join(ON_WORDS)} (on) or {', '.join(OFF_WORDS)} (off); "
        f"value: {text!r}. Fix: set it to on or off."
    )


def parse_bank(text: str, *, what: str) -> str | None:
    """The bank a value names: None for an off word; a ``scheme://`` URI as given (``s3://``,
    ``gs://``, ``hdfs://``, ``file://``, or any fsspec protocol: see ``infrarsi.bank.store``); else
    a local directory (``~`` expanded, made absolute). ``ConfigError`` for an empty value or a URI
    with no scheme or no path."""
    value = text.strip()
    if not value:
        raise ConfigError(
            f"{what}: rule: a local directory, a filesystem URI (s3://bucket/bank, file:///path) "
            f"or one of {', '.join(OFF_WORDS)}; value: {text!r}. Fix: name the bank, or `off`."
        )
    if is_off(value):
        return None
    if "://" in value:
        scheme, _, rest = value.partition("://")
        if (
            not scheme
            or not rest.strip("/")
            or not scheme.replace("+", "").replace("-", "").isalnum()
        ):
            raise ConfigError(
                f"{what}: rule: a URI needs a scheme and a path (s3://bucket/bank, "
                f"file:///abs/path); value: {text!r}. Fix: name the bank's location in full."
            )
        return value
    return str(Path(value).expanduser().resolve())


def _env(name: str, environ: Mapping[str, str]) -> str | None:
    value = environ.get(name)
    return value if value is not None and value.strip() else None


def bank_from_environment(environ: Mapping[str, str] | None = None) -> str | None:
    """The bank ``$INFRARSI_BANK`` names (None: off), else ``DEFAULT_BANK``."""
    env = os.environ if environ is None else environ
    text = _env(BANK_ENV, env)
    return parse_bank(
        text if text is not None else DEFAULT_BANK, what=f"environment variable {BANK_ENV}"
    )


class StudySwitches(BaseModel):
    """The switches of one study (``contract.yaml``'s ``switches`` section), frozen at init."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    analytic_prior: bool
    """Give the optimizer the workload's analytic prior mean (``infrarsi.workload_prior``)."""
    loss_guard: bool
    """Stop a trial's ranks at the first step whose loss leaves the contract's tolerance
    (once the doctor has a baseline loss trace); off runs such trials to the end."""
    bank: str | None
    """The experience bank the study warm-starts from and that every stage feeds: an absolute
    local directory or a filesystem URI (``s3://...``, ``file://...``); None: off."""

    @classmethod
    def resolve(
        cls,
        *,
        analytic_prior: bool | None = None,
        loss_guard: bool | None = None,
        bank: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> StudySwitches:
        """The switches init records: each given value (``bank`` as text, ``off`` allowed), else
        its environment variable, else its default (module docstring)."""
        return cls(
            analytic_prior=_switch_from_environment(PRIOR_ENV, environ)
            if analytic_prior is None
            else analytic_prior,
            loss_guard=_switch_from_environment(LOSS_GUARD_ENV, environ)
            if loss_guard is None
            else loss_guard,
            bank=bank_from_environment(environ)
            if bank is None
            else parse_bank(bank, what="--bank"),
        )


def _switch_from_environment(name: str, environ: Mapping[str, str] | None) -> bool:
    text = _env(name, os.environ if environ is None else environ)
    return True if text is None else parse_switch(text, what=f"environment variable {name}")


def prior_from_environment(environ: Mapping[str, str] | None = None) -> bool:
    """``$INFRARSI_PRIOR`` (on when unset): the analytic prior's default outside a study."""
    return _switch_from_environment(PRIOR_ENV, environ)


__all__ = [
    "DEFAULT_BANK",
    "OFF_WORDS",
    "ON_WORDS",
    "StudySwitches",
    "bank_from_environment",
    "is_off",
    "parse_bank",
    "parse_switch",
    "prior_from_environment",
]
