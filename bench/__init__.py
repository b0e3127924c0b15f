"""Benchmarks of multigpu: throughput and memory, side by side.

Run `python -m bench` (or `make bench`); `python -m bench --quick` is the
CI smoke run. See `docs/benchmarks.md` for how to read the results.
"""
