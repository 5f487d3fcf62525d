"""An fsspec file system over a packfs archive (``pip install packfs[fsspec]``).

Registered under the protocol ``packfs`` (an entry point), so any fsspec-aware tool
reads files inside an archive by URL, the archive given as ``fo``::

    fsspec.open("packfs://train/cat/1.jpg", fo="data.ffr")
    pandas.read_csv("packfs://labels.csv", storage_options={"fo": "data.ffr"})
    fs = fsspec.filesystem("packfs", fo="data.ffr"); fs.ls("train"); fs.glob("**/*.jpg")

Read-only: anything that would write raises ``PermissionError``.  Files open as
``PackedFolder.open`` opens them (seekable, CRC checked once at open when
``check_data``); text mode wraps them in ``io.TextIOWrapper``, as fsspec does.
"""

from __future__ import annotations

import os
from typing import Any

from fsspec import AbstractFileSystem

from .errors import PathNotFoundError
from .folder import PackedFolder

__all__ = ["PackfsFileSystem"]

_TYPES = {"dir": "directory", "file": "file", "symlink": "link"}


class PackfsFileSystem(AbstractFileSystem):
    """A read-only fsspec file system over one archive: ``packfs://PATH`` with
    ``fo=ARCHIVE`` (``storage_options={"fo": "data.ffr"}``); ls, info, cat, glob and seekable
    ``open`` work, every write is refused."""
    protocol = "packfs"
    root_marker = ""

    def __init__(self, fo: str | os.PathLike[str] = "", check_data: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not fo:
            raise ValueError('the packfs file system needs the archive: fo="data.ffr"')
        self.folder = PackedFolder(fo, check_data=check_data)

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return super()._strip_protocol(path).strip("/")

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        """Attributes of ``path`` in fsspec's form (name, size, type, mode, mtime, uid, gid, nlink)."""
        path = self._strip_protocol(path)
        try:
            stat = self.folder.stat(path)
        except PathNotFoundError:
            raise FileNotFoundError(path) from None
        info = {"name": path, "size": stat.size, "type": _TYPES[stat.kind], "mode": stat.mode,
                "mtime": stat.mtime_ns / 1e9, "uid": stat.uid, "gid": stat.gid, "nlink": stat.nlink}
        if stat.kind == "symlink":
            info["destination"] = self.folder.readlink(path)
        return info

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        """The entries of directory ``path`` (with ``detail``, their info dicts)."""
        path = self._strip_protocol(path)
        info = self.info(path)
        if info["type"] != "directory":
            entries = [info]
        else:
            entries = [self.info(f"{path}/{name}" if path else name) for name in self.folder.list(path)]
        return entries if detail else [entry["name"] for entry in entries]

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        """The bytes of file ``path``, or of [start, end) of it."""
        return self.folder.read(self._strip_protocol(path))[start:end]

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if mode != "rb":
            raise PermissionError(f"a packfs archive is read-only (mode {mode!r})")
        return self.folder.open(self._strip_protocol(path))

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise PermissionError("a packfs archive is read-only")

    mkdir = makedirs = rm = rm_file = rmdir = mv = cp_file = put_file = touch = _read_only
