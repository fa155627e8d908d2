"""simspec.files: atomic writes leave whole files with the user's permissions."""

from __future__ import annotations

import os
import stat

import pytest

from simspec.files import staged_folder, write_text


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_written_files_and_staged_folders_follow_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        write_text(tmp_path / "a.txt", "hello")
        with staged_folder(tmp_path / "run") as folder:
            write_text(folder / "b.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").read_text() == "hello"
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o666 & ~mask
    assert stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE((tmp_path / "run" / "b.txt").stat().st_mode) == 0o666 & ~mask
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_a_failed_write_leaves_the_old_file(tmp_path):
    from simspec.files import write_atomic

    write_text(tmp_path / "a.txt", "old")

    def boom(f):
        f.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_atomic(tmp_path / "a.txt", boom)
    assert (tmp_path / "a.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]
