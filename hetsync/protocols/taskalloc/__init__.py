"""Task allocation: per-rank workloads proportional to speed (static or self-adaptive). Modules:
``protocol`` (the protocol), ``allocation`` (the TF-free maths: shares, rounding, adaptation)."""
