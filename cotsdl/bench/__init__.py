"""Benchmarks that print a table and JSON; each measures its peer or ceiling in the same run."""
