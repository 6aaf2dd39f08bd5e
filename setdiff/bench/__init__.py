"""Benchmarks: commands that write measured figures to files (not tests)."""
