"""What a rank is asked to run: the typed spec of one trial on one rank (``RankSpec``).

The runner builds it, sends it to every rank of the trial's group as a dict (``to_dict``: Ray
pickles it; the code packages hold object refs), and the rank's entry (``rank_loop.run_rank``,
``script_job.run_script_rank``) reads it back with ``from_dict``; what comes back is a
``RankResult``. Both ends use the fields, so no key is spelled in two files.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LossGuard:
    """The early-stop rule of a trial: stop once a step's loss leaves the contract's per-step
    loss tolerance around the baseline's (the trial could no longer pass the loss invariant)."""

    reference: list[float]
    """The baseline's loss per optimizer step (the doctor's reference)."""
    atol: float = 0.0
    """Absolute tolerance, loss units."""
    rtol: float = 0.0
    """Relative tolerance, a fraction of the baseline's loss."""

    def trip(self, step: int, loss: float) -> str:
        """Why ``loss`` at optimizer ``step`` breaks the guard, or "" (a step past the reference,
        or a non-finite reference value, is never judged)."""
        if step >= len(self.reference) or not math.isfinite(float(self.reference[step])):
            return ""
        base = float(self.reference[step])
        tol = float(self.atol) + float(self.rtol) * abs(base)
        if abs(loss - base) <= tol:
            return ""
        return (
            f"loss guard: step {step} loss {loss:.6g} vs baseline {base:.6g} (|diff| "
            f"{abs(loss - base):.3g} > tolerance {tol:.3g}); training stopped there, the trial "
            f"cannot pass the loss invariant"
        )


@dataclass
class RankSpec:
    """One trial as every rank of its group receives it."""

    workload: dict[str, Any]
    """The workload as ``Workload.to_yaml_dict`` writes it (``Workload.from_dict`` reads it)."""
    config: dict[str, Any]
    """The trial's knob config, every knob of the space."""
    trial_id: str = ""
    """The trial's id (the rank reports it back)."""
    code_dir: str = ""
    """The folder the job's code is imported from (a patched worktree for a patched trial)."""
    reference_code_dir: str | None = None
    """The untouched code the eval check builds its reference model from (None: ``code_dir``)."""
    memory_capacity_bytes: int | None = None
    """The study's memory capacity per device, bytes (None: unlimited)."""
    peak_flops_per_s: float | None = None
    """The device's measured peak FLOP/s (None: the rank measures or leaves MFU empty)."""
    script: str | None = None
    """A script workload's script, relative to ``code_dir`` (None: an entry-point job)."""
    script_cwd: str = "."
    """A script's working directory, relative to ``code_dir``."""
    data_path: str | None = None
    """The workload's token file, resolved on the driver (None: synthetic or the job's data)."""
    seed: int | None = None
    """The trial's data and weight seed (None: the workload's ``data.seed``)."""
    loss_guard: LossGuard | None = None
    """The early-stop rule (None: train every step whatever the loss)."""
    steps: int | None = None
    """Optimizer steps to train, warm-up included (None: the workload's); the long check asks for
    more."""
    checkpoint_step: int | None = None
    """Save a DeepSpeed checkpoint after this optimizer step and round-trip it
    (``checkpoint_trip``; None: no round trip)."""
    code_package: dict[str, Any] | None = None
    """``code_dir`` shipped through the object store to ranks on other nodes (None: not shipped)."""
    reference_code_package: dict[str, Any] | None = None
    """``reference_code_dir`` shipped likewise."""

    def to_dict(self) -> dict[str, Any]:
        """The dict sent to the ranks: every field that is set (None fields left out)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            out[f.name] = dataclasses.asdict(value) if isinstance(value, LossGuard) else value
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RankSpec:
        """Inverse of ``to_dict``; ``TypeError`` naming a key this version does not know."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise TypeError(f"rank spec: unknown keys {unknown}; known: {sorted(known)}")
        data = dict(raw)
        guard = data.get("loss_guard")
        if isinstance(guard, Mapping):
            data["loss_guard"] = LossGuard(
                reference=[float(x) for x in guard.get("reference") or []],
                atol=float(guard.get("atol", 0.0)),
                rtol=float(guard.get("rtol", 0.0)),
            )
        return cls(**data)

    def steps_to_train(self, warmup: int, measured: int) -> int:
        """Optimizer steps the trial trains, warm-up included: ``steps`` when given (it must
        exceed ``warmup``), else ``warmup + measured``."""
        if self.steps is None:
            return int(warmup) + int(measured)
        if int(self.steps) <= int(warmup):
            raise ValueError(
                f"spec steps={self.steps}: must exceed the workload's {warmup} warm-up steps"
            )
        return int(self.steps)


__all__ = ["LossGuard", "RankSpec"]
