"""The equal-budget tuning protocol: which configurations each method gets, the rule that picks one per method
without forget quality, the sweep's resumable log, and the utility-matched view of the trade-off.

The rule is written down in ``docs/tuning-protocol.md``; this module is its code. Everything here is pure (no
model, no torch) so that the protocol's guarantees are tested directly:

* every method gets the same number of configurations (:func:`check_equal_budget` refuses a sweep that does not,
  before any work);
* within a configuration the package's own selection rule picks the candidate (a trainer's checkpoint, a point of
  GROM's strength path, a ``(T, w)`` of T3's grid); across configurations :func:`choose_configuration` picks one
  per method from :class:`ConfigurationOutcome` records, which hold the criterion's figures and no forget quality;
* a finished configuration is stored under a key of its content (:func:`configuration_key`), so a sweep stopped
  midway resumes where it stopped (:class:`SweepLog`);
* :func:`best_forget_quality_at_utility` is the oracle view beside the rule's pick: the best forget quality among
  the candidates that keep model utility at or above 90% of the target's (the sweep measures candidates without
  generation, so their utility is :func:`model_utility_without_generation`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: The learning rates every trainer is swept over (open-unlearning and the NPO/SimNPO papers unlearn at the
#: fine-tuning learning rate; the SmolLM2 target is fine-tuned at 3e-4).
LEARNING_RATES = (1e-5, 3e-5, 1e-4, 3e-4)
#: Every trainer runs up to this many epochs over the forget rows, the first of them a linear warm-up.
EPOCHS = 10
WARMUP_EPOCHS = 1
#: The trainers of the headline, each swept over :data:`LEARNING_RATES`.
TRAINERS = ("grad_ascent", "grad_diff", "npo", "simnpo", "atwu", "masc", "rmu", "wga", "undial")
#: The methods whose candidates are not checkpoints, each with as many configurations as a trainer: GROM's ridge
#: (its candidates are the points of its exact strength path) and T3's head rank (its candidates the ``(T, w)``
#: calibration grid).
NON_TRAINER_AXES = {"grom": ("ridge", (1e-4, 1e-3, 1e-2, 1e-1)), "t3": ("rank", (5, 10, 20, 40))}
#: The protocol's second axis: each method's one main weight, the method's default first, every value joined with
#: every learning rate. A sweep with the second axis refuses a method that has none, so the counts stay equal.
MAIN_WEIGHTS = {"npo": ("beta", (0.1, 0.5)), "simnpo": ("delta", (0.0, 1.0)),
                "grad_diff": ("retain_weight", (1.0, 5.0)), "atwu": ("budget", (0.2, 0.4))}
#: The criterion figures a configuration's outcome holds; forget quality is not among them.
CRITERION_FIELDS = ("shift_gap", "equivalence_pvalue", "retain_change")


def trainer_schedule(epochs: int = EPOCHS, warmup_epochs: int = WARMUP_EPOCHS) -> dict[str, Any]:
    """The trainer arguments every trainer configuration shares: ``epochs`` over the forget rows, a linear warm-up
    over the first ``warmup_epochs`` of them (transformers' ``warmup_steps`` as a fraction of the run,
    ``warmup_epochs / epochs``) and linear decay, no step ceiling."""
    return {"num_train_epochs": epochs, "warmup_steps": warmup_epochs / epochs, "lr_scheduler_type": "linear",
            "max_steps": -1}


def protocol_configurations(methods: Sequence[str], second_axis: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Each method's configurations, as setting overrides: a trainer's :data:`LEARNING_RATES` with
    :func:`trainer_schedule`, GROM's and T3's :data:`NON_TRAINER_AXES`; with ``second_axis``, each learning rate
    joined with every value of the method's :data:`MAIN_WEIGHTS` (learning rate first in the order). An unknown
    method, or with ``second_axis`` a method without a main weight, is refused."""
    if second_axis:
        missing = [m for m in methods if m not in MAIN_WEIGHTS]
        if missing:
            raise ValueError(f"The second axis gives every method the same number of configurations; {missing} have "
                             f"no main weight (those with one: {sorted(MAIN_WEIGHTS)}).")
    out: dict[str, list[dict[str, Any]]] = {}
    for method in methods:
        if method in TRAINERS:
            out[method] = [{"learning_rate": lr, **trainer_schedule()} for lr in LEARNING_RATES]
        elif method in NON_TRAINER_AXES:
            key, values = NON_TRAINER_AXES[method]
            out[method] = [{key: v} for v in values]
        else:
            raise ValueError(f"The tuning protocol has no configurations for {method!r}; it covers "
                             f"{sorted([*TRAINERS, *NON_TRAINER_AXES])}.")
        if second_axis:
            key, values = MAIN_WEIGHTS[method]
            out[method] = [{**c, key: v} for c in out[method] for v in values]
    check_equal_budget(out)
    return out


def check_equal_budget(configurations: Mapping[str, Sequence[Mapping[str, Any]]]) -> int:
    """The number of configurations every method gets; a ``ValueError`` naming each method whose count differs
    from the most common one (a method with more or fewer configurations than the others), or a method whose
    configurations repeat one another."""
    counts = {m: len(c) for m, c in configurations.items()}
    if not counts:
        raise ValueError("A sweep needs at least one method.")
    values = sorted(counts.values())
    budget = max(set(values), key=lambda v: (values.count(v), -v))
    unequal = {m: n for m, n in counts.items() if n != budget}
    if unequal or budget < 1:
        raise ValueError(f"Every method must get the same number of configurations ({budget}); these differ: "
                         f"{unequal}.")
    for method, configs in configurations.items():
        keys = [json.dumps(dict(c), sort_keys=True) for c in configs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"{method}: two configurations are the same ({keys}).")
    return budget


def configuration_key(method: str, settings: Mapping[str, Any], context: Mapping[str, Any]) -> str:
    """The SHA-256 of the canonical JSON of ``(method, settings, context)``: a finished configuration is found again
    by its content (``context``: the pair's fingerprints, the rows, the rule), wherever the files lie."""
    payload = json.dumps({"method": method, "settings": dict(settings), "context": dict(context)}, sort_keys=True,
                         default=str)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ConfigurationOutcome:
    """What the across-configuration rule may read of one configuration: the criterion's figures of the candidate
    the package's rule chose within it, whether that candidate was eligible (retain change within the
    tolerance), and the configuration's position in the protocol's order (weaker first). No forget quality."""

    index: int
    shift_gap: float
    equivalence_pvalue: float
    retain_change: float
    eligible: bool


def outcome_from_selection(index: int, selection: Mapping[str, Any]) -> ConfigurationOutcome:
    """A configuration's :class:`ConfigurationOutcome` from its selection record (``SelectionRecord.to_dict()``):
    the chosen candidate's :data:`CRITERION_FIELDS` and eligibility, nothing else."""
    chosen = selection["measurements"][selection["index"]]
    tolerance = float(selection["rule"]["retain_tolerance"])
    figures = {k: float(chosen[k]) for k in CRITERION_FIELDS}
    return ConfigurationOutcome(index=index, eligible=figures["retain_change"] <= tolerance, **figures)


def choose_configuration(outcomes: Sequence[ConfigurationOutcome]) -> int:
    """The pre-registered rule across one method's configurations (``docs/tuning-protocol.md``): the package's
    selection rule applied to the configurations' chosen candidates.

    1. configurations whose chosen candidate keeps the retain change within the tolerance are eligible;
    2. among them, the one whose chosen candidate has the smallest ``|shift_gap|``;
    3. with no eligible configuration, the one with the smallest retain change;
    ties go to the earlier configuration in the protocol's order (the smaller learning rate, the weaker setting).
    Returns the chosen outcome's ``index``.
    """
    if not outcomes:
        raise ValueError("No configuration has finished; nothing to choose from.")
    eligible = [o for o in outcomes if o.eligible]
    if eligible:
        return min(eligible, key=lambda o: (abs(o.shift_gap), o.index)).index
    return min(outcomes, key=lambda o: (o.retain_change, o.index)).index


def best_forget_quality_at_utility(
    candidates: Sequence[Mapping[str, float]], target_utility: float, fraction: float = 0.9
) -> int | None:
    """The oracle view: the index of the candidate with the highest ``forget_quality`` among those with
    ``model_utility >= fraction * target_utility`` (ties: the earlier candidate), ``None`` when none keeps it."""
    bar = fraction * target_utility
    kept = [(i, c) for i, c in enumerate(candidates)
            if _finite(c.get("model_utility")) and c["model_utility"] >= bar and _finite(c.get("forget_quality"))]
    if not kept:
        return None
    return max(kept, key=lambda ic: (ic[1]["forget_quality"], -ic[0]))[0]


def model_utility_without_generation(splits: Mapping[str, Mapping[str, Sequence[float]]]) -> float:
    """The truth-ratio and probability part of TOFU's model utility, for candidates scored without generation:
    ``H(mean_i prob_i, mean_i max(0, 1 - tr_i) for each split)``, ``H`` the harmonic mean (0 when any part is 0);
    ``splits`` maps each utility split (retain, real authors, world facts) to its per-row ``prob`` and
    ``truth_ratio``."""
    parts = []
    for rows in splits.values():
        parts.append(sum(rows["prob"]) / len(rows["prob"]))
        parts.append(sum(max(0.0, 1.0 - t) for t in rows["truth_ratio"]) / len(rows["truth_ratio"]))
    if not parts or min(parts) <= 0:
        return 0.0
    return len(parts) / sum(1.0 / v for v in parts)


def utility_matched_view(candidates: Sequence[Mapping[str, Any]], target_utility: float,
                         fraction: float = 0.9) -> dict[str, Any] | None:
    """The oracle view over every scored candidate of one method (``candidates``: dicts with ``forget_quality``,
    ``model_utility`` and where they came from): the one :func:`best_forget_quality_at_utility` picks, ``None`` when
    none keeps ``fraction`` of the target's utility."""
    index = best_forget_quality_at_utility(candidates, target_utility, fraction)
    return None if index is None else dict(candidates[index])


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


class SweepLog:
    """The sweep's finished configurations, ``{key: record}`` in one JSON file, written through the package's write
    gate (:func:`hf_unlearn.safe_output.atomic_write_json`) after every configuration. A record is stored under
    :func:`configuration_key`, so a resumed sweep skips exactly the configurations whose content it has."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.records: dict[str, dict[str, Any]] = {}
        if self.path.is_symlink():
            raise ValueError(f"{self.path} is a link; the sweep log is never written through one.")
        if self.path.is_file():
            saved = json.loads(self.path.read_text(encoding="utf-8"))
            self.records = dict(saved.get("configurations", {}))

    def done(self, key: str) -> bool:
        return key in self.records

    def add(self, key: str, record: Mapping[str, Any], header: Mapping[str, Any]) -> None:
        """Store ``record`` under ``key`` and write the file (``header``: the protocol and provenance)."""
        from hf_unlearn.safe_output import atomic_write_json

        self.records[key] = dict(record)
        atomic_write_json(self.path, {**dict(header), "configurations": self.records})


def outcome_fields() -> tuple[str, ...]:
    """The names of a :class:`ConfigurationOutcome`'s fields (what the across-configuration rule can read)."""
    return tuple(asdict(ConfigurationOutcome(0, 0.0, 0.0, 0.0, True)))
