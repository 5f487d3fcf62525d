"""Archives written by FFRecord's ``pack_folder`` ("legacy packed folders"), read safely.

``pack_folder`` writes one record per file and then a metadata record: the 9 bytes
``b"piouhjgbr"`` and a pickle of nested ``collections.OrderedDict`` (name -> record index,
or name -> sub-directory).  ``pickle.loads`` on it would run whatever code a hostile file
carries, so this module never unpickles: it interprets the opcode stream itself and
accepts only what ``pack_folder`` writes (protocols 2 to 5; ``tests/vectors/ffrecord``
lists every opcode), with limits on depth, name length and total path bytes.  Anything
else is a FormatError.

The decoded tree becomes a packfs path table built in memory (O(entries) memory, once,
at open); ``packfs convert`` writes a native archive that opens in O(1).  Legacy archives
hold no modes, owners or times: files are served 0444, directories 0555, with the
archive's own owner and mtime.
"""

from __future__ import annotations

import os
import struct

from ..errors import FormatError

__all__ = ["MAGIC", "is_legacy", "parse_tree", "legacy_rows", "legacy_table"]

MAGIC = b"piouhjgbr"
MAX_DEPTH = 256
MAX_NAME_BYTES = 4096
FILE_MODE = 0o100444
DIR_MODE = 0o040555


def is_legacy(last_record_head: bytes) -> bool:
    """Whether a last record ``metadata`` is an FFRecord packed folder's (its magic bytes)."""
    return last_record_head[: len(MAGIC)] == MAGIC


class _OrderedDictClass:
    """The only global a pack_folder pickle names."""


class _EmptyTuple:
    pass


_ORDERED_DICT = _OrderedDictClass()
_EMPTY_TUPLE = _EmptyTuple()


class _Directory(dict):
    """A decoded OrderedDict (dicts keep insertion order), keyed by names as the bytes
    they stand for."""

    placed = False  # already the value of some name: a second use would make a DAG


def parse_tree(data: bytes | memoryview, where: str) -> _Directory:
    """Decode a pack_folder metadata pickle (the bytes after the magic) into nested
    dicts of name (bytes) -> record index (int) or sub-directory, without unpickling.

    A name is the string pack_folder got from os.listdir, so its bytes are its UTF-8
    with surrogateescape; names are compared as those bytes, because different
    strings can stand for the same bytes ("\\u00e9" and "\\udcc3\\udca9" are both
    b"\\xc3\\xa9"), and a second such name would silently hide the first."""
    data = bytes(data)

    def fail(message: str) -> FormatError:
        return FormatError(f"{where}: FFRecord packed-folder metadata: {message}")

    stack: list[object] = []
    marks: list[int] = []
    memo: dict[int, object] = {}
    position, end = 0, len(data)

    def take(count: int) -> bytes:
        nonlocal position
        if count < 0 or position + count > end:
            raise fail("truncated")
        chunk = data[position : position + count]
        position += count
        return chunk

    def pop() -> object:
        if len(stack) <= (marks[-1] if marks else 0):
            raise fail("stack underflow")
        return stack.pop()

    def text(raw: bytes) -> str:
        try:
            return raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise fail("a string is not UTF-8") from None

    def add(directory: object, key: object, value: object) -> None:
        if not isinstance(directory, _Directory):
            raise fail("an item is set on something that is not an OrderedDict")
        if not isinstance(key, str):
            raise fail(f"a name is a {type(key).__name__}, expected a string")
        try:
            name = key.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise fail(f"the name {key!r} is not a file name") from None
        if isinstance(value, _Directory):
            if value.placed or value is directory:
                raise fail("a directory appears twice in the tree")
            value.placed = True
        elif type(value) is not int:
            raise fail(f"{key!r} maps to a {type(value).__name__}, expected a record index or a directory")
        if name in directory:
            raise fail(f"the name {key!r} appears twice in one directory (as the bytes {name!r})")
        directory[name] = value

    first = True
    while True:
        opcode = take(1)
        if first and opcode != b"\x80":
            raise fail("no PROTO opcode: not a pickle of protocol 2 or later")
        first = False
        if opcode == b"\x80":  # PROTO
            protocol = take(1)[0]
            if not 2 <= protocol <= 5:
                raise fail(f"pickle protocol {protocol}, expected 2 to 5")
        elif opcode == b"\x95":  # FRAME: a length hint only
            take(8)
        elif opcode == b"c":  # GLOBAL "module\nname\n"
            line_end = data.find(b"\n", position)
            line_end = data.find(b"\n", line_end + 1) if line_end >= 0 else -1
            if line_end < 0:
                raise fail("truncated GLOBAL")
            if take(line_end + 1 - position) != b"collections\nOrderedDict\n":
                raise fail("a global other than collections.OrderedDict")
            stack.append(_ORDERED_DICT)
        elif opcode == b"\x93":  # STACK_GLOBAL
            name, module = pop(), pop()
            if (module, name) != ("collections", "OrderedDict"):
                raise fail(f"the global {module!r}.{name!r}, expected collections.OrderedDict")
            stack.append(_ORDERED_DICT)
        elif opcode == b"\x8c":  # SHORT_BINUNICODE
            stack.append(text(take(take(1)[0])))
        elif opcode == b"X":  # BINUNICODE
            stack.append(text(take(struct.unpack("<I", take(4))[0])))
        elif opcode == b"\x8d":  # BINUNICODE8
            stack.append(text(take(struct.unpack("<Q", take(8))[0])))
        elif opcode == b"K":  # BININT1
            stack.append(take(1)[0])
        elif opcode == b"M":  # BININT2
            stack.append(struct.unpack("<H", take(2))[0])
        elif opcode == b"J":  # BININT
            stack.append(struct.unpack("<i", take(4))[0])
        elif opcode == b"\x8a":  # LONG1
            size = take(1)[0]
            if size > 8:
                raise fail("an integer of more than 64 bits")
            stack.append(int.from_bytes(take(size), "little", signed=True))
        elif opcode == b")":  # EMPTY_TUPLE
            stack.append(_EMPTY_TUPLE)
        elif opcode == b"}":  # EMPTY_DICT
            stack.append(_Directory())
        elif opcode == b"R":  # REDUCE: only OrderedDict()
            arguments, callable_ = pop(), pop()
            if callable_ is not _ORDERED_DICT or arguments is not _EMPTY_TUPLE:
                raise fail("REDUCE of something other than OrderedDict()")
            stack.append(_Directory())
        elif opcode == b"\x94":  # MEMOIZE
            if not stack:
                raise fail("MEMOIZE on an empty stack")
            memo[len(memo)] = stack[-1]
        elif opcode in (b"q", b"r"):  # BINPUT, LONG_BINPUT
            index = take(1)[0] if opcode == b"q" else struct.unpack("<I", take(4))[0]
            if not stack:
                raise fail("PUT on an empty stack")
            memo[index] = stack[-1]
        elif opcode in (b"h", b"j"):  # BINGET, LONG_BINGET
            index = take(1)[0] if opcode == b"h" else struct.unpack("<I", take(4))[0]
            if index not in memo:
                raise fail(f"GET of memo slot {index}, which was never set")
            stack.append(memo[index])
        elif opcode == b"(":  # MARK
            marks.append(len(stack))
        elif opcode == b"s":  # SETITEM
            value, key = pop(), pop()
            add(stack[-1] if stack else None, key, value)
        elif opcode == b"u":  # SETITEMS
            if not marks:
                raise fail("SETITEMS without MARK")
            start = marks.pop()
            items = stack[start:]
            del stack[start:]
            if len(items) % 2:
                raise fail("SETITEMS with an odd number of items")
            target = stack[-1] if stack else None
            for index in range(0, len(items), 2):
                add(target, items[index], items[index + 1])
        elif opcode == b".":  # STOP
            if marks or len(stack) != 1 or not isinstance(stack[0], _Directory):
                raise fail("the pickle does not end with exactly one OrderedDict")
            if position != end:
                raise fail(f"{end - position} bytes after the pickle's STOP")
            return stack[0]  # type: ignore[return-value]
        else:
            raise fail(f"opcode {opcode!r} at byte {position - 1}, which pack_folder never writes")


def legacy_rows(tree: object, file_records: int, where: str):
    """(path, kind, record) for every entry of a decoded tree, depth-first in the
    tree's own order; checks names, depth, indices (each record once) and total size."""

    def fail(message: str) -> FormatError:
        return FormatError(f"{where}: FFRecord packed-folder metadata: {message}")

    used = bytearray(file_records)
    budget = 64 * (1 << 20)  # total bytes of all paths: a nested pickle may not explode
    pending: list[tuple[bytes, int, object]] = [(b"", 0, tree)]
    while pending:
        prefix, depth, directory = pending.pop()
        if depth > MAX_DEPTH:
            raise fail(f"directories nested deeper than {MAX_DEPTH}")
        children = []
        for raw, value in directory.items():  # type: ignore[attr-defined]
            if not raw or b"/" in raw or b"\0" in raw or raw in (b".", b"..") or len(raw) > MAX_NAME_BYTES:
                raise fail(f"the name {os.fsdecode(raw)!r} is not a valid file name")
            path = prefix + raw
            budget -= len(path)
            if budget < 0:
                raise fail("the tree's paths add up to more than 64 MiB")
            if isinstance(value, dict):
                yield path, "dir", -1
                children.append((path + b"/", depth + 1, value))
            else:
                if not 0 <= value < file_records:
                    raise fail(f"{os.fsdecode(path)!r} names record {value}, expected 0 to {file_records - 1}")
                if used[value]:
                    raise fail(f"record {value} is named by two paths")
                used[value] = 1
                yield path, "file", value
        pending.extend(reversed(children))


def legacy_table(container, metadata: bytes, where: str):
    """(footer, PathTable) for a packed folder: its tree as a packfs path table in
    memory, over the archive's own records."""
    from ..format import NO_RECORD, SECTION_COUNT, Footer
    from .pathtable import PathTable
    from .tablebuild import TableRows, build_tables, table_image

    file_records = container.record_count - 1
    tree = parse_tree(memoryview(metadata)[len(MAGIC):], where)
    uid, gid, mtime_ns = container.source.owner  # legacy archives hold no owners or times
    rows = TableRows()
    rows.add(b"", DIR_MODE, uid, gid, mtime_ns, 0, NO_RECORD)
    for path, kind, record in legacy_rows(tree, file_records, where):
        if kind == "dir":
            rows.add(path, DIR_MODE, uid, gid, mtime_ns, 0, NO_RECORD)
        else:
            start, end = container.record_span(record)
            rows.add(path, FILE_MODE, uid, gid, mtime_ns, end - start, record)
    footer = Footer(1, 0, 0, len(rows), file_records, SECTION_COUNT)
    image, spans = table_image(build_tables(rows))
    # bytes, not the bytearray it was built in: names sliced from it must be bytes, as
    # they are from an archive's map (os.fsdecode refuses a bytearray).
    return footer, PathTable(container, footer, image=(bytes(image), spans))
