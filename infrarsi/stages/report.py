"""Stage 5, ``report``: ``DIR/report.md`` and a self-contained ``DIR/report.html``.

Reads only the study directory (contract, doctor.json, trials/, verify.json), so it can be re-run
at any time. Figures are drawn with matplotlib (Agg), embedded in the HTML as base64 PNG data URIs
and written next to the Markdown under ``DIR/report_files/``. ``pdf=True`` also prints the HTML to
``DIR/report.pdf`` with headless Chromium (or, without Chromium, collects the figures into a PDF
with matplotlib).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from infrarsi.errors import ContractError
from infrarsi.report.build import build_sections
from infrarsi.report.data import load_study
from infrarsi.report.document import Figure, to_html, to_markdown
from infrarsi.study.paths import REPORT_FILES_DIR, StudyPaths, make_private_dir

FILES_DIR = REPORT_FILES_DIR
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


@dataclass
class ReportPaths:
    """What ``write_report`` wrote."""

    markdown: Path
    """``DIR/report.md``."""
    html: Path
    """``DIR/report.html`` (self-contained)."""
    figures: list[Path]
    """PNG files under ``DIR/report_files/``."""
    pdf: Path | None = None
    """``DIR/report.pdf`` when asked for."""


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome binary, or None (``INFRARSI_CHROMIUM`` overrides)."""
    env = os.environ.get("INFRARSI_CHROMIUM")
    if env:
        return env if Path(env).exists() else None
    for n in CHROMIUM_NAMES:
        p = shutil.which(n)
        if p:
            return p
    return None


def _write(path: Path, data: str | bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    if isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        tmp.write_text(data)
    os.replace(tmp, path)


def write_report(
    study_dir: str | Path, pdf: bool = False, *, wait_s: float | None = None
) -> ReportPaths:
    """Render the study's report, holding the study lock (a run or verify writing meanwhile would
    change what it reads; ``wait_s`` as in ``run_stage``); returns the paths written."""
    from infrarsi.study.lock import hold_study

    d = Path(study_dir)
    if not d.is_dir():
        raise ContractError(
            f"study directory {d} does not exist; run `infrarsi init WORKLOAD --study {d}` first."
        )
    with hold_study(d, "report", wait_s=wait_s):
        return _write_report(d, pdf)


def _write_report(d: Path, pdf: bool) -> ReportPaths:
    data = load_study(d)
    sections = build_sections(data)
    title = f"infrarsi report: {data.contract.study}"
    if data.simulated:
        title += " (SIMULATED)"
    files = StudyPaths(d).report_files
    make_private_dir(files)
    figs = []
    for s in sections:
        for b in s.blocks:
            if isinstance(b, Figure):
                p = files / f"{b.name}.png"
                _write(p, b.png)
                figs.append(p)
    md, html = StudyPaths(d).report_md, StudyPaths(d).report_html
    _write(md, to_markdown(title, sections, FILES_DIR))
    _write(html, to_html(title, sections))
    out = ReportPaths(markdown=md, html=html, figures=figs)
    if pdf:
        out.pdf = _pdf(html, d / "report.pdf", figs)
    return out


def _pdf(html: Path, dest: Path, figs: list[Path]) -> Path:
    chrome = find_chromium()
    if chrome:
        with tempfile.TemporaryDirectory(prefix="infrarsi-chrome-") as prof:
            cmd = [
                chrome,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={prof}",
                "--no-pdf-header-footer",
                f"--print-to-pdf={dest}",
                html.resolve().as_uri(),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode == 0 and dest.exists() and dest.stat().st_size > 0:
            return dest
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_pdf import PdfPages

    with PdfPages(dest) as pp:
        for f in figs:
            fig = plt.figure(figsize=(8.27, 5.8))
            ax = fig.add_axes((0, 0, 1, 1))
            ax.imshow(mpimg.imread(f))
            ax.axis("off")
            pp.savefig(fig)
            plt.close(fig)
    return dest


__all__ = ["ReportPaths", "find_chromium", "write_report"]
