"""Metrics and reports: Prometheus metrics, label-skew (KL) reports, federated evaluation figures."""
