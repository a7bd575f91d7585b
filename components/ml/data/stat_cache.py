"""The stat cache of ingest's inputs: a local file's sha256 kept by its stat, as git's index and
DVC's state keep theirs, so a rerun reads only the files whose stat changed.

An entry is the file's absolute path, its stat (device, inode, size, mtime and ctime in
nanoseconds) and the sha256 of its bytes when that stat was taken. A later run trusts the
entry only when the file's stat is equal in every field **and** the file's mtime is older
than the moment the stats were taken by more than :data:`RACY_NS`: a file written just
before (or while) it was hashed could change again within the same timestamp without its
stat showing it (git's "racily clean" entries), so such a file is hashed again next time.
Any difference (a touched file, a copy, another inode, another machine) means a re-hash,
never a wrong reuse.

Kept beside the snapshot (``inputs-stat.npz`` in ingest's output directory), outside
``snapshot.json``: it says how the inputs were last seen on this machine, not what the data
set holds, so it never changes the snapshot's identity. Stats are compared as arrays, not
file by file: a rerun over 100k unchanged files costs their ``stat`` calls and little more.

Library layer: imported by the ingest step's units (``components.tasks.ingest_units``).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

STAT_FILE = "inputs-stat.npz"
VERSION = 1
RACY_NS = 2_000_000_000  # mtimes this close to the stat time are not trusted (coarse clocks)
MTIME = 1  # the column of ``Stats.times`` holding st_mtime_ns


@dataclass
class Stats:
    """Files and their stats, one row each: ``ids`` (st_dev, st_ino) as uint64, ``times``
    (st_size, st_mtime_ns, st_ctime_ns) as int64, taken at ``taken_ns``."""

    paths: list[str] = field(default_factory=list)
    ids: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.uint64))
    times: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.int64))
    taken_ns: int = 0


def take(paths: Sequence[str], clock: int | None = None) -> tuple[Stats, list[int]]:
    """The stats of ``paths`` (absolute), and the places in ``paths`` of those that could be
    taken (a file that cannot be stat-ed is hashed, and fails there if it cannot be read)."""
    taken = time.time_ns() if clock is None else clock
    kept, ids, times, where = [], [], [], []
    for i, path in enumerate(paths):
        try:
            st = os.stat(path)
        except OSError:
            continue
        kept.append(path)
        ids.append((st.st_dev, st.st_ino))
        times.append((st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        where.append(i)
    return (
        Stats(
            kept,
            np.asarray(ids, dtype=np.uint64).reshape(-1, 2),
            np.asarray(times, dtype=np.int64).reshape(-1, 3),
            taken,
        ),
        where,
    )


@dataclass
class StatCache:
    """The last run's files, stats and sha256s (``digests``: 32 bytes each, in order)."""

    stats: Stats = field(default_factory=Stats)
    digests: bytes = b""

    @functools.cached_property
    def _where(self) -> dict[str, int]:
        """Each cached path's row (built once: a run asks unit by unit)."""
        return dict(zip(self.stats.paths, range(len(self.stats.paths)), strict=True))

    @functools.cached_property
    def _hex(self) -> str:
        return self.digests.hex()

    def vouch(self, now: Stats) -> list[str | None]:
        """For each file of ``now``: its sha256 (hex) if the cache's entry can be trusted for
        its stat, else None."""
        n = len(now.paths)
        old = self.stats
        if not old.paths or not n:
            return [None] * n
        if now.paths == old.paths:
            idx = np.arange(n)
        else:
            where = self._where
            idx = np.fromiter((where.get(p, -1) for p in now.paths), dtype=np.int64, count=n)
        found = np.flatnonzero(idx >= 0)
        ok = np.zeros(n, dtype=bool)
        at = idx[found]
        ok[found] = (old.ids[at] == now.ids[found]).all(axis=1) & (
            old.times[at] == now.times[found]
        ).all(axis=1)
        ok &= now.times[:, MTIME] < old.taken_ns - RACY_NS  # else racily clean: hash again
        hexes = self._hex
        return [
            hexes[64 * j : 64 * j + 64] if good else None
            for good, j in zip(ok.tolist(), idx.tolist(), strict=True)
        ]


def load(directory: Path) -> StatCache:
    """The cache kept in ``directory`` (empty when there is none, or it cannot be read: a
    cache that cannot be read only costs a re-hash, so it is logged, not an error)."""
    path = Path(directory) / STAT_FILE
    if not path.is_file():
        return StatCache()
    try:
        with np.load(path, allow_pickle=False) as z:
            if int(z["version"]) != VERSION:
                return StatCache()
            text = z["paths"].tobytes().decode("utf-8", "surrogateescape")
            bounds = z["offsets"].tolist()
            ids, times = z["ids"], z["times"]
            digests, taken = z["sha256"].tobytes(), int(z["taken_ns"])
    except (OSError, ValueError, KeyError) as exc:
        log.warning("%s: stat cache not read (%s); every input is hashed", path, exc)
        return StatCache()
    paths = [text[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    if not (len(paths) == len(ids) == len(times) == len(digests) // 32):
        log.warning("%s: stat cache inconsistent; every input is hashed", path)
        return StatCache()
    return StatCache(Stats(paths, ids, times, taken), digests)


def write(directory: Path, stats: Stats, digests: Sequence[str | None]) -> Path:
    """Write the cache of the files of ``stats`` whose sha256 (hex) is known into
    ``directory`` (ingest's temporary output, renamed into place with the snapshot)."""
    keep = [i for i, d in enumerate(digests) if d is not None]
    paths = [stats.paths[i] for i in keep]
    offsets = np.zeros(len(paths) + 1, dtype=np.int64)  # in characters: the bytes are
    np.cumsum([len(p) for p in paths], out=offsets[1:])  # decoded as one string, then cut
    blob = "".join(paths).encode("utf-8", "surrogateescape")
    dest = Path(directory) / STAT_FILE
    with open(dest, "wb") as fh:
        np.savez(
            fh,
            version=np.int64(VERSION),
            taken_ns=np.int64(stats.taken_ns),
            paths=np.frombuffer(blob, dtype=np.uint8),
            offsets=offsets,
            ids=stats.ids[keep],
            times=stats.times[keep],
            sha256=np.frombuffer(bytes.fromhex("".join(digests[i] for i in keep)), np.uint8),  # type: ignore[misc]
        )
    return dest


def clock() -> int:
    """The wall clock in nanoseconds: the clock file times are set from."""
    return time.time_ns()
