"""Serving metrics: per-iteration stats from the front end, logged and exported to Prometheus."""
