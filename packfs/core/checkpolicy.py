"""The checksum policy: when a read checks the CRCs of the contents it returns.

One :class:`ChecksumPolicy` per opened archive answers, for every read call and file
object, "must record r be checked now?" and records what a check found:

- ``"always"``: every read checks (a file object once, at open);
- ``"once"``: a record is checked the first time it is read and the outcome kept in two
  bitmaps of one bit per data record, sound and failed (a mount reads a large file in
  128 KiB requests: checked once, not once per request; a damaged record fails every
  later read at once, without being read again).  A record with piece CRCs (format
  section 4b) has the two bits per piece instead.  A check read from the source is made
  by one thread at a time per record (or piece); the others wait and find its outcome;
- ``"never"``: nothing is checked.

Memory is bounded by the archive's size (a bit or two per record and per piece), never
by the reads made.  The hottest read of stored files (``Archive.read_path`` and
``Archive.read``'s whole-file case) reads :attr:`ChecksumPolicy.checked` and
:attr:`ChecksumPolicy.every_read` inline, and calls :meth:`ChecksumPolicy.check` for
everything else: this class is still where the rule lives.
"""

from __future__ import annotations

import os
import threading
import weakref
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from ..errors import ChecksumError
from ..format import PIECE_SIZE, crc32
from .codecs import Where
from .container import Container
from .pieces import PieceTable

__all__ = ["ChecksumPolicy", "CHECKSUM_POLICIES"]

CHECKSUM_POLICIES = ("always", "once", "never")

# Every live policy, so a forked child can replace the locks a parent's thread held at
# the fork (a lock is copied held, and no thread of the child would release it).
_LIVE: "weakref.WeakSet[ChecksumPolicy]" = weakref.WeakSet()


def _new_locks_in_child() -> None:
    for policy in list(_LIVE):
        policy._lock = threading.Lock()
        policy._in_progress = {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_in_child)


def _bit_set(bitmap: bytearray, index: int) -> bool:
    return bool(bitmap[index >> 3] & (1 << (index & 7)))


def _set_bit(bitmap: bytearray, index: int) -> None:
    bitmap[index >> 3] |= 1 << (index & 7)


class ChecksumPolicy:
    """When the records of one archive are checked, and what their checks found.

    Parameters
    ----------
    kind
        ``"always"``, ``"once"`` or ``"never"``.
    container
        The archive's container: its stored CRCs, and its bytes for a check read from
        the source.
    pieces
        Its piece CRCs (format section 4b).
    record_count
        Its data records: the bitmaps' size.
    label
        Makes a quoted file name from an entry number or a path, for messages.
    """

    __slots__ = ("kind", "every_read", "checked", "failed", "pieces_checked", "pieces_failed", "_container",
                 "_pieces", "_label", "_lock", "_in_progress", "__weakref__")

    def __init__(self, kind: str, container: Container, pieces: PieceTable, record_count: int,
                 label: Callable[[Where], str]) -> None:
        if kind not in CHECKSUM_POLICIES:
            raise ValueError(f"checksums must be one of {CHECKSUM_POLICIES}, got {kind!r}")
        self.kind = kind
        #: Whether every read checks ("always"); the hot paths read it inline.
        self.every_read = kind == "always"
        once = kind == "once"
        #: Under "once", one bit per data record checked and found sound (else None).
        self.checked: Optional[bytearray] = bytearray((record_count + 7) // 8) if once else None
        #: Under "once", one bit per data record that failed its check.
        self.failed: Optional[bytearray] = bytearray((record_count + 7) // 8) if once else None
        self.pieces_checked = bytearray((pieces.piece_total + 7) // 8) if once else None
        self.pieces_failed = bytearray((pieces.piece_total + 7) // 8) if once else None
        self._container, self._pieces, self._label = container, pieces, label
        # Checks being read from the source now, under "once" (at most one per thread):
        # key (a record, or below 0 a piece) -> the lock its checking thread holds.
        self._in_progress: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()
        if once:
            _LIVE.add(self)

    @property
    def checks(self) -> bool:
        """Whether anything is checked at all (the policy is not "never")."""
        return self.kind != "never"

    # -- records -----------------------------------------------------------------------

    def must_check(self, record: int, where: Where) -> bool:
        """Whether record ``record`` is to be checked before its bytes are used: under
        "always" yes, under "never" no, under "once" unless found sound before;
        ChecksumError naming ``where`` if it failed before (it is not read again)."""
        checked = self.checked
        if checked is None:
            return self.every_read
        if _bit_set(checked, record):
            return False
        self.raise_if_failed(record, where)
        return True

    def raise_if_failed(self, record: int, where: Where) -> None:
        """Under "once", ChecksumError if record ``record`` failed an earlier check."""
        failed = self.failed
        if failed is not None and _bit_set(failed, record):
            raise self._container.checksum_error(record, self._label(where))

    def check(self, record: int, data: bytes | memoryview | None, where: Where) -> None:
        """Check record ``record``'s CRC, over ``data`` if it is the whole record, else
        read from the source (under "once" by one thread at a time); under "once" record
        the outcome, sound or failed (a record that failed before raises unread).
        ChecksumError names ``where``: an entry (its path built only then) or a path."""
        container = self._container
        failed = self.failed
        if failed is not None and _bit_set(failed, record):
            raise container.checksum_error(record, self._label(where))
        if data is None:
            if failed is not None:
                self._check_once_from_source(record, where)
                return
            if not container.record_crc_ok(record):
                raise container.checksum_error(record, self._label(where))
            return
        if crc32(data) != container.crc_items[record]:
            if failed is not None:
                _set_bit(failed, record)
            container.check_crc(record, data, self._label(where))  # raises, with details
        if self.checked is not None:
            _set_bit(self.checked, record)

    def check_if_due(self, record: int, data: bytes | memoryview | None, where: Where) -> None:
        """:meth:`check` if :meth:`must_check` says so, in one call (every read of a
        whole record makes it; a sound record under "always" costs its CRC only)."""
        checked = self.checked
        if checked is None:
            if self.every_read and (data is None or crc32(data) != self._container.crc_items[record]):
                self.check(record, data, where)  # reads it from the source, or raises
        elif not checked[record >> 3] & (1 << (record & 7)):
            self.check(record, data, where)  # raises at once if it failed before

    def _check_once_from_source(self, record: int, where: Where) -> None:
        # A large file's first READs arrive several at once (the kernel's readahead and a
        # mount's worker threads), and each used to read and check all of the record.
        with self._checking(record):
            checked: bytearray = self.checked  # type: ignore[assignment]  # "once": bitmaps
            failed: bytearray = self.failed  # type: ignore[assignment]
            if not _bit_set(checked, record):
                container = self._container
                if _bit_set(failed, record) or not container.record_crc_ok(record):
                    _set_bit(failed, record)
                    raise container.checksum_error(record, self._label(where))
                _set_bit(checked, record)

    @contextmanager
    def _checking(self, key: int) -> Iterator[None]:
        """Hold the lock of check ``key`` (a record, or below 0 a piece): the threads
        that want the same check wait for the one doing it."""
        with self._lock:
            lock = self._in_progress.setdefault(key, threading.Lock())
        with lock:
            try:
                yield
            finally:
                with self._lock:
                    if self._in_progress.get(key) is lock:
                        del self._in_progress[key]

    # -- pieces (format section 4b) ------------------------------------------------------

    def read_pieces(self, first: int, start: int, end: int, begin: int, stop: int, where: Where) -> bytes:
        """Bytes [begin, stop) of a record at [start, end) whose piece CRCs start at
        ``first``, the pieces they cover checked under the policy: read once, checked,
        and the reply cut from them, so the bytes returned are the bytes checked."""
        if begin >= stop:
            return b""
        low, high = (begin - start) // PIECE_SIZE, (stop - start - 1) // PIECE_SIZE + 1
        checked = self.pieces_checked
        if checked is None:
            return self._check_pieces(first, start, end, low, high, begin, stop, where)
        pieces = range(first + low, first + high)
        if all(_bit_set(checked, p) for p in pieces):
            return self._container.pread(begin, stop, end)
        with self._checking(-1 - first - low):  # below 0: never a record's key
            failed: bytearray = self.pieces_failed  # type: ignore[assignment]
            for p in range(low, high):  # failed while we waited, or before
                if _bit_set(failed, first + p):
                    raise self._piece_error(p, start, end, where)
            if all(_bit_set(checked, p) for p in pieces):  # checked while we waited
                return self._container.pread(begin, stop, end)
            return self._check_pieces(first, start, end, low, high, begin, stop, where)

    def _piece_error(self, p: int, start: int, end: int, where: Where) -> ChecksumError:
        return ChecksumError(f"{self._container.path!r}: {self._label(where)}: checksum mismatch in bytes "
                             f"[{p * PIECE_SIZE}, {min(end - start, (p + 1) * PIECE_SIZE)})")

    def _check_pieces(self, first: int, start: int, end: int, low: int, high: int, begin: int, stop: int,
                      where: Where) -> bytes:
        span_start = start + low * PIECE_SIZE
        data = self._container.pread(span_start, min(end, start + high * PIECE_SIZE), end)
        view = memoryview(data)
        checked, failed, pieces = self.pieces_checked, self.pieces_failed, self._pieces
        for p in range(low, high):
            at = (p - low) * PIECE_SIZE
            if crc32(view[at: at + PIECE_SIZE]) != pieces.crc(first + p):
                if failed is not None:
                    _set_bit(failed, first + p)
                raise self._piece_error(p, start, end, where)
            if checked is not None:
                _set_bit(checked, first + p)
        return data[begin - span_start: stop - span_start]
