"""The five stages: init, doctor, run, verify, report, apply (one file each), plus `tune`."""
