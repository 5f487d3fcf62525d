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
    "dataset": 6, "windows": 6, "torch": 6, "fsspec": 6, "ffrecord": 6, "fuse": 6, "mount": 6,
    "_lowlevel": 6,  # the compiled daemon, imported by packfs.fuse.inodedaemon
    "cli": 7, "__main__": 7, "manpage": 7,
}
# Names with a leading underscore that are public by convention (namedtuple's API) or
# the standard library's.
# packfs's compiled extension modules (no .py file): imported as modules, importing nothing of packfs.
COMPILED = {"_sigbus", "_lowlevel", "_format"}  # _format: packfs.core's, from packfs/cpython/
CONVENTIONAL = {"_fields", "_make", "_asdict", "_replace", "_exit", "_getframe",
                "_name",  # ctypes.CDLL's: the library's path
                "_sigbus",  # packfs's compiled extension modules, imported by packfs.source.local
                "_lowlevel",  # and by packfs.fuse.inodedaemon
                "_format"}  # packfs.core's compiled format library, imported by packfs.core.inplace


def modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(name: str) -> int | None:
    """The layer of module ``packfs.X...`` (None for the package itself)."""
    parts = name.split(".")
    return LAYERS[parts[1]] if len(parts) > 1 else None


def is_module(name: str) -> bool:
    """Whether ``packfs.x.y`` names a module (a .py file, a package or a compiled
    extension's source) rather than a name inside one."""
    where = PACKAGE.parent / name.replace(".", "/")
    return (where.with_suffix(".py").exists() or (where / "__init__.py").exists() or where.with_suffix(".c").exists()
            or name.rpartition(".")[2] in COMPILED)


def imported_modules(path: Path, typing_too: bool = False) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, names) of every import of a packfs module in ``path``,
    at module level or inside a function; those under ``if TYPE_CHECKING:`` too when
    ``typing_too``.  ``from package import name`` counts as an import of the module
    ``package.name`` when there is one, of ``package`` otherwise."""
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found = []
    tree = ast.parse(path.read_text())
    typing_only = set() if typing_too else {id(inner) for node in type_checking_blocks(tree) for inner in ast.walk(node)}
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
                # "from . import x", "from .core import tablecheck": x is a module.
                modules_named = [name for name in names if not name.startswith("__") and is_module(f"{target}.{name}")]
                for name in modules_named:
                    found.append((node.lineno, f"{target}.{name}", []))
                others = [name for name in names if name not in modules_named]
                if others:  # names defined in ``target`` (``from . import __version__``: the package's)
                    found.append((node.lineno, target, others))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("packfs"):
                    found.append((node.lineno, alias.name, []))
    return found


def type_checking_blocks(tree: ast.AST) -> list[ast.If]:
    """The ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) blocks of a module."""
    return [node for node in ast.walk(tree) if isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING"))]


# The one import that points up: mount(8)'s helper (packfs.fuse.process.mount_helper)
# runs the command line's own parsing, imported when it runs.  It closes the one circle
# the package has, cli -> fuse -> fuse.process -> cli, and only then: cli mounts through
# fuse.process, and fuse.process calls cli.main only when mount(8) runs the helper,
# long after both are loaded.  Helpers installed by earlier versions call
# packfs.fuse.mount_helper (or packfs.mount's), so the name stays where they find it.
DOCUMENTED_UPWARD = ("packfs.fuse.process", "packfs.cli")


def import_graph() -> dict[str, dict[str, list[str]]]:
    """module -> imported packfs module -> where ("path:line", type-checking ones marked):
    every import, at module level, in a function or under ``if TYPE_CHECKING:``."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in modules():
        own = module_name(path)
        typing = {line for node in type_checking_blocks(ast.parse(path.read_text()))
                  for inner in ast.walk(node) if isinstance(inner, (ast.Import, ast.ImportFrom))
                  for line in [inner.lineno]}
        edges = graph.setdefault(own, {})
        for line, target, _ in imported_modules(path, typing_too=True):
            if target != own:
                where = f"{path.relative_to(PACKAGE.parent)}:{line}" + (" (TYPE_CHECKING)" if line in typing else "")
                edges.setdefault(target, []).append(where)
    return graph


def import_circles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative): each is a set of modules that import each other, directly or not."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph.get(start, ())))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in graph:
                    continue  # a compiled extension: it imports nothing of packfs
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(graph[target])))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def upward_imports(graph: dict[str, dict[str, list[str]]]) -> list[tuple[str, str, str]]:
    """(module, imported module, where) of every import of a higher layer."""
    found = []
    for own, edges in graph.items():
        own_layer = layer_of(own)
        if own_layer is None:
            continue  # packfs/__init__.py re-exports the public API of every layer
        for target, wheres in edges.items():
            target_layer = layer_of(target)
            if target_layer is not None and target_layer > own_layer:
                found.extend((own, target, where) for where in wheres)
    return found


def test_imports_run_one_way() -> None:
    """Every import counts, in a function or for types only: exactly one points up."""
    upward = upward_imports(import_graph())
    assert {(own, target) for own, target, _ in upward} == {DOCUMENTED_UPWARD}, \
        "\n".join(f"{where}: {own} imports {target}" for own, target, where in upward)


def test_no_import_circles() -> None:
    """No modules import each other, directly or through others, inside a layer or across
    layers, counting imports in functions and under TYPE_CHECKING (a circle of
    annotations still welds the modules into one: none can be read, typed or moved
    alone).  The documented upward import is the one edge left out."""
    graph = import_graph()
    own, target = DOCUMENTED_UPWARD
    assert target in graph[own]  # the exception still names a real import
    graph[own] = {name: wheres for name, wheres in graph[own].items() if name != target}
    circles = import_circles(graph)
    described = []
    for circle in circles:
        members = set(circle)
        described.append(" <-> ".join(circle) + ": " + "; ".join(
            f"{where} imports {imported}" for module in circle for imported, wheres in graph[module].items()
            if imported in members for where in wheres))
    assert circles == [], "\n".join(described)


def test_the_circle_finder_finds_circles() -> None:
    """The finder itself, on a graph with a circle of three, a self-contained pair and a tail."""
    graph = {"a": {"b": []}, "b": {"c": []}, "c": {"a": [], "d": []}, "d": {}, "e": {"f": []}, "f": {"e": []}, "g": {"a": []}}
    assert sorted(import_circles(graph)) == [["a", "b", "c"], ["e", "f"]]


# How many imports are for type annotations only (under "if TYPE_CHECKING:").  Each is a
# dependency that does not run; the count may go down, and raising it needs a reason.
TYPE_CHECKING_IMPORTS_AT_MOST = 10


def test_type_checking_imports_are_counted() -> None:
    imports = [(str(path.relative_to(PACKAGE.parent)), inner.lineno, ast.unparse(inner))
               for path in modules() for node in type_checking_blocks(ast.parse(path.read_text()))
               for inner in ast.walk(node) if isinstance(inner, (ast.Import, ast.ImportFrom))]
    print(f"{len(imports)} imports under TYPE_CHECKING:")
    for where, line, text in imports:
        print(f"  {where}:{line}: {text}")
    assert len(imports) <= TYPE_CHECKING_IMPORTS_AT_MOST, f"{len(imports)} imports under TYPE_CHECKING"


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


def test_every_python_module_is_at_most_1200_lines() -> None:
    """One concept a module, as for the C files: a module past the bound is split along
    a seam of what it does (issue 35 split pack.py, union.py and cli.py so)."""
    for path in modules():
        assert len(path.read_text().splitlines()) <= 1200, path.relative_to(PACKAGE)
