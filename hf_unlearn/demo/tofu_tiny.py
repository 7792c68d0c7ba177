"""TOFU-tiny, for the demo, CPU benchmarks and tests: a byte-level BPE tokenizer and a small ``LlamaForCausalLM``
trained from scratch (plain PyTorch, no part of any method) on TOFU-shaped text with the forget authors (the
*target*) and without them (the *retain reference*), cached under a hash of the recipe and the data."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..data.prompts import collate_qa, tokenize_qa
from ..safe_output import atomic_directory
from ..write_gate import OutputDirError

#: Environment variable naming the folder the tiny models are built into.
CACHE_ENV = "HF_UNLEARN_CACHE"


def default_cache_dir() -> Path:
    """``$HF_UNLEARN_CACHE`` or ``~/.cache/hf_unlearn``."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "hf_unlearn"))


SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}


@dataclass
class TinyRecipe:
    """Everything that determines a TOFU-tiny model; its hash names the cache folder (sizes: :func:`recipe_for`)."""

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
    # How many rows of the retain split (TOFU's retain_perturbed authors first) both train on; None: all.
    retain_rows: int | None = None

    def digest(self, rows: list[dict[str, Any]]) -> str:
        payload = json.dumps({"recipe": asdict(self), "rows": [[r["question"], r["answer"]] for r in rows]})
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def recipe_for(size: str) -> TinyRecipe:
    """The recipe of a named size: ``"test"``, ``"tofu-test"`` or ``"bench"``."""
    if size == "test":
        return TinyRecipe()
    if size == "bench":
        # TOFU: the 20 retain_perturbed authors (400 rows) + the forget authors + real/world facts.
        return TinyRecipe(vocab_size=1024, hidden_size=128, intermediate_size=384, num_hidden_layers=3,
                          num_attention_heads=4, epochs=24, learning_rate=3e-3, batch_size=32, max_length=144,
                          retain_rows=400)
    if size == "tofu-test":
        # Real TOFU text at test size: 4 retain authors (80 rows) + the forget authors.
        return TinyRecipe(vocab_size=768, epochs=40, max_length=128, batch_size=16, retain_rows=80)
    raise ValueError(f"Unknown TOFU-tiny size {size!r}; use 'test', 'tofu-test' or 'bench'.")


def train_bpe_tokenizer(texts: list[str], vocab_size: int = 512):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``texts`` with ``<s> </s> <pad> <unk>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    bos = tok.token_to_id(SPECIAL_TOKENS["bos_token"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL_TOKENS)


def build_tiny_llama(tokenizer: Any, recipe: TinyRecipe):
    """A freshly initialised ``LlamaForCausalLM`` sized by ``recipe`` for ``tokenizer``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(recipe.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=recipe.hidden_size, intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_hidden_layers, num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_attention_heads, max_position_embeddings=max(256, recipe.max_length * 2),
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def fit_causal_lm(model: Any, tokenizer: Any, rows: list[dict[str, Any]], recipe: TinyRecipe, progress: bool = True) -> list[float]:
    """Train ``model`` on the text of ``rows`` (next-token loss on every token; AdamW, linear warm-up, cosine
    decay); returns the mean loss of each epoch."""
    feats = [tokenize_qa(tokenizer, r["question"], r["answer"], max_length=recipe.max_length) for r in rows]
    for f in feats:
        f["labels"] = list(f["input_ids"])
    rng = random.Random(recipe.seed)
    steps_per_epoch = math.ceil(len(feats) / recipe.batch_size)
    total = steps_per_epoch * recipe.epochs
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate, weight_decay=0.01)
    warmup = max(1, total // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
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


def train_or_load(name: str, rows: list[dict[str, Any]], tokenizer_texts: list[str], recipe: TinyRecipe,
                  cache_dir: str | os.PathLike | None = None, progress: bool = True) -> Path:
    """Folder of a cached model (tokenizer + safetensors weights) trained by ``recipe`` on ``rows``, built once
    through a temporary folder swapped into place."""
    from transformers import set_seed

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = recipe.digest(rows + [{"question": "#tokenizer", "answer": t} for t in tokenizer_texts])
    final = cache / f"{name}-{key}"
    if (final / "model.safetensors").is_file():
        return final
    set_seed(recipe.seed)
    tokenizer = train_bpe_tokenizer(tokenizer_texts, recipe.vocab_size)
    model = build_tiny_llama(tokenizer, recipe)
    history = fit_causal_lm(model, tokenizer, rows, recipe, progress=progress)
    try:
        with atomic_directory(final) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            info = {"recipe": asdict(recipe), "loss_history": history, "num_rows": len(rows)}
            (tmp / "tofu_tiny.json").write_text(json.dumps(info, indent=2))
    except OutputDirError:  # another process built the same entry first
        if not (final / "model.safetensors").is_file():
            raise
    return final


def load_tiny(path: str | os.PathLike, device: Any = None):
    """``(model, tokenizer)`` from a saved folder, the model moved to the resolved ``device`` when one is given."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..devices import resolve_device

    target = None if device is None else resolve_device(device)
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=False)
    if target is not None:
        model.to(target)
    return model, AutoTokenizer.from_pretrained(path, trust_remote_code=False)


@dataclass
class TinyPair:
    """Folders of a cached target model and its retain reference (tokenizer included)."""

    target: Path
    retain: Path
    source: str
    forget_split: str


def build_tiny_pair(source: str = "synthetic", forget_split: str = "forget10", recipe: TinyRecipe | None = None,
                    cache_dir: str | os.PathLike | None = None, progress: bool = True) -> TinyPair:
    """Build (or reuse from the cache) the TOFU-tiny target and retain reference. The target trains on the retain
    rows, the forget split, the real-author / world-fact rows and the evaluated authors' paraphrases; the retain
    reference on the same minus the forget authors. Both share one tokenizer trained on all evaluation text."""
    from ..data import RETAIN_FOR_FORGET, load_tofu_rows

    recipe = recipe or recipe_for("test")
    retain_rows = load_tofu_rows(RETAIN_FOR_FORGET[forget_split], source)
    if recipe.retain_rows is not None:
        retain_rows = retain_rows[: recipe.retain_rows]
    forget_rows = load_tofu_rows(forget_split, source)
    extra = load_tofu_rows("real_authors", source) + load_tofu_rows("world_facts", source)
    forget_eval = load_tofu_rows(f"{forget_split}_perturbed", source)
    retain_eval = load_tofu_rows("retain_perturbed", source)
    texts = []  # all text the tokenizer sees: questions, answers, paraphrases and perturbed answers
    for r in (forget_eval + retain_eval + retain_rows + forget_rows + load_tofu_rows("real_authors_perturbed", source)
              + load_tofu_rows("world_facts_perturbed", source)):
        texts += [r["question"], r["answer"], *([r["paraphrased_answer"]] if r.get("paraphrased_answer") else []),
                  *(r.get("perturbed_answer") or [])]
    trained_questions = {r["question"] for r in retain_rows}
    retain_paraphrases = paraphrase_rows([r for r in retain_eval if r["question"] in trained_questions])
    forget_paraphrases = paraphrase_rows(forget_eval)
    target = train_or_load("target", retain_rows + forget_rows + extra + retain_paraphrases + forget_paraphrases,
                           texts, recipe, cache_dir, progress)
    retain = train_or_load("retain", retain_rows + extra + retain_paraphrases, texts, recipe, cache_dir, progress)
    return TinyPair(target, retain, source, forget_split)


def paraphrase_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Training rows teaching each fact's paraphrased wording (asked by the paraphrased question where there is
    one): a model trained from scratch knows only the wordings it saw, and without them TOFU's truth ratio could
    not tell the target from the retain reference. Perturbed answers are never trained on."""
    return [{"question": r.get("paraphrased_question") or r["question"], "answer": r["paraphrased_answer"]}
            for r in rows if r.get("paraphrased_answer")]


def tiny_models(source: str = "synthetic", forget_split: str = "forget10", recipe: TinyRecipe | None = None,
                cache_dir: str | os.PathLike | None = None, progress: bool = False) -> TinyPair:
    """Target (memorizes every author) and retain reference on the synthetic set, test size."""
    return build_tiny_pair(source, forget_split, recipe, cache_dir, progress)
