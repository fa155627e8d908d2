"""The documentation says what the code does: the flags page is the parser's,
and every page the README links to exists."""

from __future__ import annotations

import re
from pathlib import Path

from simspec.cli import doc

REPO = Path(__file__).resolve().parents[1]


def test_the_flags_page_is_generated_from_the_parser():
    assert (REPO / "docs" / "flags.md").read_text() == doc.page(), (
        "docs/flags.md is stale: regenerate it with `python -m simspec.cli.doc > docs/flags.md`")


def test_every_subcommand_and_scenario_flag_is_on_the_flags_page():
    from simspec.cli import parser
    from simspec.config import FLAGS

    page = (REPO / "docs" / "flags.md").read_text()
    for name in doc._subcommands(parser()):
        assert f"`simspec {name[0]}`" in page
    for flag in FLAGS:
        assert f"`{flag.name}`" in page, flag.name


def test_every_local_link_in_the_readme_and_docs_resolves():
    pages = [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    for page in pages:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(REPO)} links to missing {target}"
