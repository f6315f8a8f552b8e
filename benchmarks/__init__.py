"""Benchmarks: measured figures against baselines (not part of `make test`)."""
