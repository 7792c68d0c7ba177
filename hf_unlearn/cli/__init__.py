"""The `hf-unlearn` command line: `demo`, `unlearn` and `eval`.

Console: one progress line per method and phase (training, evaluation, NF4 re-check), then the table. The
Trainer's per-step logs go to ``<output>/logs/<method>.jsonl`` (``--verbose`` also prints them).
Third-party chatter a user cannot act on (library log messages, progress bars, deprecation notices raised
inside transformers/TRL/PEFT/bitsandbytes) is silenced here, in the CLI only: importing ``hf_unlearn``
changes no global logging or warning state.

This package is a thin dispatcher: one module per command (:mod:`.demo`, :mod:`.unlearn`, :mod:`.eval`), each
with ``add_parser(subparsers)`` and its command function, and what they share in :mod:`.common`. `unlearn` runs
:func:`hf_unlearn.run.unlearn` and takes the method's own config fields as options (``hf-unlearn unlearn --method
masc --help`` lists every field).

``--data`` (``unlearn``, ``eval``) defaults to the folder in ``$HF_UNLEARN_TOFU_DIR`` when
set, else the Hub dataset ``locuslab/TOFU``.

Bad input ends with one ``hf-unlearn: error: ...`` line and exit status 2, before any training step and before
any output folder is created: an unknown method or option, a value of the wrong type or one the method's config
refuses (for the trainers: a learning rate that is not a finite number > 0, zero or negative epochs,
``--max_steps 0``, a batch size below 1, ``--max_length`` below 2, any NaN or infinite value, a value outside
its range such as a seed outside 0..2**32 - 1, ``trust_remote_code``), an output folder that is unsafe or not
writable, a model path that does not exist, a model folder without weights or without a tokenizer, one that asks
to run its own code (``auto_map``, an unknown ``model_type``; no prompt is ever shown), or with pickle-only,
damaged, non-finite or mismatched weights (:mod:`hf_unlearn.model_files`), a rows file or TOFU config with a
missing, empty, null, non-string or not valid Unicode question or answer, an empty or whitespace-only document, a
link inside a documents folder, a UTF-8 byte-order mark or a repeated key in JSON input, a ``--resume`` with
another setting or other rows than the run it resumes, forget rows that also occur in the retain rows, a forget prompt
that leaves no room for an answer token, a prompt template the tokenizer cannot render, a T3 ``--layer`` outside
the model, a GROM ``--target_modules`` entry the model does not have, a retain reference that is missing,
unreadable or (with ``--eval``) made on other rows, TOFU configs that ``--eval`` needs but the data source lacks,
an invalid repo id, a missing token when pushing (:func:`hf_unlearn.preconditions.check_run_preconditions` holds
the checks that need the model). A failure during a run prints one line naming the method, the phase and the log
file (exit status 1).
"""

from __future__ import annotations

import os
import sys

from ..console import quiet_console
from ..options import RunFailure, UserError, join_negative_values
from . import demo, unlearn
from . import eval as eval_command
from .common import TOFU_DIR_ENV, ArgumentParser, default_data_source

__all__ = ["build_parser", "main"]

#: The commands, in the order ``hf-unlearn --help`` lists them: each module's ``add_parser(subparsers)``.
COMMANDS = (demo, unlearn, eval_command)


def build_parser() -> ArgumentParser:
    """The ``hf-unlearn`` parser: one subcommand per module of :data:`COMMANDS`."""
    parser = ArgumentParser(prog="hf-unlearn", allow_abbrev=False,
                            description="Machine unlearning for causal LMs on the Hugging Face stack.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def _data_hint(args) -> str:
    """Fill ``--data``'s default (:func:`~.common.default_data_source`); the line to print when the TOFU data cannot
    be fetched from the Hub (``{cause}`` is the error's type), ``""`` for a local source."""
    if not hasattr(args, "data") or getattr(args, "help", False):
        return ""
    given = args.data is not None
    args.data = args.data if given else default_data_source()
    if os.path.isdir(args.data) or str(args.data).startswith("synthetic"):
        return ""
    return (f"Could not load the TOFU data from the Hub dataset {args.data} ({{cause}}); offline, pass --data with a "
            f"local folder of TOFU <config>.jsonl files (or --data synthetic){'' if given else ', or set ' + TOFU_DIR_ENV}.")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 a run failed, 2 bad input)."""
    argv = join_negative_values(list(sys.argv[1:] if argv is None else argv))
    data_hint = ""
    try:
        args, extra = build_parser().parse_known_args(argv)
        takes_extra = getattr(args, "takes_method_options", False)  # `unlearn`: the method's config options
        if extra and not takes_extra:
            raise UserError(f"unrecognized arguments: {' '.join(extra)}")
        data_hint = _data_hint(args)
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
