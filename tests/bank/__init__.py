"""Tests of the matching package."""
