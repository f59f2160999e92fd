"""The argparse parser class of every ``vigil`` command, and the walk over its commands.

What it adds to argparse: a value outside a flag's ``choices`` is answered with the closest valid
one; an unknown flag is reported by the command it was given to, with that command's usage (argparse
hands a subcommand's leftovers up to the top-level parser, which printed ``usage: vigil`` for
``vigil sql --bogus``), even when a required argument is missing too; and help texts keep their
line breaks, so the ``exit codes:`` block at the end of each ``--help`` has a line per code.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from trainvigil.schemas.settings import did_you_mean

_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
"""What argparse takes for a negative number rather than a flag."""
_CODE_LINE = re.compile(r"^(\s*\d+\s+)")
"""A line of the ``exit codes:`` block: its continuation lines are indented under the text."""


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, but a description or epilog is wrapped line by line (a code's line stays its own)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines():
            hang = _CODE_LINE.match(line)
            if hang:
                body = " ".join(line[hang.end() :].split())
                lines.append(
                    textwrap.fill(
                        body,
                        width,
                        initial_indent=indent + hang.group(1),
                        subsequent_indent=indent + " " * len(hang.group(1)),
                    )
                )
            else:
                lines.append(
                    textwrap.fill(" ".join(line.split()), width, initial_indent=indent, subsequent_indent=indent)
                )
        return "\n".join(lines)


class Parser(argparse.ArgumentParser):
    """The parser of ``vigil`` and, through ``add_subparsers``, of each of its commands."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self._given: list[str] = []

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """As argparse's, but what this parser does not know is its error, shown with its own usage."""
        self._given = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        # argparse checks required arguments before it hands back the unknown ones: a flag's typo would be
        # reported as "the following arguments are required", which hides the cause.
        if "required" in message and (strays := self._unknown_flags()):
            message = f"unrecognized arguments: {' '.join(strays)}"
        super().error(message)

    def _unknown_flags(self) -> list[str]:
        known = self._option_string_actions
        strays = []
        for arg in self._given:
            if arg == "--":
                break
            if len(arg) < 2 or arg[0] not in self.prefix_chars or " " in arg or _NUMBER.match(arg):
                continue
            name = arg.split("=", 1)[0]
            if name in known or (arg[1] not in self.prefix_chars and arg[:2] in known):  # -ofile is -o file
                continue
            if self.allow_abbrev and name.startswith("--") and any(o.startswith(name) for o in known):
                continue
            strays.append(arg)
        return strays

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse's check of choices= (and of command names), with the closest valid value.
        if action.choices is not None and value not in action.choices:
            valid = [str(c) for c in action.choices]
            raise argparse.ArgumentError(
                action, f"invalid choice: {value!r}{did_you_mean(str(value), valid)} (choose from {', '.join(valid)})"
            )


def commands(
    parser: argparse.ArgumentParser, prefix: str = "vigil"
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """Every command under ``parser``, nested ones included (``vigil canary run``), with its help and parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", helps.get(name, ""), sub
                yield from commands(sub, f"{prefix} {name}")
