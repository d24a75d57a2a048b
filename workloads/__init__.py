"""The built-in training jobs infrarsi tunes: hand-written model code (``models/``), the entry
point the families stand for (``jobs.builtin_job``) and their code patches (``patches/``).

The wheel ships this package beside ``infrarsi`` (an installed infrarsi runs the built-in families
with nothing copied from the repository). It stays a top-level package of its own because the
trial harness imports it afresh from the trial's code directory, so code patches can edit it (a
patched git worktree of the repository). Modules inside it use relative imports only, so a second, untouched copy can be
loaded under another name as the reference model for the eval check.
"""
