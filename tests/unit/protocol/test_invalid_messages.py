"""Messages that decode as msgpack but break the schema or carry bad values raise ProtocolError."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from protocol.arrays import check_layout, layout_of
from protocol.codec import encode
from protocol.errors import Reason
from protocol.messages import AgentStatus, Chunk, GlobalState, Update
from protocol.task_card import layout_fingerprint
from protocol.version import SCHEMA_VERSION
from protocol.wire import decode_message, encode_message

from .malformed_cases import VALID_UPDATE, reason_of, update_dict
from .wire_strategies import sample_update

FUZZ = settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------- schema


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"round": "3"}, id="round-as-string"),
        pytest.param({"round": 3.0}, id="round-as-float"),
        pytest.param({"round": -1}, id="negative-round"),
        pytest.param({"round": 10_000_001}, id="round-too-large"),
        pytest.param({"num_samples": -1}, id="negative-samples"),
        pytest.param({"num_samples": True}, id="bool-as-int"),
        pytest.param({"agent_id": "bad/id"}, id="slash-in-id"),
        pytest.param({"agent_id": "a+"}, id="wildcard-in-id"),
        pytest.param({"agent_id": ""}, id="empty-id"),
        pytest.param({"agent_id": "a" * 65}, id="id-too-long"),
        pytest.param({"agent_id": "abc\n"}, id="trailing-newline-id"),
        pytest.param({"agent_id": b"agent-0"}, id="id-as-bytes"),
        pytest.param({"task": "sleep"}, id="unknown-task"),
        pytest.param({"base_digest": "XYZ"}, id="bad-digest"),
        pytest.param({"delta": {"w": [1.0, 2.0]}}, id="list-as-array"),
        pytest.param({"delta": [1.0]}, id="list-as-arrays"),
        pytest.param({"delta": {"w": 1.0}}, id="float-as-array"),
        pytest.param({"delta": {"a:<f4:(1,);b": np.ones(1, dtype="<f4")}}, id="colon-in-array-name"),
        pytest.param({"delta": {"[weights]": np.ones(1, dtype="<f4")}}, id="bracket-in-array-name"),
        pytest.param({"delta": {"w\n": np.ones(1, dtype="<f4")}}, id="control-character-in-array-name"),
        pytest.param({"delta": {"": np.ones(1, dtype="<f4")}}, id="empty-array-name"),
        pytest.param({"delta": {"w" * 257: np.ones(1, dtype="<f4")}}, id="array-name-too-long"),
        pytest.param({"metrics": 5}, id="metrics-as-int"),
        pytest.param({"metrics": {"steps": -1}}, id="negative-steps"),
        pytest.param({"metrics": {"train_accuracy": 1.5}}, id="accuracy-over-one"),
        pytest.param({"metrics": {"surprise": 1}}, id="unknown-metric"),
        pytest.param({"privacy": {"epsilon": 1.0, "delta": 1.0}}, id="delta-of-one"),
        pytest.param({"surprise": 1}, id="unknown-field"),
        pytest.param({"weights": {"w": np.ones(2, dtype="<f4")}}, id="weights-and-delta"),
        pytest.param({"task": "evaluate"}, id="evaluation-with-payload"),
        pytest.param({"prototypes": np.ones((2, 3), dtype="<f4")}, id="prototypes-without-counts"),
        pytest.param({"prototypes": np.ones((2, 3), dtype="<f4"), "prototype_counts": np.ones(2, dtype="<i8")},
                     id="prototypes-with-delta"),
        pytest.param({"delta": {}, "control_delta": {"w": np.ones(2, dtype="<f4")}}, id="control-delta-alone"),
        pytest.param({"delta": {}, "task": "evaluate", "control_delta": {"w": np.ones(2, dtype="<f4")}},
                     id="evaluation-with-control-delta"),
    ],
)
def test_wrong_field_types_and_values_are_schema_errors(overrides: dict[str, Any]) -> None:
    assert reason_of(lambda: decode_message(encode(update_dict(**overrides)))) is Reason.SCHEMA


def test_an_array_name_cannot_make_one_layout_fingerprint_as_another() -> None:
    """Why names may not hold ``:`` ``;`` ``[`` ``]``: the fingerprint's text has no length prefixes, so one array
    named ``a:<f4:(1,);b`` hashes as the two arrays ``a`` and ``b``, and would pass the layout check."""
    one = {"a:<f4:(1,);b": ((1,), "<f4")}
    two = {"a": ((1,), "<f4"), "b": ((1,), "<f4")}
    assert layout_fingerprint(one) == layout_fingerprint(two)
    honest = decode_message(encode(update_dict(delta={"a": np.ones(1, "<f4"), "b": np.ones(1, "<f4")})))
    assert isinstance(honest, Update) and list(honest.delta) == ["a", "b"]
    assert reason_of(lambda: decode_message(encode(update_dict(delta={"a:<f4:(1,);b": np.ones(1, "<f4")})))) is (
        Reason.SCHEMA)


@pytest.mark.parametrize("field", ["run_id", "agent_id", "round", "task", "family", "num_samples", "metrics",
                                   "base_digest"])
def test_missing_fields_are_schema_errors(field: str) -> None:
    data = update_dict()
    del data[field]
    assert reason_of(lambda: decode_message(encode(data))) is Reason.SCHEMA


@pytest.mark.parametrize("value", [None, 1, 1.5, "update", b"x", [1, 2], np.zeros(3)])
def test_top_level_must_be_a_map(value: Any) -> None:
    assert reason_of(lambda: decode_message(encode(value))) is Reason.SCHEMA


@pytest.mark.parametrize("version", [0, 2, -1, 2**40, "1", None, [1]])
def test_unsupported_schema_versions(version: Any) -> None:
    assert reason_of(lambda: decode_message(encode(update_dict(v=version)))) is Reason.UNSUPPORTED_VERSION


def test_missing_schema_version() -> None:
    data = update_dict()
    del data["v"]
    assert reason_of(lambda: decode_message(encode(data))) is Reason.UNSUPPORTED_VERSION


@pytest.mark.parametrize("kind", ["nope", "", "Update", 7, None, ["update"]])
def test_unknown_kinds_are_schema_errors(kind: Any) -> None:
    assert reason_of(lambda: decode_message(encode(update_dict(kind=kind)))) is Reason.SCHEMA


def test_schema_is_checked_after_the_version() -> None:
    assert reason_of(lambda: decode_message(encode({"v": SCHEMA_VERSION + 1, "kind": "nope"}))) is (
        Reason.UNSUPPORTED_VERSION
    )


@pytest.mark.parametrize("expect", [AgentStatus, GlobalState, Chunk])
def test_wrong_kind_when_another_is_expected(expect: type) -> None:
    assert reason_of(lambda: decode_message(VALID_UPDATE, expect=expect)) is Reason.WRONG_KIND
    assert isinstance(decode_message(VALID_UPDATE, expect=Update), Update)


# ---------------------------------------------------------------------------- values


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
@pytest.mark.parametrize("field", ["delta", "weights", "control_delta"])
def test_non_finite_arrays_are_rejected(bad: float, dtype: str, field: str) -> None:
    array = np.ones((2, 3), dtype=dtype)
    array[1, 2] = bad
    overrides: dict[str, Any] = {field: {"w": array}}
    if field == "weights":
        overrides["delta"] = {}
    assert reason_of(lambda: decode_message(encode(update_dict(**overrides)))) is Reason.NON_FINITE


def test_non_finite_prototypes_are_rejected() -> None:
    protos = np.ones((2, 3), dtype="<f4")
    protos[0, 0] = np.nan
    message = update_dict(prototypes=protos, prototype_counts=np.array([1, 2], dtype="<i8"), delta={})
    assert reason_of(lambda: decode_message(encode(message))) is Reason.NON_FINITE


def test_non_finite_global_weights_are_rejected() -> None:
    weights = {"w": np.array([1.0, np.inf], dtype="<f4")}
    message = {"v": 1, "kind": "global_state", "run_id": "r", "family": "f", "round": 0,
               "digest": GlobalState.compute_digest(weights, {}, None, None), "weights": weights}
    assert reason_of(lambda: decode_message(encode(message))) is Reason.NON_FINITE


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_metrics_are_rejected(bad: float) -> None:
    metrics = {"train_loss": bad}
    assert reason_of(lambda: decode_message(encode(update_dict(metrics=metrics)))) is Reason.NON_FINITE


def test_integer_arrays_have_no_finiteness_to_check() -> None:
    message = decode_message(encode(update_dict(delta={"n": np.array([2**63 - 1], dtype="<i8")})), expect=Update)
    assert message.delta["n"][0] == 2**63 - 1


@pytest.mark.parametrize(
    ("prototypes", "counts"),
    [
        pytest.param(np.ones(3, dtype="<f4"), np.ones(3, dtype="<i8"), id="1d-prototypes"),
        pytest.param(np.ones((2, 3, 1), dtype="<f4"), np.ones(2, dtype="<i8"), id="3d-prototypes"),
        pytest.param(np.ones((2, 3), dtype="<i4"), np.ones(2, dtype="<i8"), id="integer-prototypes"),
        pytest.param(np.ones((2, 3), dtype="<f4"), np.ones(3, dtype="<i8"), id="counts-too-long"),
        pytest.param(np.ones((2, 3), dtype="<f4"), np.ones((2, 1), dtype="<i8"), id="counts-2d"),
        pytest.param(np.ones((2, 3), dtype="<f4"), np.ones(2, dtype="<f4"), id="float-counts"),
        pytest.param(np.ones((2, 3), dtype="<f4"), np.array([1, -1], dtype="<i8"), id="negative-count"),
    ],
)
def test_prototypes_of_the_wrong_shape_are_bad_shape(prototypes: np.ndarray, counts: np.ndarray) -> None:
    message = update_dict(prototypes=prototypes, prototype_counts=counts, delta={})
    assert reason_of(lambda: decode_message(encode(message))) is Reason.BAD_SHAPE


LAYOUT = layout_of(sample_update().delta)


@pytest.mark.parametrize(
    "delta",
    [
        pytest.param({"conv.weight": np.zeros((3, 2, 2), "<f4"), "conv.bias": np.zeros(3, "<f4")}, id="missing"),
        pytest.param({**sample_update().delta, "extra": np.zeros(1, "<f4")}, id="extra"),
        pytest.param({**sample_update().delta, "conv.bias": np.zeros(4, "<f4")}, id="longer"),
        pytest.param({**sample_update().delta, "conv.bias": np.zeros((3, 1), "<f4")}, id="reshaped"),
        pytest.param({**sample_update().delta, "conv.weight": np.zeros((2, 3, 2), "<f4")}, id="permuted"),
        pytest.param({**sample_update().delta, "conv.bias": np.zeros(3, "<f8")}, id="wider-dtype"),
        pytest.param({**sample_update().delta, "steps": np.array([7], "<i8")}, id="0d-as-1d"),
        pytest.param({**sample_update().delta, "steps": np.array(7, "<i4")}, id="narrower-int"),
    ],
)
def test_layout_mismatch_after_decoding_is_bad_shape(delta: dict[str, np.ndarray]) -> None:
    message = decode_message(encode_message(sample_update(delta=delta)), expect=Update)
    assert reason_of(lambda: check_layout(message.delta, LAYOUT, "delta")) is Reason.BAD_SHAPE


def test_matching_layout_passes() -> None:
    message = decode_message(VALID_UPDATE, expect=Update)
    check_layout(message.delta, LAYOUT, "delta")


def _global_state_dict() -> dict[str, Any]:
    weights = {"w": np.arange(6, dtype="<f4").reshape(2, 3), "n": np.array(3, dtype="<i8")}
    digest = GlobalState.compute_digest(weights, {}, None, None)
    return GlobalState(run_id="run", family="cnn", round=4, digest=digest, weights=weights).model_dump()


def test_global_state_with_a_wrong_digest() -> None:
    data = _global_state_dict()
    assert isinstance(decode_message(encode(data), expect=GlobalState), GlobalState)
    wrong = {**data, "digest": "f" * 32 if data["digest"] != "f" * 32 else "e" * 32}
    assert reason_of(lambda: decode_message(encode(wrong))) is Reason.DIGEST_MISMATCH


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda d: {**d, "weights": {**d["weights"], "w": d["weights"]["w"] + 1}}, id="value"),
        pytest.param(lambda d: {**d, "weights": {**d["weights"], "w": d["weights"]["w"].reshape(3, 2)}}, id="shape"),
        pytest.param(lambda d: {**d, "weights": {**d["weights"], "w": d["weights"]["w"].astype("<f8")}}, id="dtype"),
        pytest.param(lambda d: {**d, "weights": {"v": d["weights"]["w"], "n": d["weights"]["n"]}}, id="name"),
        pytest.param(lambda d: {**d, "weights": {"n": d["weights"]["n"], "w": d["weights"]["w"]}}, id="order"),
        pytest.param(lambda d: {**d, "control": {"w": d["weights"]["w"]}}, id="control"),
        pytest.param(lambda d: {**d, "weights": {}, "control": d["weights"]}, id="group"),
    ],
)
def test_global_state_with_tampered_content(tamper: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    assert reason_of(lambda: decode_message(encode(tamper(_global_state_dict())))) is Reason.DIGEST_MISMATCH


# ---------------------------------------------------------------------------- agent label histograms


def _status_dict(num_samples: int = 6, **overrides: Any) -> dict[str, Any]:
    return {"v": SCHEMA_VERSION, "kind": "agent_status", "agent_id": "a0", "state": "online", "device": "rpi",
            "family": "cnn", "num_samples": num_samples, "num_eval_samples": 2, "version": "t", "timestamp": 1.0,
            "task_ref": {"name": "digits", "version": "1"}, "layout": "0" * 32, **overrides}


@pytest.mark.parametrize("dtype", ["<i8", "<i4", "|u1", "<u8"])
def test_a_label_histogram_summing_to_the_sample_count_passes(dtype: str) -> None:
    message = decode_message(encode(_status_dict(label_counts=np.array([1, 0, 5], dtype=dtype))), expect=AgentStatus)
    assert message.label_counts is not None and message.label_counts.tolist() == [1, 0, 5]
    assert decode_message(encode(_status_dict()), expect=AgentStatus).label_counts is None  # optional


@pytest.mark.parametrize(
    ("counts", "num_samples", "reason"),
    [
        pytest.param(np.array([1, 2, 4], dtype="<i8"), 6, Reason.SCHEMA, id="sum-above"),
        pytest.param(np.array([1, 2, 2], dtype="<i8"), 6, Reason.SCHEMA, id="sum-below"),
        pytest.param(np.array([7, -1, 0], dtype="<i8"), 6, Reason.SCHEMA, id="negative"),
        pytest.param(np.array([2**62, 2**62, 2**62, 2**62, 6], dtype="<i8"), 6, Reason.SCHEMA, id="sum-wraps-int64"),
        pytest.param(np.array([[1, 2, 3]], dtype="<i8"), 6, Reason.BAD_SHAPE, id="2d"),
        pytest.param(np.array(6, dtype="<i8"), 6, Reason.BAD_SHAPE, id="scalar"),
        pytest.param(np.zeros(0, dtype="<i8"), 0, Reason.BAD_SHAPE, id="empty"),
        pytest.param(np.array([1.0, 2.0, 3.0], dtype="<f8"), 6, Reason.BAD_SHAPE, id="float"),
        pytest.param(np.array([True, False]), 1, Reason.BAD_SHAPE, id="bool"),
        pytest.param(np.zeros(100_001, dtype="|u1"), 0, Reason.BAD_SHAPE, id="too-many-classes"),
    ],
)
def test_bad_label_histograms_are_rejected(counts: np.ndarray, num_samples: int, reason: Reason) -> None:
    message = encode(_status_dict(num_samples, label_counts=counts))
    assert reason_of(lambda: decode_message(message, expect=AgentStatus)) is reason


def test_a_label_histogram_of_the_most_classes_passes() -> None:
    counts = np.zeros(100_000, dtype="<i8")
    counts[-1] = 3
    assert decode_message(encode(_status_dict(3, label_counts=counts)), expect=AgentStatus).label_counts is not None
