"""Throughput benchmarks (installed as sessionlog.bench; run as python -m benchmarks)."""
