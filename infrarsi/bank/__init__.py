"""The experience bank, in one place: what past studies teach a new one.

``store`` is the bank itself (an Arrow dataset of studies' trials, ingest, query, stats);
``signatures`` the hardware and workload signatures its rows carry and transfer matches on;
``feed`` adds a study to the bank its contract names, stage by stage; ``transfer`` turns the
bank's rows into the search core's ``TransferPrior``. The ``infrarsi bank`` command is
``infrarsi.cli.bank``; the report's bank tables are ``infrarsi.report.bank_section``.
"""
