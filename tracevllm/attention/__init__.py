"""Paged attention: the Attention layer models call, and the backends that compute it."""
