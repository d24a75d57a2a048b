"""The training jobs infrarsi tunes: hand-written model code (``models/``), the synthetic data
source (``data.py``) and test-only cheat variants (``cheats.py``).

This package is imported by the trial harness from the trial's code directory, so code patches
can edit it. Modules inside it use relative imports only, so a second, untouched copy can be
loaded under another name as the reference model for the eval check.
"""
