"""A method's config dataclass as command-line options (through ``HfArgumentParser``), and the checks of the settings
given that way; a bad option or value raises :class:`UserError` (one line, exit status 2)."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
import types
import typing
import warnings
from typing import Any

from .registry import get_method

__all__ = [
    "CLI_OWNED_FIELDS", "RunFailure", "UserError", "config_kwargs", "config_parser", "join_negative_values",
    "method_config_class", "option_fields", "options_dataclass", "parse_method_settings", "validate_settings",
]

#: Config fields the CLI sets itself (``--output``, ``--resume``, ``--push-to-hub``) or that describe the base
#: model and are filled in from it: never options.
CLI_OWNED_FIELDS = frozenset({
    "output_dir", "resume_from_checkpoint", "push_to_hub", "hub_token", "overwrite_output_dir", "overwrite",
    "hidden_size", "vocab_size", "fit_report",
})

class UserError(Exception):
    """A mistake in the command line or its inputs: reported as one line, exit status 2."""


class RunFailure(Exception):
    """A method failed during a phase: one line (method, phase, log file), exit status 1; ``printed`` when the
    progress line already showed it."""

    def __init__(self, message: str, printed: bool = False):
        super().__init__(message)
        self.printed = printed


def method_config_class(method: str) -> type:
    try:
        return get_method(method).config_cls
    except KeyError:
        raise UserError(f"Method {method!r} is not registered.") from None


def option_fields(config_class: type) -> list[dataclasses.Field]:
    """The init fields of ``config_class`` that become options: not the CLI's own, nor a
    ``PreTrainedConfig``'s generic ones."""
    if not dataclasses.is_dataclass(config_class):
        raise UserError(f"{config_class.__name__} is not a dataclass; cannot build its options.")
    from transformers import PreTrainedConfig

    skip = set(CLI_OWNED_FIELDS)
    if issubclass(config_class, PreTrainedConfig) and dataclasses.is_dataclass(PreTrainedConfig):
        skip |= {f.name for f in dataclasses.fields(PreTrainedConfig)}
    return [f for f in dataclasses.fields(config_class)
            if f.init and f.name not in skip and not f.name.startswith("base_") and not f.name.startswith("_")]


def _is_list_type(hint: Any) -> bool:
    if typing.get_origin(hint) is list:
        return True
    args = typing.get_args(hint)
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and any(typing.get_origin(a) is list for a in args)


def options_dataclass(config_class: type) -> type:
    """A plain dataclass of the :func:`option_fields` of ``config_class`` (resolved types, same defaults
    and help) for ``HfArgumentParser``, also for configs whose annotations it cannot resolve."""
    selected = option_fields(config_class)
    try:
        hints = typing.get_type_hints(config_class)
    except Exception:  # a config base annotates a name its module does not import: resolve only our fields
        namespace = {k: v for klass in reversed(config_class.__mro__) for k, v in vars(sys.modules[klass.__module__]).items()}
        hints = {f.name: eval(f.type, namespace) if isinstance(f.type, str) else f.type  # noqa: S307
                 for f in selected}
    spec = []
    unset: set[str] = set()
    for f in selected:
        kwargs: dict[str, Any] = {"metadata": dict(f.metadata)}
        if _is_list_type(hints.get(f.name)) and f.default is not dataclasses.MISSING and not isinstance(
                f.default, (list, type(None))):
            # A list option whose default is not a list (GROM's layers="auto"): argparse would convert the default
            # with the element type, so the option defaults to None, which config_kwargs() leaves out.
            kwargs["default"] = None
            kwargs["metadata"]["help"] = f"{f.metadata.get('help', '')} (default when not given: {f.default!r})"
            unset.add(f.name)
        elif f.default is not dataclasses.MISSING:
            kwargs["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kwargs["default_factory"] = f.default_factory
        else:
            kwargs["default"] = None
        spec.append((f.name, hints.get(f.name, f.type), dataclasses.field(**kwargs)))
    return dataclasses.make_dataclass(f"{config_class.__name__}Options", spec,
                                      namespace={"_default_when_none": frozenset(unset)})


def config_kwargs(options: Any) -> dict[str, Any]:
    """The config's keyword arguments from an :func:`options_dataclass` instance (an option left at ``None``
    that stands for a non-list default is left out)."""
    skip = getattr(options, "_default_when_none", frozenset())
    return {k: v for k, v in dataclasses.asdict(options).items() if not (k in skip and v is None)}


def config_parser(method: str, config_class: type | None = None) -> argparse.ArgumentParser:
    """An ``HfArgumentParser`` with one option per field of the method's config."""
    from transformers import HfArgumentParser

    config_class = config_class or method_config_class(method)

    class _Parser(HfArgumentParser):
        def error(self, message: str) -> typing.NoReturn:
            raise UserError(f"{method}: {message}")

    parser = _Parser(options_dataclass(config_class), prog=f"hf-unlearn unlearn --method {method}",
                     allow_abbrev=False, add_help=False,
                     description=f"Options of {config_class.__name__} (the config of method {method!r}).")
    parser.config_class = config_class
    return parser


def parse_method_settings(method: str, argv: list[str], preset: dict[str, Any] | None = None) -> dict[str, Any]:
    """``preset`` updated with every option given in ``argv`` (even one equal to the default), so the
    settings record exactly what was chosen; unknown options and wrong types raise :class:`UserError`."""
    parser = config_parser(method)
    argv = join_negative_values(list(argv))
    dests = {a.dest for a in parser._actions}
    preset = {k: v for k, v in (preset or {}).items() if k in dests}
    namespace, unknown = parser.parse_known_args(argv)
    if unknown:
        flags = [u for u in unknown if u.startswith("-")] or unknown
        names = [opt for a in parser._actions for opt in a.option_strings]
        hint = difflib.get_close_matches(flags[0].split("=", 1)[0], names, n=1)
        suggestion = f" (did you mean {hint[0]}?)" if hint else ""
        raise UserError(f"Unknown option {flags[0]} for method {method!r}{suggestion}; `hf-unlearn unlearn "
                        f"--method {method} --help` lists its {parser.config_class.__name__} fields.")
    given = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    chosen = {a.dest for a in parser._actions if given.intersection(a.option_strings)}
    values = vars(namespace)
    return {**preset, **{k: values[k] for k in chosen}}


def validate_settings(method: str, settings: dict[str, Any], output_dir: str | os.PathLike) -> Any:
    """Build the method's config from ``settings`` so that a bad value fails now (one line), not mid-run."""
    config_class = method_config_class(method)
    kwargs = dict(settings)
    if get_method(method).is_trainer:
        kwargs = {"output_dir": str(output_dir), "report_to": "none", "save_strategy": "no", **kwargs}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return config_class(**kwargs)
    except (ValueError, TypeError) as err:
        raise UserError(f"Invalid {method} setting: {' '.join(str(err).split())}") from None


def join_negative_values(argv: list[str]) -> list[str]:
    """``--option -1e-3`` as ``--option=-1e-3`` (argparse would read ``-1e-3`` as an option)."""
    out: list[str] = []
    for token in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and token.startswith("-") and len(token) > 1:
            try:
                float(token)
            except ValueError:
                pass
            else:
                out[-1] = f"{out[-1]}={token}"
                continue
        out.append(token)
    return out
