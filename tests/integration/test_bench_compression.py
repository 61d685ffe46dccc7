"""bench/compression.py --quick runs end to end (real broker, coordinator and agents) and prints its tables.

Its accuracies after three rounds mean nothing; the byte ratios do: compressed updates must be smaller.
"""

from __future__ import annotations

import re

import pytest

from tests.bench_runner import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_compression_bench_quick_prints_bytes_accuracy_and_codec_times() -> None:
    out = run_bench("compression.py", "--quick", timeout_s=900)
    rows = re.findall(r"^iid\s+(none|fp16|int8|topk:0.01)( \+fp16 st)?\s+([\d,]+)\s+\d+\.\d\s+([\d,]+)\s+\d+\.\d\s+"
                      r"\d+\.\d+%", out, re.MULTILINE)
    assert [name + half for name, half, *_ in rows] == ["none", "fp16", "int8", "topk:0.01", "int8 +fp16 st",
                                                        "topk:0.01 +fp16 st"], out
    upload = {name + half: int(size.replace(",", "")) for name, half, size, _ in rows}
    published = {name + half: int(size.replace(",", "")) for name, half, _, size in rows}
    assert upload["none"] > upload["fp16"] > upload["int8"] > upload["topk:0.01"]  # what crossed the wire
    for name in ("int8", "topk:0.01"):  # float16 states: fewer bytes published, the same updates
        assert published[f"{name} +fp16 st"] < published[name], (name, published)
    assert [text.split(" ")[0] for _, text in re.findall(r"^(PASS|MISS)  (.+)$", out, re.MULTILINE)] == [
        "int8", "topk:0.01"]
    codec = re.findall(r"^(none|fp16|int8|topk:\S+)\s+\d+\.\d\s+\d+\.\d\s+([\d,]+)$", out, re.MULTILINE)
    assert [kind for kind, _ in codec][:3] == ["none", "fp16", "int8"]
