"""Tensor-parallel state and collectives (world size 1 until worker processes exist)."""
