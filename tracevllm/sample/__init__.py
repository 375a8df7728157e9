"""Sampling: logits of the rows that sample this step in, one token per row out."""
