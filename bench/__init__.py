"""Benchmarks run as scripts (``python -m bench.NAME``), results as JSON in bench/results."""
