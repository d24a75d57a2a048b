"""Tests of ``infrarsi.search.priors``, one file per module."""
