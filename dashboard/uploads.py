"""What the dashboard's pages share: an uploaded trace saved privately and
checked, and the exceptions that end a page with one message.

Imports: the standard library, streamlit, simspec's public API (workloads, types).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import streamlit as st

from simspec.types import InputError
from simspec.workloads import read_trace


class Refused(Exception):
    """Bad input found while reading the widgets: shown with st.error."""


class Waiting(Refused):
    """Input still missing (no trace uploaded yet): shown with st.info."""


def _upload_folder() -> Path:
    """This browser session's private folder for uploads: created fresh by
    ``mkdtemp`` (mode 0700, a name nobody can guess or plant), removed when
    the server exits."""
    folder = st.session_state.get("_upload_folder")
    if folder is None or not Path(folder).is_dir():
        folder = tempfile.mkdtemp(prefix="simspec-upload-")
        atexit.register(shutil.rmtree, folder, True)
        st.session_state["_upload_folder"] = folder
    return Path(folder)


def named(text: str, path: Path, name: str) -> str:
    """An error about the saved copy, said of the uploaded file."""
    return text.replace(f"trace {path}", f"uploaded trace {name}").replace(str(path), name)


def saved_upload(upload) -> Path:
    """The uploaded trace in the session's private folder, as a file named
    by its content (so the cache key is the content), written without
    following links and checked by the trace reader; messages name the upload."""
    data = upload.getvalue()
    suffix = Path(upload.name).suffix.lower()
    path = _upload_folder() / f"{hashlib.sha256(data).hexdigest()[:20]}{suffix}"
    if not path.is_file():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    st.session_state.setdefault("_uploads", {})[str(path)] = upload.name
    try:
        read_trace(path)
    except (InputError, UnicodeDecodeError, ValueError) as err:
        text = named(str(err), path, upload.name)
        raise Refused(text if text.startswith("uploaded trace") else f"uploaded trace {upload.name}: {text}") from None
    return path


def uploaded_trace(container, key: str) -> str:
    """The trace widget in ``container`` (a sidebar): the saved upload's path; Waiting until one is given."""
    upload = container.file_uploader("Trace: Azure LLM/LMM CSV or Mooncake JSONL", type=["csv", "jsonl", "json"],
                                     key=key)
    if upload is None:
        raise Waiting("upload a trace (Azure LLM 2023 / LMM 2025 CSV, or Mooncake-style JSONL), "
                      "or choose synthetic requests")
    return str(saved_upload(upload))


def stop(err: Exception) -> None:
    """End the page with ``err`` as one message (Waiting: a hint; otherwise an error, uploads named by their names)."""
    if isinstance(err, Waiting):
        st.info(str(err))
    else:
        text = str(err)
        for path, name in st.session_state.get("_uploads", {}).items():
            text = named(text, Path(path), name)
        st.error(text)
    st.stop()


__all__ = ["Refused", "Waiting", "named", "saved_upload", "uploaded_trace", "stop"]
