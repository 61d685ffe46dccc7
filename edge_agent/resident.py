"""Give back the clean file-backed pages a start-up faulted in: the light agent's resident set.

Importing torch maps libtorch (hundreds of MB of code) and runs its initialisers, which leaves
about 75 MiB of its code and read-only data resident in the agent (and some 25 MiB more for
numpy, pydantic-core and cryptography). Most of it is never executed again. Those pages are
clean copies of files on disk: the kernel reclaims them anyway under memory pressure, but until
it does they count in the process's resident set (RSS), which is what a phone's or a cgroup's
memory accounting, and an operator's ``top``, look at.

``drop_clean_file_pages`` unmaps them with ``madvise(MADV_DONTNEED)``: a page touched again
comes back as a minor fault from the page cache, unchanged, so nothing is lost and behaviour is
the same. It is only applied to mappings where that is certain:

* private, not writable, of a regular file (code and read-only data of libraries);
* with no anonymous or dirty page at all, so no page differs from the file (a library's
  relocated read-only data, written by the loader then write-protected, has dirty pages and
  is kept; dropping those would re-read unrelocated bytes).

Call it from the main thread at start-up, before the agent starts its threads: a mapping that is
not writable cannot gain a dirty page unless someone ``mprotect``\\ s it between the check and the
call, which nothing in the agent does. Linux only; elsewhere it does nothing and says so. It
does not touch the anonymous memory (Python objects, torch's operator tables), which is most of
what an agent holds: the figures in ``bench/memory.py`` report the two apart.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

MADV_DONTNEED = 4
"""Linux's value on every architecture the agent runs on (x86-64, arm64, armv7)."""
SMAPS = Path("/proc/self/smaps")


@dataclass(frozen=True)
class Mapping:
    """One entry of /proc/self/smaps: an address range and the page counts that decide if it may go."""

    start: int
    end: int
    perms: str
    """e.g. ``r-xp``: read, write, execute, private (p) or shared (s)."""
    path: str
    """The mapped file, or ``[heap]``, ``[stack]``..., or empty for anonymous memory."""
    kb: dict[str, int] = field(default_factory=dict)
    """Rss, Anonymous, Private_Dirty, Shared_Dirty... in kB, as smaps lists them."""


@dataclass(frozen=True)
class PageDrop:
    """What one ``drop_clean_file_pages`` call gave back."""

    supported: bool
    """False where /proc/self/smaps or madvise is not available (not Linux): nothing was done."""
    dropped_bytes: int = 0
    """Resident bytes of the mappings given back (what smaps said just before)."""
    mappings: int = 0
    refused: tuple[str, ...] = ()
    """Mappings the kernel refused, as ``path: errno text``; the process is unchanged for them."""
    why_not: str = "not supported on this system (Linux only)"
    """When not supported: why."""

    def describe(self) -> str:
        if not self.supported:
            return self.why_not
        text = f"gave back {self.dropped_bytes / 2**20:.1f} MiB of clean library pages from {self.mappings} mappings"
        return text + (f"; {len(self.refused)} refused" if self.refused else "")


def parse_smaps(text: str) -> list[Mapping]:
    """The mappings in the text of /proc/<pid>/smaps."""
    mappings: list[Mapping] = []
    for line in text.splitlines():
        head, _, rest = line.partition(" ")
        if head.endswith(":"):  # "Rss:  123 kB" (or "VmFlags: rd ex ...", not a size)
            parts = rest.split()
            if mappings and len(parts) == 2 and parts[1] == "kB":
                mappings[-1].kb[head[:-1]] = int(parts[0])
            continue
        # "7f..-7f.. r-xp 00000000 fe:00 5351268    /path/to/lib.so" (the path may hold spaces)
        fields = line.split(maxsplit=5)
        start, _, end = fields[0].partition("-")
        mappings.append(Mapping(int(start, 16), int(end, 16), fields[1], fields[5] if len(fields) > 5 else ""))
    return mappings


def droppable(mapping: Mapping) -> bool:
    """True when every resident page of ``mapping`` is an unmodified page of a regular file."""
    kb = mapping.kb
    return (
        mapping.perms[1] != "w" and mapping.perms[3] == "p"
        and mapping.path.startswith("/") and not mapping.path.startswith(("/dev/", "/proc/", "/sys/"))
        and kb.get("Rss", 0) > 0
        # Missing counts are treated as dirty: a kernel that does not report them gets nothing dropped.
        and kb.get("Anonymous", 1) == 0 and kb.get("Private_Dirty", 1) == 0 and kb.get("Shared_Dirty", 1) == 0
        and kb.get("Locked", 0) == 0
        and os.path.isfile(mapping.path)
    )


def drop_clean_file_pages() -> PageDrop:
    """Unmap the resident pages of this process's clean, read-only library mappings (see the module)."""
    if not sys.platform.startswith("linux") or not SMAPS.exists():
        return PageDrop(supported=False)
    libc = ctypes.CDLL(None, use_errno=True)
    madvise = libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    try:
        text = SMAPS.read_text()
    except OSError as exc:  # a sandbox that hides /proc: keep every page, say why
        return PageDrop(supported=False, why_not=f"cannot read {SMAPS}: {exc.strerror or exc}")
    return _drop([m for m in parse_smaps(text) if droppable(m)], madvise)


def _drop(mappings: Iterable[Mapping], madvise: Callable[[int, int, int], int]) -> PageDrop:
    dropped = count = 0
    refused: list[str] = []
    for m in mappings:
        if madvise(m.start, m.end - m.start, MADV_DONTNEED) == 0:
            dropped += m.kb["Rss"] * 1024
            count += 1
        else:
            refused.append(f"{m.path}: {os.strerror(ctypes.get_errno())}")
    return PageDrop(True, dropped, count, tuple(refused))


def give_back_library_pages(when: str) -> PageDrop:
    """``drop_clean_file_pages``, logged at DEBUG (a refusal at WARNING: it means a kernel quirk)."""
    result = drop_clean_file_pages()
    log.debug("%s: %s", when, result.describe())
    if result.refused:
        log.warning("%s: the kernel refused to drop %d mappings: %s", when, len(result.refused),
                    "; ".join(result.refused[:3]))
    return result
