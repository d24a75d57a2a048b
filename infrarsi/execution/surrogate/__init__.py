"""The simulated ``surrogate`` backend: ``model`` (analytic step time and memory) and ``backend`` (trials from it)."""
