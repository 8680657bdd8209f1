"""Benchmarks, one layer above the library: `harness` (the machine record, results writing, emulated CPUs) used by
every benchmark, and the benchmarks by kind: `micro` (one component), `system` (the program end to end), `learning`
(returns and time to target), `peers` (other systems measured beside this one). Results go to `results/bench/`."""
