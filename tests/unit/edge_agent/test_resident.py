"""edge_agent/resident.py gives back only pages that are exact copies of their file.

The selection rules are checked on smaps text; the real effect in a fresh interpreter on
mappings made for the purpose: a read-only file mapping whose pages are dropped and read back
unchanged, and two that must be kept because a page differs from the file (a private copy
written to, and one written to then made read-only, as the loader does to relocated data).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from edge_agent import resident
from edge_agent.resident import Mapping, PageDrop, droppable, parse_smaps
from tests.chart import REPO

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps is Linux's")

SMAPS = """\
7f3d58c00000-7f3d6d1e5000 r-xp 00000000 fe:00 5351268                    {lib}
Size:             333716 kB
Rss:               46268 kB
Private_Clean:     46268 kB
Private_Dirty:         0 kB
Shared_Dirty:          0 kB
Anonymous:             0 kB
Locked:                0 kB
VmFlags: rd ex mr mw me sd
7f3d6d1e5000-7f3d6d200000 r--p 145e5000 fe:00 5351268                    {lib}
Rss:                 100 kB
Private_Dirty:        60 kB
Shared_Dirty:          0 kB
Anonymous:            60 kB
7ffdc7ae1000-7ffdc7b02000 rw-p 00000000 00:00 0                          [stack]
Rss:                  56 kB
Private_Dirty:        56 kB
Shared_Dirty:          0 kB
Anonymous:            56 kB
7f2ed292a000-7f2ed4c00000 rw-p 00000000 00:00 0
Rss:               35312 kB
Anonymous:         35312 kB
"""


def _mapping(lib: Path, perms: str = "r-xp", path: str | None = None, **kb: int) -> Mapping:
    counts = {"Rss": 8, "Anonymous": 0, "Private_Dirty": 0, "Shared_Dirty": 0, "Locked": 0, **kb}
    return Mapping(0x1000, 0x3000, perms, str(lib) if path is None else path, counts)


def test_smaps_text_is_parsed_into_ranges_permissions_paths_and_counts(tmp_path: Path) -> None:
    lib = tmp_path / "lib with space.so"
    maps = parse_smaps(SMAPS.format(lib=lib))
    assert [(m.start, m.end, m.perms, m.path) for m in maps] == [
        (0x7f3d58c00000, 0x7f3d6d1e5000, "r-xp", str(lib)),
        (0x7f3d6d1e5000, 0x7f3d6d200000, "r--p", str(lib)),
        (0x7ffdc7ae1000, 0x7ffdc7b02000, "rw-p", "[stack]"),
        (0x7f2ed292a000, 0x7f2ed4c00000, "rw-p", ""),
    ]
    assert maps[0].kb == {"Size": 333716, "Rss": 46268, "Private_Clean": 46268, "Private_Dirty": 0,
                          "Shared_Dirty": 0, "Anonymous": 0, "Locked": 0}  # VmFlags is not a size
    assert maps[3].kb == {"Rss": 35312, "Anonymous": 35312}


def test_only_clean_private_read_only_pages_of_a_regular_file_may_go(tmp_path: Path) -> None:
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"\0" * 8192)
    assert droppable(_mapping(lib))
    assert droppable(_mapping(lib, perms="r--p"))
    refused = {
        "writable": _mapping(lib, perms="rw-p"),
        "shared": _mapping(lib, perms="r-xs"),
        "a page copied on write (relocated data)": _mapping(lib, perms="r--p", Anonymous=4, Private_Dirty=4),
        "a dirty page": _mapping(lib, Private_Dirty=4),
        "a dirty shared page": _mapping(lib, Shared_Dirty=4),
        "locked": _mapping(lib, Locked=8),
        "nothing resident": _mapping(lib, Rss=0),
        "anonymous memory": _mapping(lib, path=""),
        "the heap": _mapping(lib, path="[heap]"),
        "a device": _mapping(lib, path="/dev/zero"),
        "a file that is gone": _mapping(lib, path=str(tmp_path / "deleted.so")),
    }
    assert [why for why, m in refused.items() if droppable(m)] == []
    unreported = Mapping(0x1000, 0x3000, "r-xp", str(lib), {"Rss": 8})
    assert not droppable(unreported), "a kernel that does not report the dirty counts gets nothing dropped"


def test_on_other_systems_nothing_is_done_and_it_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert PageDrop(supported=False).describe() == "not supported on this system (Linux only)"
    monkeypatch.setattr(resident, "SMAPS", tmp_path / "no-such-file")
    assert resident.drop_clean_file_pages() == PageDrop(supported=False)
    monkeypatch.setattr(resident, "SMAPS", tmp_path)  # exists, cannot be read as text: a sandbox's /proc
    result = resident.drop_clean_file_pages()
    assert not result.supported and result.dropped_bytes == 0
    assert result.describe().startswith(f"cannot read {tmp_path}: "), result.describe()
    assert PageDrop(True, 3 * 2**20, 2).describe() == "gave back 3.0 MiB of clean library pages from 2 mappings"


PROCESS = r"""
import ctypes, json, mmap, os, sys
from edge_agent.resident import drop_clean_file_pages, parse_smaps

PAGE = mmap.PAGESIZE
path = os.path.realpath(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

with open(path, "rb") as f:
    clean = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)  # like a library's code
    copied = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # a private copy, written to
    sealed = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # written, then made read-only
original = clean[:]
copied[0:5] = b"XXXXX"
sealed[PAGE:PAGE + 5] = b"YYYYY"
sealed_at = ctypes.addressof(ctypes.c_char.from_buffer(sealed))
assert libc.mprotect(sealed_at, len(sealed), mmap.PROT_READ) == 0
copied_at = ctypes.addressof(ctypes.c_char.from_buffer(copied))

def rss_kb(start):
    with open("/proc/self/smaps") as f:
        return next(m.kb["Rss"] for m in parse_smaps(f.read()) if m.start == start)

# The clean mapping's address: the one mapping of the file that is neither of the others.
with open("/proc/self/smaps") as f:
    clean_at = next(m.start for m in parse_smaps(f.read()) if m.path == path and m.start not in (copied_at, sealed_at))
before = {"clean": rss_kb(clean_at), "copied": rss_kb(copied_at), "sealed": rss_kb(sealed_at)}
result = drop_clean_file_pages()
after = {"clean": rss_kb(clean_at), "copied": rss_kb(copied_at), "sealed": rss_kb(sealed_at)}
print(json.dumps({
    "before": before, "after": after, "dropped_bytes": result.dropped_bytes, "refused": list(result.refused),
    "clean_unchanged": clean[:] == original,
    "copied_kept_its_write": copied[0:5] == b"XXXXX" and copied[5:] == original[5:],
    "sealed_kept_its_write": sealed[PAGE:PAGE + 5] == b"YYYYY" and sealed[:PAGE] == original[:PAGE],
}))
"""


def test_a_real_process_gives_back_clean_pages_and_keeps_every_written_one(tmp_path: Path) -> None:
    data = tmp_path / "data.bin"
    with data.open("wb") as f:
        f.write(bytes(range(256)) * 64 * 16)  # 256 KiB: 64 pages of 4 KiB
        f.flush()
        os.fsync(f.fileno())  # pages not yet written back count as dirty, and dirty pages are kept
    done = subprocess.run([sys.executable, "-c", PROCESS, str(data)], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["before"]["clean"] == 256, report  # every page read, so resident
    assert report["after"]["clean"] == 0, report  # given back
    assert report["clean_unchanged"], "a dropped page reads back from the file, unchanged"
    assert report["after"]["copied"] == report["before"]["copied"] > 0, report
    assert report["after"]["sealed"] == report["before"]["sealed"] > 0, report
    assert report["copied_kept_its_write"] and report["sealed_kept_its_write"], report
    assert report["dropped_bytes"] >= 256 * 1024 and report["refused"] == [], report


PHASES = ("after the settings", "after importing torch", "after building the agent")


def _start_up_log(tmp_path: Path, *flags: str) -> list[str]:
    """DEBUG log lines of ``edge-agent run`` up to its first broker connection attempt (no broker listens)."""
    argv = [sys.executable, "-m", "edge_agent", "run", "--device", "phone", "--agent-id", "p0", "--state-dir",
            str(tmp_path / "state"), "--broker-url", "mqtt://127.0.0.1:9", "--log-level", "DEBUG", *flags]
    agent = subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    watchdog = threading.Timer(180.0, agent.kill)  # a hung start-up fails the test instead of hanging it
    watchdog.start()
    lines: list[str] = []
    try:
        assert agent.stderr is not None
        for line in agent.stderr:
            lines.append(line.rstrip())
            if "agent p0: task" in line:  # build_agent's last log line: start-up is over
                break
        # Whatever start-up logged after that line and before the broker is tried.
        for line in agent.stderr:
            lines.append(line.rstrip())
            if "mqtt" in line.lower() or "broker" in line.lower() or "connect" in line.lower():
                break
    finally:
        watchdog.cancel()
        agent.kill()
        agent.wait()
    return lines


def test_the_agent_gives_back_library_pages_after_each_start_up_phase(tmp_path: Path) -> None:
    lines = _start_up_log(tmp_path)
    given = [next((line for line in lines if f"{phase}: gave back" in line), None) for phase in PHASES]
    assert None not in given, "\n".join(lines[-40:])
    megabytes = [float(re.search(r"gave back ([\d.]+) MiB", line).group(1)) for line in given]  # type: ignore[union-attr]
    assert megabytes[1] > 10.0, given  # torch's code: tens of MiB on every build measured


def test_the_setting_turns_it_off(tmp_path: Path) -> None:
    lines = _start_up_log(tmp_path, "--no-give-back-library-pages")
    assert any("agent p0: task" in line for line in lines), "\n".join(lines[-40:])
    assert not [line for line in lines if "gave back" in line]
