"""Benchmarks of infrarsi (search efficiency, reproduction); runnable as scripts or modules."""
