"""Attention backends: each reads and writes the same paged KV cache layout (see abstract.py)."""
