"""docs/protocol.md against the code: every message's field table matches its pydantic model, so the page cannot drift.

For each model in ``MESSAGE_TYPES`` and every nested map they hold: the same field names in the same order
(the order the encoder writes), the same required flags, nil where the model allows None and nowhere else,
the same defaults, and msgpack types that are those of the annotations. Also the page's BLAKE2b test vectors.
"""

from __future__ import annotations

import hashlib
import re
import types
import typing
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from protocol.messages import MESSAGE_TYPES
from protocol.wire_model import WireModel

from .spec_tables import DOC, NO_DEFAULT, Table, Type, message_tables, tables

ENVELOPE = ("v", "kind")
"""Checked by the codec before the model (``protocol/wire.py``): required on the wire, defaults in the model."""


def nested_models(model: type[BaseModel], seen: dict[str, type[BaseModel]] | None = None) -> dict[str, type[BaseModel]]:
    """Every wire model reachable from ``model``'s fields."""
    seen = {} if seen is None else seen
    for field in model.model_fields.values():
        for inner in _classes(field.annotation):
            if issubclass(inner, WireModel) and inner.__name__ not in seen:
                seen[inner.__name__] = inner
                nested_models(inner, seen)
    return seen


def _classes(annotation: Any) -> list[type]:
    """The classes an annotation mentions, through Annotated, unions, Literal, containers."""
    if isinstance(annotation, type) and typing.get_origin(annotation) is None:
        return [annotation]
    if typing.get_origin(annotation) is typing.Literal:
        return []
    return [c for arg in typing.get_args(annotation) for c in _classes(arg)]


MESSAGE_MODELS = frozenset(cls.__name__ for cls in MESSAGE_TYPES.values())
ALL_MODELS: dict[str, type[BaseModel]] = {cls.__name__: cls for cls in MESSAGE_TYPES.values()}
for _cls in list(ALL_MODELS.values()):
    nested_models(_cls, ALL_MODELS)


def wire_bases(annotation: Any) -> set[str]:
    """The msgpack base types a value of ``annotation`` travels as: atoms, ``map`` or ``array``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return wire_bases(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return set().union(*(wire_bases(a) for a in typing.get_args(annotation)))
    if origin is typing.Literal:
        return {"bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "str"
                for v in typing.get_args(annotation)}
    if origin is dict:
        return {"map"}
    if origin in (list, tuple):
        return {"array"}
    simple = {type(None): "nil", bool: "bool", int: "int", float: "float", str: "str", bytes: "bin",
              np.ndarray: "ext 1"}
    if annotation in simple:
        return {simple[annotation]}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {"map"}
    raise AssertionError(f"no wire type for {annotation!r}")


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def test_every_message_kind_and_every_nested_map_has_a_table() -> None:
    documented = tables()
    assert set(documented) == set(ALL_MODELS), (f"undocumented: {set(ALL_MODELS) - set(documented)}; "
                                               f"documented but not a model: {set(documented) - set(ALL_MODELS)}")
    by_kind = message_tables()
    assert set(by_kind) == set(MESSAGE_TYPES)
    for kind, cls in MESSAGE_TYPES.items():
        assert by_kind[kind].model == cls.__name__, f"the {kind} table names {by_kind[kind].model}"
        assert f'`"{kind}"`' in by_kind[kind].field("kind").constraints


@pytest.mark.parametrize("name", sorted(ALL_MODELS))
def test_a_table_lists_its_models_fields_in_order_with_their_flags_defaults_and_types(name: str) -> None:
    table: Table = tables()[name]
    model_fields: dict[str, FieldInfo] = ALL_MODELS[name].model_fields
    assert [f.name for f in table.fields] == list(model_fields), f"{name}: fields or their order differ"
    for spec in table.fields:
        field = model_fields[spec.name]
        where = f"{name}.{spec.name}"
        if spec.name in ENVELOPE and name in MESSAGE_MODELS:
            assert spec.required, f"{where}: the envelope fields are required on the wire"
        else:
            assert spec.required == field.is_required(), f"{where}: required is {field.is_required()} in the model"
        if not spec.required:
            assert spec.default is not NO_DEFAULT
            assert spec.default == _plain(field.get_default(call_default_factory=True)), f"{where}: default"
        allows_none = "nil" in wire_bases(field.annotation)
        assert spec.nullable == allows_none, f"{where}: nil is {'' if allows_none else 'not '}allowed by the model"
        documented = {t.base for t in spec.types}
        expected = wire_bases(field.annotation)
        assert documented == expected, f"{where}: the page says {sorted(documented)}, the model {sorted(expected)}"
        for t in spec.types:
            if t.model is not None:
                assert t.model in ALL_MODELS, f"{where}: map of unknown model {t.model}"


def test_a_nested_map_type_names_the_model_the_field_holds() -> None:
    for name, cls in ALL_MODELS.items():
        for spec in tables()[name].fields:
            named = {t.model for t in _walk(spec.types) if t.model is not None}
            held = {c.__name__ for c in _classes(cls.model_fields[spec.name].annotation) if issubclass(c, WireModel)}
            assert named == held, f"{name}.{spec.name}: the page names {named}, the model holds {held}"


def _walk(alternatives: tuple[Type, ...]) -> list[Type]:
    out = []
    for t in alternatives:
        out.append(t)
        if t.of is not None:
            out.extend(_walk(t.of))
    return out


def _hash_vectors() -> list[tuple[bytes, str, str]]:
    """(input, BLAKE2b digest length 16, first 16 bytes of BLAKE2b-512) from the page's test vector table."""
    text = DOC.read_text()
    section = text[text.index("**The hash.**"):text.index("**Shapes**")]
    rows = re.findall(r"^\| `([^`]*)`[^|]*\| `([0-9a-f]{32})` \| `([0-9a-f]{32})` \|$", section, re.M)
    return [(data.encode("ascii"), right, wrong) for data, right, wrong in rows]


def test_the_hash_is_blake2b_with_digest_length_16_as_the_pages_vectors_say() -> None:
    vectors = _hash_vectors()
    assert len(vectors) >= 2 and b"" in [v[0] for v in vectors]
    for data, right, wrong in vectors:
        assert hashlib.blake2b(data, digest_size=16).hexdigest() == right
        assert hashlib.blake2b(data).hexdigest()[:32] == wrong != right  # truncating BLAKE2b-512 is another hash
    from protocol.digest import digest_bytes
    from protocol.task_card import layout_fingerprint

    assert digest_bytes(b"abc") == hashlib.blake2b(b"abc", digest_size=16).hexdigest()
    assert layout_fingerprint({"w": ((3,), "<f4")}) == hashlib.blake2b(b"w:<f4:(3,);", digest_size=16).hexdigest()
