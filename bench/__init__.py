"""Benchmarks, one layer above the library: `harness` used by every benchmark (the machine record, results writing,
emulated CPUs, and what several kinds share: the training rows and settings, one training run and its evaluations,
runs in a process of their own, the learner's update timing), and the benchmarks by kind: `micro` (one component),
`system` (the program end to end), `learning` (returns and time to target), `peers` (other systems measured beside
this one). A benchmark imports the harness and modules of its own kind only. Results go to `results/bench/`."""
