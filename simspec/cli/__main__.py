"""``python -m simspec.cli``: the ``simspec`` command."""

from simspec.cli import entry

entry()
