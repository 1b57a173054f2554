"""Benchmarks: `python -m transformer.benchmark --config=... --suite=NAME`."""
