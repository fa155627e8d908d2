"""Files in and out: atomic writes, and TOML and JSON reads whose errors name
the file (and the field, where a caller checks one).

Imports: the standard library, numpy and simspec.types.

Every file simspec writes goes through :func:`write_atomic`: the bytes go to
a new temporary file in the target's folder (``.NAME.XXXXXX.tmp``, created
exclusively, so a planted symlink is never followed), which is then renamed
over the target. A crash, a full disk or Ctrl-C leaves the old file or
none, never half of the new one, and the temporary file is removed.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import tomllib
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import numpy as np

from simspec.types import InputError, require


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write(f)`` on a temporary file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 is for the write, not the result
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


STAGING = ".staging-"  # a folder being built: ``.NAME.staging-XXXXXX`` beside NAME


def check_writable(folder: str | os.PathLike, what: str) -> None:
    """Refuse a folder files cannot be made in, before any work: an
    InputError naming ``what`` and why. Nothing is left behind: a missing
    folder is not made here (the writer makes it), its nearest existing
    parent is tried instead."""
    folder = Path(folder).absolute()
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, "a file is in the way", str(existing))
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as err:
        where = "" if existing == folder else f"; {existing} is where it would be made"
        raise InputError(f"{what}: cannot write in {folder} ({err.strerror or err}{where})") from None


@contextmanager
def staged_folder(path: str | os.PathLike) -> Iterator[Path]:
    """Build a folder in a fresh sibling (``.NAME.staging-XXXXXX``), then
    put it in place of ``path`` (replacing a folder there). An error or
    Ctrl-C inside removes the sibling and leaves ``path`` as it was; a
    sibling left by a killed process is removed by the next build."""
    path = Path(path)
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(f".{path.name}{STAGING}*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{path.name}{STAGING}"))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 is for the build, not the result
    try:
        yield tmp
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(dir=parent, prefix=f".{path.name}.replaced-"))
            os.replace(path, old / "old")
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    write_atomic(path, lambda f: f.write(data))


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_png(path: str | os.PathLike, figure, dpi: int = 100) -> None:
    """A matplotlib Figure drawn with the Agg canvas (headless; pyplot's
    backend is left alone) into ``path`` as PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    write_atomic(path, lambda f: figure.savefig(f, format="png", dpi=dpi))


def jsonable(x):
    """Plain JSON values: numpy scalars and arrays unwrapped, tuples as
    lists, NaN and infinities as null."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [jsonable(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


def dump_json(obj, *, sort_keys: bool = True, indent: int | None = 2) -> str:
    """``obj`` as JSON text (:func:`jsonable` first), newline-terminated."""
    return json.dumps(jsonable(obj), sort_keys=sort_keys, indent=indent, allow_nan=False) + "\n"


def write_json(path: str | os.PathLike, obj, *, sort_keys: bool = True, indent: int | None = 2) -> None:
    write_text(path, dump_json(obj, sort_keys=sort_keys, indent=indent))


def read_text(path: str | os.PathLike, what: str) -> str:
    """The UTF-8 text of ``path``; one-line InputErrors for a missing file,
    a folder, an unreadable or a non-UTF-8 file, each naming ``what`` and the path."""
    path = Path(path)
    require(not path.is_dir(), f"{what} {path} is a folder, not a file")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} {path}: no such file") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{what} {path}: not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise InputError(f"{what} {path}: cannot be read ({err.strerror or err})") from None


def read_toml(path: str | os.PathLike, what: str) -> dict:
    """A TOML file's tables; errors name ``what`` and the path."""
    text = read_text(path, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise InputError(f"{what} {path}: not valid TOML ({err})") from None
    except RecursionError:
        raise InputError(f"{what} {path}: not valid TOML (nested too deeply)") from None


def read_json(path: str | os.PathLike, what: str):
    """A JSON file's value; errors name ``what`` and the path."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except ValueError as err:
        raise InputError(f"{what} {path}: not valid JSON ({err})") from None
    except RecursionError:
        raise InputError(f"{what} {path}: not valid JSON (nested too deeply)") from None


def save_record(record: dict, path: str | os.PathLike) -> None:
    """A JSON record with a ``format`` key (calibrated models), as :func:`load_record` reads it."""
    write_text(path, json.dumps(record, indent=2) + "\n")


def load_record(path: str | os.PathLike, what: str, expected: str, build: Callable[[dict], object]):
    """Read a record :func:`save_record` wrote, check its ``format`` is
    ``expected`` and ``build`` its object; errors name ``what`` and the file."""
    path = Path(path)
    require(path.is_file(), f"{what} file {path} does not exist")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        require(isinstance(record, dict) and record.get("format") == expected,
                f"{what} file {path} has format {record.get('format') if isinstance(record, dict) else None!r}, "
                f"expected {expected!r}")
        return build(record)
    except InputError:
        raise
    except (ValueError, KeyError, TypeError, RecursionError) as error:
        raise InputError(f"{what} file {path} is corrupt: {error}") from None


__all__ = ["save_record", "load_record", "check_writable", "staged_folder", "write_atomic", "write_bytes", "write_text", "write_png", "write_json", "dump_json", "jsonable", "read_text",
           "read_toml", "read_json"]
