"""Tensor operations of the sampler: penalties, and top-k / top-p / min-p filtering."""
