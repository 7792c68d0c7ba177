"""The ``hf-unlearn`` command line: ``demo``, ``unlearn`` and ``eval``. Bad input ends with one ``hf-unlearn: error:``
line and exit status 2 before any work; a failure during a run prints one line naming the method, the phase and
the log file (exit status 1)."""

from __future__ import annotations

import os
import sys

from ..console import quiet_console
from ..options import RunFailure, UserError, join_negative_values
from . import demo, unlearn
from . import eval as eval_command
from .common import TOFU_DIR_ENV, ArgumentParser, default_data_source

__all__ = ["build_parser", "main"]

def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="hf-unlearn", allow_abbrev=False,
                            description="Machine unlearning for causal LMs on the Hugging Face stack.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    for command in (demo, unlearn, eval_command):  # in the order --help lists them
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 a run failed, 2 bad input)."""
    argv = join_negative_values(list(sys.argv[1:] if argv is None else argv))
    data_hint = ""
    try:
        args, extra = build_parser().parse_known_args(argv)
        takes_extra = getattr(args, "takes_method_options", False)  # `unlearn`: the method's config options
        if extra and not takes_extra:
            raise UserError(f"unrecognized arguments: {' '.join(extra)}")
        if hasattr(args, "data") and not getattr(args, "help", False):  # --data's default; what to print offline
            given = args.data is not None
            args.data = args.data if given else default_data_source()
            if not (os.path.isdir(args.data) or str(args.data).startswith("synthetic")):
                data_hint = (f"Could not load the TOFU data from the Hub dataset {args.data} ({{cause}}); offline, "
                             "pass --data with a local folder of TOFU <config>.jsonl files (or --data synthetic)"
                             f"{'' if given else ', or set ' + TOFU_DIR_ENV}.")
        restore = quiet_console(getattr(args, "verbose", False))
        try:
            return int((args.func(args, extra) if takes_extra else args.func(args)) or 0)
        finally:
            restore()
    except UserError as err:
        print(f"hf-unlearn: error: {err}", file=sys.stderr)
        return 2
    except RunFailure as err:
        if not err.printed:
            print(f"hf-unlearn: error: {err}", file=sys.stderr)
        return 1
    except ConnectionError as err:
        message = " ".join(str(err).split())
        if data_hint:
            message = data_hint.format(cause=type(err.__cause__ or err).__name__)
        print(f"hf-unlearn: error: {message}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as err:
        print(f"hf-unlearn: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hf-unlearn: interrupted (a run with save_strategy=steps can continue with --resume)", file=sys.stderr)
        return 130
