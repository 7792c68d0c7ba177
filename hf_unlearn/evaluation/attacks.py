"""Is it really gone? Two attacks that try to bring unlearned knowledge back, each a report section, run by name
here (:func:`run_attacks`, :func:`attack_summary`, :func:`format_attacks`): :func:`quantization_attack` (Zhang et
al., 2024) and :func:`relearning_attack` (Hu et al., 2024). Both work on copies (PEFT adapters merged); a model
that decodes through a decoding-time artifact has its base attacked and the artifact kept (``decoding=``). The
figures, over the forget rows an attack measures::

    forget_nll                 = mean_i NLL_i                  (average per-token answer NLL)
    forget_rouge_l             = mean ROUGE-L recall of greedy answers
    recovered_fraction         = (NLL_unlearned - NLL_attacked) / (NLL_unlearned - NLL_original)
    recovered_fraction_rouge_l = (R_attacked - R_unlearned) / (R_original - R_unlearned)

the fractions with ``original`` only, ``None`` when the gap is below :data:`~.attack_measure.MIN_GAP`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .attack_quant import _check_bits, quantization_attack
from .attack_relearn import DEFAULT_RELEARN_LR, relearning_attack

ATTACK_NAMES = ("quant", "relearn")
"""The attacks by their short names (``hf-unlearn eval --attacks quant,relearn``)."""

_ALIASES = {"quant": "quant", "quantization": "quant", "relearn": "relearn", "relearning": "relearn"}


def parse_attacks(attacks: str | Sequence[str] | Mapping[str, Mapping[str, Any] | None] | None
                  ) -> dict[str, dict[str, Any]]:
    """``{name: kwargs}`` from ``"quant,relearn"``, a list of names or a mapping of names to keyword arguments
    (``quant``/``quantization``, ``relearn``/``relearning``); ``None`` or empty gives ``{}``."""
    if attacks is None:
        return {}
    if isinstance(attacks, str):
        attacks = [a.strip() for a in attacks.split(",") if a.strip()]
    items = attacks.items() if isinstance(attacks, Mapping) else ((a, None) for a in attacks)
    out: dict[str, dict[str, Any]] = {}
    for name, kwargs in items:
        key = _ALIASES.get(str(name).lower())
        if key is None:
            raise ValueError(f"Unknown attack {name!r}; choose from {', '.join(ATTACK_NAMES)}.")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise ValueError(f"The options of attack {name!r} must be a dict, got {type(kwargs).__name__}.")
        out[key] = dict(kwargs or {})
    return out


def check_attack_options(chosen: Mapping[str, Mapping[str, Any]], **common: Any) -> None:
    """Refuse, before any model call, options an attack does not take, would refuse later or that make it a no-op
    (``steps=0``, ``learning_rate=0``: a null control only when :func:`relearning_attack` is called directly)."""
    import inspect

    functions = {"quant": quantization_attack, "relearn": relearning_attack}
    for name, kwargs in chosen.items():
        merged = _merged(name, common, kwargs)
        try:
            inspect.signature(functions[name]).bind(None, None, [], **merged)
        except TypeError as err:
            raise ValueError(f"Bad options for the {name} attack: {err}.") from None
        if name == "quant":
            _check_bits(merged.get("bits", (4, 8)), merged.get("method", "roundtrip"))
        else:
            share = merged.get("share", 0.1)
            if not isinstance(share, (int, float)) or not 0.0 < share < 1.0:
                raise ValueError(f"share must be in (0, 1), got {share!r}.")
            steps = merged.get("steps", 10)
            if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
                raise ValueError(f"steps must be a non-negative integer, got {steps!r}.")
            if steps == 0:
                raise ValueError("steps=0: a relearning attack of no steps changes nothing and reports nothing; use steps >= 1 (10 by default).")
            lr = merged.get("learning_rate", DEFAULT_RELEARN_LR)
            if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or not lr > 0:
                raise ValueError(f"learning_rate must be a finite number > 0 for the relearning attack, got {lr!r}.")


def run_attacks(
    model: Any, tokenizer: Any, forget: Sequence[Mapping[str, Any]],
    retain: Sequence[Mapping[str, Any]] | None,
    attacks: str | Sequence[str] | Mapping[str, Mapping[str, Any] | None], **common: Any,
) -> dict[str, Any]:
    """Run the named ``attacks`` (:func:`parse_attacks`) on ``model``: ``{"quantization": section, "relearning":
    section}`` for those asked. ``common`` (e.g. ``template``, ``original``, ``decoding``, ``progress``) goes to
    every attack; an attack's own options override it."""
    chosen = parse_attacks(attacks)
    check_attack_options(chosen, **common)
    out: dict[str, Any] = {}
    if "quant" in chosen:
        out["quantization"] = quantization_attack(model, tokenizer, forget, **_merged("quant", common, chosen["quant"]))
    if "relearn" in chosen:
        kwargs = {"retain": retain, **_merged("relearn", common, chosen["relearn"])}
        out["relearning"] = relearning_attack(model, tokenizer, forget, **kwargs)
    return out


def _merged(name: str, common: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """An attack's keyword arguments: ``common`` overridden by its own; the relearning attack's ``batch_size``
    is the training one, so a common ``batch_size`` becomes its ``eval_batch_size``."""
    merged = {**common, **own}
    if name == "relearn" and "batch_size" in common and "batch_size" not in own:
        merged["eval_batch_size"] = merged.pop("batch_size")
    return merged


ATTACK_COLUMNS = (
    ("attack_nf4_forget_rouge_l", "forget ROUGE-L (NF4 attack)"),
    ("attack_int8_forget_rouge_l", "forget ROUGE-L (int8 attack)"), ("attack_nf4_recovered", "NF4 recovered"),
    ("attack_int8_recovered", "int8 recovered"), ("attack_relearn_forget_nll", "forget NLL after relearning"),
    ("attack_relearn_recovered", "relearning recovered"),
    ("attack_benign_recovered", "benign fine-tune recovered"),
)
"""The flat attack figures (:func:`attack_summary`) and their titles, for tables and model cards."""


def attack_summary(section: Mapping[str, Any] | None) -> dict[str, float | None]:
    """The headline figure of each attack, flat (:data:`ATTACK_COLUMNS`, ``None`` where not run): forget ROUGE-L and
    recovered NLL fraction of each quantized copy, held-out forget NLL after relearning, and the recovered NLL
    fractions of targeted relearning and benign fine-tuning."""
    out: dict[str, float | None] = dict.fromkeys(key for key, _ in ATTACK_COLUMNS)
    section = section or {}
    quant = (section.get("quantization") or {}).get("bits", {})
    for bits, scheme in (("4", "nf4"), ("8", "int8")):
        entry = quant.get(bits)
        if entry:
            out[f"attack_{scheme}_forget_rouge_l"] = entry.get("forget_rouge_l")
            out[f"attack_{scheme}_recovered"] = entry.get("recovered_fraction")
    relearn = section.get("relearning")
    if relearn:
        out["attack_relearn_forget_nll"] = relearn.get("forget_nll_after")
        out["attack_relearn_recovered"] = relearn.get("recovered_fraction")
        out["attack_benign_recovered"] = (relearn.get("benign") or {}).get("recovered_fraction")
    return out


def format_attacks(section: Mapping[str, Any] | None) -> str:
    """The attack section as printable lines (empty when no attack ran)."""
    if not section:
        return ""
    lines = ["Attacks (is it really gone?)"]

    def f(value: Any) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    quant = section.get("quantization")
    if quant:
        full = quant["full_precision"]
        lines.append(f"  quantization ({quant['method']}, {quant['num_rows']} forget rows): full precision NLL {f(full['forget_nll'])}, ROUGE-L {f(full['forget_rouge_l'])}")
        for entry in quant["bits"].values():
            lines.append(f"    {entry['bits']}-bit {entry['scheme']}: NLL {f(entry['forget_nll'])}, ROUGE-L {f(entry['forget_rouge_l'])}, recovered {f(entry['recovered_fraction'])}")
    relearn = section.get("relearning")
    if relearn:
        lines.append(f"  relearning ({relearn['steps']} steps at lr {relearn['learning_rate']:g} on "
                     f"{relearn['num_attack_rows']} forget rows, measured on {relearn['num_eval_rows']}): NLL "
                     f"{f(relearn['forget_nll_before'])} -> {f(relearn['forget_nll_after'])}, ROUGE-L "
                     f"{f(relearn['forget_rouge_l_before'])} -> {f(relearn['forget_rouge_l_after'])}, recovered "
                     f"{f(relearn['recovered_fraction'])}")
        benign = relearn.get("benign")
        if benign:
            lines.append(f"    benign fine-tune on {benign['num_train_rows']} retain rows: NLL {f(benign['forget_nll_after'])}, recovered {f(benign['recovered_fraction'])}")
    kept = (quant or relearn or {}).get("decoding")
    if kept:
        lines.append(f"  ({kept})")
    return "\n".join(lines)
