"""The stages a user runs, one entry point per file.

init, doctor, run, verify, long_check, report, apply, propose, and ``tune`` (all of them in
order); beside them the helpers only one stage uses (``doctor_analysis``, ``long_check_analysis``,
``init_script``, ``apply_script``). What the stages share (the executor, the optimizer factory)
is in ``infrarsi.orchestration``; the experience bank is ``infrarsi.bank``.
"""
