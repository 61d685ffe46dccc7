#!/usr/bin/env python3
"""Writes the chart's schema of `coordinator.settings` from the coordinator's settings model.

values.schema.json then refuses an unknown key (a typo) or an out-of-range value at
`helm install`/`helm template`, naming it, instead of the pod failing at start-up. The
fragment is derived from CoordinatorSettings (names, types, enums, bounds, descriptions);
tests/unit/deploy/test_chart_values.py fails when the checked-in schema drifts from it.

Run from the repository root: `PYTHONPATH=. python scripts/chart_config_schema.py`
(`--check` only reports whether the schema is current).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from coordinator.settings import CoordinatorSettings
from protocol.compression import COMPRESSORS
from protocol.messages import IDENTIFIER_PATTERN

SCHEMA = Path(__file__).resolve().parents[1] / "helm" / "edgefl-coordinator" / "values.schema.json"
KEPT = ("type", "enum", "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "description")
"""What the chart's schema keeps of pydantic's (titles, defaults and formats say nothing to Helm)."""

EXTRA: dict[str, dict[str, Any]] = {
    # Rules the model checks in validators rather than in field constraints.
    "client_id": {"pattern": IDENTIFIER_PATTERN},
    "federation": {"pattern": IDENTIFIER_PATTERN},
    # none, or a registered compressor: KIND, or KIND:NUMBER for one that takes an argument (topk:F).
    "compression": {"pattern": "^(" + "|".join(["none", *(e.name + (r":[0-9.eE+-]+" if e.value.argument else "")
                                                          for e in COMPRESSORS)]) + ")$"},
}
"""Constraints added on top of the model's field constraints, each mirroring a field validator."""

ONE_OF: dict[str, list[dict[str, Any]]] = {
    # 0 (no chunking) or at least 4096 (CoordinatorSettings._consistent).
    "max_message_bytes": [{"const": 0}, {"minimum": 4096}],
}


def _field(schema: dict[str, Any]) -> dict[str, Any]:
    """One setting: pydantic's `anyOf: [X, null]` becomes X with type [X's type, "null"]."""
    description = schema.get("description")
    options = schema.get("anyOf", [schema])
    types: list[str] = []
    out: dict[str, Any] = {}
    for option in options:
        types.append(option["type"])
        out.update({k: v for k, v in option.items() if k in KEPT and k not in ("type", "description")})
    out = {"type": types[0] if len(types) == 1 else types, **out}
    if description:
        out["description"] = description
    return out


def config_schema() -> dict[str, Any]:
    """The schema of coordinator.settings: every setting of `coordinator run`, nothing else."""
    model = CoordinatorSettings.model_json_schema()
    properties: dict[str, Any] = {}
    for name, schema in model["properties"].items():
        field = _field(schema)
        field.update(EXTRA.get(name, {}))
        if name in ONE_OF:
            field["anyOf"] = ONE_OF[name]
        properties[name] = dict(sorted(field.items(), key=lambda item: KEPT.index(item[0]) if item[0] in KEPT else 99))
    return {
        "type": "object",
        "description": ("Settings of `coordinator run` (snake_case, as in its --config YAML); generated from "
                        "CoordinatorSettings by scripts/chart_config_schema.py."),
        "properties": properties,
        "additionalProperties": False,
    }


def with_config_schema(values_schema: dict[str, Any]) -> dict[str, Any]:
    """values.schema.json with coordinator.settings replaced by the generated fragment (key order kept)."""
    updated = json.loads(json.dumps(values_schema))
    updated["properties"]["coordinator"]["properties"]["config"] = config_schema()
    return updated


def main(argv: list[str]) -> int:
    current = json.loads(SCHEMA.read_text())
    wanted = with_config_schema(current)
    if "--check" in argv:
        if wanted != current:
            print(f"{SCHEMA} is stale: run PYTHONPATH=. python scripts/chart_config_schema.py", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(json.dumps(wanted, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote coordinator.settings's schema ({len(wanted['properties']['coordinator']['properties']['config']['properties'])} settings) into {SCHEMA}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
