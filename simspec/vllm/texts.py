"""Prompts of distinct request classes from real text already on the
machine, each with where it came from.

Imports: the standard library and simspec.types.

A random-weight model's "text" has none of the structure that makes
acceptance depend on the request; a trained model's does, but only on
prompts that are real text. These are built from files every Debian and
Python install carries, read in place (nothing downloaded), chosen by a
seeded generator from sorted file lists, so the same machine and seed give
the same prompts. Each prompt records its source file, the byte range of
the passage and the passage's sha256, and the prompts themselves are kept
with a run (``prompts.jsonl``), so a run is re-analysed without the files.

Classes (simspec.acceptance.classes names):

- ``code``: complete a function of Python's standard library from its
  ``def`` line, docstring and first lines;
- ``summarize``: summarise a paragraph of a licence text or a package's
  README;
- ``rag``: answer a question about a word of a passage, the passage given;
- ``edit``: copy a passage with one word replaced (a copy-and-edit task);
- ``translate``: translate a sentence of that prose into French;
- ``chat``: explain what a standard-library module is for.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import re
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path

from simspec.types import InputError, require

LIVE_CLASSES = ("chat", "code", "summarize", "rag", "edit", "translate")
PROSE_ROOTS = ("/usr/share/common-licenses", "/usr/share/doc")
MIN_PASSAGE, MAX_PASSAGE = 300, 900  # characters of a prose passage
WORD = re.compile(r"[A-Za-z]{6,}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Prompt:
    """One request's text and where it came from."""

    index: int
    task: str  # its class
    text: str  # the user message
    source: str  # the file the passage came from
    span: tuple[int, int]  # characters of that file's text the passage spans
    sha256: str  # of the passage

    def to_json(self) -> dict:
        return {**asdict(self), "span": list(self.span)}

    @classmethod
    def from_json(cls, record: dict) -> Prompt:
        return cls(**{**record, "span": tuple(record["span"])})


def _read(path: Path) -> str:
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return data.decode("utf-8", errors="replace")


def _prose_files() -> list[Path]:
    files = []
    for root in PROSE_ROOTS:
        base = Path(root)
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            name = path.name.lower()
            if path.is_file() and (base.name == "common-licenses" or name.startswith(("readme", "news"))) \
                    and not path.is_symlink() and path.stat().st_size > 2 * MIN_PASSAGE:
                files.append(path)
    return files


def _paragraphs(text: str) -> list[tuple[int, int]]:
    """Spans of the text's blank-line-separated paragraphs of MIN..MAX_PASSAGE characters that read as prose."""
    spans, start = [], 0
    for match in re.finditer(r"\n\s*\n", text + "\n\n"):
        end = match.start()
        para = text[start:end].strip()
        letters = sum(c.isalpha() or c == " " for c in para)
        if MIN_PASSAGE <= len(para) <= MAX_PASSAGE and letters >= 0.85 * len(para) and para.count(".") >= 2:
            first = text.index(para, start)
            spans.append((first, first + len(para)))
        start = match.end()
    return spans


def _passages(rng: random.Random, n: int) -> list[tuple[Path, tuple[int, int], str]]:
    """``n`` distinct prose passages, drawn from every passage of every prose file."""
    files = _prose_files()
    require(files, f"no prose to build prompts from: no licence or README files under {', '.join(PROSE_ROOTS)}")
    every: list[tuple[Path, tuple[int, int], str]] = []
    seen: set[str] = set()
    for path in files:
        text = _read(path)
        for span in _paragraphs(text):
            passage = " ".join(text[span[0]:span[1]].split())
            if passage not in seen:
                seen.add(passage)
                every.append((path, span, passage))
    require(len(every) >= n, f"only {len(every)} prose passages found under {', '.join(PROSE_ROOTS)} ({n} needed)")
    return rng.sample(every, n)


def _functions(rng: random.Random, n: int) -> list[tuple[Path, tuple[int, int], str]]:
    """``n`` openings of standard-library functions with a docstring: the def line, docstring and 3 lines more."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.stat().st_size > 2000)
    require(files, f"no Python standard-library source under {stdlib}")
    opening = re.compile(r'^(    )?def \w+\(.*?\):\n(\s+)(?:"""|\'\'\')', re.M)
    out, tries = [], 0
    while len(out) < n and tries < 50 * n:
        tries += 1
        path = rng.choice(files)
        text = path.read_text(errors="replace")
        found = list(opening.finditer(text))
        if not found:
            continue
        m = found[rng.randrange(len(found))]
        lines = text[m.start():].split("\n")
        close = next((i for i, line in enumerate(lines[1:], 1) if line.rstrip().endswith(('"""', "'''"))
                      and (i > 1 or line.count('"""') + line.count("'''") >= 2)), None)
        if close is None or close > 25:
            continue
        body = lines[:close + 4]
        snippet = "\n".join(body).rstrip()
        if any(snippet == s for _, _, s in out) or len(snippet) > 1500:
            continue
        out.append((path, (m.start(), m.start() + len(snippet)), snippet))
    require(len(out) == n, f"only {len(out)} standard-library functions found under {stdlib} ({n} needed)")
    return out


def _modules(rng: random.Random, n: int) -> list[tuple[Path, tuple[int, int], str]]:
    """``n`` standard-library modules and submodules by dotted name (tests, IDLE, 2to3 and private ones left out)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__", "turtledemo"}
    names = []
    for path in sorted(stdlib.rglob("*.py")):
        parts = path.relative_to(stdlib).with_suffix("").parts
        if any(p in skip or p.startswith("_") for p in parts[:-1]) or (parts[-1].startswith("_")
                                                                       and parts[-1] != "__init__"):
            continue
        dotted = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if dotted and "-" not in dotted:
            names.append((path, dotted))
    require(len(names) >= n, f"only {len(names)} standard-library modules under {stdlib} ({n} needed)")
    return [(path, (0, 0), dotted) for path, dotted in rng.sample(names, n)]


def _first_sentence(passage: str) -> str:
    sentence = re.split(r"(?<=[.;])\s", passage, maxsplit=1)[0]
    return sentence if len(sentence) >= 40 else passage[:240]


def _word(rng: random.Random, passage: str) -> str:
    words = sorted(set(WORD.findall(passage)))
    return rng.choice(words) if words else "the"


def build(per_class: int, seed: int = 0, tasks: tuple[str, ...] = LIVE_CLASSES) -> list[Prompt]:
    """``per_class`` prompts of each class in ``tasks``, interleaved (class after class), deterministic in ``seed``."""
    require(per_class >= 1, f"per_class must be >= 1 (got {per_class})")
    unknown = [t for t in tasks if t not in LIVE_CLASSES]
    if unknown:
        raise InputError(f"no prompts for class {unknown[0]!r} (allowed: {', '.join(LIVE_CLASSES)})")
    rng = random.Random(seed)
    prose_needed = per_class * sum(t in ("summarize", "rag", "edit", "translate") for t in tasks)
    spare = per_class if "translate" in tasks else 0  # translation takes a passage's first sentence: a spare
    prose = iter(_passages(rng, prose_needed + spare)) if prose_needed else iter(())  # each for one seen before
    sentences: set[str] = set()
    made: dict[str, list[tuple[Path, tuple[int, int], str, str]]] = {}
    for task in tasks:
        rows = []
        if task == "code":
            for path, span, snippet in _functions(rng, per_class):
                rows.append((path, span, snippet, f"Complete this Python function:\n\n```python\n{snippet}\n```"))
        elif task == "chat":
            for path, span, name in _modules(rng, per_class):
                rows.append((path, span, name, f"In a few sentences, explain what the Python standard-library "
                                               f"module `{name}` is for, with one short example of its use."))
        else:
            for _ in range(per_class):
                path, span, passage = next(prose)
                while task == "translate" and _first_sentence(passage) in sentences:
                    path, span, passage = next(prose, (None, None, None))
                    require(path is not None, "too few distinct sentences to translate in the machine's prose")
                if task == "summarize":
                    text = f"Summarize the following text in two or three sentences.\n\n{passage}"
                elif task == "rag":
                    text = (f"Answer the question from the passage.\n\nPassage: {passage}\n\nQuestion: what does "
                            f"the passage say about \"{_word(rng, passage)}\"?")
                elif task == "edit":
                    word = _word(rng, passage)
                    text = (f"Copy the following text exactly, but replace every \"{word}\" with "
                            f"\"{word.upper()}\".\n\n{passage}")
                else:
                    passage = _first_sentence(passage)
                    sentences.add(passage)
                    text = f"Translate into French:\n\n{passage}"
                rows.append((path, span, passage, text))
        made[task] = rows
    prompts = []
    for i in range(per_class):
        for task in tasks:
            path, span, passage, text = made[task][i]
            prompts.append(Prompt(index=len(prompts), task=task, text=text, source=str(path), span=span,
                                  sha256=hashlib.sha256(passage.encode()).hexdigest()))
    return prompts


def bench_dataset(count: int, seed: int, output_tokens: int, range_ratio: float = 0.0) -> list[dict]:
    """``count`` prompts of the live classes in turn (:func:`build` with
    ``seed``) as ``vllm bench serve``'s custom dataset reads them: each its
    ``prompt``, its ``output_tokens`` (``output_tokens`` x U[1 - r, 1 + r],
    rounded, at least 1; drawn with ``seed``) and where it came from."""
    prompts = build(-(-count // len(LIVE_CLASSES)), seed)[:count]
    rng = random.Random(seed)
    return [{"prompt": p.text, "output_tokens": max(1, round(output_tokens * rng.uniform(1 - range_ratio,
                                                                                          1 + range_ratio))),
             "task": p.task, "source": p.source, "span": list(p.span), "sha256": p.sha256} for p in prompts]


def write(prompts: list[Prompt], path: Path) -> None:
    path.write_text("".join(json.dumps(p.to_json(), sort_keys=True) + "\n" for p in prompts))


def read(path: str | Path) -> list[Prompt]:
    """Prompts from a JSONL file: each line an object with at least ``task`` and ``text``."""
    prompts = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as err:
        raise InputError(f"--prompts {path}: cannot read ({err.strerror})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise InputError(f"--prompts {path}: line {n} is not JSON") from None
        require(isinstance(record, dict) and isinstance(record.get("task"), str) and isinstance(record.get("text"), str),
                f"--prompts {path}: line {n} needs a string task and text")
        prompts.append(Prompt(index=len(prompts), task=record["task"], text=record["text"],
                              source=str(record.get("source", path)), span=tuple(record.get("span", (0, 0))),
                              sha256=record.get("sha256") or hashlib.sha256(record["text"].encode()).hexdigest()))
    require(prompts, f"--prompts {path}: no prompts")
    return prompts
