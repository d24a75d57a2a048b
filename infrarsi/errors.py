"""The typed error hierarchy of infrarsi.

Every error raised on bad user input is an ``InfrarsiError`` subclass whose message names the
file, the field, the rule, the value and the fix. The CLI maps ``UserInputError`` subclasses to
exit code 2 and everything else to exit code 1.
"""

from __future__ import annotations


class InfrarsiError(Exception):
    """Base class of every error infrarsi raises on purpose."""


class UserInputError(InfrarsiError):
    """Bad input from the user (a file, a flag, a value). The CLI exits with code 2."""


class SearchSpaceError(UserInputError):
    """A search-space YAML (or a config checked against it) breaks a rule."""


class ExpressionError(SearchSpaceError):
    """A ``when`` or ``constraints`` expression is outside the safe grammar."""


class ExpressionEvaluationError(ExpressionError):
    """A ``when`` or ``constraints`` expression could not be evaluated for one config (a type
    mismatch, a division by zero...). ``cause`` is the underlying exception's class."""

    def __init__(self, message: str, cause: type[BaseException] = Exception) -> None:
        super().__init__(message)
        self.cause = cause


class WorkloadError(UserInputError):
    """A workload YAML breaks a rule (missing field, bad value, indivisible batch...)."""


class JobError(WorkloadError):
    """A workload's training job (``model.entry_point``) cannot be imported, called or used."""


class KnobError(UserInputError):
    """A knob is unknown, has no registered handler, or got a value it cannot apply."""


class ContractError(UserInputError):
    """The task contract is missing, malformed, or its hash no longer matches."""


class ConfigError(UserInputError):
    """A CLI flag or option value is malformed (a size, a duration, a ``--set k=v``)."""


class PatchError(UserInputError):
    """A code patch touches paths outside the contract's editable scope, or does not apply."""


class PatchConflictError(PatchError):
    """The patches of a patch set each apply to the base commit, but not together."""


class ApplyError(UserInputError):
    """``apply`` refused: protected branch, dirty tree, existing branch..."""


class ClusterError(UserInputError):
    """The Ray cluster cannot hold one trial of the contract's workload (devices, CPUs, nodes)."""


class NotAStudyError(UserInputError):
    """A directory given as a study is not one: it does not exist, or holds no ``contract.yaml``."""


class ProposalError(UserInputError):
    """A proposal (``infrarsi propose``, the MCP server's ``propose``) breaks the contract: an
    unknown knob or value, a knob outside the editable scope, a patch that touches forbidden paths."""


class StudyLockedError(UserInputError):
    """Another live process holds the study (or its proposal queue): one writer at a time.
    ``holder`` is its ``infrarsi.study.lock.LockHolder``, ``path`` the lock file."""

    def __init__(self, message: str, *, holder: object = None, path: object = None) -> None:
        super().__init__(message)
        self.holder = holder
        self.path = path


class StudyError(InfrarsiError):
    """A study directory is missing something a stage needs (run the earlier stage first)."""


class TrialError(InfrarsiError):
    """A trial could not be started or its workers misbehaved (not a classified trial status)."""


class LogError(InfrarsiError):
    """The Arrow trial log cannot be written or read."""


__all__ = [
    "ApplyError",
    "ClusterError",
    "ConfigError",
    "ContractError",
    "ExpressionError",
    "ExpressionEvaluationError",
    "InfrarsiError",
    "KnobError",
    "LogError",
    "NotAStudyError",
    "PatchConflictError",
    "PatchError",
    "ProposalError",
    "SearchSpaceError",
    "StudyError",
    "StudyLockedError",
    "TrialError",
    "UserInputError",
    "WorkloadError",
]
