"""The report: Markdown + self-contained HTML, rendered in real headless Chromium."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import pytest
from synthetic_study import make_study

from infrarsi.errors import ContractError
from infrarsi.result import TrialExtra
from infrarsi.stages.report import find_chromium, write_report
from infrarsi.study.contract import CONTRACT_FILE

PROBE = """<script>
window.addEventListener('load', function () {
  var out = [];
  document.querySelectorAll('img').forEach(function (i) {
    out.push(i.alt + ':' + i.naturalWidth + 'x' + i.naturalHeight);
  });
  var p = document.createElement('pre');
  p.textContent = 'IMGPROBE[' + out.join(' ') + ']';
  document.body.appendChild(p);
});
</script></body>"""


def test_report_sections_and_files(tmp_path: Path) -> None:
    d = make_study(tmp_path, patches=[])
    out = write_report(d)
    md = out.markdown.read_text()
    for heading in (
        "Baseline vs verified best",
        "Past the trial's horizon (long check)",
        "The winning config, as a diff against the baseline",
        "Figures",
        "Every trial",
        "Device-seconds per status",
        "Appendix: noise and calibration (doctor)",
        "Audit",
        "How every figure was measured",
    ):
        assert f"## {heading}" in md
    assert (
        "3.03x, interval [2.9, 3.1] (75.0% interval (order statistics 1 and 3 of 3 pairs): "
        "it covers the true median 75.0% of the time); accepted: yes" in md
    )
    assert "| micro_batch_size | 1 | 8 |" in md
    for tid in ("doctor-0", "run-1", "verify-c2"):
        assert f"| {tid} |" in md
    assert "(>=, censored)" in md  # the OOM row
    assert (
        "Verdict: PASSED over 24 optimizer steps (a trial: 10" in md
    )  # the long check, with its curves
    assert len(out.figures) == 7 and all(p.stat().st_size > 1000 for p in out.figures)
    html = out.html.read_text()
    assert html.count("src='data:image/png;base64,") == 7
    assert not re.search(r"src=['\"](?!data:)", html), "the HTML must not load external files"


def test_unverified_best_is_labelled_and_edited_contract_refused(tmp_path: Path) -> None:
    d = make_study(tmp_path, verified=False)
    (d / "doctor.json").unlink()
    md = write_report(d).markdown.read_text()
    assert "NOT a verified win" in md and "accepted: NO" in md
    assert "doctor.json is missing" in md
    (d / CONTRACT_FILE).write_text(
        (d / CONTRACT_FILE).read_text().replace("request: make it faster", "request: other")
    )
    with pytest.raises(ContractError, match="request"):
        write_report(d)


def test_report_html_renders_its_images_in_chromium(tmp_path: Path) -> None:
    chrome = find_chromium()
    if chrome is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    out = write_report(make_study(tmp_path))
    probe = tmp_path / "probe.html"
    probe.write_text(out.html.read_text().replace("</body>", PROBE))
    with tempfile.TemporaryDirectory(prefix="infrarsi-chrome-") as prof:
        proc = subprocess.run(
            [
                chrome,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={prof}",
                "--virtual-time-budget=10000",
                "--dump-dom",
                probe.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    found = re.findall(r"IMGPROBE\[([^\]']*)\]", proc.stdout)  # the probe's output, not its source
    assert found, f"chromium did not run the probe (rc={proc.returncode}): {proc.stderr[-800:]}"
    sizes = dict(x.split(":") for x in found[-1].split())
    assert set(sizes) == {p.stem for p in out.figures}
    for name, wh in sizes.items():
        w, h = (int(v) for v in wh.split("x"))
        assert w > 200 and h > 200, f"image {name} did not decode in the browser ({wh})"


def test_pdf(tmp_path: Path) -> None:
    out = write_report(make_study(tmp_path), pdf=True)
    assert out.pdf is not None and out.pdf.read_bytes()[:5] == b"%PDF-"


def test_deepspeed_config_prefers_the_logged_one(tmp_path: Path) -> None:
    from synthetic_study import BEST, row

    from infrarsi.report.dsconfig import deepspeed_config
    from infrarsi.study.contract import Contract

    c = Contract.load(make_study(tmp_path))
    r = row(
        "run-9",
        "run",
        BEST,
        0.0,
        step=1.0,
        extra=TrialExtra(ds_config={"train_batch_size": 16, "x": 1}),
    )
    assert deepspeed_config(c, BEST, [r]) == {"train_batch_size": 16, "x": 1}
    built = deepspeed_config(c, BEST, [])
    assert built is not None and built["train_micro_batch_size_per_gpu"] == 8


def test_a_study_where_every_trial_ran_out_of_memory_says_so_and_names_the_savers(
    tmp_path: Path,
) -> None:
    """Every trial oom (the interrupted one aside): the report says so at the top, with the
    capacity, and names the search space's memory-saver knobs the contract keeps fixed (with
    the init command that allows them) and the allowed savers' most saving values, tried or not."""
    import time

    from synthetic_study import BASE, GIB, ROOT, row, write_rows

    from infrarsi.study.contract import Contract

    d = tmp_path / "study"
    Contract.create(
        ROOT / "workloads/dense_debug.yaml",
        study_dir=d,
        memory_capacity_bytes=GIB // 64,
        editable_knobs=["micro_batch_size", "zero_stage"],
    ).save(d)
    t = time.time() - 600
    cfgs = [BASE, {**BASE, "zero_stage": 2}, {**BASE, "micro_batch_size": 2}]
    trials = [
        row(f"run-{i}", "run", c, t + 20 * i, status="oom", mem=0.02 + 0.01 * i)
        for i, c in enumerate(cfgs)
    ]
    trials.append(
        row("run-3", "run", BASE, t + 80, status="failed", extra=TrialExtra(interrupted=True))
    )
    write_rows(d, trials)
    md = write_report(d).markdown.read_text()
    assert "Every trial ran out of memory: all 3 trials that ran ended 'oom'" in md
    assert "16.00 MiB per device (--memory-capacity)" in md
    fixed = md.split("does not allow yet: ")[1].split(".")[0].split(", ")
    assert set(fixed) == {"activation_checkpointing", "offload_optimizer", "offload_param"}
    assert "--knob micro_batch_size --knob zero_stage --knob activation_checkpointing" in md
    assert "zero_stage=3 (tried)" in md

    # one trial that fits: no such note
    write_rows(d, [row("run-4", "run", BASE, t + 100, step=2.0)], name="seg1")
    assert "Every trial ran out of memory" not in write_report(d).markdown.read_text()
