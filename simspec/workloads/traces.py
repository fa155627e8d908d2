"""Request traces from disk: Azure LLM 2023 and LMM 2025 CSV, vLLM/AIPerf
Mooncake-style JSONL.

Imports: the standard library, numpy, pandas (when reading) and simspec.types.

A trace is read in blocks of rows, so memory stays bounded whatever the
file's size: every row is checked (its number of fields, a date-time or a
number where one belongs, integer counts within their range), and only the
rows a run replays are kept (``limit``: the earliest ``limit`` arrivals;
``within_s``: those within that many seconds of the first). Errors name the
file and the row (CSV, counted from 1 after the header) or line (JSONL).
Equal times keep file order.

Any schema may also give each request's image size, in pixels: columns
(CSV) or keys (JSONL) ``image_width`` and ``image_height``, or
``image_size`` as ``WIDTHxHEIGHT``; an empty cell or a missing key gives
none (the request's images then follow the workload's ``image_size``).
And each request's class (simspec.acceptance.classes): a column or key
``task``, one of the classes' names; an empty cell or a missing key gives
none (the request then draws one from the workload's ``mix``, if any).
"""

from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterator

import numpy as np

from simspec.acceptance.classes import CLASSES
from simspec.types import MAX_IMAGE_SIDE, InputError, require

BLOCK_ROWS = 1 << 16  # rows parsed at a time
MAX_COUNT = 1 << 31  # tokens or images of one request at most: far beyond any context
NS = 1_000_000_000

CSV_SCHEMAS = {
    # Checked in order: the LMM schema is a superset of the LLM one.
    "azure-lmm-2025": ("TIMESTAMP", "NumImages", "ContextTokens", "GeneratedTokens"),
    "azure-llm-2023": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
}
JSONL_KEYS = ("timestamp", "input_length", "output_length")
JSONL_IMAGE_KEYS = ("num_images", "images")
SIZE_COLUMNS = ("image_width", "image_height", "image_size")  # optional in every schema (module docstring)
TASK = "task"  # optional in every schema: the request's class


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """A request trace as read from disk, sorted by arrival."""

    arrival_s: np.ndarray  # [N] float, starts at 0, sorted
    prompt_tokens: np.ndarray  # [N] int >= 1
    output_tokens: np.ndarray  # [N] int >= 1
    images: np.ndarray | None  # [N] int >= 0, None when the schema has no image column
    # [N] int pixels of each request's images, 0 where a row gives no size;
    # None when the file has no image-size column.
    image_width: np.ndarray | None = None
    image_height: np.ndarray | None = None
    task: np.ndarray | None = None  # [N] str each request's class, "" where a row gives none; None: no such column
    source: str  # schema name: "azure-llm-2023", "azure-lmm-2025", "mooncake-jsonl"


@dataclass(slots=True)
class _Block:
    """Rows parsed so far: times as integers (ns for CSV, ms for JSONL) or
    floats, their file order, counts."""

    time: np.ndarray
    order: np.ndarray  # [n] int the rows' place in the file
    prompt: np.ndarray
    output: np.ndarray
    images: np.ndarray  # 0 where a row gives none
    width: np.ndarray  # image size, pixels; 0 where a row gives none
    height: np.ndarray
    task: np.ndarray  # [n] str class, "" where a row gives none

    def take(self, keep: np.ndarray) -> "_Block":
        """The rows ``keep`` [k] (indices) of this block."""
        return _Block(*(getattr(self, f.name)[keep] for f in fields(self)))

    def join(self, other: "_Block") -> "_Block":
        """This block's rows, then ``other``'s."""
        return _Block(*(np.concatenate([getattr(self, f.name), getattr(other, f.name)]) for f in fields(self)))


def read_trace(path: str | os.PathLike, *, limit: int | None = None, within_s: float | None = None) -> Trace:
    """Read a trace, detecting its schema: JSONL when the name ends in
    ``.jsonl``/``.json`` or the first line is a JSON object, CSV otherwise.
    With ``limit``, only the earliest ``limit`` arrivals are kept; with
    ``within_s``, only those within that many seconds of the first."""
    path = Path(path)
    require(path.is_file(), f"trace {path}: no such file")
    try:
        with path.open("r", encoding="utf-8") as f:
            first = next((line.strip() for line in f if line.strip()), "")
        require(first != "", f"trace {path}: the file is empty (no rows)")
        seen = {"images": False, "sizes": False, "tasks": False}  # does any row give an image count, a size, a class?
        if path.suffix.lower() in (".jsonl", ".json") or first.startswith("{"):
            blocks, scale, source = _jsonl_blocks(path, seen), 1000.0, "mooncake-jsonl"
        else:
            source = _csv_schema(path)
            seen["images"] = "NumImages" in CSV_SCHEMAS[source]
            seen["sizes"] = bool(_size_columns(path, _csv_header(path)))
            seen["tasks"] = TASK in _csv_header(path)
            blocks, scale = _csv_blocks(path, source), float(NS)
        kept = _select(blocks, limit, within_s, scale)
    except UnicodeDecodeError as err:
        raise InputError(f"trace {path}: not UTF-8 text (byte {err.start} of a block is {err.object[err.start]:#04x})")
    require(kept is not None and len(kept.order), f"trace {path}: no rows after the header")
    order = np.lexsort((kept.order, kept.time))  # by time, equal times in file order
    time = kept.time[order]
    seconds = (time - time[0]).astype(np.float64) / scale
    sized = seen["sizes"]
    return Trace(arrival_s=seconds, prompt_tokens=kept.prompt[order], output_tokens=kept.output[order],
                 images=kept.images[order] if seen["images"] else None, source=source,
                 image_width=kept.width[order] if sized else None, image_height=kept.height[order] if sized else None,
                 task=kept.task[order] if seen["tasks"] else None)


def _select(blocks: Iterator[_Block], limit: int | None, within_s: float | None, scale: float) -> _Block | None:
    """The rows of every block that a run keeps (module docstring)."""
    kept = None
    for block in blocks:
        kept = block if kept is None else kept.join(block)
        keep = None
        if limit is not None and len(kept.order) > limit:
            keep = np.lexsort((kept.order, kept.time))[:limit]
        elif within_s is not None:
            keep = np.flatnonzero(kept.time - kept.time.min() < within_s * scale)
        if keep is not None:
            kept = kept.take(np.sort(keep))
    return kept


# -- CSV -------------------------------------------------------------------------------

def _csv_header(path: Path) -> list[str]:
    with path.open("r", encoding="utf-8", newline="") as f:
        return [c.strip() for c in next(csv.reader(f), [])]


def _csv_schema(path: Path) -> str:
    header = _csv_header(path)
    source = next((name for name, cols in CSV_SCHEMAS.items() if set(header).issuperset(cols)), None)
    expected = " or ".join(",".join(cols) for cols in reversed(CSV_SCHEMAS.values()))
    require(source is not None, f"trace {path}: columns {','.join(header)} match no known schema (expected {expected})")
    return source


def _csv_blocks(path: Path, source: str) -> Iterator[_Block]:
    with path.open("r", encoding="utf-8", newline="") as f:
        reader = csv.reader(f, skipinitialspace=True)
        header = [c.strip() for c in next(reader)]
        width = len(header)
        where = {name: header.index(name) for name in CSV_SCHEMAS[source] + _size_columns(path, header)
                 + ((TASK,) if TASK in header else ())}
        rows: list[list[str]] = []
        first = 1
        for number, row in enumerate(reader, start=1):
            if not row:
                continue
            require(len(row) == width, f"trace {path}: row {number} has {len(row)} fields, the header {width} "
                                       f"({','.join(header)})")
            rows.append(row)
            if len(rows) == BLOCK_ROWS:
                yield _csv_block(path, rows, first, where)
                first, rows = number + 1, []
        if rows:
            yield _csv_block(path, rows, first, where)


def _csv_block(path: Path, rows: list[list[str]], first: int, where: dict[str, int]) -> _Block:
    numbers = np.arange(first, first + len(rows))
    column = {name: np.array([r[i] for r in rows], dtype=object) for name, i in where.items()}
    raw_time = column["TIMESTAMP"]
    time_ns = _plain_stamps_ns(raw_time)
    if time_ns is None:
        import pandas as pd  # other forms (offsets, odd years, bad stamps): pandas reads them, or says which row

        # ISO8601 covers both "2023-11-16 18:15:46.6805900" and "2024-10-15T12:00:05.819Z";
        # utc=True puts naive and Z-suffixed stamps on one clock.
        stamp = pd.to_datetime(pd.Series(raw_time), format="ISO8601", errors="coerce", utc=True)
        bad = stamp.isna().to_numpy()
        if bad.any():
            i = int(np.argmax(bad))
            raise InputError(f"trace {path}: TIMESTAMP is not a date-time (row {numbers[i]} has {raw_time[i]!r})")
        time_ns = stamp.dt.tz_localize(None).to_numpy("datetime64[ns]").astype(np.int64)
    images = (_counts(path, "NumImages", column["NumImages"], 0, "row", numbers) if "NumImages" in column
              else np.zeros(len(rows), np.int64))
    width, height = _sizes(path, column, "row", numbers)
    return _Block(time=time_ns, order=numbers,
                  prompt=_counts(path, "ContextTokens", column["ContextTokens"], 1, "row", numbers),
                  output=_counts(path, "GeneratedTokens", column["GeneratedTokens"], 1, "row", numbers),
                  images=images, width=width, height=height, task=_tasks(path, column.get(TASK), "row", numbers))


_PLAIN_STAMP = re.compile(r"(19|20)\d\d-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d{1,9})?Z?")
_PLAIN_COUNT = re.compile(r"\d{1,15}")


def _plain_stamps_ns(raw: np.ndarray) -> np.ndarray | None:
    """Nanoseconds of ``raw`` [N] when every stamp is a plain ISO 8601
    date-time (naive, or UTC with Z, as the Azure traces write them), read
    by numpy as pandas would read them, without importing pandas (~0.4 s of
    a process); None for anything else, which pandas then reads."""
    if not all(isinstance(v, str) and _PLAIN_STAMP.fullmatch(v) for v in raw):
        return None
    try:
        return np.array([v.removesuffix("Z") for v in raw], dtype="datetime64[ns]").astype(np.int64)
    except ValueError:  # a day or an hour out of range
        return None


# -- JSONL -----------------------------------------------------------------------------

def _jsonl_blocks(path: Path, seen: dict) -> Iterator[_Block]:
    rows: list[tuple[int, dict]] = []
    with path.open("r", encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"trace {path}: line {number} is not valid JSON ({err.msg})") from None
            except RecursionError:
                raise InputError(f"trace {path}: line {number} is not valid JSON (nested too deeply)") from None
            require(isinstance(row, dict), f"trace {path}: line {number} is not a JSON object")
            missing = [k for k in JSONL_KEYS if k not in row]
            require(not missing, f"trace {path}: line {number} lacks {', '.join(missing)} "
                                 f"(expected timestamp, input_length, output_length, optional num_images)")
            seen["images"] |= any(k in row for k in JSONL_IMAGE_KEYS)
            seen["sizes"] |= any(row.get(k) is not None for k in SIZE_COLUMNS)
            seen["tasks"] |= row.get(TASK) is not None
            rows.append((number, row))
            if len(rows) == BLOCK_ROWS:
                yield _jsonl_block(path, rows)
                rows = []
    if rows:
        yield _jsonl_block(path, rows)


def _jsonl_block(path: Path, rows: list[tuple[int, dict]]) -> _Block:
    numbers = np.array([n for n, _ in rows])

    def values(key: str) -> np.ndarray:
        return np.array([r[key] for _, r in rows], dtype=object)

    # A row without an image count has none; some writers list the images themselves.
    raw = [next((r[k] for k in JSONL_IMAGE_KEYS if k in r), 0) for _, r in rows]
    images = _counts(path, "num_images", np.array([len(v) if isinstance(v, list) else v for v in raw], dtype=object),
                     0, "line", numbers)
    given = [k for k in SIZE_COLUMNS if any(r.get(k) is not None for _, r in rows)]
    _size_columns(path, given, "keys")
    width, height = _sizes(path, {k: np.array([r.get(k) for _, r in rows], dtype=object) for k in given}, "line",
                           numbers)
    tasks = np.array([r.get(TASK) for _, r in rows], dtype=object)
    return _Block(time=_numbers(path, "timestamp", values("timestamp"), numbers, "line"), order=numbers,
                  prompt=_counts(path, "input_length", values("input_length"), 1, "line", numbers),
                  output=_counts(path, "output_length", values("output_length"), 1, "line", numbers),
                  images=images, width=width, height=height, task=_tasks(path, tasks, "line", numbers))


def _tasks(path: Path, raw: np.ndarray | None, unit: str, rows: np.ndarray) -> np.ndarray:
    """Each row's class ("" for an empty cell or a missing key), refused by row where it is no class."""
    if raw is None:
        return np.full(len(rows), "", dtype=object)
    out = np.empty(len(raw), dtype=object)
    for k, value in enumerate(raw.tolist()):
        text = "" if value is None else value.strip() if isinstance(value, str) else value
        require(text == "" or text in CLASSES, f"trace {path}: task is no class (the {unit} {rows[k]} has {value!r}; "
                                               f"allowed: {', '.join(CLASSES)})")
        out[k] = text
    return out


# -- values ----------------------------------------------------------------------------

def _numbers(path: Path, name: str, raw: np.ndarray, rows: np.ndarray, unit: str) -> np.ndarray:
    """Parse ``raw`` [N] (strings or JSON values) as finite floats or raise
    naming the first bad one. ``rows`` [N] numbers the entries for messages."""
    if all(isinstance(v, str) and _PLAIN_COUNT.fullmatch(v) for v in raw):  # what the CSV traces hold: exact as floats
        return np.array(raw, dtype=str).astype(np.float64)
    import pandas as pd  # other forms and bad values (the first named below)

    values = pd.to_numeric(pd.Series(raw), errors="coerce").to_numpy(np.float64)
    # JSON booleans would parse as 0/1; they are never a count or a time.
    bad = ~np.isfinite(values) | np.array([isinstance(v, bool) for v in raw], dtype=bool)
    if bad.any():
        i = int(np.argmax(bad))
        raise InputError(f"trace {path}: {name} must be a finite number ({unit} {rows[i]} has {raw[i]!r})")
    return values


def _counts(path: Path, name: str, raw: np.ndarray, minimum: int, unit: str, rows: np.ndarray) -> np.ndarray:
    """Parse a token or image count column: integers in [minimum, MAX_COUNT]."""
    values = _numbers(path, name, raw, rows, unit)
    fractional = values != np.round(values)
    if fractional.any():
        i = int(np.argmax(fractional))
        raise InputError(f"trace {path}: {name} must be an integer ({unit} {rows[i]} has {raw[i]!r})")
    out = (values < minimum) | (values > MAX_COUNT)
    if out.any():
        i = int(np.argmax(out))
        raise InputError(f"trace {path}: {name} must be in {minimum}..{MAX_COUNT:,} ({unit} {rows[i]} has {values[i]:.0f})")
    return values.astype(np.int64)


def _size_columns(path: Path, names, what: str = "columns") -> tuple[str, ...]:
    """The image-size columns among ``names``: image_size alone, or
    image_width with image_height; () for none."""
    width, height, size = (name in names for name in SIZE_COLUMNS)
    require(not (size and (width or height)),
            f"trace {path}: give image_size or image_width and image_height, not both ({what})")
    require(width == height, f"trace {path}: image_width and image_height come together (the {what} have only "
                             f"{'image_width' if width else 'image_height'})")
    return ("image_size",) if size else ("image_width", "image_height") if width else ()


def _blank(v) -> bool:
    return v is None or (isinstance(v, str) and not v.strip())


def _sizes(path: Path, column: dict[str, np.ndarray], unit: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's image (width, height) [N] in pixels from its size columns
    (``column`` by name, only those the file has); 0, 0 where a row gives
    none. A side outside 1..MAX_IMAGE_SIDE is an error naming the row."""
    width, height = np.zeros(len(rows), np.int64), np.zeros(len(rows), np.int64)
    if "image_size" in column:
        for i, v in enumerate(column["image_size"]):
            if _blank(v):
                continue
            w, sep, h = str(v).strip().lower().partition("x")
            require(bool(sep) and w.isdigit() and h.isdigit(),
                    f"trace {path}: image_size must be WIDTHxHEIGHT in pixels ({unit} {rows[i]} has {v!r})")
            width[i] = _side(path, "image_size", int(w), v, unit, rows[i])
            height[i] = _side(path, "image_size", int(h), v, unit, rows[i])
    elif "image_width" in column:
        for name, out in (("image_width", width), ("image_height", height)):
            raw = column[name]
            given = np.array([not _blank(v) for v in raw], dtype=bool)
            other = "image_height" if name == "image_width" else "image_width"
            lone = given & np.array([_blank(v) for v in column[other]], dtype=bool)
            if lone.any():
                i = int(np.argmax(lone))
                raise InputError(f"trace {path}: {name} without {other} ({unit} {rows[i]} has {raw[i]!r})")
            for i in np.flatnonzero(given):
                out[i] = _side(path, name, raw[i], raw[i], unit, rows[i])
    return width, height


def _side(path: Path, name: str, value, raw, unit: str, row: int) -> int:
    """One side of an image, pixels: an integer in 1..MAX_IMAGE_SIDE (an
    int, an integral float, or digits)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # not nan
          and 1 <= value <= MAX_IMAGE_SIDE and value == int(value))
    require(ok, f"trace {path}: {name} must be an integer in 1..{MAX_IMAGE_SIDE} pixels a side ({unit} {row} has "
                f"{raw!r})")
    return int(value)


__all__ = ["Trace", "read_trace", "CSV_SCHEMAS", "MAX_COUNT", "MAX_IMAGE_SIDE"]
