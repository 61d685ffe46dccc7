"""bench/codec.py --quick runs and prints its table; timings are not asserted (DESIGN.md)."""

from __future__ import annotations

import re

from tests.bench_runner import run_bench


def test_codec_bench_quick_prints_its_table() -> None:
    out = run_bench("codec.py", "--quick", timeout_s=120)
    assert re.search(r"^size\s+operation\s+median ms\s+MB/s", out, re.MULTILINE), out
    for operation in ("encode  ours", "encode  pickle", "arr.tobytes()", "np.copy(arr)", "decode  ours",
                      "decode  pickle"):
        assert re.search(rf"^\s+1M\s+\S*\s*{re.escape(operation)}.*\d", out, re.MULTILINE), (operation, out)
    assert " 10M " not in out, "--quick measures 1M parameters only"
    verdicts = re.findall(r"^(PASS|MISS)\s+1M: (decode|encode)", out, re.MULTILINE)
    assert sorted(kind for _, kind in verdicts) == ["decode", "encode"], out


def test_signing_bench_quick_prints_its_table() -> None:
    out = run_bench("signing.py", "--quick", timeout_s=180)
    assert re.search(r"^\s+params\s+bytes\s+encode.*open/pool\s+latency\s+pipelined.*pool/pipelined$", out,
                     re.MULTILINE), out
    for params in ("127,000", "1,000,000"):
        assert re.search(rf"^\s*{params}\s+[\d,]+(\s+\d+\.\d+){{9}}\s+\d+\.\d+$", out, re.MULTILINE), (params, out)
        # the goal compares with the pipelined transport per message, and can be missed
        assert re.search(rf"^(PASS|MISS)\s+{params} params: opening an update .* x the pipelined transport per "
                         rf"message \(\d+\.\d+ ms; goal <= 0\.3\)", out, re.MULTILINE), out


def test_compression_codec_bench_prints_its_table() -> None:
    out = run_bench("compression_codec.py", "--n", "20000", "--repeats", "1", timeout_s=120)
    assert re.search(r"^kind\s+encode ms\s+decode ms\s+bytes\s+of none$", out, re.MULTILINE), out
    for kind in ("none", "fp16", "int8", "topk:0.1", "topk:0.01"):
        assert re.search(rf"^{re.escape(kind)}\s+\d+\.\d+\s+\d+\.\d+\s+[\d,]+\s+\d\.\d+$", out, re.MULTILINE), (kind, out)


def test_device_rounds_bench_quick_prints_its_table() -> None:
    """CI has no GPU: the CPU column is timed and the CUDA ones say so (scripts/cuda-check.sh runs it on one)."""
    out = run_bench("device_rounds.py", "--quick", timeout_s=300)
    assert re.search(r"^task\s+family\s+algorithm\s+dp\s+records\s+steps\s+cpu ms\s+cuda ms\s+tf32 ms\s+cpu/cuda$",
                     out, re.MULTILINE), out
    for dp in ("off", "on"):
        assert re.search(rf"^digits\s+cnn_large\s+fedavg\s+{dp}\s+\d+\s+\d+\s+\d+\.\d+\s+(-|\d+\.\d+)", out,
                         re.MULTILINE), (dp, out)
