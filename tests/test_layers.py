"""The package's layers, checked from the source: imports run one way (docs/ARCHITECTURE.md),
no module reads another module's private names, and every public name has a docstring."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "packfs"

# Lower layers never import higher ones.  Modules of one layer may import each other.
LAYERS = {
    "errors": 0, "format": 1,
    "source": 2, "_sigbus": 2,  # the compiled SIGBUS guard of packfs.source.local
    "core": 3,
    "write": 4,
    "folder": 5, "extract": 5, "records": 5, "nodecache": 5,
    "dataset": 6, "torch": 6, "fsspec": 6, "ffrecord": 6, "fuse": 6, "mount": 6,
    "_lowlevel": 6,  # the compiled daemon, imported by packfs.fuse.inodedaemon
    "cli": 7, "__main__": 7, "manpage": 7,
}
# Names with a leading underscore that are public by convention (namedtuple's API) or
# the standard library's.
CONVENTIONAL = {"_fields", "_make", "_asdict", "_replace", "_exit", "_getframe",
                "_name",  # ctypes.CDLL's: the library's path
                "_sigbus",  # packfs's compiled extension modules, imported by packfs.source.local
                "_lowlevel",  # and by packfs.fuse.inodedaemon
                "_format"}  # packfs.core's compiled format library, imported by packfs.folder


def modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(name: str) -> int | None:
    """The layer of module ``packfs.X...`` (None for the package itself)."""
    parts = name.split(".")
    return LAYERS[parts[1]] if len(parts) > 1 else None


def imported_modules(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, names) of every import of a packfs module in ``path``."""
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found = []
    tree = ast.parse(path.read_text())
    # Imports for type annotations only (under "if TYPE_CHECKING:") never run.
    typing_only = {id(inner) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                   for inner in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "packfs" or target.startswith("packfs."):
                names = [alias.name for alias in node.names]
                # "from . import x": x is a module.
                if not node.module:
                    for name in names:
                        if name.startswith("__"):
                            continue  # "from . import __version__": a name, not a module
                        found.append((node.lineno, f"{target}.{name}", []))
                    continue
                found.append((node.lineno, target, names))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("packfs"):
                    found.append((node.lineno, alias.name, []))
    return found


def test_imports_run_one_way() -> None:
    wrong = []
    for path in modules():
        own = module_name(path)
        own_layer = layer_of(own)
        if own_layer is None:
            continue  # packfs/__init__.py re-exports the public API of every layer
        for line, target, _ in imported_modules(path):
            target_layer = layer_of(target)
            if target_layer is not None and target_layer > own_layer:
                # The one exception: mount(8)'s helper (packfs.fuse.process.mount_helper)
                # runs the command line's own parsing, imported when it runs.
                if own == "packfs.fuse.process" and target == "packfs.cli":
                    continue
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {own} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_the_lower_layers_never_import_fuse_torch_or_click() -> None:
    for path in modules():
        layer = layer_of(module_name(path))
        if layer is None or layer > 5:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for name in names:
                    assert name.split(".")[0] not in {"fuse", "mfusepy", "torch", "click", "fsspec"}, (path, name)


def private_names_defined(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, module globals, and
    attributes it assigns (``self._x = ...``) or declares in a class body."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(alias.asname or alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            names.add(node.value)  # names used through getattr/setattr/__dict__
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def test_no_module_reads_another_modules_private_names() -> None:
    wrong = []
    for path in modules():
        tree = ast.parse(path.read_text())
        own = private_names_defined(tree)
        for line, target, names in imported_modules(path):
            for name in names:
                if name.startswith("_") and not name.startswith("__") and name not in CONVENTIONAL:
                    wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: imports {name} from {target}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if node.attr not in own and node.attr not in CONVENTIONAL:
                    wrong.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: reads .{node.attr}, "
                                 f"which this module does not define")
    assert not wrong, "\n".join(wrong)


def public_definitions() -> list[tuple[str, ast.AST]]:
    """(where, node) of every public module, function, class and method."""
    found = []
    for path in modules():
        if path.name == "__main__.py":
            continue
        tree = ast.parse(path.read_text())
        where = str(path.relative_to(PACKAGE.parent))
        found.append((where, tree))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                found.append((f"{where}: {node.name}", node))
                if isinstance(node, ast.ClassDef):
                    for member in node.body:
                        if isinstance(member, ast.FunctionDef) and not member.name.startswith("_"):
                            found.append((f"{where}: {node.name}.{member.name}", member))
    return found


@pytest.mark.parametrize("where, node", public_definitions(), ids=lambda value: value if isinstance(value, str) else "")
def test_every_public_name_has_a_docstring(where: str, node: ast.AST) -> None:
    if isinstance(node, ast.FunctionDef) and any(
            isinstance(decorator, ast.Name) and decorator.id == "overload" for decorator in node.decorator_list):
        return  # an @overload stub: the implementation below carries the docstring
    assert ast.get_docstring(node), f"{where} has no docstring"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="reads pyproject.toml with tomllib, Python 3.11's")
def test_every_subpackage_is_installed() -> None:
    """pyproject's package list covers every package directory: ``packages = ["packfs"]``
    once left core, write, source, fuse and ffrecord out of non-editable installs."""
    import fnmatch
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = [module_name(init) for init in PACKAGE.rglob("__init__.py")]
    assert "packfs.ffrecord.torch" in packages
    missing = [name for name in packages if not any(fnmatch.fnmatch(name, pattern) for pattern in include)]
    assert missing == []


# -- the C format library (packfs/cformat/): no FUSE, no Python ---------------------------

C_LIBRARY = PACKAGE / "cformat"


def test_the_c_format_library_includes_no_fuse_or_python_header() -> None:
    """The format library reads archives and nothing else: FUSE's glue (packfs/cdaemon/)
    and Python's (packfs/cpython/) build on it, never the other way."""
    import re

    sources = sorted(C_LIBRARY.glob("*.[ch]"))
    assert {path.name for path in sources} >= {"table.c", "lookup.c", "records.c", "codecs.c", "forest.c", "tree.h"}
    for path in sources:
        included = re.findall(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', path.read_text(), re.M)
        assert [name for name in included if "fuse" in name.lower() or name == "Python.h" or "cdaemon" in name
                or "cpython" in name] == [], path.name


def test_the_c_format_library_objects_have_no_fuse_or_python_symbol(tmp_path: Path) -> None:
    """Each file of the format library compiled alone (as setup.py compiles it, with
    libzstd where its header is) defines and uses no ``fuse_`` nor ``Py`` symbol (nm)."""
    import shutil
    import subprocess

    if shutil.which("gcc") is None or shutil.which("nm") is None:
        pytest.skip("needs gcc and nm (binutils)")
    zstd = [] if Path("/usr/include/zstd.h").exists() else ["-DPACKFS_NO_ZSTD"]
    for source in sorted(C_LIBRARY.glob("*.c")):
        built = tmp_path / (source.stem + ".o")
        subprocess.run(["gcc", "-c", "-O1", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter", *zstd,
                        str(source), "-o", str(built)], check=True)
        symbols = subprocess.run(["nm", str(built)], check=True, capture_output=True, text=True).stdout.split("\n")
        names = [line.split()[-1] for line in symbols if line.strip()]
        assert names, source.name
        assert [name for name in names if name.startswith(("fuse_", "Py", "_Py"))] == [], source.name


def test_every_c_file_is_at_most_1200_lines() -> None:
    """One concept a file (the compiled code's files, as the Python modules are kept)."""
    for path in sorted(PACKAGE.rglob("*.[ch]")):
        assert len(path.read_text().splitlines()) <= 1200, path.relative_to(PACKAGE)
