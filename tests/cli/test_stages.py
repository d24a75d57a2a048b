"""The stage commands' options: ``init`` records the switches and the memory capacity in the
contract (the environment is only the default), bad values exit 2 naming the option."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import yaml
from hypothesis import assume, given
from hypothesis import strategies as st
from malformed import PROPERTY, mutated, refused
from typer.testing import CliRunner

from infrarsi.cli import app
from infrarsi.errors import ConfigError, SearchSpaceError, UserInputError
from infrarsi.search import SearchSpace
from infrarsi.study.contract import Contract
from infrarsi.units import parse_duration, parse_size
from infrarsi.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
DENSE = str(ROOT / "workloads" / "dense_debug.yaml")
SURROGATE_SMALL = ROOT / "tests" / "fixtures" / "stages" / "surrogate_small.yaml"


def _invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env)


def test_init_records_the_switches_given(tmp_path: Path) -> None:
    study = tmp_path / "s"
    env = {
        "INFRARSI_PRIOR": "on",
        "INFRARSI_LOSS_GUARD": "on",
        "INFRARSI_BANK": str(tmp_path / "env-bank"),
    }
    res = _invoke(
        "init",
        DENSE,
        "--study",
        str(study),
        "--no-analytic-prior",
        "--no-loss-guard",
        "--bank",
        "off",
        "--memory-capacity",
        "160MiB",
        env=env,
    )
    assert res.exit_code == 0, res.output
    assert "160.00 MiB per device (--memory-capacity)" in res.output
    data = yaml.safe_load((study / "contract.yaml").read_text())
    assert data["switches"] == {"analytic_prior": False, "loss_guard": False, "bank": None}
    assert data["memory_capacity_bytes"] == 160 << 20
    assert stat.S_IMODE(study.stat().st_mode) == 0o700  # the study directory is the owner's alone


def test_init_takes_the_environment_as_default(tmp_path: Path) -> None:
    study = tmp_path / "s"
    env = {
        "INFRARSI_PRIOR": "off",
        "INFRARSI_LOSS_GUARD": "",
        "INFRARSI_BANK": str(tmp_path / "env-bank"),
    }
    res = _invoke("init", DENSE, "--study", str(study), env=env)
    assert res.exit_code == 0, res.output
    sw = Contract.load(study).switches
    assert sw is not None and (sw.analytic_prior, sw.loss_guard, sw.bank) == (
        False,
        True,
        str(tmp_path / "env-bank"),
    )
    assert "unlimited" in res.output  # dense_debug sets no capacity: said so, not hidden


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--bank", "s3://"], {}, "--bank"),
        ([], {"INFRARSI_PRIOR": "maybe"}, "INFRARSI_PRIOR"),
        ([], {"INFRARSI_LOSS_GUARD": "sometimes"}, "INFRARSI_LOSS_GUARD"),
    ],
)
def test_bad_switch_values_exit_2_and_name_them(
    tmp_path: Path, args: list[str], env: dict[str, str], needle: str
) -> None:
    res = _invoke("init", DENSE, "--study", str(tmp_path / "s"), *args, env=env)
    assert res.exit_code == 2, res.output
    assert needle in res.output
    assert not (tmp_path / "s" / "contract.yaml").exists()


# ------------------------------------------------------------ property-based: bad input exits 2
DENSE_SPACE = ROOT / "search_spaces" / "deepspeed_dense.yaml"
SPACE_RAW = yaml.safe_load(DENSE_SPACE.read_text())
KNOB_FIELDS = ["name", "type", "values", "range", "log", "memory", "when", "default", "grid"]
WORKLOAD_RAW = {**yaml.safe_load(Path(DENSE).read_text()), "search_space": str(DENSE_SPACE)}
WORKLOAD_SECTIONS = {
    "model": ["family", "size", "overrides", "entry_point"],
    "data": ["kind", "seq_len", "dtype"],
    "steps": ["warmup", "measured"],
    "resources": ["workers", "nodes", "device"],
    "baseline": ["zero_stage", "micro_batch_size"],
}


@PROPERTY
@given(raw=mutated(SPACE_RAW, {"knobs": KNOB_FIELDS}, list_key="knobs"))
def test_init_refuses_a_malformed_search_space_with_exit_2(raw: object, tmp_path: Path) -> None:
    space = tmp_path / "mutated_space.yaml"
    space.write_text(yaml.safe_dump(raw, sort_keys=False))
    try:
        SearchSpace.from_yaml(space)
    except SearchSpaceError:
        pass
    else:
        assume(False)  # the junk happened to be valid: init would run the whole preflight
    res = _invoke("init", DENSE, "--study", str(tmp_path / "s"), "--space", str(space))
    refused(res, str(space))
    assert not (tmp_path / "s" / "contract.yaml").exists()


@PROPERTY
@given(raw=mutated(WORKLOAD_RAW, WORKLOAD_SECTIONS))
def test_init_refuses_a_malformed_workload_with_exit_2(raw: object, tmp_path: Path) -> None:
    wl = tmp_path / "mutated_workload.yaml"
    wl.write_text(yaml.safe_dump(raw, sort_keys=False))
    try:
        Workload.from_yaml(wl).memory_capacity_bytes  # noqa: B018
    except UserInputError:
        pass
    else:
        assume(False)
    res = _invoke("init", str(wl), "--study", str(tmp_path / "s"))
    refused(res, str(wl))


def _not(parse, text: str) -> bool:
    try:
        parse(text)
    except (ConfigError, ValueError):
        return True
    return False


def _cli_size(text: str) -> int:
    """``parse_size`` as the CLI's flags call it: a unit is required."""
    return parse_size(text, unit_required=True)


BAD_OPTIONS = st.one_of(
    st.tuples(
        st.just("--trials"),
        st.one_of(st.integers(max_value=0).map(str), st.sampled_from(["many", "1.5", ""])),
    ),
    st.tuples(
        st.just("--device-hours"),
        st.one_of(st.floats(max_value=0).map(str), st.sampled_from(["nan", "inf", "x"])),
    ),
    st.tuples(
        st.just("--loss-tolerance"),
        st.one_of(
            st.floats(max_value=-1e-300).map(str), st.sampled_from(["nan", "inf", "-inf", "tight"])
        ),
    ),
    st.tuples(
        st.just("--memory-capacity"),
        st.text(max_size=10).filter(lambda t: t != "" and _not(_cli_size, t)),
    ),
    st.tuples(
        st.just("--time-budget"),
        st.text(max_size=10).filter(lambda t: t != "" and _not(parse_duration, t)),
    ),
    st.tuples(
        st.just("--editable"),
        st.one_of(
            st.sampled_from(["", " ", "/etc/**", "../**", "a/../../b", "C:\\x"]),
            st.text(max_size=8).map(lambda t: "/" + t),
        ),
    ),
    st.tuples(
        st.just("--knob"),
        st.from_regex(r"\A[a-z_]{1,12}\Z").filter(lambda k: k not in SPACE_RAW_NAMES),
    ),
)
SPACE_RAW_NAMES = {k["name"] for k in SPACE_RAW["knobs"]}


@PROPERTY
@given(option=BAD_OPTIONS)
def test_bad_init_options_exit_2_naming_the_option(option: tuple[str, str], tmp_path: Path) -> None:
    flag, value = option
    study = tmp_path / "s"
    res = _invoke("init", DENSE, "--study", str(study), f"{flag}={value}")
    refused(res, flag)
    assert not (study / "contract.yaml").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["doctor", "STUDY", "--repeats", "1"],
        ["verify", "STUDY", "--top-k", "0"],
        ["verify", "STUDY", "--pairs", "1"],
        ["verify", "STUDY", "--rounds", "0"],
        ["run", "STUDY", "--trials", "0"],
        ["run", "STUDY", "--seed", "-1"],
        ["tune", DENSE, "--study", "STUDY", "--trials", "-3"],
        ["tune", DENSE, "--study", "STUDY", "--top-k", "0"],
        ["tune", DENSE, "--study", "STUDY", "--loss-tolerance", "nan"],
        ["report", "STUDY"],
        ["init", DENSE, "--study", "FILE"],
        ["init", DENSE, "--study", "STUDY", "--long-check-budget", "-5s"],
    ],
)
def test_stage_options_out_of_range_exit_2_naming_them(args: list[str], tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    args = [
        {"STUDY": str(tmp_path / "none"), "FILE": str(tmp_path / "file")}.get(a, a) for a in args
    ]
    res = _invoke(*args)
    refused(res, next((a for a in args if a.startswith("--") and a != "--study"), str(tmp_path)))


@pytest.mark.parametrize("cmd", ["init", "tune"])
def test_a_size_without_a_unit_exits_2_with_the_fix(cmd: str, tmp_path: Path) -> None:
    study = tmp_path / "s"
    res = _invoke(cmd, DENSE, "--study", str(study), "--memory-capacity", "160")
    refused(res, "--memory-capacity", "'160'", "no unit", "160MiB", "160GB")
    assert not study.exists()


HOLD = """
import sys
from infrarsi.study.lock import hold_study
with hold_study(sys.argv[1], "run"):
    print("held", flush=True)
    sys.stdin.readline()
"""


@pytest.mark.parametrize("command", [["verify"], ["doctor"], ["report"], ["run", "--resume"]])
def test_a_writer_on_a_held_study_exits_2_naming_the_holder(
    tmp_path: Path, command: list[str]
) -> None:
    """Another process holds the study as ``run``: each stage that writes exits 2 before doing
    anything, naming the stage, host, pid and since when, and the fix; ``--wait 1s`` gives up
    after waiting; ``state`` (read-only) takes no lock and answers."""
    import os
    import socket
    import subprocess
    import sys

    from infrarsi.stages.init import init_stage

    study = tmp_path / "s"
    init_stage(SURROGATE_SMALL, study)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(study)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        res = _invoke(command[0], str(study), *command[1:])
        assert res.exit_code == 2, res.output
        out = " ".join(res.output.split())
        assert (
            "held by `run`" in out
            and f"host {socket.gethostname()}" in out
            and f"pid {proc.pid}" in out
        )
        assert "since" in out and "--wait" in out
        res = _invoke(command[0], str(study), *command[1:], "--wait", "1s")
        assert res.exit_code == 2 and "waited" in res.output, res.output
        res = _invoke("state", str(study), "--json")
        assert res.exit_code == 0, res.output
        held = json.loads(res.output)["held_by"]
        assert held["pid"] == proc.pid and held["stage"] == "run"
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert not list(study.glob("report.*")) and not (study / "doctor.json").exists()


def test_long_check_without_an_accepted_candidate_exits_2_naming_verify_json(
    tmp_path: Path,
) -> None:
    import json

    from infrarsi.stages.init import init_stage

    res = _invoke("long-check", str(tmp_path))
    refused(res, "contract.yaml")  # not a study
    study = tmp_path / "s"
    init_stage(SURROGATE_SMALL, study)
    res = _invoke("long-check", str(study))
    refused(res, "verify.json")
    (study / "verify.json").write_text(json.dumps({"best": None, "candidates": []}))
    res = _invoke("long-check", str(study))
    refused(res, "best")
    assert "accepted" in res.output


# ------------------------------------------------------------ tune takes every stage's options
TUNE_LEAVES_OUT = {"run": {"--resume"}, "long-check": {"--budget"}}
"""Stage options ``tune`` has no use for: it resumes a study by itself, and its long check's
budget is the contract's (``--long-check-budget`` at init)."""


def _options(name: str) -> set[str]:
    import typer

    cmd = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}


@pytest.mark.parametrize("stage", ["init", "doctor", "run", "verify", "long-check", "report"])
def test_tune_takes_every_option_of_the_stages_it_runs(stage: str) -> None:
    assert _options(stage) - _options("tune") == TUNE_LEAVES_OUT.get(stage, set())


RUN_OWN_DEFAULTS = {"--trials", "--time-budget"}
"""``run``'s own spelling of these: its default is the contract's, not a new study's."""


@pytest.mark.parametrize("stage", ["init", "doctor", "run", "verify", "long-check", "report"])
def test_tune_and_each_stage_share_one_definition_of_their_options(stage: str) -> None:
    """An option that a stage and ``tune`` both take comes from one definition (``SHARED_OPTIONS``):
    it reads the same in both helps."""
    import typer

    group = typer.main.get_command(app)

    def helps(name: str) -> dict[str, str | None]:
        return {p.opts[0]: p.help for p in group.commands[name].params if p.opts}  # type: ignore[attr-defined]

    mine, tune = helps(stage), helps("tune")
    both = (
        (set(mine) & set(tune))
        - {"--study", "--json", "--wait"}
        - (RUN_OWN_DEFAULTS if stage == "run" else set())
    )
    assert both and {o: mine[o] for o in both} == {o: tune[o] for o in both}


def test_tune_passes_the_stage_options_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import infrarsi.stages.tune as tune_mod

    seen: dict[str, object] = {}

    def fake_tune_stage(workload: object, study: object, **kw: object) -> dict:
        seen.update(kw, workload=workload, study=study)
        return {
            "run": {"baseline_step_time_s": 2.0},
            "verify": {"best": None, "candidates": []},
            "long_check": None,
            "report_html": str(tmp_path / "report.html"),
        }

    monkeypatch.setattr(tune_mod, "tune_stage", fake_tune_stage)
    res = _invoke(
        "tune",
        DENSE,
        "--study",
        str(tmp_path / "s"),
        "--space",
        str(DENSE_SPACE),
        "--knob",
        "zero_stage",
        "--knob",
        "micro_batch_size",
        "--editable",
        "workloads/**",
        "--device-hours",
        "2",
        "--repeats",
        "4",
        "--no-honest-change",
        "--pairs",
        "4",
        "--rounds",
        "3",
        "--top-k",
        "2",
        "--horizon-factor",
        "5",
        "--skip-checkpoint",
        "--pdf",
        "--json",
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["report_html"].endswith("report.html")
    assert seen["space"] == DENSE_SPACE and seen["editable_knobs"] == [
        "zero_stage",
        "micro_batch_size",
    ]
    assert seen["editable_globs"] == ["workloads/**"] and seen["device_hours"] == 2.0
    assert (seen["doctor_repeats"], seen["honest_change"]) == (4, False)
    assert (seen["pairs"], seen["rounds"], seen["top_k"]) == (4, 3, 2)
    assert (seen["horizon_factor"], seen["checkpoint"], seen["pdf"]) == (5.0, False, True)
    res = _invoke("tune", DENSE, "--study", str(tmp_path / "s"))  # the summary table instead
    assert res.exit_code == 0, res.output
    for row in (
        "baseline",
        "2.0000 s/step",
        "verified best",
        "long check",
        "report",
        "full log",
        str(Path("logs") / "infrarsi.jsonl"),
    ):
        assert row in res.stdout, row


# ------------------------------------------------------------ --json: one JSON object on stdout
def _fake_stages(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every stage function the commands call, answering at once (the commands' printing is
    under test here; the stages have their own tests)."""
    from types import SimpleNamespace

    import infrarsi.stages.apply as apply_mod
    import infrarsi.stages.doctor as doctor_mod
    import infrarsi.stages.long_check as long_mod
    import infrarsi.stages.report as report_mod
    import infrarsi.stages.run as run_mod
    import infrarsi.stages.verify as verify_mod
    from infrarsi.stages.apply import ApplyResult
    from infrarsi.stages.report import ReportPaths

    monkeypatch.setattr(
        doctor_mod, "doctor_stage", lambda *a, **k: SimpleNamespace(to_json=lambda: {"noise": 0.05})
    )
    monkeypatch.setattr(
        run_mod,
        "run_stage",
        lambda *a, **k: {
            "trials": 3,
            "statuses": {"ok": 3},
            "concurrency": 1,
            "best_step_time_s": 1.0,
            "baseline_step_time_s": 2.0,
            "raw_speedup": 2.0,
            "best_config": {"zero_stage": 1},
        },
    )
    monkeypatch.setattr(
        verify_mod, "verify_stage", lambda *a, **k: {"best": None, "candidates": []}
    )
    monkeypatch.setattr(long_mod, "accepted_candidate", lambda *a, **k: None)
    monkeypatch.setattr(
        long_mod,
        "long_check_stage",
        lambda *a, **k: SimpleNamespace(to_json=lambda: {"status": "passed"}),
    )
    monkeypatch.setattr(
        report_mod,
        "write_report",
        lambda *a, **k: ReportPaths(
            tmp_path / "report.md", tmp_path / "report.html", [tmp_path / "report_files" / "a.png"]
        ),
    )
    monkeypatch.setattr(
        apply_mod,
        "apply",
        lambda *a, **k: ApplyResult(
            "infrarsi/s-1", "a" * 40, "b" * 40, "infrarsi/golden/s", True, ["ds.json"]
        ),
    )


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["doctor", "STUDY"], "noise"),
        (["run", "STUDY"], "concurrency"),
        (["verify", "STUDY"], "candidates"),
        (["long-check", "STUDY"], "status"),
        (["report", "STUDY"], "html"),
        (["apply", "STUDY", "--repo", "REPO"], "branch"),
        (["state", "STUDY"], "trials"),
    ],
)
def test_json_prints_one_object_on_stdout(
    args: list[str], key: str, study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_stages(monkeypatch, tmp_path)
    args = [{"STUDY": str(study), "REPO": str(tmp_path)}.get(a, a) for a in args]
    res = _invoke(*args, "--json")
    assert res.exit_code == 0, res.output
    assert key in json.loads(res.stdout)


def test_init_space_takes_a_shipped_space_by_name(tmp_path: Path) -> None:
    res = _invoke(
        "init",
        DENSE,
        "--study",
        str(tmp_path / "s"),
        "--space",
        "builtin:deepspeed_dense",
        "--bank",
        "off",
        "--no-analytic-prior",
    )
    assert res.exit_code == 0, res.output
    copied = yaml.safe_load((tmp_path / "s" / "search_space.yaml").read_text())
    assert copied == yaml.safe_load(DENSE_SPACE.read_text())
    res = _invoke("init", DENSE, "--study", str(tmp_path / "s2"), "--space", "builtin:nope")
    assert res.exit_code == 2 and "builtin:deepspeed_dense" in res.output, res.output


def test_init_json_names_the_contract_and_its_switches(tmp_path: Path) -> None:
    res = _invoke(
        "init", str(SURROGATE_SMALL), "--study", str(tmp_path / "s"), "--bank", "off", "--json"
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["contract"].endswith("contract.yaml") and len(out["contract_hash"]) == 64
    assert out["switches"]["bank"] is None and "per device" in out["memory_capacity"]


@pytest.mark.parametrize(
    "command", ["init", "doctor", "run", "verify", "long-check", "report", "apply", "tune", "state"]
)
def test_every_stage_command_takes_json(command: str) -> None:
    assert "--json" in _options(command)


def test_the_environment_variables_show_in_the_help() -> None:
    for args, var in (
        (["init", "--help"], "INFRARSI_BANK"),
        (["init", "--help"], "INFRARSI_PRIOR"),
        (["tune", "--help"], "INFRARSI_LOSS_GUARD"),
        (["run", "--help"], "RAY_ADDRESS"),
        (["report", "--help"], "INFRARSI_CHROMIUM"),
        (["bank", "stats", "--help"], "INFRARSI_BANK"),
    ):
        res = _invoke(*args, env={"COLUMNS": "300"})
        assert res.exit_code == 0, res.output
        assert f"[env var: {var}]" in res.output, (args, var)


def test_init_script_writes_the_workload_of_the_launch_line_and_inits_from_it(
    tmp_path, monkeypatch
) -> None:
    for f in ("ds_train.py", "ds.json"):
        (tmp_path / f).write_text((ROOT / "examples" / "scripts" / f).read_text())
    monkeypatch.chdir(tmp_path)
    line = "deepspeed --num_gpus 2 ds_train.py --deepspeed --deepspeed_config ds.json --steps 1000"
    res = _invoke(
        "init",
        "--script",
        line,
        "--study",
        str(tmp_path / "s"),
        "--no-analytic-prior",
        "--bank",
        "off",
    )
    assert res.exit_code == 0, res.output
    assert (
        "workload written:" in res.output
        and "pinned at the baseline (cannot reach a script): optimizer_impl" in res.output
    )
    wl = Workload.from_yaml(tmp_path / "ds_train.infrarsi.yaml")
    assert (
        wl.script is not None
        and wl.script.args[-1] == "1000"
        and wl.baseline["micro_batch_size"] == 1
    )
    assert (
        yaml.safe_load((tmp_path / "s" / "contract.yaml").read_text())["workload"]["name"]
        == "ds_train_script"
    )
    for bad, says in (
        (line.replace("deepspeed --num_gpus 2", "accelerate launch"), "launcher 'accelerate'"),
        (line.replace("ds.json", "gone.json"), "cannot be read as JSON"),
        (line.replace("ds_train.py", "gone.py"), "not a file"),
    ):
        res = _invoke("init", "--script", bad, "--study", str(tmp_path / "s2"))
        assert res.exit_code == 2 and says in res.output, res.output
    res = _invoke("init", "--study", str(tmp_path / "s3"))
    assert res.exit_code == 2 and "exactly one" in res.output


def test_run_prints_the_config_to_verify_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import infrarsi.stages.run as run_mod

    choice = {
        "config": {"micro_batch_size": 4},
        "reason": "measured_faster_posterior_uncertain",
        "why": "fastest measured (median 2.45 s over 1 trial); the posterior prefers another",
    }
    summary = {
        "trials": 3,
        "statuses": {"ok": 3},
        "best_config": {"micro_batch_size": 4},
        "best_step_time_s": 2.45,
        "baseline_step_time_s": 3.0,
        "raw_speedup": 3.0 / 2.45,
        "choice": choice,
        "concurrency": 1,
    }
    monkeypatch.setattr(run_mod, "run_stage", lambda *a, **kw: summary)
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "contract.yaml").write_text("{}\n")  # a study, as far as the CLI checks
    res = _invoke("run", str(tmp_path / "s"))
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert "to verify" in flat and "measured_faster_posterior_uncertain" in flat
    assert "over 1 trial" in flat
    monkeypatch.setattr(run_mod, "run_stage", lambda *a, **kw: {**summary, "choice": None})
    res = _invoke("run", str(tmp_path / "s"))
    assert res.exit_code == 0 and "to verify" in res.output


@pytest.mark.parametrize("broken", [False, True])
def test_the_summary_names_the_choice_or_none_and_never_fails_the_stage(broken: bool) -> None:
    from infrarsi.search import BEST_REASONS, Optimizer, Outcome, SearchSpace
    from infrarsi.stages.run import best_choice_summary

    space = SearchSpace.from_yaml("name: t\nknobs:\n  - {name: a, type: int, values: [1, 2, 3]}\n")
    opt = Optimizer(space, memory_capacity=10.0, seed=0)
    assert best_choice_summary(opt) is None  # no ok trial yet
    for a, t in ((1, 2.0), (2, 1.5), (3, 1.8)):
        opt.tell({"a": a}, Outcome("ok", step_time=t, peak_memory=1.0))
    if broken:
        opt.best_choice = lambda: 1 / 0  # type: ignore[method-assign]
        assert best_choice_summary(opt) is None
        return
    s = best_choice_summary(opt)
    assert s is not None and s["reason"] in BEST_REASONS and s["config"] == opt.best()
    assert s["why"] and s["measured_median_s"] > 0
