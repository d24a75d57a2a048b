"""Tests of ``infrarsi.search.models``, one file per module."""
