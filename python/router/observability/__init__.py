"""Metrics, access log, SLOs, quantiles, the status page."""
