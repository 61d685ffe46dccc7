"""Hypothesis strategies and comparison helpers shared by the protocol unit tests.

Imports numpy, msgpack and the protocol package only: these tests also run without torch.
"""

from __future__ import annotations

import struct
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import strategies as st

from protocol.arrays import ARRAY_NAME_PATTERN
from protocol.limits import DEFAULT_DTYPES
from protocol.messages import (
    VERSION_PATTERN,
    AgentStatus,
    Chunk,
    CoordinatorStatus,
    GlobalState,
    LocalTraining,
    Message,
    Notice,
    PrivacySpent,
    RoundAnnouncement,
    Signed,
    StateRef,
    TaskAnnouncement,
    TaskRef,
    TrainMetrics,
    Update,
)
from protocol.task_card import FamilyLayout, TaskCard

ALLOWED_DTYPES: list[str] = sorted(DEFAULT_DTYPES)
MAX_ROUND = 10_000_000

# ---------------------------------------------------------------------------- arrays


def wire_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype an array of ``dtype`` has after a trip over the wire (little-endian)."""
    return dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype


def dtypes(big_endian: bool = True) -> st.SearchStrategy[np.dtype]:
    """Every allowed dtype, optionally also in big-endian byte order."""
    base = st.sampled_from(ALLOWED_DTYPES).map(np.dtype)
    if not big_endian:
        return base
    return st.tuples(base, st.booleans()).map(lambda t: t[0].newbyteorder(">") if t[1] else t[0])


def _elements(dtype: np.dtype, finite: bool) -> st.SearchStrategy[Any] | None:
    if dtype.kind == "f" and finite:
        return hnp.from_dtype(dtype, allow_nan=False, allow_infinity=False)
    return None


def shapes(min_dims: int = 0, max_dims: int = 4, max_side: int = 5) -> st.SearchStrategy[tuple[int, ...]]:
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=0, max_side=max_side)


def arrays(
    dtype: st.SearchStrategy[np.dtype] | None = None,
    shape: st.SearchStrategy[tuple[int, ...]] | None = None,
    *,
    finite: bool = False,
) -> st.SearchStrategy[np.ndarray]:
    """Arrays of any allowed dtype and shape, including 0-d and empty ones."""
    dtype = dtypes() if dtype is None else dtype
    shape = shapes() if shape is None else shape
    return st.tuples(dtype, shape).flatmap(lambda t: hnp.arrays(t[0], t[1], elements=_elements(t[0], finite)))


def _relayout(array: np.ndarray, how: str) -> np.ndarray:
    if array.ndim == 0 or how == "c":
        return array
    if how == "fortran":
        return np.asfortranarray(array)
    if how == "transposed":
        return array.T
    if how == "reversed":
        return array[::-1]
    # "strided": every other element of a doubled array, so it is never contiguous
    doubled = np.repeat(array, 2, axis=-1)
    return doubled[..., ::2]


def any_layout_arrays(*, finite: bool = False) -> st.SearchStrategy[np.ndarray]:
    """Arrays as above, also as Fortran-ordered, transposed, reversed or strided views."""
    return st.tuples(arrays(finite=finite), st.sampled_from(["c", "fortran", "transposed", "reversed", "strided"])).map(
        lambda t: _relayout(*t)
    )


def finite_arrays() -> st.SearchStrategy[np.ndarray]:
    """What a message field accepts: any allowed dtype, byte order and layout, finite floats."""
    return any_layout_arrays(finite=True)


array_names = st.from_regex(ARRAY_NAME_PATTERN, fullmatch=True).filter(lambda name: len(name) <= 12)
"""Any name the wire accepts (``protocol.arrays.ARRAY_NAME_PATTERN``), kept short."""


def named_arrays(max_size: int = 3) -> st.SearchStrategy[dict[str, np.ndarray]]:
    return st.dictionaries(array_names, finite_arrays(), max_size=max_size)


# ---------------------------------------------------------------------------- plain data

MSGPACK_INTS = st.integers(min_value=-(2**63), max_value=2**64 - 1)

plain_scalars: st.SearchStrategy[Any] = (
    st.none() | st.booleans() | MSGPACK_INTS | st.floats() | st.text(max_size=16) | st.binary(max_size=16)
)


def plain_data(leaves: st.SearchStrategy[Any] = plain_scalars) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda children: st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(st.text(max_size=8), children, max_size=4),
        max_leaves=16,
    )


# ---------------------------------------------------------------------------- comparison


def assert_wire_equal(expected: Any, actual: Any, path: str = "$") -> None:
    """``actual`` is what ``expected`` must decode to: same types, values, bits, dtypes, shapes."""
    if isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray), f"{path}: {type(actual).__name__} is not an array"
        assert actual.dtype == wire_dtype(expected.dtype), f"{path}: dtype {actual.dtype.str} != {expected.dtype.str}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        # Byte-exact (C order, little-endian): also pins NaN payloads and signed zeros.
        assert actual.tobytes() == expected.astype(actual.dtype).tobytes(), f"{path}: data differs"
        if expected.dtype.kind != "f" or np.isfinite(expected).all():
            assert np.array_equal(actual, expected), f"{path}: values differ"
    elif isinstance(expected, np.generic):
        assert_wire_equal(expected.item(), actual, path)
    elif isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: {type(actual).__name__} is not a dict"
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for key, value in expected.items():
            assert_wire_equal(value, actual[key], f"{path}.{key}")
    elif isinstance(expected, (list, tuple)):
        # A model's tuple fields (TaskCard.families) travel as arrays and come back as tuples.
        assert isinstance(actual, list | tuple), f"{path}: {type(actual).__name__} is not a list"
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            assert_wire_equal(e, a, f"{path}[{i}]")
    elif isinstance(expected, float):
        assert type(actual) is float, f"{path}: {type(actual).__name__} is not a float"
        assert struct.pack("<d", actual) == struct.pack("<d", expected), f"{path}: {actual!r} != {expected!r}"
    else:
        assert type(actual) is type(expected), f"{path}: {type(actual).__name__} != {type(expected).__name__}"
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def assert_same_message(expected: Message, actual: Message) -> None:
    """Model equality would compare arrays with ``==``; compare field by field instead."""
    assert type(actual) is type(expected)
    assert_wire_equal(expected.model_dump(), actual.model_dump())


# ---------------------------------------------------------------------------- message fields

identifiers = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", fullmatch=True)
digests = st.from_regex(r"[0-9a-f]{32}", fullmatch=True)
rounds = st.integers(min_value=0, max_value=MAX_ROUND)
counts = st.integers(min_value=0, max_value=2**63 - 1)
finite_floats = st.floats(allow_nan=False, allow_infinity=False)
non_negative = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)
positive = st.floats(min_value=0.0, exclude_min=True, allow_nan=False, allow_infinity=False)
probabilities = st.floats(min_value=0.0, max_value=1.0)
algorithms = st.sampled_from(["fedavg", "fedprox", "scaffold", "fedproto"]) | identifiers  # an open set of names
versions = st.text(max_size=64)
short_keys = st.text(max_size=64)
task_refs = st.builds(TaskRef, name=identifiers, version=st.from_regex(VERSION_PATTERN, fullmatch=True))

float_dtypes = st.sampled_from([d for d in ALLOWED_DTYPES if np.dtype(d).kind == "f"]).map(np.dtype)
count_dtypes = st.sampled_from([d for d in ALLOWED_DTYPES if np.dtype(d).kind in "iu"]).map(np.dtype)


@st.composite
def prototype_pairs(draw: st.DrawFn) -> tuple[np.ndarray | None, np.ndarray | None]:
    if not draw(st.booleans()):
        return None, None
    classes = draw(st.integers(0, 5))
    dim = draw(st.integers(0, 4))
    dtype = draw(float_dtypes)
    protos = draw(hnp.arrays(dtype, (classes, dim), elements=_elements(dtype, finite=True)))
    counts_dtype = draw(count_dtypes)
    class_counts = draw(hnp.arrays(counts_dtype, (classes,), elements=st.integers(0, 100)))
    return protos, class_counts


privacy = st.none() | st.builds(
    PrivacySpent,
    epsilon=non_negative,
    delta=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
    budget_epsilon=st.none() | positive,
    exhausted=st.booleans(),
)

coordinator_statuses = st.builds(
    CoordinatorStatus,
    federation=identifiers,
    run_id=identifiers,
    session=identifiers,
    state=st.sampled_from(["online", "offline", "finished"]),
    round=rounds,
    algorithm=algorithms,
    version=versions,
    timestamp=finite_floats,
)

@st.composite
def sample_counts(draw: st.DrawFn) -> tuple[int, np.ndarray | None]:
    """``(num_samples, label_counts)``: a histogram of any integer dtype summing to the count, or none."""
    if draw(st.booleans()):
        return draw(counts), None
    histogram = draw(hnp.arrays(draw(count_dtypes), (draw(st.integers(1, 12)),), elements=st.integers(0, 100)))
    return int(histogram.sum(dtype=np.int64)), histogram


agent_statuses = sample_counts().flatmap(lambda samples: st.builds(
    AgentStatus,
    agent_id=identifiers,
    state=st.sampled_from(["online", "offline", "budget_exhausted"]),
    device=identifiers,
    family=identifiers,
    num_samples=st.just(samples[0]),
    num_eval_samples=counts,
    version=versions,
    timestamp=finite_floats,
    privacy=privacy,
    task_ref=task_refs,
    layout=digests,
    problem=st.none() | st.text(max_size=512),
    label_counts=st.just(samples[1]),
))

local_trainings = st.builds(
    LocalTraining,
    epochs=st.integers(1, 1000),
    learning_rate=st.floats(min_value=0.0, max_value=10.0, exclude_min=True),
    momentum=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
    weight_decay=st.floats(min_value=0.0, max_value=1.0),
    batch_size=st.none() | st.integers(1, 65536),
)


@st.composite
def round_announcements(draw: st.DrawFn) -> RoundAnnouncement:
    families = draw(st.lists(identifiers, unique=True, max_size=3))
    return RoundAnnouncement(
        run_id=draw(identifiers),
        round=draw(rounds),
        task=draw(st.sampled_from(["train", "evaluate"])),
        task_ref=draw(task_refs),
        layouts=draw(st.dictionaries(identifiers, digests, max_size=3)),
        algorithm=draw(algorithms),
        training=draw(local_trainings),
        params=draw(st.dictionaries(short_keys, finite_floats | MSGPACK_INTS | st.booleans(), max_size=4)),
        selected=draw(st.lists(identifiers, unique=True, max_size=5)),
        states={f: StateRef(family=f, round=draw(rounds), digest=draw(digests)) for f in families},
        init_seed=draw(st.integers(0, 2**31 - 1)),
        issued_at=draw(finite_floats),
        deadline_s=draw(positive),
        last_round=draw(rounds),
    )


@st.composite
def global_states(draw: st.DrawFn) -> GlobalState:
    weights = draw(named_arrays())
    control = draw(named_arrays(max_size=2))
    protos, class_counts = draw(prototype_pairs())
    return GlobalState(
        run_id=draw(identifiers),
        family=draw(identifiers),
        round=draw(rounds),
        digest=GlobalState.compute_digest(weights, control, protos, class_counts),
        weights=weights,
        control=control,
        prototypes=protos,
        prototype_counts=class_counts,
    )


train_metrics = st.builds(
    TrainMetrics,
    eval_loss=st.none() | non_negative,
    eval_accuracy=st.none() | probabilities,
    num_eval_samples=counts,
    train_loss=st.none() | non_negative,
    train_accuracy=st.none() | probabilities,
    duration_s=non_negative,
    steps=counts,
    extra=st.dictionaries(short_keys, finite_floats, max_size=3),
)


@st.composite
def updates(draw: st.DrawFn) -> Update:
    task = draw(st.sampled_from(["train", "evaluate"]))
    weights: dict[str, np.ndarray] = {}
    delta: dict[str, np.ndarray] = {}
    control_delta: dict[str, np.ndarray] = {}
    protos, class_counts = None, None
    if task == "train":
        payload = draw(st.sampled_from(["weights", "delta", "prototypes", "none"]))
        if payload == "weights":
            weights = draw(named_arrays())
        elif payload == "delta":
            delta = draw(named_arrays())
        elif payload == "prototypes":
            protos, class_counts = draw(prototype_pairs())
        if weights or delta:
            control_delta = draw(named_arrays(max_size=2))
    return Update(
        run_id=draw(identifiers),
        agent_id=draw(identifiers),
        round=draw(rounds),
        task=task,
        task_ref=draw(task_refs),
        family=draw(identifiers),
        base_digest=draw(st.none() | digests),
        num_samples=draw(counts),
        weights=weights,
        delta=delta,
        control_delta=control_delta,
        prototypes=protos,
        prototype_counts=class_counts,
        metrics=draw(train_metrics),
        privacy=draw(privacy),
    )


@st.composite
def chunks(draw: st.DrawFn) -> Chunk:
    count = draw(st.integers(1, 100_000))
    return Chunk(
        transfer_id=draw(st.from_regex(r"[0-9a-f]{16,32}", fullmatch=True)),
        index=draw(st.integers(0, count - 1)),
        count=count,
        total_bytes=draw(st.integers(count, 2**63 - 1)),  # no more pieces than bytes
        digest=draw(digests),
        data=draw(st.binary(min_size=1, max_size=64)),  # no empty piece
    )


@st.composite
def signed(draw: st.DrawFn) -> Signed:
    return Signed(key_id=draw(st.from_regex(r"[0-9a-f]{16}", fullmatch=True)), payload=draw(st.binary(max_size=256)),
                  signature=draw(st.binary(min_size=64, max_size=64)))


@st.composite
def task_announcements(draw: st.DrawFn) -> TaskAnnouncement:
    """A card of a few families, each with its arrays, only a fingerprint, or no layout yet."""
    families = draw(st.lists(identifiers, min_size=1, max_size=3, unique=True))
    layouts: dict[str, FamilyLayout] = {}
    for family in families:
        how = draw(st.sampled_from(["arrays", "fingerprint", "none"]))
        shapes = draw(st.lists(st.lists(st.integers(0, 64), max_size=3).map(tuple), min_size=1, max_size=4))
        layout = {f"layer{i}.weight": (shape, draw(st.sampled_from(["<f4", "<f2", "<i8"])))
                  for i, shape in enumerate(shapes)}
        if how == "arrays":
            layouts[family] = FamilyLayout.of(layout)
        elif how == "fingerprint":
            layouts[family] = FamilyLayout(fingerprint=FamilyLayout.of(layout).fingerprint)
    classes = draw(st.lists(st.text(min_size=1, max_size=8), min_size=2, max_size=6, unique=True))
    card = TaskCard(name=draw(identifiers), version=draw(st.from_regex(VERSION_PATTERN, fullmatch=True)),
                    classes=tuple(classes), families=tuple(families), layouts=layouts,
                    embedding_dim=draw(st.none() | st.integers(1, 512)))
    return TaskAnnouncement(run_id=draw(identifiers), card=card, timestamp=draw(finite_floats),
                            epoch=draw(st.integers(0, 2**63 - 1)))


notices = st.builds(
    Notice,
    run_id=identifiers,
    agent_id=identifiers,
    about=st.sampled_from(["status", "update"]),
    reason=st.from_regex(r"[a-z][a-z0-9_]{0,63}", fullmatch=True),
    detail=st.text(max_size=512),
    round=rounds,
    timestamp=finite_floats,
    epoch=st.integers(0, 2**63 - 1),
)


def sample_update(**overrides: Any) -> Update:
    """A small valid training update with two float arrays and an integer buffer."""
    fields: dict[str, Any] = dict(
        run_id="run-1",
        agent_id="agent-0",
        round=3,
        task="train",
        task_ref=TaskRef(name="digits", version="1"),
        family="cnn",
        base_digest="0" * 32,
        num_samples=42,
        delta={
            "conv.weight": np.arange(12, dtype="<f4").reshape(3, 2, 2) / 10,
            "conv.bias": np.array([0.5, -0.5, 1.5], dtype="<f4"),
            "steps": np.array(7, dtype="<i8"),
        },
        metrics=TrainMetrics(train_loss=0.25, train_accuracy=0.9, duration_s=1.5, steps=10),
    )
    fields.update(overrides)
    return Update(**fields)
