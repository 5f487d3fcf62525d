"""An fsspec file system over a packfs archive (``pip install packfs[fsspec]``).

Registered under the protocol ``packfs`` (an entry point), so any fsspec-aware tool
reads files inside an archive by URL.  The archive is named in one of three ways:

- in the URL's path: ``packfs://data.ffr/train/cat/1.jpg``,
  ``packfs:///srv/data.ffr/labels.csv`` (absolute).  The archive is the prefix of the
  path that is an existing local file; there is at most one, since nothing on a local
  file system lies below a file.  The file system's paths then start with the
  archive's (``fs.ls("data.ffr/train")``);
- chained, as fsspec chains file systems: ``packfs://train/cat/1.jpg::data.ffr``, and
  from S3 or HTTP(S): ``packfs://train/cat/1.jpg::s3://bucket/data.ffr`` (the ``s3``
  part's options as fsspec passes a chain's: ``s3={"endpoint_url": ...}``);
- as ``fo``: ``fsspec.open("packfs://train/cat/1.jpg", fo="data.ffr")``,
  ``storage_options={"fo": "data.ffr"}``; paths are then inside the archive.  A remote
  ``fo`` (``"s3://bucket/data.ffr"``, or ``"bucket/data.ffr"`` with
  ``target_protocol="s3"``) takes its credentials and endpoint as ``target_options``
  (fsspec's name, as ``zip`` and ``tar`` take it) or ``storage_options``.

packfs reads a remote archive itself (:mod:`packfs.source.remote`): neither s3fs nor
aiohttp is needed.  fsspec looks up the class of every protocol in a chain, even one
it will not use; where s3fs (or aiohttp, for http(s)) is not installed, importing this
module registers a stand-in for ``s3``, ``http`` and ``https`` that serves only that
look-up (used on its own it raises fsspec's ImportError).  So without s3fs, a chained
URL works once ``packfs.fsspec`` is imported (``import packfs.fsspec``; any earlier
``packfs://`` URL in the process also imports it).

::

    fsspec.open("packfs://data.ffr/train/cat/1.jpg")
    pandas.read_csv("packfs://data.ffr/labels.csv")
    fs = fsspec.filesystem("packfs", fo="data.ffr"); fs.ls("train"); fs.glob("**/*.jpg")
    fs = fsspec.filesystem("packfs", fo="s3://bucket/data.ffr", target_options={"anon": True})

Read-only: anything that would write raises ``PermissionError``.  Files open as
``PackedFolder.open`` opens them (seekable, CRC checked once at open when
``check_data``); text mode wraps them in ``io.TextIOWrapper``, as fsspec does.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from .errors import PathNotFoundError, missing_dependency

try:
    from fsspec import AbstractFileSystem
except ImportError as error:
    raise missing_dependency(error, "fsspec", "packfs.fsspec", "fsspec") from None
from .folder import PackedFolder

__all__ = ["PackfsFileSystem", "URL_FORMS"]

_TYPES = {"dir": "directory", "file": "file", "symlink": "link"}
URL_FORMS = ('packfs://ARCHIVE/PATH with ARCHIVE an existing local file (packfs://data.ffr/train/1.jpg, '
             'packfs:///srv/data.ffr/train/1.jpg), packfs://PATH::ARCHIVE (packfs://train/1.jpg::data.ffr), '
             'or packfs://PATH with fo=ARCHIVE (storage_options={"fo": "data.ffr"})')


def _archive_in(url_path: str) -> str | None:
    """The prefix of ``url_path`` (whole components) that is an existing file, or None.
    At most one can be: below a file nothing exists, so the search stops there."""
    parts = url_path.split("/")
    for count in range(1, len(parts) + 1):
        candidate = "/".join(parts[:count])
        if not candidate.strip("/"):
            continue  # the root of an absolute path
        if os.path.isfile(candidate):
            return candidate
        if not os.path.isdir(candidate):
            return None
    return None


class PackfsFileSystem(AbstractFileSystem):
    """A read-only fsspec file system over one archive, named by ``fo=ARCHIVE``
    (``storage_options={"fo": "data.ffr"}``), by the URL's path
    (``packfs://data.ffr/labels.csv``) or by a chained URL
    (``packfs://labels.csv::data.ffr``, ``packfs://labels.csv::s3://bucket/data.ffr``);
    a remote archive's options (credentials, endpoint) are ``target_options``, or
    ``storage_options``, ``target_protocol`` its scheme when ``fo`` has none; ls, info,
    cat, glob and seekable ``open`` work, every write is refused.

    Raises
    ------
    ValueError
        No archive is named (the message lists the URL forms).
    RemoteArchiveError
        The archive is chained from a remote file system packfs does not read (it reads
        ``::s3://...`` and ``::http(s)://...``), or options are given for a local one.
    """
    protocol = "packfs"
    root_marker = ""

    def __init__(self, fo: str | os.PathLike[str] = "", check_data: bool = True,
                 archive_in_url: str | None = None, target_protocol: str | None = None, **kwargs: Any) -> None:
        # A remote archive's options (credentials, endpoint): fsspec's target_options
        # (what a chain's s3={...} becomes), or storage_options, as PackedFolder names them.
        target_options = {**(kwargs.pop("storage_options", None) or {}), **(kwargs.pop("target_options", None) or {})}
        super().__init__(**kwargs)
        if target_protocol not in (None, "file", "local") and "://" not in os.fspath(fo):
            # Chained from another file system (packfs://x::s3://bucket/a.ffr, given as
            # fo="bucket/a.ffr", target_protocol="s3"): its URL, which the source layer
            # reads (or reports as a scheme it does not read).  fsspec's http gives the
            # whole URL already, as the stand-ins below do.
            fo = f"{target_protocol}://{os.fspath(fo)}"
        if fo and archive_in_url and not _same_file(fo, archive_in_url):
            archive_in_url = None  # a path inside fo that happens to name a local file
        if not fo and not archive_in_url:
            raise ValueError(f"the packfs file system needs an archive; no prefix of the URL's path is an "
                             f"existing file.  packfs URLs are {URL_FORMS}")
        # In a URL's path the archive comes first, and every path of this file system
        # starts with it, so that glob and walk give back URLs that open.
        self.prefix = archive_in_url.strip("/") if archive_in_url else ""
        self.folder = PackedFolder(fo or archive_in_url, check_data=check_data,  # type: ignore[arg-type]
                                   storage_options=target_options or None)

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return super()._strip_protocol(path).strip("/")

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        if not path.startswith("packfs://"):
            return {}
        archive = _archive_in(path[len("packfs://"):].partition("::")[0])
        return {"archive_in_url": archive} if archive else {}

    def _inner(self, path: str) -> str:
        """A path of this file system as a path inside the archive."""
        path = self._strip_protocol(path)
        if not self.prefix:
            return path
        if path == self.prefix:
            return ""
        if path.startswith(self.prefix + "/"):
            return path[len(self.prefix) + 1 :]
        raise FileNotFoundError(f"{path!r} is not in the archive {self.prefix!r}: paths of this file system "
                                f"start with it ({self.prefix}/PATH)")

    def _outer(self, inner: str) -> str:
        """A path inside the archive as a path of this file system."""
        if not self.prefix:
            return inner
        return f"{self.prefix}/{inner}" if inner else self.prefix

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        """Attributes of ``path`` in fsspec's form (name, size, type, mode, mtime, uid, gid, nlink)."""
        inner = self._inner(path)
        try:
            stat = self.folder.stat(inner)
        except PathNotFoundError:
            raise FileNotFoundError(self._outer(inner)) from None
        info = {"name": self._outer(inner), "size": stat.size, "type": _TYPES[stat.kind], "mode": stat.mode,
                "mtime": stat.mtime_ns / 1e9, "uid": stat.uid, "gid": stat.gid, "nlink": stat.nlink}
        if stat.kind == "symlink":
            info["destination"] = self.folder.readlink(inner)
        return info

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        """The entries of directory ``path`` (with ``detail``, their info dicts)."""
        outer = self._outer(self._inner(path))
        info = self.info(outer)
        if info["type"] != "directory":
            entries = [info]
        else:
            entries = [self.info(f"{outer}/{name}" if outer else name) for name in self.folder.list(self._inner(outer))]
        return entries if detail else [entry["name"] for entry in entries]

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        """The bytes of file ``path``, or of [start, end) of it."""
        return self.folder.read(self._inner(path))[start:end]

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if mode != "rb":
            raise PermissionError(f"a packfs archive is read-only (mode {mode!r})")
        return self.folder.open(self._inner(path))

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise PermissionError("a packfs archive is read-only")

    mkdir = makedirs = rm = rm_file = rmdir = mv = cp_file = put_file = touch = _read_only


def _same_file(first: str | os.PathLike[str], second: str) -> bool:
    try:
        return os.path.samefile(first, second)
    except OSError:
        return False


class _ChainStandIn(AbstractFileSystem):
    """Stands in for a remote file system that is not installed (s3fs; fsspec's http
    without aiohttp) when fsspec parses ``packfs://PATH::s3://...``: fsspec looks up the
    class of each protocol in a chain, and packfs reads the archive at that URL itself.
    Used on its own, it raises the ImportError fsspec would have."""

    missing = ""  # fsspec's message: what to install

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ImportError(f"{self.missing} (packfs reads archives at {self.protocol}:// URLs without it: "
                          f"packfs://PATH::{self.protocol}://...)")

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return path  # the whole URL, for packfs's own remote source

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        return {}


# protocol -> the module its fsspec implementation cannot be imported without.
_CHAIN_TARGETS = {"s3": "s3fs", "http": "aiohttp", "https": "aiohttp"}


def _register_chain_stand_ins() -> None:
    """A stand-in for each protocol of _CHAIN_TARGETS whose implementation is not
    installed (nothing is replaced: a protocol already registered is left alone)."""
    from fsspec.registry import known_implementations, register_implementation, registry

    for protocol, module in _CHAIN_TARGETS.items():
        if protocol in registry or _importable(module):
            continue
        missing = known_implementations.get(protocol, {}).get("err") or f"Install {module} to access {protocol}://"
        stand_in = type(f"PackfsChainStandIn_{protocol}", (_ChainStandIn,), {"protocol": protocol, "missing": missing})
        register_implementation(protocol, stand_in)


def _importable(module: str) -> bool:
    """Whether ``module`` is installed (found, not imported: s3fs imports a lot)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


_register_chain_stand_ins()
