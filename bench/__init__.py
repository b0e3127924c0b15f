"""Benchmarks of multigpu: throughput, cost and memory, side by side.

`python -m bench.lockstep` (`make bench`) is the main comparison of every
configuration; `python -m bench.<study>` answers one question each (the
cost studies through one paired runner, `bench.paired`). See
`docs/benchmarks.md` for how to read the results.
"""
