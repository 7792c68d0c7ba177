"""The ``unlearn-bench`` command line (``python -m unlearn_bench``): ``run`` (every method side by side on
TOFU-tiny, a given model pair, a pretrained subject or MUSE-News) and ``tiny`` (build the TOFU-tiny pair and run
its sanity gate).

Bad input ends with one ``unlearn-bench: error: ...`` line and exit status 2, before any work; a failed method
is recorded in its row and the run ends with status 1.
"""

from __future__ import annotations

import sys

from hf_unlearn.cli.common import ArgumentParser, default_data_source
from hf_unlearn.console import quiet_console
from hf_unlearn.options import UserError

from . import cli_run, cli_tiny


def build_parser() -> ArgumentParser:
    """The ``unlearn-bench`` parser: the ``run`` and ``tiny`` subcommands."""
    parser = ArgumentParser(prog="unlearn-bench", allow_abbrev=False,
                            description="Every unlearning method of hf-unlearn compared on one benchmark.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    for command in (cli_run, cli_tiny):
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 a method failed, 2 bad input)."""
    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        if getattr(args, "data", "") is None and getattr(args, "benchmark", None) != "muse":
            args.data = default_data_source()
        restore = quiet_console(getattr(args, "verbose", False))
        try:
            return int(args.func(args) or 0)
        finally:
            restore()
    except UserError as err:
        print(f"unlearn-bench: error: {err}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, ConnectionError) as err:
        print(f"unlearn-bench: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
