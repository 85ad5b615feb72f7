"""hetsync's benchmark suite: protocols side by side, against BSP and the physical limit.

``python -m hetsync.bench`` (console script ``hetsync-bench``) runs a matrix of protocols x
(data set, scenario) cells x seeds, each run a real ``horovodrun --mpi`` launch of
``python -m hetsync.bench.job``, interleaved so machine noise hits every protocol alike. The protocols
are every name registered in :data:`hetsync.protocols.WRAPPERS` (or ``--protocols``).

For each run: time to target accuracy, final test accuracy, steps/s, samples/s and the heterogeneity
efficiency E = measured samples/s / sum_i v_i, v_i being rank i's samples/s alone under the same
scenario (:mod:`hetsync.bench.efficiency`; E = 1 is the physical limit on dedicated cores, BSP's expected value is
n * min_i v_i / sum_i v_i); ratios against BSP from the same seed and scenario; medians and
min-max spread over seeds (:mod:`hetsync.bench.matrix`). Output: ``results.json``, Markdown tables
(:mod:`hetsync.bench.table`), PNG plots (:mod:`hetsync.bench.plots`), op microbenchmarks
(:mod:`hetsync.bench.micro`) and the documentation pages written from results (:mod:`hetsync.bench.docpages`).

Modules are imported lazily so that ``import hetsync.bench`` stays cheap.
"""
__all__ = []  # submodules: efficiency, matrix, micro, plots, docpages, solo, table (imported on use)
