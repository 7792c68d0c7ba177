"""MUSE-News-small: a subset of MUSE-News (Shi et al., 2024) small enough to train a target on, and its subject pair.

**The subset.** MUSE's verbmem prompts and knowmem questions come from the forget articles (``raw/forget.json``);
a subset of those articles is only useful with the items that come from it, so the items are matched to the
articles by text:

* a **verbmem item** ``{prompt, gt}`` matches article ``j`` when the last :data:`VERBMEM_TAIL_CHARS` characters
  of its prompt followed by its whole ``gt`` occur in the article. MUSE cut its prompts from the articles joined
  end to end, so a prompt often begins in an earlier article (only a few prompt + gt are inside one article);
  the subset's prompt is the longest end of the original prompt that lies in the matched article
  (``prompt_chars`` records its length), so every kept prompt + gt is a substring of its article.
* a **knowmem item** ``{question, answer}`` matches article ``j`` when the answer string occurs in the article
  and at least :data:`KNOWMEM_MIN_OVERLAP` of the question's content words (lower-cased words of four letters or
  more) do; among the articles that qualify, the one with the largest share (then the first) is taken. An answer
  such as ``"2005"`` occurs in many articles; the word overlap picks the one the question is about.

The retain2 knowmem questions (C4, utility) are matched the same way to the ``privleak/retain2`` texts, and the
subset's retain texts are the matched ones; holdout texts are ``privleak/holdout``'s, split into the selection
criterion's half and PrivLeak's half (never the same text). :func:`match_muse_subset` returns which items matched
(their indices in the MUSE files, the article each came from), and the pair records it in ``subset.json``.

**Knowledge as text.** A model trained from scratch (or a 135M one) does not turn an article into answers to
questions about it, so the recipe's ``qa_in_documents`` appends each matched question and answer to its article
(and each retain question to its retain text) as ``"Question: q\\nAnswer:  a"`` (``qa_repeats`` times), and both models train on the
in-context examples in the same form: the knowledge KnowMem asks for is then text the target read, and unlearning
the forget documents (which carry it) can remove it. The answer follows two spaces so that the byte-level tokens
after MUSE's prompt (which ends in ``"Answer: "``, a lone space token) are those trained on.

**The pair.** The *target* trains on the forget subset and the retain texts (the unlearning retain set and the
criterion's retain-validation texts, which no method sees); the *retain reference* on the retain texts only; the
in-context examples go to both. One function (:func:`build_muse_pair`) builds both kinds of subject from a
:class:`MuseRecipe`: ``"tiny"`` (a Llama trained from scratch, TOFU-tiny's tokenizer and model helpers) and
``"smollm2-135m"`` (the pretrained subject fine-tuned on the same documents). Training is next-token loss on every
token of chunks of ``max_length`` tokens cut from the documents joined by a blank line, the cut shifted by a
random offset each epoch (so no text sits at a chunk start every epoch).

:func:`muse_sanity_gate` checks that the target memorised what the benchmark measures.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from hf_unlearn.demo import default_cache_dir

VERBMEM_TAIL_CHARS = 200  # prompt characters that must precede the gt inside the article
KNOWMEM_MIN_OVERLAP = 0.5  # share of a question's content words that must occur in its article
QA_ANSWER_PREFIX = "Answer:  "  # two spaces: see the module docstring
GATE_VERBMEM_GAP = 20.0  # target VerbMem >= retain reference's + 20 points
GATE_KNOWMEM_GAP = 10.0  # target KnowMem forget >= retain reference's + 10 points
_WORD = re.compile(r"[a-z0-9']{4,}")


@dataclass
class MuseRecipe:
    """Everything that determines a MUSE-News-small pair; its hash (with the data) names the cache folders.

    ``kind``: ``"tiny"`` (a Llama trained from scratch: ``vocab_size``, ``hidden_size``, ``intermediate_size``,
    ``num_hidden_layers``, ``num_attention_heads``) or a pretrained subject name (``"smollm2-135m"``).
    Data (:func:`match_muse_subset`): ``forget_articles`` articles with verbmem items and ``knowmem_articles``
    with knowmem items only (the forget subset), ``retain_texts`` retain2 texts (``retain_validation_texts`` of
    them, the last, are the criterion's retain validation) and ``2 * holdout_texts`` holdout texts; ``max_chars``
    cuts the retain and holdout texts (``None``: whole). ``qa_in_documents``: the matched questions are appended
    to their texts, ``qa_repeats`` times (a short line read once is not learnt as well as the article around it).
    Training: ``epochs`` over chunks of ``max_length`` tokens, AdamW at ``learning_rate`` with linear warm-up over
    ``warmup_ratio`` of the steps and cosine decay, batch ``batch_size``; ``bf16_autocast`` as TOFU-small's
    (``"auto"``: where bfloat16 is native). A tiny model's maximum positions are set to ``max_length`` (what it
    trained on), which MUSE's evaluation then fits its prompts into (128 prompt tokens before VerbMem's 128 new
    ones).

    The tiny recipe, measured on 2 CPU cores: 5 forget articles (5 verbmem prompts, 8 questions), 6 retain texts
    (6 questions), target built in 38 s and retain reference in 15 s (final epoch losses 0.27 and 0.28); target
    VerbMem 92.1 / KnowMem forget 25.9 against the retain reference's 13.1 / 0.0. With one copy of each question
    (``qa_repeats=1``) and 40 epochs KnowMem forget was 0 for both models.
    """

    kind: str = "tiny"
    forget_articles: int = 4
    knowmem_articles: int = 1
    retain_texts: int = 6
    retain_validation_texts: int = 2
    holdout_texts: int = 6
    max_chars: int | None = 2000
    qa_in_documents: bool = True
    qa_repeats: int = 3
    epochs: int = 50
    learning_rate: float = 3e-3
    batch_size: int = 8
    max_length: int = 256
    warmup_ratio: float = 0.05
    weight_decay: float = 0.01
    bf16_autocast: bool | str = False
    seed: int = 0
    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 4

    def digest(self, name: str, documents: list[str], extra: Any = None) -> str:
        payload = json.dumps({"recipe": asdict(self), "name": name, "documents": documents, "extra": extra})
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def muse_recipe_for(kind: str) -> MuseRecipe:
    """The recipe of a named subject: ``"tiny"`` (about a minute on 2 CPU cores) or ``"smollm2-135m"``."""
    if kind == "tiny":
        return MuseRecipe()
    if kind == "smollm2-135m":
        return MuseRecipe(kind=kind, forget_articles=20, knowmem_articles=20, retain_texts=24, retain_validation_texts=8,
                          holdout_texts=20, max_chars=None, epochs=5, learning_rate=3e-4, batch_size=8,
                          max_length=512, warmup_ratio=0.1, bf16_autocast="auto")
    raise ValueError(f"Unknown MUSE-News-small subject {kind!r}; use 'tiny' or 'smollm2-135m'.")


def _read(folder: Path, name: str) -> Any:
    return json.loads((folder / name).read_text(encoding="utf-8"))


def _content_words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def match_knowmem(rows: list[dict[str, str]], texts: list[str]) -> list[dict[str, Any]]:
    """The knowmem ``rows`` that match one of ``texts`` (see the module docstring): ``{"item", "text", "overlap"}``
    per matched row, ``item`` and ``text`` their indices, ``overlap`` the share of the question's content words in
    the text."""
    lowered = [t.lower() for t in texts]
    matches = []
    for i, row in enumerate(rows):
        words = _content_words(row["question"])
        best = None
        for j, text in enumerate(texts):
            if row["answer"] not in text:
                continue
            share = sum(w in lowered[j] for w in words) / len(words) if words else 0.0
            if share >= KNOWMEM_MIN_OVERLAP and (best is None or share > best[1]):
                best = (j, share)
        if best is not None:
            matches.append({"item": i, "text": best[0], "overlap": round(best[1], 4)})
    return matches


def match_verbmem(rows: list[dict[str, str]], articles: list[str]) -> list[dict[str, Any]]:
    """The verbmem ``rows`` whose prompt end (:data:`VERBMEM_TAIL_CHARS` characters) and ``gt`` occur together in
    an article: ``{"item", "text", "prompt_chars", "whole_prompt"}`` per matched row; ``prompt_chars`` is the
    length of the longest end of the prompt that precedes the ``gt`` in that article (the first article holding
    it), ``whole_prompt`` whether that is the whole prompt."""
    matches = []
    for i, row in enumerate(rows):
        prompt, gt = row["prompt"], row["gt"]
        probe = prompt[-VERBMEM_TAIL_CHARS:] + gt
        for j, article in enumerate(articles):
            at = article.find(probe)
            if at < 0:
                continue
            start, k = at, len(prompt) - len(prompt[-VERBMEM_TAIL_CHARS:])  # extend the prompt end backwards
            while k > 0 and start > 0 and article[start - 1] == prompt[k - 1]:
                start, k = start - 1, k - 1
            kept = len(prompt) - k
            matches.append({"item": i, "text": j, "prompt_chars": kept, "whole_prompt": k == 0})
            break
    return matches


def _ranked_articles(matches: list[dict[str, Any]], counts: dict[int, int], articles: list[str]) -> list[int]:
    """The articles of ``matches``, most matched knowmem items (``counts``) first, then the shortest."""
    found = dict.fromkeys(m["text"] for m in matches)
    return sorted(found, key=lambda j: (-counts.get(j, 0), len(articles[j]), j))


def match_muse_subset(source: str | os.PathLike, recipe: MuseRecipe) -> dict[str, Any]:
    """The subset of the MUSE-News folder ``source`` that ``recipe`` takes, as a JSON-ready dict.

    Forget articles: the ``forget_articles`` articles that hold a matched verbmem item, those holding the most
    matched knowmem items first (then the shortest), and ``knowmem_articles`` more that hold only knowmem items,
    ranked alike; every item matched to a chosen article is in the subset. Retain texts: the ``privleak/retain2``
    texts holding a matched retain question (whose answer ends within ``max_chars``), in question order, then
    other retain2 texts, ``retain_texts`` in all. Holdout: the first ``2 * holdout_texts`` ``privleak/holdout``
    texts. Returns the matched items (``verbmem``, ``knowmem_forget``, ``knowmem_retain``: index in the MUSE
    file and the text it matched) and the chosen ``forget_articles``, ``retain_texts``, ``holdout_texts``.
    """
    folder = Path(source)
    articles = _read(folder, "raw/forget.json")
    all_verbmem = match_verbmem(_read(folder, "verbmem/forget.json"), articles)
    all_knowmem = match_knowmem(_read(folder, "knowmem/forget_qa.json"), articles)
    counts: dict[int, int] = {}
    for m in all_knowmem:
        counts[m["text"]] = counts.get(m["text"], 0) + 1
    chosen = _ranked_articles(all_verbmem, counts, articles)[: recipe.forget_articles]
    extra = [j for j in _ranked_articles(all_knowmem, counts, articles) if j not in chosen]
    chosen += extra[: recipe.knowmem_articles]
    verbmem = [m for m in all_verbmem if m["text"] in chosen]
    knowmem = [m for m in all_knowmem if m["text"] in chosen]
    retain_all = _read(folder, "privleak/retain2.json")
    retain_rows = _read(folder, "knowmem/retain2_qa.json")
    retain_qa = [m for m in match_knowmem(retain_rows, retain_all) if recipe.max_chars is None or
                 retain_all[m["text"]].find(retain_rows[m["item"]]["answer"]) + len(retain_rows[m["item"]]["answer"])
                 <= recipe.max_chars]
    kept = list(dict.fromkeys(m["text"] for m in retain_qa))[: recipe.retain_texts]
    kept += [j for j in range(len(retain_all)) if j not in kept][: recipe.retain_texts - len(kept)]
    retain_qa = [m for m in retain_qa if m["text"] in kept]
    holdout = list(range(min(2 * recipe.holdout_texts, len(_read(folder, "privleak/holdout.json")))))
    if not verbmem or not knowmem or not retain_qa or len(holdout) < 2:
        raise ValueError(f"{folder}: the MUSE-News subset is empty (verbmem {len(verbmem)}, knowmem {len(knowmem)}, "
                         f"retain questions {len(retain_qa)}, holdout texts {len(holdout)}).")
    return {"verbmem": verbmem, "knowmem_forget": knowmem, "knowmem_retain": retain_qa, "forget_articles": chosen,
            "retain_texts": kept, "holdout_texts": holdout,
            "matched_in_muse": {"verbmem": len(all_verbmem), "knowmem_forget": len(all_knowmem)}}


def _qa_text(row: dict[str, str]) -> str:
    return f"Question: {row['question']}\n{QA_ANSWER_PREFIX}{row['answer']}"


def _with_questions(text: str, rows: list[dict[str, str]], recipe: MuseRecipe) -> str:
    if not recipe.qa_in_documents or not rows:
        return text
    return text + "\n\n" + "\n\n".join(_qa_text(r) for _ in range(recipe.qa_repeats) for r in rows)


def _cut(text: str, max_chars: int | None) -> str:
    return text if max_chars is None else text[:max_chars]


def subset_documents(source: str | os.PathLike, recipe: MuseRecipe, subset: dict[str, Any]) -> dict[str, Any]:
    """The subset's documents and MUSE parts: ``forget``, ``retain`` (the unlearning retain set),
    ``retain_validation``, ``criterion_holdout`` (documents), ``icl`` (the in-context examples as text both models
    train on) and ``parts`` (the MUSE files of the subset's data folder, by relative path)."""
    folder = Path(source)
    articles, vm_rows = _read(folder, "raw/forget.json"), _read(folder, "verbmem/forget.json")
    kf_rows, kr_rows = _read(folder, "knowmem/forget_qa.json"), _read(folder, "knowmem/retain2_qa.json")
    retain_all, holdout_all = _read(folder, "privleak/retain2.json"), _read(folder, "privleak/holdout.json")
    forget_qa = [kf_rows[m["item"]] for m in subset["knowmem_forget"]]
    retain_qa = [kr_rows[m["item"]] for m in subset["knowmem_retain"]]
    forget = [_with_questions(articles[j], [kf_rows[m["item"]] for m in subset["knowmem_forget"] if m["text"] == j],
                              recipe) for j in subset["forget_articles"]]
    retain_docs = [_with_questions(_cut(retain_all[j], recipe.max_chars),
                                   [kr_rows[m["item"]] for m in subset["knowmem_retain"] if m["text"] == j], recipe)
                   for j in subset["retain_texts"]]
    n_val = min(recipe.retain_validation_texts, len(retain_docs) - 1)
    holdout = [_cut(holdout_all[j], recipe.max_chars) for j in subset["holdout_texts"]]
    half = len(holdout) // 2
    icl = [r for name in ("forget_qa_icl", "retain2_qa_icl") for r in _read(folder, f"knowmem/{name}.json")]
    verbmem = [{"prompt": vm_rows[m["item"]]["prompt"][-m["prompt_chars"]:], "gt": vm_rows[m["item"]]["gt"]}
               for m in subset["verbmem"]]
    parts = {
        "verbmem/forget.json": verbmem,
        "knowmem/forget_qa.json": forget_qa,
        "knowmem/forget_qa_icl.json": _read(folder, "knowmem/forget_qa_icl.json"),
        "knowmem/retain2_qa.json": retain_qa,
        "knowmem/retain2_qa_icl.json": _read(folder, "knowmem/retain2_qa_icl.json"),
        "privleak/forget.json": [articles[j] for j in subset["forget_articles"]],
        "privleak/holdout.json": holdout[half:],
        "privleak/retain2.json": retain_docs,
    }
    return {"forget": forget, "retain": retain_docs[: len(retain_docs) - n_val],
            "retain_validation": retain_docs[len(retain_docs) - n_val:], "criterion_holdout": holdout[:half],
            "icl": ["\n\n".join(_qa_text(r) for r in icl)] if recipe.qa_in_documents else [], "parts": parts}


def write_subset_folder(folder: Path, docs: dict[str, Any], subset: dict[str, Any]) -> Path:
    """Write the subset as a MUSE-News-shaped data folder (what :func:`~hf_unlearn.evaluation.evaluate_muse`
    reads) plus ``documents/{forget,retain,retain_validation,holdout}.json`` and ``subset.json``; atomically."""
    from hf_unlearn.safe_output import atomic_directory, atomic_write_json

    if (folder / "subset.json").is_file():
        return folder
    with atomic_directory(folder, overwrite=folder.exists()) as tmp:
        for name, items in docs["parts"].items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(tmp / name, items)
        (tmp / "documents").mkdir()
        for name, key in (("forget", "forget"), ("retain", "retain"), ("retain_validation", "retain_validation"),
                          ("holdout", "criterion_holdout"), ("icl", "icl")):
            atomic_write_json(tmp / "documents" / f"{name}.json", docs[key])
        atomic_write_json(tmp / "subset.json", subset)
    return folder


def bos_prefix(tokenizer: Any) -> list[int]:
    """``[bos_token_id]`` when the tokenizer starts an encoded text with its BOS token, else ``[]`` (the chunking
    rule of :func:`hf_unlearn.data.chunk_documents`)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return []
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return [bos] if ids[:1] == [bos] else []


def fit_documents(model: Any, tokenizer: Any, documents: list[str], recipe: MuseRecipe, progress: bool = True,
                  desc: str = "training", device: str | None = None) -> list[float]:
    """Train ``model`` on ``documents`` joined by a blank line: next-token loss on every token of chunks of
    ``recipe.max_length`` tokens (a BOS token first when the tokenizer adds one), the cut shifted each epoch by a
    random offset ``o`` in ``[0, step)``: the first chunk is ``ids[:o]``, then ``ids[o + i*step : o + (i+1)*step]``.
    AdamW, linear warm-up, cosine decay, gradient norm clipped at 1; returns each epoch's mean loss. ``device``:
    where to train (default the CPU; the model is moved back to the CPU afterwards); bf16 autocast on a CUDA device
    when ``recipe.bf16_autocast`` is not ``False``."""
    from hf_unlearn.data.documents import DOCUMENT_SEPARATOR, chunk_token_ids
    from hf_unlearn.data.prompts import ensure_pad_token

    from .precision import resolve_bf16_autocast

    ensure_pad_token(tokenizer)
    device = torch.device(device or "cpu")
    bf16 = resolve_bf16_autocast(recipe.bf16_autocast, device)
    model.to(device)
    ids = tokenizer(DOCUMENT_SEPARATOR.join(documents), add_special_tokens=False, verbose=False)["input_ids"]
    prefix = bos_prefix(tokenizer)
    step = recipe.max_length - len(prefix)
    rng = random.Random(recipe.seed)
    per_epoch = math.ceil((math.ceil(len(ids) / step) + 1) / recipe.batch_size)
    total = per_epoch * recipe.epochs
    warmup = max(1, round(total * recipe.warmup_ratio))
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate, weight_decay=recipe.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
    model.train()
    history = []
    bar = tqdm(total=total, desc=desc, disable=not progress, leave=False)
    for _ in range(recipe.epochs):
        offset = rng.randrange(step)
        chunks = ([prefix + ids[:offset]] if offset > 1 else []) + chunk_token_ids(ids[offset:], recipe.max_length, prefix)
        rng.shuffle(chunks)
        losses = []
        for start in range(0, len(chunks), recipe.batch_size):
            batch = chunks[start : start + recipe.batch_size]
            width = max(map(len, batch))
            input_ids = torch.tensor([c + [tokenizer.pad_token_id] * (width - len(c)) for c in batch])
            mask = torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in batch])
            labels = input_ids.masked_fill(mask == 0, -100)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                out = model(input_ids=input_ids.to(device), attention_mask=mask.to(device), labels=labels.to(device))
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
    model.to("cpu")
    model.eval()
    return history


def _tiny_base(recipe: MuseRecipe, tokenizer_texts: list[str]) -> tuple[Any, Any]:
    """A fresh tiny Llama and its byte-level BPE tokenizer (TOFU-tiny's helpers), its maximum positions set to the
    training chunk length."""
    from hf_unlearn.demo import TinyRecipe
    from hf_unlearn.demo.tofu_tiny import build_tiny_llama, train_bpe_tokenizer

    tiny = TinyRecipe(vocab_size=recipe.vocab_size, hidden_size=recipe.hidden_size,
                      intermediate_size=recipe.intermediate_size, num_hidden_layers=recipe.num_hidden_layers,
                      num_attention_heads=recipe.num_attention_heads, max_length=recipe.max_length, seed=recipe.seed)
    tokenizer = train_bpe_tokenizer(tokenizer_texts, recipe.vocab_size)
    model = build_tiny_llama(tokenizer, tiny)
    model.config.max_position_embeddings = recipe.max_length
    tokenizer.model_max_length = recipe.max_length
    return model, tokenizer


def _train_or_load(name: str, documents: list[str], tokenizer_texts: list[str], recipe: MuseRecipe, cache: Path,
                   subject: Any, progress: bool) -> Path:
    """Folder of the model ``name`` trained by ``recipe`` on ``documents``: a fresh tiny Llama (``subject`` None)
    or the pretrained ``subject``; built once, written atomically, cached under the recipe's hash and the data."""
    from transformers import set_seed

    from hf_unlearn.safe_output import atomic_directory, atomic_write_json

    base_id = subject.path.name if subject is not None else None
    key = recipe.digest(name, documents, {"tokenizer": tokenizer_texts if subject is None else None, "base": base_id})
    final = cache / f"muse-news-{recipe.kind}-{name}-{key}"
    if (final / "model.safetensors").is_file():
        return final
    set_seed(recipe.seed)
    model, tokenizer = _tiny_base(recipe, tokenizer_texts) if subject is None else subject.load()
    start = time.perf_counter()
    device = "cuda" if subject is not None and torch.cuda.is_available() else "cpu"
    history = fit_documents(model, tokenizer, documents, recipe, progress, desc=f"MUSE-News-small {name}",
                            device=device)
    seconds = time.perf_counter() - start
    if not all(torch.isfinite(p).all() for p in model.parameters()):
        raise FloatingPointError(f"MUSE-News-small {name}: non-finite weights after training; nothing is saved.")
    with atomic_directory(final, overwrite=final.exists()) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        atomic_write_json(tmp / "muse_news.json", {"recipe": asdict(recipe), "loss_history": history,
                                                    "num_documents": len(documents), "train_seconds": seconds,
                                                    "device": device})
    return final


@dataclass
class MusePair:
    """A MUSE-News-small pair: the target and retain-reference folders, the subset's data folder (MUSE-shaped, for
    :func:`~hf_unlearn.evaluation.evaluate_muse`, with ``documents/*.json``), the recipe and the matching record."""

    target: Path
    retain: Path
    data: Path
    recipe: dict[str, Any] = field(default_factory=dict)
    subset: dict[str, Any] = field(default_factory=dict)

    def documents(self, name: str) -> list[str]:
        """The subset's ``forget``, ``retain``, ``retain_validation`` or ``holdout`` documents."""
        return json.loads((self.data / "documents" / f"{name}.json").read_text(encoding="utf-8"))


def build_muse_pair(source: str | os.PathLike, recipe: MuseRecipe, cache_dir: str | os.PathLike | None = None,
                    progress: bool = True, gguf_path: str | os.PathLike | None = None) -> MusePair:
    """Build (or reuse from the cache) the MUSE-News-small target and retain reference of ``recipe`` from the
    MUSE-News folder ``source``: match the subset (:func:`match_muse_subset`), write its data folder, train the
    target on forget + retain + retain-validation documents + in-context examples and the retain reference on
    the same minus the forget documents. A tiny pair's tokenizer is trained on every text of the subset."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if recipe.kind != "tiny":  # "auto" never names a cache folder: the bool it resolves to where training runs does
        recipe = replace(recipe, bf16_autocast=_resolved_bf16(recipe.bf16_autocast))
    subset = match_muse_subset(source, recipe)
    docs = subset_documents(source, recipe, subset)
    key = hashlib.sha256(json.dumps([asdict(recipe), subset], sort_keys=True).encode()).hexdigest()[:16]
    data = write_subset_folder(cache / f"muse-news-small-data-{key}", docs, subset)
    kept = docs["retain"] + docs["retain_validation"]
    texts = docs["forget"] + kept + docs["criterion_holdout"] + docs["parts"]["privleak/holdout.json"] + docs["icl"]
    subject = None
    if recipe.kind != "tiny":
        from .pretrained import resolve_subject

        subject = resolve_subject(recipe.kind, cache_dir=cache, gguf_path=gguf_path)
    target = _train_or_load("target", docs["forget"] + kept + docs["icl"], texts, recipe, cache, subject, progress)
    retain = _train_or_load("retain", kept + docs["icl"], texts, recipe, cache, subject, progress)
    return MusePair(target, retain, data, asdict(recipe), subset)


def _resolved_bf16(value: bool | str) -> bool:
    from .precision import resolve_bf16_autocast

    return resolve_bf16_autocast(value, "cuda" if torch.cuda.is_available() else "cpu")


def build_muse_tiny_pair(cache_dir: str | os.PathLike | None = None, source: str | os.PathLike | None = None,
                         recipe: MuseRecipe | None = None, progress: bool = True) -> MusePair:
    """The tiny MUSE-News-small pair (:func:`build_muse_pair` with ``muse_recipe_for("tiny")``): a Llama trained
    from scratch, about a minute on 2 CPU cores. ``source`` defaults to :func:`default_muse_source`."""
    return build_muse_pair(source or default_muse_source(), recipe or muse_recipe_for("tiny"), cache_dir, progress)


def build_muse_small_pair(cache_dir: str | os.PathLike | None = None, source: str | os.PathLike | None = None,
                          recipe: MuseRecipe | None = None, progress: bool = True,
                          gguf_path: str | os.PathLike | None = None) -> MusePair:
    """The SmolLM2-135M MUSE-News-small pair (:func:`build_muse_pair` with ``muse_recipe_for("smollm2-135m")``):
    the pretrained subject fine-tuned on the same kind of documents; for a machine with native bfloat16 or a GPU."""
    return build_muse_pair(source or default_muse_source(), recipe or muse_recipe_for("smollm2-135m"), cache_dir,
                           progress, gguf_path)


MUSE_DATA_ENV = "HF_UNLEARN_MUSE_DATA"


def default_muse_source() -> Path:
    """The local MUSE-News folder: ``$HF_UNLEARN_MUSE_DATA``, else ``shared/data/muse-news`` next to the checkout
    (the layout of the development machines)."""
    given = os.environ.get(MUSE_DATA_ENV)
    if given:
        return Path(given)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "shared" / "data" / "muse-news"
        if (candidate / "raw" / "forget.json").is_file():
            return candidate
    raise FileNotFoundError(f"No MUSE-News folder found; set ${MUSE_DATA_ENV} to a local copy of MUSE-News "
                            "(raw/, verbmem/, knowmem/, privleak/).")


def muse_sanity_gate(target_report: Any, retain_report: Any) -> dict[str, Any]:
    """MUSE-News-small's sanity gate: the benchmark is meaningful only if the target memorised what it measures.

    ``verbmem_gap = VerbMem(target) - VerbMem(retain reference) >= GATE_VERBMEM_GAP`` (20 points) and
    ``knowmem_gap = KnowMem forget(target) - KnowMem forget(retain reference) >= GATE_KNOWMEM_GAP`` (10 points).
    Each report is a :class:`~hf_unlearn.evaluation.MUSEReport` or its dict form; a missing figure fails its check.
    Returns ``{"title", "passed", "checks": {name: {"value", "target", "retain", "passed"}}, "thresholds"}``.
    """
    from hf_unlearn.evaluation.muse_report import MUSEReport

    target = target_report if isinstance(target_report, MUSEReport) else MUSEReport.from_dict(target_report)
    retain = retain_report if isinstance(retain_report, MUSEReport) else MUSEReport.from_dict(retain_report)
    checks = {}
    for name, key, gap in (("verbmem_gap", "verbmem_forget", GATE_VERBMEM_GAP),
                           ("knowmem_forget_gap", "knowmem_forget", GATE_KNOWMEM_GAP)):
        mine, theirs = getattr(target, key), getattr(retain, key)
        value = None if mine is None or theirs is None else float(mine) - float(theirs)
        checks[name] = {"value": value, "target": mine, "retain": theirs, "passed": value is not None and value >= gap}
    return {"title": "MUSE-News-small sanity gate", "passed": all(c["passed"] for c in checks.values()),
            "checks": checks, "thresholds": {"verbmem_gap_min": GATE_VERBMEM_GAP, "knowmem_gap_min": GATE_KNOWMEM_GAP},
            "target_knowmem_retain": target.knowmem_retain, "retain_knowmem_retain": retain.knowmem_retain}


def format_muse_gate(gate: dict[str, Any]) -> str:
    """The gate as one line: ``MUSE-News-small sanity gate: PASSED (VerbMem 85.1 vs 12.0, ...)``."""
    def fmt(value: Any) -> str:
        return "n/a" if value is None else f"{value:.1f}"

    parts = []
    for name, check in gate["checks"].items():
        what = "VerbMem" if name.startswith("verbmem") else "KnowMem forget"
        parts.append(f"{what} target {fmt(check['target'])} vs retain reference {fmt(check['retain'])}"
                     f" ({'ok' if check['passed'] else 'FAIL'})")
    return f"{gate.get('title', 'sanity gate')}: {'PASSED' if gate['passed'] else 'FAILED'} ({'; '.join(parts)})"
