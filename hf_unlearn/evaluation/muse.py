"""The MUSE evaluator (Shi et al., 2024): the model-side criteria C1-C4 of MUSE's six-way table on MUSE-News, as the
authors' ``eval.py`` and ``metrics/*.py`` compute them:

* **C1 VerbMem**: each ``verbmem/forget`` prompt continued greedily for 128 tokens, ROUGE-L F1 against ``gt`` cut to
  its first 128 tokens;
* **C2 / C4 KnowMem** (forget, retain): each question after the 10 in-context examples of its set
  (:func:`build_knowmem_prompt`), the greedy answer (32 tokens) cut at :data:`KNOWMEM_STOPS`, ROUGE-L F1;
* **C3 PrivLeak**: the Min-40% score of every ``privleak/forget`` and ``privleak/holdout`` text,
  ``AUC = P(s_forget > s_holdout)``, ``PrivLeak = (AUC - AUC_retrain) / AUC_retrain * 100``.
Prompts too long for the model lose their beginning, texts are scored on their beginning (counted in the settings).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..assets import __version__
from ..data.documents import bos_prefix
from ..data.prompts import collate_qa, ensure_pad_token, model_max_positions
from ..jsonutil import read_json_file
from ..logprobs import TokenScorer, answer_mask, causal_lm_scorer, eval_mode, model_device
from ..safe_output import check_report_path
from . import metrics
from .generation import greedy_generate
from .muse_report import MUSEReport
from .privacy import min_k_score

MUSE_HUB_ID = "muse-bench/MUSE-News"
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
MUSE_CRITERIA = ("verbmem_forget", "knowmem_forget", "privleak", "knowmem_retain")
VERBMEM_MAX_NEW_TOKENS = 128  # authors' eval.py verbmem_max_new_tokens
KNOWMEM_MAX_NEW_TOKENS = 32  # authors' eval.py knowmem_max_new_tokens
PRIVLEAK_MIN_K = 0.4  # the authors' privleak_auc_key 'forget_holdout_Min-40%'
NEWS_RETRAIN_AUC = 0.47719999999999996  # authors' constants.py AUC_RETRAIN['news']['forget_holdout_Min-40%']
KNOWMEM_STOPS = ("\n\n", "\nQuestion", "Question:")  # authors' metrics/knowmem.py

# part -> (local file names, tried in order; Hub (config, split))
MUSE_PARTS: dict[str, tuple[tuple[str, ...], tuple[str, str]]] = {
    "verbmem_forget": (("verbmem/forget.json",), ("verbmem", "forget")),
    "knowmem_forget": (("knowmem/forget_qa.json",), ("knowmem", "forget_qa")),
    "knowmem_forget_icl": (("knowmem/forget_qa_icl.json",), ("knowmem", "forget_qa_icl")),
    "knowmem_retain": (("knowmem/retain2_qa.json", "knowmem/retain_qa.json"), ("knowmem", "retain_qa")),
    "knowmem_retain_icl": (("knowmem/retain2_qa_icl.json", "knowmem/retain_qa_icl.json"), ("knowmem", "retain_qa_icl")),
    "privleak_forget": (("privleak/forget.json",), ("privleak", "forget")),
    "privleak_holdout": (("privleak/holdout.json",), ("privleak", "holdout")),
}
# the parts each criterion reads
CRITERION_PARTS = {
    "verbmem_forget": ("verbmem_forget",), "knowmem_forget": ("knowmem_forget", "knowmem_forget_icl"),
    "privleak": ("privleak_forget", "privleak_holdout"),
    "knowmem_retain": ("knowmem_retain", "knowmem_retain_icl"),
}
_FIELDS = {"verbmem_forget": ("prompt", "gt"), "knowmem_forget": ("question", "answer"),
           "knowmem_forget_icl": ("question", "answer"), "knowmem_retain": ("question", "answer"),
           "knowmem_retain_icl": ("question", "answer"), "privleak_forget": (), "privleak_holdout": ()}


def _checked_items(part: str, items: Sequence[Any], origin: str) -> list[Any]:
    keys = _FIELDS[part]
    out = []
    for i, item in enumerate(items):
        if not keys:  # privleak: texts (a string, or a row with a "text" field on the Hub)
            item = item.get("text") if isinstance(item, Mapping) else item
            if not isinstance(item, str):
                raise ValueError(f"{origin}: item {i} is not a text.")
        elif not (isinstance(item, Mapping) and all(isinstance(item.get(k), str) for k in keys)):
            raise ValueError(f"{origin}: item {i} needs string fields {list(keys)}.")
        out.append(item if not keys else {k: item[k] for k in keys})
    if not out:
        raise ValueError(f"{origin} is empty.")
    return out


def load_muse_part(source: str | os.PathLike, part: str) -> list[Any]:
    """One part of the MUSE data (a key of :data:`MUSE_PARTS`): verbmem ``{prompt, gt}`` rows, knowmem
    ``{question, answer}`` rows, or privleak texts, from a local folder (its JSON file) or a Hub dataset id."""
    if part not in MUSE_PARTS:
        raise ValueError(f"Unknown MUSE part {part!r}; use one of {list(MUSE_PARTS)}.")
    files, (config, split) = MUSE_PARTS[part]
    folder = Path(source).expanduser()
    if folder.is_dir():
        for name in files:
            if (folder / name).is_file():
                items = read_json_file(folder / name)
                if not isinstance(items, list):
                    raise ValueError(f"{folder / name} does not hold a JSON list.")
                return _checked_items(part, items, str(folder / name))
        raise FileNotFoundError(f"{folder} has no {' or '.join(files)} (MUSE part {part!r}).")
    if not _HUB_ID.fullmatch(str(source)) or str(source).startswith((".", "~")):
        raise FileNotFoundError(f"No MUSE data folder at {source} (and it is not a Hub dataset id).")
    import datasets

    rows = datasets.load_dataset(str(source), config, split=split)
    return _checked_items(part, list(rows), f"{source} ({config}/{split})")


def build_knowmem_prompt(question: str, icl: Sequence[Mapping[str, str]]) -> str:
    """MUSE's KnowMem prompt: ``"".join(f"Question: {q}\\nAnswer: {a}\\n\\n" for the in-context examples)`` then
    ``f"Question: {question}\\nAnswer: "``."""
    shots = "".join(f"Question: {ex['question']}\nAnswer: {ex['answer']}\n\n" for ex in icl)
    return shots + f"Question: {question}\nAnswer: "


def cut_answer(text: str, stops: Sequence[str] = KNOWMEM_STOPS) -> str:
    """``text`` before the first occurrence of each stop string in turn (``for s in stops: text = text.split(s)[0]``)."""
    for stop in stops:
        text = text.split(stop)[0]
    return text


def truncate_to_tokens(tokenizer: Any, text: str, num_tokens: int) -> str:
    """``text`` cut to its first ``num_tokens`` tokens as the authors cut VerbMem's truth: tokenized with special
    tokens, ``[:num_tokens]``, decoded without them."""
    ids = tokenizer(text, add_special_tokens=True, verbose=False)["input_ids"][:num_tokens]
    return tokenizer.decode(ids, skip_special_tokens=True)


def fit_prompt(ids: Sequence[int], room: int, prefix: Sequence[int] = ()) -> list[int]:
    """``ids`` when at most ``room`` long, else ``prefix`` and the last ``room - len(prefix)`` ids (when ``ids``
    starts with ``prefix``; the last ``room`` ids otherwise)."""
    ids = list(ids)
    if len(ids) <= room:
        return ids
    if prefix and ids[: len(prefix)] == list(prefix):
        return list(prefix) + ids[len(ids) - (room - len(prefix)) :]
    return ids[len(ids) - room :]


@torch.no_grad()
def greedy_continuations(
    model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int, *, batch_size: int = 8,
    progress: bool = False, desc: str = "generating", generation_kwargs: Mapping[str, Any] | None = None,
) -> tuple[list[str], int]:
    """Greedy continuations (:func:`~.generation.greedy_generate`) of raw ``prompts`` (tokenized with special
    tokens, no template), and how many prompts lost their beginning to fit the model's positions (:func:`fit_prompt`)."""
    ensure_pad_token(tokenizer)
    limit = model_max_positions(model)
    room = None if limit is None else limit - max_new_tokens
    if room is not None and room < 1:
        raise ValueError(f"{max_new_tokens} new tokens leave no room for a prompt within the model's {limit} positions.")
    bos = bos_prefix(tokenizer)
    encoded, truncated = [], 0
    for p in prompts:
        ids = tokenizer(p, add_special_tokens=True, verbose=False)["input_ids"]
        if room is not None and len(ids) > room:
            ids, truncated = fit_prompt(ids, room, bos), truncated + 1
        encoded.append(ids)
    out = greedy_generate(model, tokenizer, encoded, batch_size=batch_size, max_new_tokens=max_new_tokens,
                          generation_kwargs=generation_kwargs, progress=progress, desc=desc)
    return out, truncated


@torch.no_grad()
def text_min_k_scores(
    model: Any, tokenizer: Any, texts: Sequence[str], k: float = PRIVLEAK_MIN_K, *, batch_size: int = 8,
    progress: bool = False, desc: str = "scoring texts", scorer: TokenScorer | None = None,
) -> tuple[list[float], int]:
    """The Min-K% score of each text (:func:`~hf_unlearn.evaluation.min_k_score` of its token log-probabilities
    ``log p(x_t | x_<t)``, ``t >= 1``, the text tokenized with special tokens as the authors do), and how many texts
    were cut to the model's maximum positions. ``scorer`` (a :data:`~hf_unlearn.logprobs.TokenScorer`; default the
    model's own log-probabilities) scores the tokens, e.g. under a decoding-time method's tilted distribution."""
    ensure_pad_token(tokenizer)
    limit = model_max_positions(model)
    features, truncated = [], 0
    for text in texts:
        ids = tokenizer(text, add_special_tokens=True, verbose=False)["input_ids"]
        if limit is not None and len(ids) > limit:
            ids, truncated = ids[:limit], truncated + 1
        features.append({"input_ids": ids, "labels": list(ids)})
    order = sorted(range(len(features)), key=lambda i: len(features[i]["input_ids"]))
    device = model_device(model)
    score = scorer or causal_lm_scorer(model)
    scores = [0.0] * len(features)
    with eval_mode(model):
        for start in tqdm(range(0, len(order), batch_size), desc=desc, disable=not progress, leave=False):
            idx = order[start : start + batch_size]
            batch = {key: v.to(device) for key, v in collate_qa([features[i] for i in idx], tokenizer.pad_token_id).items()}
            lp = score(batch["input_ids"], batch["attention_mask"], batch["position_ids"], batch["labels"])
            mask = answer_mask(batch["labels"])
            for row, i in enumerate(idx):
                scores[i] = min_k_score(lp[row][mask[row]].double().cpu().numpy(), k)
    return scores, truncated


def reference_auc_of(retain_reference: Any) -> tuple[float, str]:
    """The retrained model's AUC and where it comes from: ``None`` -> the authors' News value; a number; a
    :class:`MUSEReport`, its dict form or the path of its JSON -> its ``privleak_auc``."""
    if retain_reference is None:
        return NEWS_RETRAIN_AUC, "muse-news-retrain"
    if isinstance(retain_reference, (int, float)) and not isinstance(retain_reference, bool):
        return float(retain_reference), "given"
    if isinstance(retain_reference, (str, os.PathLike)):
        retain_reference = MUSEReport.load(retain_reference)
    if isinstance(retain_reference, Mapping):
        retain_reference = MUSEReport.from_dict(retain_reference)
    if not isinstance(retain_reference, MUSEReport):
        raise ValueError(f"retain_reference must be an AUC, a MUSE report or its path, got {type(retain_reference).__name__}.")
    if retain_reference.privleak_auc is None:
        raise ValueError("The retain reference's MUSE report has no privleak_auc (it was evaluated without privleak).")
    return float(retain_reference.privleak_auc), str(retain_reference.model_name)


def evaluate_muse(
    model: Any, tokenizer: Any, source: str | os.PathLike = MUSE_HUB_ID, *,
    criteria: Sequence[str] = MUSE_CRITERIA, retain_reference: Any = None, max_examples: int | None = None,
    batch_size: int = 8, verbmem_max_new_tokens: int = VERBMEM_MAX_NEW_TOKENS,
    knowmem_max_new_tokens: int = KNOWMEM_MAX_NEW_TOKENS, progress: bool = True,
    output_path: str | os.PathLike | None = None, model_name: str | None = None,
    scorer: TokenScorer | None = None, generation_kwargs: Mapping[str, Any] | None = None,
) -> MUSEReport:
    """Evaluate a causal LM on MUSE (C1-C4) and return (and optionally write) a :class:`MUSEReport`.

    Args:
        source: a folder laid out like MUSE-News or a Hub dataset id.
        criteria: which of :data:`MUSE_CRITERIA` to measure; the others stay ``None``.
        retain_reference: PrivLeak's reference: ``None`` (the authors' retrained News model, 0.4772), an AUC, or a
            retain model's :class:`MUSEReport` (its dict, or its JSON path).
        max_examples: score only the first ``max_examples`` items of each part (in-context examples stay whole).
        verbmem_max_new_tokens, knowmem_max_new_tokens: continuation and answer lengths (MUSE's 128 and 32).
        output_path: write the report there as JSON (atomically; checked before any work).
        scorer, generation_kwargs: a decoding-time method's (as for :func:`~hf_unlearn.evaluation.evaluate_tofu`):
            PrivLeak scores with ``scorer``, VerbMem and KnowMem generate with ``generation_kwargs``.

    Raises:
        ValueError: bad arguments, malformed data or a bad retain reference, before any model call.
        FileNotFoundError: a local folder that lacks a part the criteria need.
    """
    criteria = list(dict.fromkeys(criteria))
    new_tokens = {"verbmem_max_new_tokens": verbmem_max_new_tokens, "knowmem_max_new_tokens": knowmem_max_new_tokens}
    unknown = [c for c in criteria if c not in MUSE_CRITERIA]
    if unknown or not criteria:
        raise ValueError(f"criteria must be a non-empty subset of {list(MUSE_CRITERIA)}, got {list(criteria)}.")
    if max_examples is not None and (not isinstance(max_examples, int) or max_examples < 1):
        raise ValueError(f"max_examples must be None or a positive integer, got {max_examples!r}.")
    for name, value in {"batch_size": batch_size, **new_tokens}.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    if output_path is not None:  # never a report inside the model, the tokenizer or the data folder
        config = getattr(model, "config", None)
        check_report_path(output_path, [getattr(config, "_name_or_path", None),
                                        getattr(tokenizer, "name_or_path", None), source], overwrite=True)
    ref_auc, ref_source = reference_auc_of(retain_reference) if "privleak" in criteria else (None, None)
    if ref_auc is not None and not 0 < ref_auc <= 1:
        raise ValueError(f"The reference AUC must be in (0, 1], got {ref_auc!r}.")
    data: dict[str, list[Any]] = {}  # the parts the criteria read, the in-context examples whole
    for part in (part for criterion in criteria for part in CRITERION_PARTS[criterion]):
        items = load_muse_part(source, part)
        data[part] = items if part.endswith("_icl") or max_examples is None else items[:max_examples]
    ensure_pad_token(tokenizer)
    # Everything above runs before the model is touched.
    common = {"batch_size": batch_size, "progress": progress}  # every model call below
    generating = {**common, "generation_kwargs": generation_kwargs}
    per_example: dict[str, Any] = {}
    figures: dict[str, float | None] = dict.fromkeys(MUSE_CRITERIA)
    truncated: dict[str, int] = {}
    if "verbmem_forget" in criteria:  # C1
        rows = data["verbmem_forget"]
        truths = [truncate_to_tokens(tokenizer, r["gt"], verbmem_max_new_tokens) for r in rows]
        outputs, truncated["verbmem_prompts"] = greedy_continuations(
            model, tokenizer, [r["prompt"] for r in rows], verbmem_max_new_tokens, desc="verbmem", **generating)
        out = metrics.load_metric("muse_verbmem").compute(predictions=outputs, references=truths)
        figures["verbmem_forget"] = float(out["verbmem"])
        per_example["verbmem_forget"] = {"generation": outputs, "truth": truths, "rouge_l_f1": out["rouge_l_f1_per_example"]}
    for criterion in ("knowmem_forget", "knowmem_retain"):  # C2, C4
        if criterion in criteria:
            rows, icl = data[criterion], data[f"{criterion}_icl"]
            prompts = [build_knowmem_prompt(r["question"], icl) for r in rows]
            raw, truncated[f"{criterion}_prompts"] = greedy_continuations(
                model, tokenizer, prompts, knowmem_max_new_tokens, desc=criterion.replace("_", " "), **generating)
            answers = [cut_answer(text) for text in raw]
            out = metrics.load_metric("muse_knowmem").compute(predictions=answers, references=[r["answer"] for r in rows])
            figures[criterion] = float(out["knowmem"])
            per_example[criterion] = {"answer": answers, "rouge_l_f1": out["rouge_l_f1_per_example"]}
    auc = None
    if "privleak" in criteria:  # C3
        forget, truncated["privleak_forget_texts"] = text_min_k_scores(
            model, tokenizer, data["privleak_forget"], desc="privleak forget", scorer=scorer, **common)
        holdout, truncated["privleak_holdout_texts"] = text_min_k_scores(
            model, tokenizer, data["privleak_holdout"], desc="privleak holdout", scorer=scorer, **common)
        out = metrics.load_metric("muse_privleak").compute(
            predictions=forget + holdout, references=[0] * len(forget) + [1] * len(holdout), reference_auc=ref_auc)
        auc, figures["privleak"] = float(out["auc"]), float(out["privleak"])
        per_example["privleak"] = {"forget_min_k": forget, "holdout_min_k": holdout}
    config = getattr(model, "config", None)
    report = MUSEReport(
        model_name=model_name or str(getattr(config, "_name_or_path", None) or type(model).__name__),
        source=str(source), **figures, privleak_auc=auc, reference_auc=ref_auc, reference_source=ref_source,
        num_examples={part: len(items) for part, items in data.items()}, per_example=per_example,
        settings={"criteria": criteria, "max_examples": max_examples, "batch_size": batch_size, **new_tokens,
                  "min_k": PRIVLEAK_MIN_K, "max_length": model_max_positions(model), "num_truncated": truncated},
        hf_unlearn_version=__version__,
    )
    if output_path is not None:
        report.save(output_path)
    return report
