"""The trial log's public reader, at its documented spelling ``infrarsi.log.read_trials(DIR)``.

The code is in ``infrarsi.study.trial_log``."""

from __future__ import annotations

from infrarsi.study.trial_log import TrialLogWriter, read_results, read_trials

__all__ = ["TrialLogWriter", "read_results", "read_trials"]
