"""The node's HTTP surface: JSON API under /api/v1, Prometheus /metrics."""
