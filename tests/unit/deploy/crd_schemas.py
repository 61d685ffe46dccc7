"""JSON schemas for the two Prometheus Operator kinds the chart renders.

kubernetes-validate knows only built-in kinds. These cover the monitoring.coreos.com/v1
fields the chart uses, with the operator's types and duration format, and reject any other
field, so a typo in a template fails here instead of in the operator's admission webhook.
"""

from __future__ import annotations

from typing import Any

DURATION = {"type": "string",
            "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}


def _object(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required or [], "additionalProperties": False}


METADATA = {"type": "object", "required": ["name"],
            "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 253},
                           "namespace": {"type": "string"}, "labels": STRING_MAP, "annotations": STRING_MAP}}

SERVICE_MONITOR = _object({
    "apiVersion": {"const": "monitoring.coreos.com/v1"},
    "kind": {"const": "ServiceMonitor"},
    "metadata": METADATA,
    "spec": _object({
        "selector": _object({"matchLabels": STRING_MAP}, ["matchLabels"]),
        "namespaceSelector": _object({"matchNames": {"type": "array", "items": {"type": "string"}},
                                      "any": {"type": "boolean"}}),
        "endpoints": {"type": "array", "minItems": 1, "items": _object({
            "port": {"type": "string"}, "path": {"type": "string", "pattern": "^/"}, "interval": DURATION,
            "scrapeTimeout": DURATION, "scheme": {"enum": ["http", "https"]}})},
    }, ["selector", "endpoints"]),
}, ["apiVersion", "kind", "metadata", "spec"])

RULE = _object({
    "alert": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}, "record": {"type": "string"},
    "expr": {"type": "string", "minLength": 1}, "for": DURATION, "keep_firing_for": DURATION,
    "labels": STRING_MAP, "annotations": STRING_MAP,
}, ["expr"])

PROMETHEUS_RULE = _object({
    "apiVersion": {"const": "monitoring.coreos.com/v1"},
    "kind": {"const": "PrometheusRule"},
    "metadata": METADATA,
    "spec": _object({"groups": {"type": "array", "minItems": 1, "items": _object({
        "name": {"type": "string", "minLength": 1}, "interval": DURATION,
        "rules": {"type": "array", "minItems": 1, "items": RULE}}, ["name", "rules"])}}, ["groups"]),
}, ["apiVersion", "kind", "metadata", "spec"])

SCHEMAS = {("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
           ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE}
