"""The main comparison: every configuration's throughput, in lockstep.

`python -m bench.lockstep` (`make bench`; `--quick` is CI's smoke run,
`make bench-quick`) trains each workload with plain Keras, `multi_gpu_model`'s
engines, MirroredStrategy by hand and the R package, each configuration in
a worker process of its own, one epoch at a time as the orchestrator grants
it, the order shuffled every round, and writes CSV files, Markdown and
plots. The modules:

* `cli`: the command line, the run and its outputs;
* `plan`: what a run measures (configurations, groups, rounds);
* `probe`: what this machine and this multigpu offer, in a throwaway process;
* `runner` and `protocol`: the orchestrator and its pipes to the workers;
* `worker`, `r_worker.R` and `timer`: a configuration's process (Python- or
  R-driven) and its epoch timer;
* `memory` and `stability`: peak memory and the CPUs' steadiness;
* `report`: the measurements as ratios, tables, targets and plots.
"""
