"""docs/flags.md, generated from the parser itself: every subcommand and
every flag with its help and default, so the page cannot drift from the
command. Regenerate with ``python -m simspec.cli.doc > docs/flags.md``
(tests/test_docs.py checks the file is what this prints)."""

from __future__ import annotations

import argparse

HEADER = """# `simspec` flags

Every subcommand and its flags, generated from the command's own parser
(`python -m simspec.cli.doc > docs/flags.md`; a test checks this page is
current). `simspec COMMAND --help` prints the same. Scenario flags map to
one field of the config each (`simspec simulate --config FILE.toml` sets any
of them from a file; flags override the file).
"""


def _subcommands(parser: argparse.ArgumentParser):
    for action in parser._actions:  # argparse keeps its subparsers here, with no public accessor
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _flag(action: argparse.Action) -> str:
    names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
    if action.option_strings and action.nargs != 0:
        names += f" `{action.metavar or action.dest.upper()}`"
    return names


def _rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        text = (action.help or "").replace("%(default)s", str(action.default)).replace("|", "\\|")
        if action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            text += f" (default: {action.default})"
        if action.choices and not isinstance(action.choices, dict):
            text += f" (one of: {', '.join(map(str, action.choices))})"
        rows.append(f"| {_flag(action)} | {text} |")
    return rows


def markdown(parser: argparse.ArgumentParser, prefix: str = "simspec", level: int = 2) -> str:
    out = []
    for name, help_text, sub in _subcommands(parser):
        out.append(f"{'#' * level} `{prefix} {name}`\n\n{help_text}\n")
        rows = _rows(sub)
        if rows:
            out += ["| flag | what it sets |", "| --- | --- |", *rows, ""]
        if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
            out.append(markdown(sub, f"{prefix} {name}", level + 1))
    return "\n".join(out)


def page() -> str:
    from pathlib import Path

    import simspec
    from simspec.cli import parser

    repo = str(Path(simspec.__file__).resolve().parents[1])  # defaults under the checkout, wherever it is
    return (HEADER + "\n" + markdown(parser()).rstrip() + "\n").replace(repo + "/", "").replace(repo, ".")


if __name__ == "__main__":
    print(page(), end="")
