"""The tests of infrarsi, laid out like the package they test."""
