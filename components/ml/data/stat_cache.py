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
set holds, so it never changes the snapshot's identity.

Library layer: imported by the ingest step's units (``components.tasks.ingest_units``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

STAT_FILE = "inputs-stat.npz"
VERSION = 1
RACY_NS = 2_000_000_000  # mtimes this close to the stat time are not trusted (coarse clocks)

Stat = tuple[int, int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns


def stat_of(path: str) -> Stat | None:
    """The stat of a file as the cache compares it, or None when it cannot be taken."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class StatCache:
    """The entries of the last run (path -> (stat, sha256 hex)) and when their stats were
    taken (``taken_ns``, the wall clock in nanoseconds)."""

    entries: dict[str, tuple[Stat, str]] = field(default_factory=dict)
    taken_ns: int = 0

    def lookup(self, path: str, stat: Stat | None) -> str | None:
        """The sha256 of ``path`` if its entry can be trusted for this ``stat``, else None."""
        if stat is None:
            return None
        entry = self.entries.get(path)
        if entry is None or entry[0] != stat:
            return None
        if stat[3] >= self.taken_ns - RACY_NS:  # racily clean: it may have changed since
            return None
        return entry[1]


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
            blob, bounds = z["paths"].tobytes(), z["offsets"].tolist()
            ids, times = z["ids"].tolist(), z["times"].tolist()
            digests, taken = z["sha256"].tobytes().hex(), int(z["taken_ns"])
    except (OSError, ValueError, KeyError) as exc:
        log.warning("%s: stat cache not read (%s); every input is hashed", path, exc)
        return StatCache()
    names = blob.decode("utf-8", "surrogateescape")
    entries = {
        names[bounds[i] : bounds[i + 1]]: (
            (*ids[i], *times[i]),
            digests[64 * i : 64 * i + 64],
        )
        for i in range(len(ids))
    }
    return StatCache(entries, taken)  # type: ignore[arg-type]


def write(directory: Path, entries: Iterable[tuple[str, Stat, str]], taken_ns: int) -> Path:
    """Write the cache (path, stat, sha256 hex) into ``directory`` (ingest's temporary output,
    renamed into place with the snapshot)."""
    paths, stats, shas = [], [], []
    for path, stat, sha in entries:
        paths.append(path)
        stats.append(stat)
        shas.append(sha)
    offsets = np.zeros(len(paths) + 1, dtype=np.int64)  # in characters: the bytes are
    np.cumsum([len(p) for p in paths], out=offsets[1:])  # decoded as one string, then cut
    blob = "".join(paths).encode("utf-8", "surrogateescape")
    dest = Path(directory) / STAT_FILE
    with open(dest, "wb") as fh:
        np.savez(
            fh,
            version=np.int64(VERSION),
            taken_ns=np.int64(taken_ns),
            paths=np.frombuffer(blob, dtype=np.uint8),
            offsets=offsets,
            ids=np.asarray([st[:2] for st in stats], dtype=np.uint64).reshape(-1, 2),
            times=np.asarray([st[2:] for st in stats], dtype=np.int64).reshape(-1, 3),
            sha256=np.frombuffer(bytes.fromhex("".join(shas)), dtype=np.uint8),
        )
    return dest


def clock() -> int:
    """The wall clock in nanoseconds, the clock file times are set from (tests inject
    theirs)."""
    return time.time_ns()
