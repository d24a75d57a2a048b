"""What the stages share, apart from the stage entry points (``infrarsi.stages``).

The study executor that runs, checks and logs one trial (``executor``, ``trial_request``), the
study's optimizer built from its log (``optimizer_factory``), the space, baseline and budgets of a
study (``common``), and ``run``'s progress bar (``progress``). The experience bank the stages
feed and read is ``infrarsi.bank``.
"""
