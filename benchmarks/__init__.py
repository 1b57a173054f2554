"""Benchmarks: `python -m benchmarks --config=... --suite=NAME`."""
