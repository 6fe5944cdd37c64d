"""argparse, with errors that name the mistake: an unknown option with the closest known one,
an unknown command with the nearest command (or the option it meant: `kvdeck serve` ->
`kvdeck --serve`), then one line of usage and a pointer to --help, never the whole usage.

Why argparse alone says "invalid choice: 'demo'" for `kvdeck --modle demo`: it sets an unknown
option aside and goes on, so the word after it becomes the first positional, which is the
subcommand. When argparse fails (or is left with unrecognised words), `diagnose` walks the
command line with argparse's own tables, the options and how many values each takes, and
finds the first word that is wrong.
"""

import argparse
import difflib
import re
import sys
from dataclasses import dataclass
from typing import NoReturn

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # a value, as argparse reads it here


class CliParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors name the wrong word; its subcommands' parsers are too."""

    _argv: list[str] | None = None

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(self._argv, namespace)

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:  # argparse's "unrecognized arguments", unless diagnose finds the word
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace

    def error(self, message: str) -> NoReturn:
        found = diagnose(self, self._argv or [])
        parser, message = (found.parser, found.message) if found else (self, message)
        usage = parser.format_usage().strip()
        lines = [f"{parser.prog}: error: {message}"]
        if usage.count("\n") == 0:  # a one-line usage helps; a page of it buries the error
            lines.append(usage)
        lines.append(f"see {parser.prog} --help")
        self.exit(2, "\n".join(lines) + "\n")


@dataclass(frozen=True, slots=True)
class Diagnosis:
    parser: argparse.ArgumentParser  # the (sub)command the wrong word was given to
    message: str


def diagnose(parser: argparse.ArgumentParser, argv: list[str]) -> Diagnosis | None:
    """The first unknown option or unknown command in `argv`, named; None if every word is
    known (the error is then about a value, which argparse's own message says well)."""
    commands = _subcommands(parser)
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return None
        if _is_option(word):
            action = _option_action(parser, word)
            if action is None:
                return Diagnosis(parser, _unknown_option(parser, word))
            taken = _values_taken(action, word, argv[i + 1:])
            if action is _AMBIGUOUS or taken is None:
                return None  # argparse's own message (the candidates, a missing value) says it
            i += 1 + taken
            continue
        if commands is not None:
            if word in commands.choices:
                return diagnose(commands.choices[word], argv[i + 1:])
            return Diagnosis(parser, _unknown_command(parser, word, commands))
        i += 1  # a positional argument's value
    return None


def given_options(parser: argparse.ArgumentParser, argv: list[str]) -> list[tuple[str, argparse.Action]]:
    """The options `argv` gives this parser (not its subcommand), each as its full option
    string with its action; argv must have parsed."""
    given = []
    i = 0
    while i < len(argv) and argv[i] != "--":
        word = argv[i]
        if not _is_option(word):
            if _subcommands(parser) is not None:
                break  # the rest belongs to the subcommand
            i += 1
            continue
        action = _option_action(parser, word)
        taken = None if action is None or action is _AMBIGUOUS else \
            _values_taken(action, word, argv[i + 1:])
        if taken is None:
            break
        given.append((_full_option(parser, word), action))
        i += 1 + taken
    return given


_AMBIGUOUS = argparse.Action(option_strings=[], dest="ambiguous")  # a prefix of several options


def _is_option(word: str) -> bool:
    return word.startswith("-") and word != "-" and not _NEGATIVE_NUMBER.match(word)


def _option_table(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return parser._option_string_actions  # argparse's own table: the options as it matches them


def _full_option(parser: argparse.ArgumentParser, word: str) -> str:
    name = word.split("=", 1)[0]
    table = _option_table(parser)
    if name in table:
        return name
    return next(option for option in table if option.startswith(name))


def _option_action(parser: argparse.ArgumentParser, word: str) -> argparse.Action | None:
    """The option's action (exact, or a unique prefix where argparse allows them), None if
    unknown, _AMBIGUOUS if a prefix of several."""
    name = word.split("=", 1)[0]
    table = _option_table(parser)
    if name in table:
        return table[name]
    if not (parser.allow_abbrev and name.startswith("--")):
        return None
    matches = {table[option] for option in table if option.startswith(name)}
    if len(matches) > 1:
        return _AMBIGUOUS
    return matches.pop() if matches else None


def _values_taken(action: argparse.Action, word: str, rest: list[str]) -> int | None:
    """How many of the following words are the option's values; None if they are missing."""
    if "=" in word:
        return 0
    nargs = action.nargs
    if nargs is None or isinstance(nargs, int):
        count = 1 if nargs is None else nargs
        values = rest[:count]
        return count if len(values) == count and not any(map(_is_option, values)) else None
    taken = 0
    for value in rest:
        if _is_option(value) or (nargs == "?" and taken == 1):
            break
        taken += 1
    return taken


def _subcommands(parser: argparse.ArgumentParser) -> argparse.Action | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


# An option a user brings from another command, for what this one takes as an argument:
# `kvdeck --model M` and `kvdeck bench ... --model M`, but `kvdeck quantize M`.
_ARGUMENT_ALIASES = {"--model": ("model", "source")}


def _unknown_option(parser: argparse.ArgumentParser, word: str) -> str:
    name = word.split("=", 1)[0]
    for action in parser._actions:
        if not action.option_strings and action.dest in _ARGUMENT_ALIASES.get(name, ()):
            return (f"unknown option {name}: give the {name[2:]} as an argument, "
                    f"`{parser.prog} {action.metavar or action.dest.upper()} ...`")
    known = [option for option in _option_table(parser) if option.startswith("--")]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"unknown option {name}" + (f"; did you mean {close[0]}?" if close else "")


def _unknown_command(parser: argparse.ArgumentParser, word: str, commands: argparse.Action) -> str:
    meant = [f"--{word}"] if f"--{word}" in _option_table(parser) else []  # `kvdeck serve`
    meant += difflib.get_close_matches(word, list(commands.choices), n=2, cutoff=0.6)
    if meant:
        return f"unknown command {word!r}; did you mean " + \
            " or ".join(f"`{parser.prog} {m}`" for m in meant) + "?"
    return f"unknown command {word!r}; the commands are {', '.join(commands.choices)}"
