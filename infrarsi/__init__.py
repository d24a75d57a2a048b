"""infrarsi: makes distributed LLM training jobs faster, and proves it.

The package, from the bottom up:

- ``search``: the pure search core (no Ray): search spaces, the step-time and censored-memory
  models, the acquisition and the ask/tell ``Optimizer``.
- ``execution``: the Ray side: trial groups of worker actors training with DeepSpeed, memory
  capacity and measurement, the knob handlers (``execution.knobs``) and the simulated
  ``surrogate`` backend.
- ``study``: one study directory: its paths, the task contract, the Arrow trial log, the
  invariants, the experience bank.
- ``stages``: init, doctor, run, verify, report, apply, and ``tune`` (all of them).
- ``report``: the Markdown and HTML report.
- ``cli``: the ``infrarsi`` command line.
"""
