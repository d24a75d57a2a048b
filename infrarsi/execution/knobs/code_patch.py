"""The ``code_patch`` knob: a code patch as one more searchable choice.

A search space may hold::

    - name: code_patch
      type: choice
      values: [none, rope_complex, moe_batched_experts, rope_complex+moe_batched_experts]

A value is ``none``, a patch name (``workloads/patches/<name>.diff`` of the workload's
repository), or a patch set ``a+b`` applied in that order in one worktree. This module is only the
knob's registration: the handler records the value (``TrialBuild.runtime["code_patch"]``), since
the patch acts on the CODE, not on the DeepSpeed config. Everything else lives in
``infrarsi.patches``: the values and init's checks (``infrarsi.patches.knob``), and the patched
worktree a trial runs in (``infrarsi.patches.checkout``, used by the study executor and
``infrarsi trial``); a set that does not apply together is refused at ``init``, and logged
``failed`` with ``extra.patch_conflict`` before any rank starts if it reaches the executor.
"""

from __future__ import annotations

from typing import Any

from infrarsi.execution.knobs.registry import KnobContext, TrialBuild, checked_by, register_knob
from infrarsi.patches.knob import NO_PATCH, PATCH_KNOB, SET_SEP, check_patch_name


@register_knob(
    PATCH_KNOB,
    default=NO_PATCH,
    values=checked_by(
        check_patch_name, f"{NO_PATCH}, a patch name, or distinct names joined by {SET_SEP}"
    ),
)
def code_patch(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """The code patch the trial runs with: ``none``, a patch name, or a set ``a+b`` applied in order.

    Name ``N`` is ``workloads/patches/N.diff``. Record-only: sets runtime ``code_patch``; the study
    executor (and ``infrarsi trial``, through ``patched_code``) runs the trial in a patched git
    worktree. A set that does not apply together is refused at ``init``, and failed without a
    trial if it reaches the executor (docs/PATCHES.md). No DeepSpeed key (the code, not the config)."""
    build.runtime[PATCH_KNOB] = check_patch_name(value)


__all__ = ["code_patch"]
