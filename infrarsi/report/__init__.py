"""The study report: data gathering, figures, and Markdown/HTML rendering.

The stage entry point is ``infrarsi.stages.report.write_report(study_dir, pdf=False)``.
"""
