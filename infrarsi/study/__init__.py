"""A study directory and what it holds: paths, the task contract, the trial log, invariants and the experience bank."""
