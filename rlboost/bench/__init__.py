"""Benchmarks behind `rlboost bench ...`: each measures ours and its baseline in one run."""
