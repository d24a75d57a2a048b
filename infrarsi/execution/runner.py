"""``TrialRunner``: run one trial of a workload with a knob config and get its ``TrialResult``.

    from infrarsi.workload import Workload
    from infrarsi.execution.runner import TrialRunner

    wl = Workload.from_yaml("workloads/dense_debug.yaml")
    with TrialRunner(wl, memory_capacity_bytes=None) as runner:      # local Ray, or address=...
        res = runner.run({"zero_stage": 2, "micro_batch_size": 4}, trial_id="t0")

Before any trial it loads the workload's search space and checks that every knob has a handler
(``infrarsi.execution.knobs.registry.check_space``: a handler for every knob, accepting its
values); every config is validated against the space (unknown knob,
bad value, broken constraint -> ``SearchSpaceError``, exit code 2 in the CLI). Trials run on a
warm ``WorkerPool``; the peak FLOP/s of a device is probed once per runner. A ``backend:
surrogate`` workload is answered by ``infrarsi.execution.surrogate.backend`` without Ray.

Trials can run at once in different placement groups (``run(..., placement_group=pg)``, one
warm pool per placement group): the ``run`` stage's Ray Tune trials each reserve one and pass it
to the study executor, which runs them on its one runner.

Why one module: the runner is the one boundary between a trial's config and its row (checks, group,
spec, deadline, aggregation); the rank side is ``rank_loop``/``script_job``, the warm groups
``pool``, the aggregation ``aggregate``.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from infrarsi.errors import KnobError, TrialError
from infrarsi.execution.aggregate import aggregate
from infrarsi.execution.knobs.registry import check_space, process_env
from infrarsi.execution.rank_spec import LossGuard, RankSpec
from infrarsi.execution.worker import DEFAULT_ENTRY, SCRIPT_ENTRY
from infrarsi.result import Stage, TrialExtra, TrialResult
from infrarsi.search.space import SearchSpace
from infrarsi.structlog_config import get_logger
from infrarsi.workload import Workload

log = get_logger(__name__)


def init_ray(address: str | None = None, *, num_cpus: int | None = None) -> bool:
    """Connect to ``address`` (or ``RAY_ADDRESS``), or start a new local Ray. True if it started
    one. Without an address it never joins a Ray already running on this machine (a leftover
    one, or another user's), which ``ray.init()`` would do by default.

    Does nothing when Ray is already initialised in this process (a test fixture, a Tune actor).
    """
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
        return False
    ray.init(  # "local": a new Ray, never a running one found in /tmp/ray (ray.init's default)
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    return True


def default_timeout_s(workload: Workload, steps: int | None = None) -> float:
    """Trial deadline when none is given: 120 s of set-up plus 30 s per optimizer step (``steps``
    when the trial overrides the workload's ``warmup + measured``)."""
    return 120.0 + 30.0 * (
        steps if steps is not None else workload.steps.warmup + workload.steps.measured
    )


def default_code_dir(workload: Workload) -> str:
    """Where the job's code is imported from: ``model.code_dir`` for a user entry point, else the
    directory holding the built-in ``workloads`` package (next to the YAML's folder, else importable)."""
    job_dir = workload.job_code_dir()
    if job_dir is not None:
        return str(job_dir)
    if workload.path:
        folder = Path(workload.path).resolve().parent
        if folder.name == "workloads" and (folder / "__init__.py").exists():
            return str(folder.parent)
    spec = importlib.util.find_spec("workloads")
    if spec is not None and spec.submodule_search_locations:
        return str(Path(next(iter(spec.submodule_search_locations))).parent)
    return str(Path(__file__).resolve().parents[2])


def knob_env(config: dict[str, Any], workload: Workload) -> dict[str, str]:
    """Environment variables the rank processes of ``config`` need at start (see
    ``infrarsi.execution.knobs.registry.process_env``): a pure function of the knob values; the
    knob handlers themselves run once, on the ranks."""
    return process_env(config)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


class TrialRunner:
    """Runs trials of one workload on a warm Ray worker pool (or the surrogate backend)."""

    def __init__(
        self,
        workload: Workload,
        memory_capacity_bytes: int | None = None,
        address: str | None = None,
        code_dir: str | None = None,
        *,
        entry: str = DEFAULT_ENTRY,
        warm: bool = True,
        seed: int | None = None,
        peak_flops_per_s: float | None = None,
        check_knobs: bool = True,
        start_timeout_s: float = 180.0,
        space: Any = None,
        pin: bool = False,
    ) -> None:
        self.workload = workload
        """The workload every trial trains."""
        if memory_capacity_bytes is None:
            memory_capacity_bytes = workload.memory_capacity_bytes
        self.memory_capacity_bytes = memory_capacity_bytes
        """Per-device capacity enforced in the ranks (None: the device's own)."""
        self.address = address
        """Ray address (else ``RAY_ADDRESS``, else a local Ray)."""
        self.code_dir = code_dir or default_code_dir(workload)
        """Directory with the ``workloads`` package (a patched worktree for patch trials)."""
        self.entry = (
            SCRIPT_ENTRY if workload.script is not None and entry == DEFAULT_ENTRY else entry
        )
        """Function each rank calls (``module:function``; a script workload's: ``script_job``)."""
        self.warm = warm
        """Keep the worker group alive across trials."""
        self.seed = seed
        """Seed of model init passed to the ranks (None: the workload's data seed); the data order
        is always fixed by the workload's data seed."""
        self.start_timeout_s = start_timeout_s
        """How long a group start (placement group, actors, rendezvous) may take."""
        self._peak_flops = peak_flops_per_s
        self._peak_probed = peak_flops_per_s is not None
        self._owns_ray = False
        self._pools: dict[str, Any] = {}
        """Placement-group id ("" for the runner's own groups) -> its ``WorkerPool``."""
        self.pin = pin
        """Keep every trial of this runner on the same node(s): one placement group is reserved
        for the runner's life and every own group runs in it (``doctor`` and ``verify``: a
        baseline and its candidate are measured on the same machine, even after a group was
        recycled). False: each group reserves its own."""
        self._reservation: Any = None
        self._shipped: dict[str, tuple[Any, dict[str, Any]]] = {}
        """Code folder -> (its files' fingerprint, its package in the object store) (``_package``)."""
        self._lock = threading.Lock()
        """Guards ``_pools`` and the peak probe: trials in different placement groups may run at
        once from several threads (the study executor's concurrent Tune trials)."""
        self.space: SearchSpace = (
            space if space is not None else SearchSpace.from_yaml(workload.search_space_path())
        )
        """The ``SearchSpace`` configs are validated against: ``space`` if given (a study's frozen
        copy), else the workload's."""
        if workload.backend == "surrogate":
            importlib.import_module(
                "infrarsi.execution.surrogate.backend"
            )  # registers surrogate knobs
        if check_knobs:
            check_space(self.space, source=str(workload.search_space_path()))

    # ------------------------------------------------------------------ public
    def validate(self, config: dict[str, Any], *, where: str = "config") -> dict[str, Any]:
        """The full config (every knob, inactive ones at default) or a ``SearchSpaceError``."""
        return dict(self.space.validate(config, where=where))

    @property
    def pool(self) -> Any:
        """The warm ``WorkerPool`` of the runner's own groups (created, and Ray started, on first use)."""
        return self.pool_for(None)

    @property
    def live_groups(self) -> list[Any]:
        """The started trial groups of every pool (empty before the first trial)."""
        with self._lock:
            pools = list(self._pools.values())
        return [p.group for p in pools if p.group is not None]

    def pool_for(self, placement_group: Any) -> Any:
        """The warm ``WorkerPool`` whose groups run in ``placement_group`` (None: groups that
        reserve their own). Pools of placement groups Ray has removed (a finished Tune trial's)
        are closed on the way."""
        from infrarsi.execution.cluster import alive_nodes, require_slots
        from infrarsi.execution.group import GroupSpec
        from infrarsi.execution.pool import WorkerPool

        key = "" if placement_group is None else placement_group.id.hex()
        with self._lock:
            if key not in self._pools:
                self._owns_ray = init_ray(self.address) or self._owns_ray
                self._close_removed()
                base = GroupSpec.from_resources(self.workload.resources)
                if (
                    placement_group is None
                ):  # before the first trial: can the cluster hold one at all?
                    require_slots(
                        base, alive_nodes(), source=self.workload.path or self.workload.name
                    )
                    if self.pin:
                        placement_group = self._reservation = self._reserve(base)
                self._pools[key] = WorkerPool(
                    base,
                    start_timeout_s=self.start_timeout_s,
                    warm=self.warm,
                    placement_group=placement_group,
                )
            return self._pools[key]

    def _reserve(self, base: Any) -> Any:
        import ray
        from ray.util.placement_group import placement_group

        pg = placement_group(base.bundles(), strategy=base.strategy)
        try:
            ray.get(pg.ready(), timeout=self.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(pg)
            raise TrialError(
                f"{self.workload.path or self.workload.name}: could not reserve {base.bundles()} ({base.strategy}) "
                f"within {self.start_timeout_s:.0f}s; cluster resources available: {ray.available_resources()}. "
                f"Free resources (other jobs hold them) and run again."
            ) from None
        return pg

    def _close_removed(self) -> None:
        from ray.util import placement_group_table

        for key, pool in list(self._pools.items()):
            if key and placement_group_table(pool.placement_group).get("state") == "REMOVED":
                pool.close()
                del self._pools[key]

    @property
    def peak_flops_per_s(self) -> float | None:
        """Measured peak FLOP/s of one device (after the first trial; None if no probe)."""
        return self._peak_flops

    def run(
        self,
        config: dict[str, Any],
        *,
        trial_id: str,
        stage: Stage = "trial",
        patches: list[str] | tuple[str, ...] = (),
        timeout_s: float | None = None,
        code_dir: str | None = None,
        loss_guard: LossGuard | None = None,
        placement_group: Any = None,
        steps: int | None = None,
        checkpoint_step: int | None = None,
    ) -> TrialResult:
        """Run one trial; always returns a classified ``TrialResult`` (bad input raises).

        ``steps`` (the long check's horizon): train this many optimizer steps, warm-up included,
        instead of the workload's ``warmup + measured``. ``checkpoint_step`` (S, with ``steps``
        or without): a DeepSpeed checkpoint round trip at step S (``rank_loop``,
        ``checkpoint_trip``); the row's ``extra.checkpoint_round_trip`` reports it. Both None:
        the ordinary trial, unchanged.

        ``placement_group``: run the ranks in this reserved placement group (a Ray Tune trial's;
        its bundles are the workload's ``GroupSpec.bundles()``), keeping a warm group there for
        the next trial in it; None: the runner's own groups.

        ``loss_guard`` (a ``LossGuard``: the baseline's loss per step and the tolerance) stops training
        at the first step whose loss leaves the baseline's tolerance (``rank_loop``); the row
        then has ``extra.stopped_early`` and fewer steps than the contract's.
        """
        full = self.validate(config, where=f"trial {trial_id} config")
        if self.workload.script is not None:
            self.workload.script_layout()  # bad input raises: the script is a file inside the repository
        total = (
            steps
            if steps is not None
            else self.workload.steps.warmup + self.workload.steps.measured
        )
        if steps is not None and steps <= self.workload.steps.warmup:
            raise ValueError(
                f"trial {trial_id}: steps={steps} must exceed the workload's "
                f"{self.workload.steps.warmup} warm-up steps"
            )
        if checkpoint_step is not None and not 0 < checkpoint_step < total:
            raise ValueError(
                f"trial {trial_id}: checkpoint_step={checkpoint_step} must be between 1 and "
                f"{total - 1} (the trial trains {total} steps)"
            )
        if self.workload.backend == "surrogate":
            from infrarsi.execution.surrogate.backend import run_surrogate

            res = run_surrogate(
                self.workload,
                full,
                trial_id=trial_id,
                stage=stage,
                memory_capacity_bytes=self.memory_capacity_bytes,
                seed=self.seed or 0,
            )
            res.patches = list(patches)
            return res
        return self._run_real(
            full,
            trial_id=trial_id,
            stage=stage,
            patches=list(patches),
            timeout_s=timeout_s or default_timeout_s(self.workload, steps),
            code_dir=code_dir or self.code_dir,
            loss_guard=loss_guard,
            placement_group=placement_group,
            steps=steps,
            checkpoint_step=checkpoint_step,
        )

    def _run_real(
        self,
        config: dict[str, Any],
        *,
        trial_id: str,
        stage: Stage,
        patches: list[str],
        timeout_s: float,
        code_dir: str,
        loss_guard: LossGuard | None = None,
        placement_group: Any = None,
        steps: int | None = None,
        checkpoint_step: int | None = None,
    ) -> TrialResult:
        pool = self.pool_for(placement_group)
        started = time.time()
        t0 = time.perf_counter()
        try:
            group, warm = pool.acquire(env=knob_env(config, self.workload), code_dir=code_dir)
        except (TrialError, KnobError) as e:
            ended = time.time()
            return TrialResult(
                trial_id=trial_id,
                stage=stage,
                config=config,
                status="failed",
                error=str(e),
                patches=patches,
                world_size=self.workload.world_size,
                started_at=started,
                ended_at=ended,
            )
        acquire_s = time.perf_counter() - t0
        with self._lock:  # one probe per runner, even when the first trials start together
            if not self._peak_probed:
                self._peak_probed = True
                t_probe = time.time()
                try:
                    self._peak_flops = group.probe_peak_flops()
                except Exception as e:
                    log.warning("peak FLOP/s probe failed; mfu will be empty", error=str(e))
                started += time.time() - t_probe  # the one-off probe is not the trial's cost
        script, script_cwd = (
            self.workload.script_layout() if self.workload.script is not None else (None, ".")
        )  # the script and its working directory inside the trial's code
        data_path = self.workload.data_path()
        spec = RankSpec(
            workload=self.workload.to_yaml_dict(),
            config=config,
            trial_id=trial_id,
            memory_capacity_bytes=self.memory_capacity_bytes,
            code_dir=code_dir,
            peak_flops_per_s=self._peak_flops,
            reference_code_dir=self.code_dir,
            script=script,
            script_cwd=script_cwd,
            data_path=str(data_path) if data_path is not None else None,
            seed=self.seed,
            loss_guard=loss_guard,
            steps=int(steps) if steps is not None else None,
            checkpoint_step=int(checkpoint_step) if checkpoint_step is not None else None,
        )
        try:
            self._ship_code(group, spec)
            res = self._run_on(
                group,
                spec,
                config,
                trial_id=trial_id,
                stage=stage,
                patches=patches,
                timeout_s=timeout_s,
                started=started,
                warm=warm,
                acquire_s=acquire_s,
            )
        except Exception as e:  # a harness bug or a Ray error: the trial failed, the group goes
            log.exception("trial harness error", trial_id=trial_id)
            pool.release(group, "failed")
            ended = time.time()
            return TrialResult(
                trial_id=trial_id,
                stage=stage,
                config=config,
                status="failed",
                error=f"trial harness error: {type(e).__name__}: {e}",
                patches=patches,
                world_size=group.spec.world_size,
                started_at=started,
                ended_at=ended,
                device_seconds=group.spec.devices * (ended - started),
            )
        except BaseException:  # KeyboardInterrupt: release everything, then stop
            pool.release(group, "failed")
            raise
        pool.release(group, res.status, leftover_bytes=res.extra.leftover_device_bytes)
        log.info(
            "trial done",
            trial_id=trial_id,
            status=res.status,
            step_time_s=res.step_time_s,
            peak_memory_bytes=res.peak_memory_bytes,
            warm=warm,
        )
        return res

    def _run_on(
        self,
        group: Any,
        spec: RankSpec,
        config: dict[str, Any],
        *,
        trial_id: str,
        stage: Stage,
        patches: list[str],
        timeout_s: float,
        started: float,
        warm: bool,
        acquire_s: float,
    ) -> TrialResult:
        run = group.run(spec.to_dict(), timeout_s=timeout_s, entry=self.entry)
        ended = time.time()
        hardware = {
            "device": group.spec.device,
            "world_size": group.spec.world_size,
            "devices": group.spec.devices,
            "cpus_per_worker": group.spec.cpus_per_worker,
            "hosts": sorted({i["hostname"] for i in group.infos}),
            "peak_flops_per_s": self._peak_flops,
            "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch": _version("torch"),
            "deepspeed": _version("deepspeed"),
            "ray": _version("ray"),
        }
        extra = TrialExtra(
            warm=warm,
            acquire_s=acquire_s,
            group_start_s=group.start_time_s if not warm else 0.0,
            trial_wall_s=run.wall_s,
            pids=group.pids,
            actor_ids=group.actor_ids,
            placement_group_id=group.placement_group_id,
            node_ids=group.node_ids,
            cpu_pinned=group.cpu_pinned,
            cpu_pin_note=group.cpu_pin_note,
            group_trials_run=group.trials_run,
            memory_capacity_bytes=self.memory_capacity_bytes,
            code_shipped=spec.code_package is not None,
            code_digest=spec.code_package["digest"] if spec.code_package is not None else None,
        )
        return aggregate(
            run.rank_results,
            timed_out=run.timed_out,
            trial_id=trial_id,
            stage=stage,
            config=config,
            patches=patches,
            world_size=group.spec.world_size,
            nodes=len(set(group.node_ids)) or 1,
            devices=group.spec.devices,
            started_at=started,
            ended_at=ended,
            peak_flops_per_s=self._peak_flops,
            hardware=hardware,
            extra=extra,
        )

    def _ship_code(self, group: Any, spec: RankSpec) -> None:
        """When a rank runs on another node than this process, add the trial's code folder and
        its reference's as packages (``infrarsi.execution.code_package``; the ranks unpack them on
        their node and import from there). On one node the folders are read where they are."""
        import ray

        here = ray.get_runtime_context().get_node_id()
        if all(n == here for n in group.node_ids):
            return
        spec.code_package = self._package(spec.code_dir)
        spec.reference_code_package = self._package(spec.reference_code_dir or spec.code_dir)

    def _package(self, folder: str) -> dict[str, Any]:
        """``{"digest", "ref", "source"}`` of ``folder``'s code in the object store, repacked
        only when its files changed (the built-in families ship their ``workloads`` package only)."""
        import ray

        from infrarsi.execution.code_package import fingerprint, list_files, pack

        include = ("workloads",) if self.workload.job_code_dir() is None else ()
        root = Path(folder).resolve()
        stamp = fingerprint(root, list_files(root, include))
        with self._lock:
            hit = self._shipped.get(str(root))
            if hit is None or hit[0] != stamp:
                pkg = pack(root, include)
                hit = (
                    stamp,
                    {"digest": pkg.digest, "ref": ray.put(pkg.data), "source": pkg.source},
                )
                self._shipped[str(root)] = hit
            return dict(hit[1])

    def close(self) -> None:
        """Release every actor and placement group; stop Ray if this runner started it."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
        if self._reservation is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self._reservation)
            except Exception as e:  # the cluster is gone already
                log.debug("remove reservation failed", error=str(e))
            self._reservation = None
        if self._owns_ray:
            import ray

            ray.shutdown()
            self._owns_ray = False

    def __enter__(self) -> TrialRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
