"""Decoding: one loop, pluggable per-paradigm policies, pure logits helpers."""
