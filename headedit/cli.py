"""The `headedit` command line: argparse subcommands over the library's stage functions.

Every user-facing failure is one line on stderr and exit code 2; `--debug` shows the traceback.
Subcommands live in `headedit/commands/<name>.py`, each with `add_parser(subparsers)` and `run(args, console)`.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from typing import NoReturn, Sequence

from headedit import __version__
from headedit.errors import HeadeditError

EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (plus exit 2) instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"headedit: error: {message} (see `{self.prog} --help`)\n")
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="headedit", description="Model editing by attention-head ablation.")
    parser.add_argument("--version", action="version", version=f"headedit {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    # lazy: the CLI starts, and reports bad input, without loading torch
    from headedit import commands

    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        if hasattr(module, "add_parser"):
            module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    from rich.console import Console

    console = Console(highlight=False)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return EXIT_USAGE
        return int(args.func(args, console) or 0)
    except HeadeditError as err:
        if debug:
            raise
        sys.stderr.write(f"headedit: error: {err}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("headedit: interrupted (a discovery run can be resumed with `headedit discover --resume RUN`)\n")
        return 130
    except BrokenPipeError:
        return 1
    except Exception as err:  # a bug, not bad input: still one line unless --debug
        if debug:
            raise
        first = str(err).splitlines()[0] if str(err) else ""
        sys.stderr.write(f"headedit: internal error: {type(err).__name__}: {first} (rerun with --debug for details)\n")
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
