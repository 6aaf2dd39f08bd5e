"""Decoding: one engine for one prompt or a batch, pluggable per-paradigm policies, pure logits
helpers."""
