"""Measurements of the benchmark: memory, and the speed references timings are compared against.

* :class:`PeakMemory`: peak resident memory (sampled from ``/proc/self/status``) and, on CUDA, the
  allocator's peak, over a block of code.
* :func:`plain_forward_seconds`: tokenizing the rows and one no-grad forward pass over them, the
  floor for any method that reads the data (GROM's target: within 3x of it).
* :func:`generate_seconds` / :func:`generation_speed`: greedy ``generate`` wall time on one batch
  with and without logits processors (T3's target: at least half the plain tokens per second).
* :func:`load_speed_subject` (and its command-line options, :func:`add_speed_subject_arguments`): the
  model and forget/retain rows the speed scripts in ``benchmarks/`` measure.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import torch


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _rss_mb() -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def release_freed_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc ``malloc_trim``), so that the resident
    memory at the start of a measurement holds only what is still referenced."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: RSS then also counts freed but retained pages
        pass


class PeakMemory:
    """Context manager measuring peak memory over its block.

    ``.peak_mb``: the process's resident memory, sampled every ``interval`` seconds (and at entry and
    exit). ``.entry_mb``: the resident memory at entry, after :func:`release_freed_memory`;
    ``.added_mb = peak_mb - entry_mb``: what the block itself added on top of what the process already held
    (earlier methods' models and evaluations), the figure to compare between methods run in one process.
    ``.peak_gpu_mb``: ``torch.cuda.max_memory_allocated`` over the block when CUDA is available
    (the allocator's peak is reset at entry), else None.
    """

    def __init__(self, interval: float = 0.02):
        self.interval = interval
        self.peak_mb = 0.0
        self.entry_mb = 0.0
        self.peak_gpu_mb: float | None = None
        self._stop = threading.Event()

    @property
    def added_mb(self) -> float:
        return max(self.peak_mb - self.entry_mb, 0.0)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, _rss_mb())
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        release_freed_memory()
        self.entry_mb = self.peak_mb = _rss_mb()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self.peak_mb, _rss_mb())
        if torch.cuda.is_available():
            self.peak_gpu_mb = torch.cuda.max_memory_allocated() / 2**20


def plain_forward_seconds(model: Any, tokenizer: Any, rows: list[dict[str, Any]], batch_size: int = 16) -> float:
    """Seconds of tokenizing ``rows`` (question/answer) and one no-grad forward pass over them.

    Batches are length-sorted and right-padded, as GROM's key collection does them.
    """
    from hf_unlearn.data import collate_qa, ensure_pad_token, tokenize_qa

    ensure_pad_token(tokenizer)
    device = next(model.parameters()).device
    _sync()
    start = time.perf_counter()
    feats = [tokenize_qa(tokenizer, r["question"], r["answer"]) for r in rows]
    feats.sort(key=lambda f: len(f["input_ids"]))
    with torch.no_grad():
        for i in range(0, len(feats), batch_size):
            batch = collate_qa(feats[i : i + batch_size], tokenizer.pad_token_id, "right")
            model(
                input_ids=batch["input_ids"].to(device),
                attention_mask=batch["attention_mask"].to(device),
                position_ids=batch["position_ids"].to(device),
            )
    _sync()
    return time.perf_counter() - start


def generate_seconds(model: Any, enc: dict[str, torch.Tensor], max_new_tokens: int, processors: Any = None,
                     repeats: int = 1) -> float:
    """Median seconds of one greedy ``generate`` call producing exactly ``max_new_tokens`` (after a warm-up;
    ``repeats=0``: one timed call, no warm-up)."""
    kwargs: dict[str, Any] = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
    if processors is not None:
        kwargs["logits_processor"] = processors
    times = []
    for i in range(repeats + 1):
        _sync()
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**enc, **kwargs)
        _sync()
        if i > 0 or repeats == 0:
            times.append(time.perf_counter() - start)
    if out.shape[1] != enc["input_ids"].shape[1] + max_new_tokens:
        raise RuntimeError(f"generate stopped early: {out.shape[1] - enc['input_ids'].shape[1]} of {max_new_tokens} tokens")
    return statistics.median(times)


def generation_speed(model: Any, tokenizer: Any, questions: list[str], processors: Any, max_new_tokens: int = 32,
                     repeats: int = 3) -> dict[str, float]:
    """Tokens per second of greedy ``generate`` on one left-padded batch of ``questions``, plain and with ``processors``.

    Both are warmed up once, then timed alternately ``repeats`` times (so a busy machine slows both alike) and the
    medians compared; processors with ``attach``/``close`` (hooks on the model) are detached for the plain runs. The prompts are left-padded by hand with the pad (else EOS) id: ``tokenizer`` is not
    modified. Returns ``plain_tokens_per_s``, ``tokens_per_s`` (with the processors) and ``speed_ratio`` =
    with / plain (1.0 means no slowdown).
    """
    from hf_unlearn.data import build_prompt, has_chat_template

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = [tokenizer(build_prompt(tokenizer, q), add_special_tokens=not has_chat_template(tokenizer))["input_ids"]
           for q in questions]
    width = max(len(x) for x in ids)
    device = next(model.parameters()).device
    enc = {
        "input_ids": torch.tensor([[pad_id or 0] * (width - len(x)) + list(x) for x in ids], device=device),
        "attention_mask": torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device),
    }
    n_tokens = len(questions) * max_new_tokens
    # Processors that hook the model (T3's reads generate's hidden states) are detached for the plain runs.
    hooked = [p for p in (processors or []) if hasattr(p, "attach") and hasattr(p, "close")]
    plain_times, tilted_times = [], []
    for i in range(max(1, repeats) + 1):
        for p in hooked:
            p.close()
        try:
            plain = generate_seconds(model, enc, max_new_tokens, None, repeats=0)
        finally:
            for p in hooked:
                p.attach()
        tilted = generate_seconds(model, enc, max_new_tokens, processors, repeats=0)
        if i > 0:
            plain_times.append(plain)
            tilted_times.append(tilted)
    plain, tilted = statistics.median(plain_times), statistics.median(tilted_times)
    return {"plain_tokens_per_s": n_tokens / plain, "tokens_per_s": n_tokens / tilted, "speed_ratio": plain / tilted,
            "batch_size": len(questions), "max_new_tokens": max_new_tokens}


def add_speed_subject_arguments(parser: Any) -> None:
    """The ``argparse`` options shared by the speed scripts in ``benchmarks/``: those of
    :func:`load_speed_subject` (``--model --source --forget-split --cache-dir --device``), ``--seed`` and
    ``--out`` (see :func:`unlearn_bench.report.run_speed_script`)."""
    parser.add_argument("--model", default=None, help="local causal LM folder (default: the TOFU-tiny target)")
    parser.add_argument("--source", default="synthetic", help="TOFU source: 'synthetic', Hub id or local folder")
    parser.add_argument("--forget-split", default="forget10")
    parser.add_argument("--cache-dir", default=None, help="cache of the tiny models")
    parser.add_argument("--device", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the JSON here as well")


def load_speed_subject(model: str | None, cache_dir: str | None, device: str | None, source: str, forget_split: str
                       ) -> tuple[Any, Any, list[dict[str, Any]], list[dict[str, Any]], torch.device]:
    """``(model, tokenizer, forget rows, retain rows, device)``: ``model`` (a local folder or Hub id; default: the
    cached TOFU-tiny test target) in eval mode on ``device`` (default: CUDA when available), pad token set."""
    from hf_unlearn.data import RETAIN_FOR_FORGET, ensure_pad_token, load_tofu_rows

    if model:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        lm = AutoModelForCausalLM.from_pretrained(model, dtype="auto", trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=False)
    else:
        from hf_unlearn.demo import load_tiny, tiny_models

        lm, tokenizer = load_tiny(tiny_models(cache_dir=cache_dir).target)
    target_device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    lm.to(target_device).eval()
    ensure_pad_token(tokenizer)
    forget = load_tofu_rows(forget_split, source)
    retain = load_tofu_rows(RETAIN_FOR_FORGET[forget_split], source)
    return lm, tokenizer, forget, retain, target_device
