"""Benchmarks through the real broker, with per-stage microbenchmarks."""
