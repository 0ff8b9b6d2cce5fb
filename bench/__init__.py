"""Benchmarks: side-by-side throughput runs (not tests); each prints JSON to stdout."""
