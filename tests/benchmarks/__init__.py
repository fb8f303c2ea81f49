"""Benchmarks: run with `nox -s bench` or `pytest tests/benchmarks -s`."""
