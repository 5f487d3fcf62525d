"""Not the packfs package: the root folder of a clone of its repository.

Python imports a folder as a package from the directory a script runs in (or any
directory on sys.path), and a folder without this file would be imported as an empty
namespace package named ``packfs`` (``packfs.PackedFolder``: AttributeError), ahead of
an editable install (``pip install -e``), whose finder is consulted after that search.
This file makes that mistake one clear ImportError.  The package is ``packfs/`` inside
this folder.  Nothing imports this file on purpose: it is in no wheel or sdist, and the
tests are named from the repository's root (pyproject.toml: ``--import-mode=importlib``,
``pythonpath``), not through it.  pytest imports it only as the root directory's package,
under another name (``__init__``, or the clone's), and then it is an empty module.
"""

import os as _os

_clone = _os.path.dirname(_os.path.abspath(__file__))
if __name__ == "packfs":  # under any other name (pytest imports the root folder as `__init__` or by the folder's name): nothing to say
    raise ImportError(
        f"'import {__name__}' found {_clone}, the folder of a clone of packfs's repository, not the packfs "
        f"package (which is {_os.path.join(_clone, 'packfs')}): Python looks in the directory this runs in "
        f"({_os.path.dirname(_clone)}) before it finds the installed package.  "
        f"Run from another directory (from inside the clone, cd {_clone}, works too), or rename the clone "
        f"(mv {_clone} {_clone}-src)",
        name=__name__, path=__file__,
    )
