"""The one ``jit`` of the package, and where its compiled code is cached.

Imports: the standard library and numba (no other simspec module, so every
compiled module can import this one).

numba's own on-disk cache sits beside the sources and checks only the file
a function is written in: edit a compiled callee or a constant in another
file and a cached caller keeps running the old code. So simspec's compiled
code is cached in a folder of its own, outside the source tree, whose name
carries a hash of the numba version, the Python version and the source of
every compiled module and every simspec module they import (the constants
they read): any edit to any of them gives a fresh folder, and nothing is
ever cached beside the sources.

- ``$SIMSPEC_CACHE_DIR`` (default ``~/.cache/simspec``) holds one folder
  per key, ``numba-<version>-py<X.Y>-<key>``; old folders can be deleted
  at any time.
- Where that folder cannot be written, compiled code is not cached at all
  (each process compiles again), rather than cached beside the sources.
- A module is *compiled* when it imports this one (``from simspec.compiled
  import jit``); :func:`compiled_modules` finds them from the sources.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
import tempfile
from pathlib import Path

import numba
from numba.core import caching

PACKAGE = Path(__file__).resolve().parent
MARK = "simspec.compiled"


def _module_file(root: Path, name: str) -> Path | None:
    """The source file of simspec module ``name`` under ``root`` (the package folder)."""
    parts = name.split(".")[1:]
    base = root.joinpath(*parts) if parts else root
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+(simspec[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|.*)|import[ \t]+(.*))", re.M)


def _imported_names(text: str) -> list[tuple[str, str | None]]:
    """Each (module, name imported from it, or None) of a source's import
    statements, read with a regular expression rather than ``ast`` (several
    times faster, and this runs in every process). It may over-read, never
    under-read: an import-like line inside a string counts too, which can
    only key a file more (the test checks it against ``ast`` on the package)."""
    text = text.replace("\\\n", " ")  # backslash continuations
    pairs: list[tuple[str, str | None]] = []
    for found in _IMPORT.finditer(text):
        module, imported, plain = found.groups()
        if module:
            aliases = re.sub(r"#.*", "", imported).strip("() \t\n").split(",")
            pairs += [(module, a.split()[0]) for a in aliases if a.split()]
        else:
            pairs += [(a.split()[0], None) for a in re.sub(r"#.*", "", plain).split(",") if a.split()]
    return pairs


def _imports(root: Path, path: Path) -> set[Path]:
    """The simspec source files ``path`` imports from (each name's own module)."""
    names = []
    for module, alias in _imported_names(path.read_text(encoding="utf-8")):
        sub = f"{module}.{alias}" if alias else None  # a submodule, else a name of the module itself
        names.append(sub if sub and _module_file(root, sub) else module)
    found = {_module_file(root, n) for n in names if n == "simspec" or n.startswith("simspec.")}
    return found - {None}


def compiled_modules(root: Path = PACKAGE) -> list[Path]:
    """Every module under ``root`` that imports this one, sorted."""
    own = root / "compiled.py"
    return sorted(p for p in root.rglob("*.py") if p != own and MARK in p.read_text(encoding="utf-8")
                  and own in _imports(root, p))


def keyed_sources(root: Path = PACKAGE) -> list[Path]:
    """The compiled modules and every simspec module they import, transitively."""
    todo, seen = list(compiled_modules(root)), set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo.extend(_imports(root, path) - seen)
    return sorted(seen)


def cache_key(root: Path = PACKAGE) -> str:
    """A hash of the numba and Python versions and of :func:`keyed_sources`' bytes."""
    digest = hashlib.sha256(f"numba {numba.__version__} python {sys.version_info[:2]}".encode())
    for path in keyed_sources(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    """``$SIMSPEC_CACHE_DIR``, default ``~/.cache/simspec``."""
    return Path(os.environ.get("SIMSPEC_CACHE_DIR") or Path.home() / ".cache" / "simspec")


CACHE_DIR = cache_root() / f"numba-{numba.__version__}-py{sys.version_info[0]}.{sys.version_info[1]}-{cache_key()}"


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
        return True
    except OSError:
        return False


CACHING = _writable(CACHE_DIR)


class _Locator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
    """numba's cache locator for simspec's compiled functions: CACHE_DIR."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno

    def get_cache_path(self):
        return str(CACHE_DIR)

    @classmethod
    def from_function(cls, py_func, py_file):
        if not _ours(py_file):
            return None  # somebody else's function: numba's own locators decide
        return cls(py_func, py_file)


@functools.cache
def _ours(py_file: str) -> bool:
    """Whether ``py_file`` is in the package (resolved once a file, not once a function)."""
    return Path(py_file).resolve().is_relative_to(PACKAGE)


_impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
if _Locator not in _impl._locator_classes:
    _impl._locator_classes.insert(0, _Locator)


def cached(module: str, function: str) -> bool:
    """Whether :data:`CACHE_DIR` holds compiled code of ``function`` in the
    compiled module whose file is ``module``.py (numba's index file for it):
    False on a fresh machine, after any edit to a compiled source, or where
    nothing is cached at all."""
    return CACHING and any(CACHE_DIR.glob(f"{module}.{function}-*.nbi"))


def jit(fn=None, *, inline: bool = False):
    """``numba.njit`` as every compiled simspec function is built: no GIL,
    cached in :data:`CACHE_DIR` (when it can be written). ``@jit(inline=True)``
    has numba inline the function into each compiled caller.

    A small function called in a hot loop with arrays among its arguments
    should read them all before its first branch: numba counts a
    reference for each on entry (an atomic call) and drops the pair only
    when the release falls in the same block (simspec.policies.rules'
    _verified_s and _confidence). Inlining drops only some of the counts
    (none for _verified_s; some for EAGLE-2's row helpers), so it is for a
    function that takes arrays, uses them past a branch and is called from
    few sites."""
    if fn is None:
        return functools.partial(jit, inline=inline)
    return numba.njit(cache=CACHING, nogil=True, inline="always" if inline else "never")(fn)


def entry(dispatcher, *args):
    """The compiled code ``dispatcher`` runs for arguments of these values'
    types, as a plain callable (compiled or loaded from the cache first if
    need be): a call to it skips numba's dispatch, which types every
    argument anew at each call (about 50 us for fastloop.run's tuples of
    arrays, five times the work of a short call). Call it only with
    arguments of the same types as these: it converts each by the types it
    was built for and checks none."""
    return dispatcher.compile(tuple(dispatcher.typeof_pyval(a) for a in args))


__all__ = ["jit", "entry", "cached", "CACHE_DIR", "CACHING", "cache_key", "cache_root", "compiled_modules", "keyed_sources"]
