"""moto_server for bench/remote_peers.py, whose ranged GETs read only their range.

moto (5.x) builds every GET's body from the whole object and slices the range out
afterwards (``S3Response._handle_range_header``): a 64-byte ranged GET of a 1 GiB
object reads 1 GiB from its spooled temporary file.  Real S3 does not, and the
benchmark's ranged GETs (packfs's one per sample, litData's and MosaicML's few) would
measure moto's copying instead of the clients.  Here ``get_object`` answers a
GET with a single ``bytes=A-B`` or ``bytes=-N`` Range by a body that reads only what
``_handle_range_header`` slices from it; every other request (no Range, several
ranges, a malformed one) gets moto's own answer.

    python bench/remote_peers_moto.py -H 127.0.0.1 -p PORT
"""

from __future__ import annotations

import re
import sys
import threading

from moto.s3.responses import S3Response
from moto.server import main

_SINGLE_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class _RangeReader:
    """The object's bytes as ``_handle_range_header`` uses them: its length, and one
    slice read from the key's buffer under the key's lock."""

    def __init__(self, key) -> None:
        self.key = key

    def __len__(self) -> int:
        return self.key.size

    def __bool__(self) -> bool:
        return self.key.size > 0

    def __getitem__(self, part: slice) -> bytes:
        start = part.start or 0
        stop = self.key.size if part.stop is None else min(part.stop, self.key.size)
        with self.key.lock:
            self.key._value_buffer.seek(start)
            return self.key._value_buffer.read(max(0, stop - start))


_get_object = S3Response.get_object
_serving = threading.local()  # the key whose ranged GET this thread is answering


def _ranged_get_object(self):
    wanted = _SINGLE_RANGE.match(self.headers.get("range", "") or "")
    if not wanted or not (wanted.group(1) or wanted.group(2)):
        return _get_object(self)
    key, _ = self._get_key()
    first, last = wanted.group(1), wanted.group(2)
    if first and last and int(first) > int(last) or key.size == 0:
        return _get_object(self)  # moto's own answer to what is not a plain range
    _serving.key = key
    try:
        return _get_object(self)  # whose key.value is then the reader (_value below)
    finally:
        _serving.key = None


def _patch() -> None:
    from moto.s3.models import FakeKey

    whole = FakeKey.value

    def value(key):
        return _RangeReader(key) if getattr(_serving, "key", None) is key else whole.fget(key)

    FakeKey.value = property(value, whole.fset)
    S3Response.get_object = _ranged_get_object


if __name__ == "__main__":
    _patch()
    main(sys.argv[1:])
