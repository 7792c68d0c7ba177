"""TOFU-small: TOFU on a real pretrained subject, sized for a 2-core CPU.

:class:`SmallRecipe` (whole TOFU authors; the v1 and v2 data layouts), :func:`small_tofu_configs` (the recipe's
rows, written as a local TOFU source), :func:`fine_tune_qa` (answer-only fine-tuning) and
:func:`build_small_pair`: the subject fine-tuned on forget + retain authors (the *target*) and on the retain
authors only (the *retain reference*), each cached under a hash of the recipe, the subject's weights and the rows.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from hf_unlearn.data.prompts import collate_qa, tokenize_qa
from hf_unlearn.demo import TinyPair, default_cache_dir

from .precision import resolve_bf16_autocast
from .pretrained import SUBJECTS, Subject, resolve_subject

AUTHOR_ROWS = 20  # every TOFU author has 20 question/answer pairs
SMALL_FORGET_SPLIT = "forget10"  # the forget authors are the first N_f of forget10


@dataclass
class SmallRecipe:
    """Everything that determines a TOFU-small pair; its hash (with the subject's weights) names the cache.

    Forget: ``forget_authors`` authors of forget10, from author ``forget_offset`` on (0: the reported
    split; a tuning split for presets uses other authors, e.g. ``forget_offset=4``). Retain evaluation (and the retain rows
    unlearning methods see): the first ``retain_authors`` authors of ``retain_perturbed``. Real
    authors and world facts are whole: on a pretrained model they measure real knowledge. The
    *target* is fine-tuned on the original answers of forget + retain authors, the *retain
    reference* on the retain authors only, with the same recipe; answer-only loss on the subject's
    chat template (through :mod:`hf_unlearn.data.prompts`), AdamW, linear warm-up over
    ``warmup_ratio`` of the steps then cosine decay, float32 master weights saved in float32.

    ``bf16_autocast``: ``True`` (bf16 autocast on the fine-tuning device), ``False`` (float32 throughout) or
    ``"auto"`` (the default: bf16 autocast only where bfloat16 is native, see :func:`resolve_bf16_autocast`). On a
    CPU without native bfloat16 autocast is emulated: a forward + backward of this subject on 16 TOFU rows took
    418 s under bf16 autocast against 19.4 s in float32 on 2 AVX2 cores. :func:`build_small_pair` resolves
    ``"auto"`` and records the resolved value in the pair's recipe, and :meth:`digest` hashes the resolved value,
    so a float32 pair and a bf16 pair never share a cache folder.

    Defaults: 4 forget + 8 retain authors (80 forget rows, 160 retain rows) and 5 epochs of batch 16,
    as in the first probe of this subject (5 epochs at 5e-5 gave target forget quality 4.6e-5 against the retain
    reference; the untouched base scores 0.82), at peak learning rate 3e-4 so that the target also
    *reproduces* the forget answers (the gate's ROUGE-L >= 0.6). That is 75 + 50 optimizer steps.

    Why 3e-4: at 1e-4 (the first recipe) the target's last-epoch mean loss was 0.75 and its forget ROUGE-L
    0.497, failing the gate; at 3e-4 the epoch losses are 2.13, 1.05, 0.43, 0.15, 0.07 and the gate passes.
    Measured on 2 cores with AVX512-BF16 (64 new tokens, bf16-autocast evaluation): fine-tuning took 372 s
    (target) + 224 s (retain reference), about 5 s a step, and the gate's three TOFU evaluations 326 s (base)
    + 288 s (target) + 229 s (retain reference): 24 min in all (budget: 30). The gate passed:
    target forget quality 1.6e-8, target forget ROUGE-L 0.941 (retain reference 0.317, base 0.321), retain
    reference against itself 1.0, target model utility 0.311 = 1.19x the base's 0.261 (the retain reference:
    0.354; the memorising target gives up some utility).
    """

    subject: str = "smollm2-135m"
    forget_authors: int = 4
    forget_offset: int = 0
    retain_authors: int = 8
    epochs: int = 5
    learning_rate: float = 3e-4
    batch_size: int = 16
    max_length: int = 256
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    bf16_autocast: bool | str = "auto"
    seed: int = 0
    retain_train_authors: int = 0
    retain_validation_authors: int = 0
    holdout_authors: int = 0

    @classmethod
    def v2(cls, subject: str = "smollm2-135m", **overrides: Any) -> SmallRecipe:
        """TOFU-small v2: methods unlearn with 16 retain authors, of which the first 8 (``retain_perturbed``
        authors, with paraphrased and perturbed answers) are evaluated; 4 more retain authors are fine-tuned into
        the target and the retain reference but never shown to a method (the selection criterion's
        retain-validation rows); 4 ``holdout10`` authors, which no model saw, serve the MIA figures, privleak and
        the reference-free selection criterion. Real authors and world facts stay evaluation-only."""
        values = {"retain_authors": 8, "retain_train_authors": 16, "retain_validation_authors": 4,
                  "holdout_authors": 4, **overrides}
        return cls(subject=subject, **values)

    def __post_init__(self) -> None:
        if not (isinstance(self.bf16_autocast, bool) or self.bf16_autocast == "auto"):
            raise ValueError(f"bf16_autocast must be True, False or 'auto', got {self.bf16_autocast!r}.")

    def resolved(self, device: str | torch.device = "cpu") -> SmallRecipe:
        """This recipe with ``bf16_autocast`` resolved to a bool for fine-tuning on ``device``
        (:func:`resolve_bf16_autocast`)."""
        return replace(self, bf16_autocast=resolve_bf16_autocast(self.bf16_autocast, device))

    @property
    def layout(self) -> str:
        """``"v2"`` when the retain-train, retain-validation and holdout authors are set apart, else ``"v1"``."""
        return "v2" if self.retain_train_authors else "v1"

    def digest(self, subject_id: str, rows: list[dict[str, Any]], device: str | torch.device = "cpu") -> str:
        """The cache name of a model fine-tuned by this recipe on ``rows`` on ``device``: the kind of device
        (``"cuda"``, whatever its index) is hashed beside the recipe, except the CPU's (CPU pairs keep the names
        they had before the device was recorded)."""
        recipe = asdict(self.resolved(device))  # "auto" never names a cache folder: the bool it resolves to does
        if self.layout == "v1":  # v1 pairs keep the cache names they had before the v2 fields existed
            for name in ("retain_train_authors", "retain_validation_authors", "holdout_authors"):
                recipe.pop(name)
        fields: dict[str, Any] = {"recipe": recipe, "subject": subject_id,
                                  "rows": [[r["question"], r["answer"]] for r in rows]}
        kind = torch.device(device).type
        if kind != "cpu":
            fields["device"] = kind
        payload = json.dumps(fields)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def small_recipe_for(subject: str) -> SmallRecipe:
    """The TOFU-small recipe of a named subject (only ``"smollm2-135m"`` so far)."""
    if subject not in SUBJECTS:
        raise ValueError(f"Unknown subject {subject!r}; known subjects: {sorted(SUBJECTS)}.")
    return SmallRecipe(subject=subject)


def _author_blocks(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """TOFU's rows in blocks of one author each (``AUTHOR_ROWS`` consecutive rows)."""
    if len(rows) % AUTHOR_ROWS:
        raise ValueError(f"Expected a multiple of {AUTHOR_ROWS} rows (one block per author), got {len(rows)}.")
    return [rows[i:i + AUTHOR_ROWS] for i in range(0, len(rows), AUTHOR_ROWS)]


def small_tofu_configs(source: str, recipe: SmallRecipe) -> dict[str, list[dict[str, Any]]]:
    """The TOFU configs of TOFU-small, as rows (see :class:`SmallRecipe`).

    ``forget10`` / ``forget10_perturbed``: ``forget_authors * 20`` rows from row ``forget_offset * 20``;
    ``retain_perturbed``: the first ``retain_authors * 20`` rows of TOFU's ``retain_perturbed`` (the evaluated
    retain rows); real authors and world facts whole.

    ``retain90`` (the rows methods retain on): in the v1 layout exactly the evaluated retain rows; in the v2
    layout (``retain_train_authors > 0``) the evaluated authors followed by further ``retain90`` authors that
    ``retain_perturbed`` does not hold, ``retain_train_authors`` authors in all. v2 adds ``retain_validation``
    (the next ``retain_validation_authors`` such authors: fine-tuned into both models, never given to a method)
    and ``holdout10`` (the first ``holdout_authors`` authors of TOFU's ``holdout10``).
    """
    from hf_unlearn.data import RETAIN_FOR_FORGET, load_tofu_rows

    n_forget, n_retain = recipe.forget_authors * AUTHOR_ROWS, recipe.retain_authors * AUTHOR_ROWS
    start = recipe.forget_offset * AUTHOR_ROWS
    forget = load_tofu_rows(SMALL_FORGET_SPLIT, source)
    forget_eval = load_tofu_rows(f"{SMALL_FORGET_SPLIT}_perturbed", source)
    retain_eval = load_tofu_rows("retain_perturbed", source)
    if n_forget < 1 or start < 0 or start + n_forget > len(forget) or n_retain < 1 or n_retain > len(retain_eval):
        raise ValueError(
            f"TOFU-small needs 1..{len(forget) // AUTHOR_ROWS} forget authors (offset included) and "
            f"1..{len(retain_eval) // AUTHOR_ROWS} retain authors, got {recipe.forget_authors} forget authors from "
            f"author {recipe.forget_offset} and {recipe.retain_authors} retain authors."
        )
    forget, forget_eval = forget[start:], forget_eval[start:]
    if [r["question"] for r in forget[:n_forget]] != [r["question"] for r in forget_eval[:n_forget]]:
        raise ValueError(f"{SMALL_FORGET_SPLIT} and its _perturbed config list different questions in {source}.")
    retain_rows = [{"question": r["question"], "answer": r["answer"]} for r in retain_eval[:n_retain]]
    configs = {
        SMALL_FORGET_SPLIT: forget[:n_forget],
        f"{SMALL_FORGET_SPLIT}_perturbed": forget_eval[:n_forget],
        RETAIN_FOR_FORGET[SMALL_FORGET_SPLIT]: retain_rows,
        "retain_perturbed": retain_eval[:n_retain],
    }
    if recipe.layout == "v2":
        configs.update(_v2_retain_and_holdout(source, recipe, retain_rows, retain_eval))
    for name in ("real_authors", "real_authors_perturbed", "world_facts", "world_facts_perturbed"):
        configs[name] = load_tofu_rows(name, source)
    return configs


def _v2_retain_and_holdout(source: str, recipe: SmallRecipe, evaluated: list[dict[str, Any]],
                           retain_eval: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The v2 layout's ``retain90`` (retain-train), ``retain_validation`` and ``holdout10`` rows."""
    from hf_unlearn.data import HOLDOUT_FOR_FORGET, RETAIN_FOR_FORGET, load_tofu_rows

    extra_train = recipe.retain_train_authors - recipe.retain_authors
    if extra_train < 0 or recipe.retain_validation_authors < 1 or recipe.holdout_authors < 1:
        raise ValueError(
            "TOFU-small v2 needs retain_train_authors >= retain_authors (the evaluated authors are among those "
            "methods retain on), at least one retain-validation author and at least one holdout author; got "
            f"retain_train_authors={recipe.retain_train_authors}, retain_authors={recipe.retain_authors}, "
            f"retain_validation_authors={recipe.retain_validation_authors}, holdout_authors={recipe.holdout_authors}."
        )
    perturbed_questions = {r["question"] for r in retain_eval}
    unevaluated = [block for block in _author_blocks(load_tofu_rows(RETAIN_FOR_FORGET[SMALL_FORGET_SPLIT], source))
                   if not perturbed_questions & {r["question"] for r in block}]
    need = extra_train + recipe.retain_validation_authors
    holdout = _author_blocks(load_tofu_rows(HOLDOUT_FOR_FORGET[SMALL_FORGET_SPLIT], source))
    if need > len(unevaluated) or recipe.holdout_authors > len(holdout):
        raise ValueError(
            f"TOFU-small v2 asks for {need} retain authors outside retain_perturbed ({len(unevaluated)} exist) and "
            f"{recipe.holdout_authors} holdout authors ({len(holdout)} exist) in {source}."
        )

    def plain(blocks: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
        return [{"question": r["question"], "answer": r["answer"]} for block in blocks for r in block]

    return {
        RETAIN_FOR_FORGET[SMALL_FORGET_SPLIT]: evaluated + plain(unevaluated[:extra_train]),
        "retain_validation": plain(unevaluated[extra_train:need]),
        HOLDOUT_FOR_FORGET[SMALL_FORGET_SPLIT]: plain(holdout[:recipe.holdout_authors]),
    }


def small_retain_validation_rows(source: str | os.PathLike) -> list[dict[str, Any]]:
    """The retain-validation rows of a v2 TOFU-small data folder (``retain_validation.jsonl``): fine-tuned into
    both models of the pair, never given to a method; the selection criterion's retain side."""
    path = Path(source) / "retain_validation.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: retain-validation rows belong to the v2 TOFU-small layout.")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_small_source(configs: dict[str, list[dict[str, Any]]], folder: str | os.PathLike) -> Path:
    """Write TOFU-small's configs as a local TOFU source (``<config>.jsonl``) atomically; reuse it if present."""
    from hf_unlearn.safe_output import atomic_directory

    folder = Path(folder)
    if all((folder / f"{name}.jsonl").is_file() for name in configs):
        return folder
    with atomic_directory(folder, overwrite=folder.exists()) as tmp:
        for name, rows in configs.items():
            (tmp / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return folder


def fine_tune_qa(
    model: Any, tokenizer: Any, rows: list[dict[str, Any]], recipe: SmallRecipe, progress: bool = True,
    desc: str = "fine-tuning", device: Any = None,
) -> list[float]:
    """Fine-tune ``model`` on the answers of ``rows`` (answer-only loss, the tokenizer's chat template).

    AdamW, linear warm-up over ``warmup_ratio`` of the steps then cosine decay to 0, gradient norm
    clipped at 1, bf16 autocast on the training device when ``recipe.bf16_autocast`` (``"auto"``: when that device
    has native bfloat16, :func:`resolve_bf16_autocast`). ``device``: ``None`` trains where the model is;
    ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (:func:`hf_unlearn.devices.resolve_device`) moves it there
    first. Returns each epoch's mean loss.
    """
    from hf_unlearn.data.prompts import ensure_pad_token
    from hf_unlearn.devices import move_to_device

    ensure_pad_token(tokenizer)
    device = move_to_device(model, device)
    kind = torch.device(device).type
    bf16 = resolve_bf16_autocast(recipe.bf16_autocast, device)
    feats = [tokenize_qa(tokenizer, r["question"], r["answer"], max_length=recipe.max_length) for r in rows]
    rng = random.Random(recipe.seed)
    steps_per_epoch = math.ceil(len(feats) / recipe.batch_size)
    total = steps_per_epoch * recipe.epochs
    warmup = max(1, round(total * recipe.warmup_ratio))
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate, weight_decay=recipe.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total)))
    )
    model.train()
    history = []
    bar = tqdm(total=total, desc=desc, disable=not progress)
    for _ in range(recipe.epochs):
        rng.shuffle(feats)
        losses = []
        for start in range(0, len(feats), recipe.batch_size):
            batch = collate_qa(feats[start : start + recipe.batch_size], tokenizer.pad_token_id)
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.autocast(kind, dtype=torch.bfloat16, enabled=bf16):
                out = model(**batch)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            loss = out.loss.item()  # the step's one copy to the host
            if not math.isfinite(loss):
                raise FloatingPointError(f"{desc}: non-finite loss; nothing is saved.")
            losses.append(loss)
            bar.update(1)
        history.append(sum(losses) / len(losses))
        bar.set_postfix(loss=f"{history[-1]:.3f}")
    bar.close()
    model.eval()
    return history


def _fine_tune_or_load(subject: Subject, name: str, rows: list[dict[str, Any]], recipe: SmallRecipe,
                       cache: Path, progress: bool, device: str = "cpu") -> Path:
    """Folder of ``subject`` fine-tuned by ``recipe`` on ``rows`` on ``device``; built once, atomically.

    The cache key is the recipe's training fields, the subject's weights, the rows and the kind of device
    (:meth:`SmallRecipe.digest`; which authors are *forgotten* later does not change a model trained on given
    rows, so the retain reference is shared by every forget split of the same retain authors)."""
    import time

    from transformers import set_seed

    from hf_unlearn.safe_output import atomic_directory, atomic_write_json

    key = replace(recipe, forget_authors=0, forget_offset=0).digest(subject.path.name, rows, device)
    final = cache / f"{recipe.subject}-tofu-small-{name}-{key}"
    if (final / "model.safetensors").is_file():
        return final
    set_seed(recipe.seed)
    model, tokenizer = subject.load()
    start = time.perf_counter()
    history = fine_tune_qa(model, tokenizer, rows, recipe, progress, desc=f"TOFU-small {name}", device=device)
    seconds = time.perf_counter() - start
    if not all(torch.isfinite(p).all() for p in model.parameters()):
        raise FloatingPointError(f"TOFU-small {name}: non-finite weights after fine-tuning; nothing is saved.")
    with atomic_directory(final, overwrite=final.exists()) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        atomic_write_json(tmp / "tofu_small.json", {
            "recipe": asdict(recipe), "subject": subject.describe(), "num_rows": len(rows),
            "loss_history": history, "train_seconds": seconds, "torch_threads": torch.get_num_threads(),
            "device": device,
        })
    return final


@dataclass
class SmallPair(TinyPair):
    """A TOFU-small pair: :class:`TinyPair` (``source`` is the TOFU-small data folder) plus the base subject."""

    base: Path | None = None
    recipe: dict[str, Any] = field(default_factory=dict)
    subject: dict[str, Any] = field(default_factory=dict)


def build_small_pair(
    subject: str = "smollm2-135m",
    source: str | None = None,
    recipe: SmallRecipe | None = None,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    gguf_path: str | os.PathLike | None = None,
    device: Any = None,
) -> SmallPair:
    """Build (or reuse from the cache) the TOFU-small target and retain reference of ``subject``.

    ``source`` is the full TOFU (Hub id or local folder); the recipe's subset of it is written as a
    local TOFU source folder in the cache (the pair's ``source``, forget split ``forget10``), so the
    runner, the evaluator and every method read exactly the TOFU-small rows. The fine-tuning runs on ``device``
    (:func:`hf_unlearn.devices.resolve_device`: ``None``/``"auto"`` is CUDA when available, else the CPU); the
    recipe's ``bf16_autocast`` is resolved here for that device and recorded resolved in the pair's ``recipe``,
    beside ``"device"``, the device it was fine-tuned on (a kind of device other than the CPU also names the
    cache folders).
    """
    from hf_unlearn.data import TOFU_HUB_ID
    from hf_unlearn.devices import resolve_device

    recipe = recipe or small_recipe_for(subject)
    if recipe.subject != subject:
        raise ValueError(f"The recipe is for subject {recipe.subject!r}, not {subject!r}.")
    device = resolve_device(device)
    recipe = recipe.resolved(device)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    resolved = resolve_subject(subject, cache_dir=cache, gguf_path=gguf_path)
    configs = small_tofu_configs(source or TOFU_HUB_ID, recipe)
    data_key = hashlib.sha256(json.dumps(configs, sort_keys=True).encode()).hexdigest()[:16]
    data = write_small_source(configs, cache / f"tofu-small-data-{data_key}")
    forget = configs[SMALL_FORGET_SPLIT]
    retain = small_fine_tune_retain_rows(configs)
    target = _fine_tune_or_load(resolved, "target", forget + retain, recipe, cache, progress, device)
    retain_ref = _fine_tune_or_load(resolved, "retain", retain, recipe, cache, progress, device)
    return SmallPair(target, retain_ref, str(data), SMALL_FORGET_SPLIT, base=resolved.path,
                     recipe={**asdict(recipe), "device": device}, subject=resolved.describe())


def small_fine_tune_retain_rows(configs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The retain rows both models of a TOFU-small pair are fine-tuned on: retain-train plus, in the v2 layout,
    the retain-validation rows that no method sees."""
    return configs["retain90"] + configs.get("retain_validation", [])
