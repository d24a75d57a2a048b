"""The patch library: unified diffs of the built-in families' code, searched with the ``code_patch`` knob.

Each ``<name>.diff`` here is one patch (``code_patch: <name>``; several at once as ``a+b``), applied
to a git worktree of this repository for the trials that use it. ``tests/workloads/test_patches.py``
checks that each computes the same function as the committed code and that the shipped spaces'
patches and sets apply. This package holds no code: the file makes the folder a package so the
library has a documented home.
"""
