"""ATWU's learned token weighter (saved in ``atwu_weighter/`` of an output folder and of its checkpoints), its
optimizer-state files, and the token-score AUROC helpers."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from huggingface_hub import PyTorchModelHubMixin
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from ...data.prompts import PromptTemplate

_Stat = torch.Tensor | None  # optional statistics in place of the tracked ones
WEIGHTER_DIR = "atwu_weighter"
WEIGHTER_OPTIMIZER_NAME = "atwu_weighter_optimizer.safetensors"
#: Which hidden state scores answer token ``t``: ``"token"``, its own (``h_t``, the paper's ``h_theta(x_t)``);
#: ``"predicting"``, the one the model predicts it from (``h_{t-1}``, where its loss is computed).
SCORER_POSITIONS = ("token", "predicting")


def model_hidden_size(model: Any) -> int:
    """Width of ``model``'s last hidden state (``config.hidden_size``, else the embedding width)."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    size = getattr(config, "hidden_size", None)
    if size is None and hasattr(model, "get_input_embeddings"):
        size = model.get_input_embeddings().embedding_dim
    if size is None:
        raise ValueError(f"Cannot tell the hidden size of {type(model).__name__}; pass hidden_size explicitly.")
    return int(size)


class ATWUTokenWeighter(
    nn.Module,
    PyTorchModelHubMixin,
    library_name="hf-unlearn",
    tags=["hf-unlearn", "unlearning", "atwu"],
    repo_url="https://github.com/hf-unlearn/hf-unlearn",
):
    """Linear token weighter ``g_t = sigmoid(<w, (h_t - mu) / sigma> + b)``, ``sigma = sqrt(var + eps)``.

    ``h_t``: the detached last-layer state of answer token ``t`` (``position="token"``, the paper's
    ``h_theta(x_t)``) or of the one predicting it (``"predicting"``, ``h_{t-1}``); ``mu``, ``var``: running
    statistics of the scored states (buffers ``center``, ``variance``); ``standardize=False`` only centres. Starts at
    ``w = 0``, ``b = init_bias``; float32 whatever the model's dtype.
    """

    def __init__(self, hidden_size: int, init_bias: float = 0.0, standardize: bool = True, eps: float = 1e-5,
                 position: str = "token"):
        super().__init__()
        if position not in SCORER_POSITIONS:
            raise ValueError(f"position must be one of {list(SCORER_POSITIONS)}, got {position!r}.")
        self.position = position
        if int(hidden_size) < 1:
            raise ValueError(f"hidden_size must be >= 1, got {hidden_size}.")
        if not float(eps) > 0:
            raise ValueError(f"eps must be > 0, got {eps}.")
        self.hidden_size = int(hidden_size)
        self.init_bias = float(init_bias)
        self.standardize = bool(standardize)
        self.eps = float(eps)
        self.linear = nn.Linear(self.hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.constant_(self.linear.bias, self.init_bias)
        self.register_buffer("center", torch.zeros(self.hidden_size))
        self.register_buffer("variance", torch.ones(self.hidden_size))
        self.register_buffer("num_center_updates", torch.zeros((), dtype=torch.long))

    @property
    def weight(self) -> torch.Tensor:
        """The direction ``w`` (``[hidden_size]``)."""
        return self.linear.weight[0]

    def standardized(self, hidden_states: torch.Tensor, center: _Stat = None, variance: _Stat = None) -> torch.Tensor:
        """The scorer's input ``(h - mu) / sqrt(var + eps)`` (``standardize=False``: ``h - mu``) in float32;
        ``mu`` / ``var`` are ``center`` / ``variance`` when given, else the tracked buffers."""
        if hidden_states.shape[-1] != self.hidden_size:
            raise ValueError(
                f"Hidden states of width {hidden_states.shape[-1]} given to a weighter of hidden size {self.hidden_size}."
            )
        mu = self.center if center is None else center
        h = hidden_states.detach().to(self.linear.weight.dtype) - mu
        if self.standardize:
            var = self.variance if variance is None else variance
            h = h * torch.rsqrt(var.to(h.dtype) + self.eps)
        return h

    def logits(self, hidden_states: torch.Tensor, center: _Stat = None, variance: _Stat = None) -> torch.Tensor:
        """``<w, (h - mu) / sigma> + b`` on detached hidden states ``[..., hidden_size]`` (:meth:`standardized`)."""
        h = self.standardized(hidden_states, center, variance)
        with torch.autocast(device_type=h.device.type, enabled=False):  # float32 even inside mixed precision
            return self.linear(h).squeeze(-1)

    def forward(self, hidden_states: torch.Tensor, center: _Stat = None, variance: _Stat = None) -> torch.Tensor:
        """Scores in ``[0, 1]`` of shape ``hidden_states.shape[:-1]``."""
        return torch.sigmoid(self.logits(hidden_states, center, variance))

    def label_logits(self, hidden_states: torch.Tensor, center: _Stat = None, variance: _Stat = None) -> torch.Tensor:
        """:meth:`logits` aligned with the labels as :func:`hf_unlearn.logprobs.label_log_probs` is,
        ``[B, L, H] -> [B, L]``: ``out[:, t]`` reads ``h_t`` (``"token"``) or ``h_{t-1}`` (``"predicting"``;
        ``out[:, 0]`` reads ``h_0``)."""
        z = self.logits(hidden_states, center, variance)
        return z if self.position == "token" else torch.cat([z[:, :1], z[:, :-1]], dim=1)

    def label_scores(self, hidden_states: torch.Tensor, center: _Stat = None, variance: _Stat = None) -> torch.Tensor:
        """``sigmoid`` of :meth:`label_logits`: the scores of the labels, ``[B, L, H] -> [B, L]``."""
        return torch.sigmoid(self.label_logits(hidden_states, center, variance))

    def scored_states(self, hidden_states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The hidden states :meth:`label_scores` reads for the ``mask``-ed label positions, ``[N, H]``."""
        mask = mask.to(hidden_states.device)
        if self.position == "token":
            return hidden_states[mask].detach()
        return hidden_states[:, :-1][mask[:, 1:]].detach()

    @torch.no_grad()
    def update_statistics(self, batch_mean: torch.Tensor, batch_variance: _Stat = None, momentum: float = 0.1) -> None:
        """``mu <- (1 - momentum) mu + momentum * batch_mean`` (the same for ``var``; the first call sets them;
        without ``batch_variance`` only the centre moves)."""
        first = int(self.num_center_updates) == 0
        for buffer, value in ((self.center, batch_mean), (self.variance, batch_variance)):
            if value is None:
                continue
            value = value.detach().to(buffer.dtype)
            if first:
                buffer.copy_(value)
            else:
                buffer.mul_(1.0 - momentum).add_(momentum * value)
        self.num_center_updates += 1

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, *, model: Any | None = None,
        hidden_size: int | None = None, **kwargs: Any,
    ) -> ATWUTokenWeighter:
        """Load a weighter saved with ``save_pretrained`` (a folder, a Hub repo, or an ATWU output folder's
        ``atwu_weighter/``). With ``model`` (or ``hidden_size``), another width is refused (``ValueError``); with
        ``model``, it is moved to its device."""
        path = Path(pretrained_model_name_or_path)
        if (path / WEIGHTER_DIR / "config.json").is_file():
            path = path / WEIGHTER_DIR
        if path.is_dir():
            if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
                raise FileNotFoundError(
                    f"No ATWU token weighter in {pretrained_model_name_or_path}: expected {WEIGHTER_DIR}/config.json "
                    f"and {WEIGHTER_DIR}/model.safetensors (or config.json and model.safetensors)."
                )
            config = json.loads((path / "config.json").read_text())
            if not isinstance(config, dict) or "hidden_size" not in config or "init_bias" not in config:
                raise ValueError(f"{path / 'config.json'} is not an ATWU token weighter config: {sorted(config)}.")
            source: str | os.PathLike = path
        else:
            source = pretrained_model_name_or_path
        weighter = super().from_pretrained(source, **kwargs)
        expected = hidden_size if hidden_size is not None else (model_hidden_size(model) if model is not None else None)
        if expected is not None and int(expected) != weighter.hidden_size:
            raise ValueError(
                f"Hidden size mismatch: the ATWU token weighter in {pretrained_model_name_or_path} was trained on "
                f"hidden states of size {weighter.hidden_size}, but the model has hidden size {expected}."
            )
        if model is not None:
            try:
                weighter.to(next(model.parameters()).device)
            except (AttributeError, StopIteration):
                pass
        return weighter


def save_optimizer_state(optimizer: torch.optim.Optimizer, path: str | os.PathLike) -> None:
    """Write ``optimizer.state_dict()`` as safetensors: each state tensor as ``state.<param>.<key>``, the
    parameter groups and scalars as JSON metadata (:func:`load_optimizer_state` reads it back)."""
    state = optimizer.state_dict()
    tensors = {}
    scalars: dict[str, Any] = {}
    for pid, values in state["state"].items():
        for key, value in values.items():
            if torch.is_tensor(value):
                tensors[f"state.{pid}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{key}"] = value
    metadata = {"param_groups": json.dumps(state["param_groups"]), "scalars": json.dumps(scalars)}
    save_file(tensors, str(path), metadata=metadata)


def load_optimizer_state(optimizer: torch.optim.Optimizer, path: str | os.PathLike) -> None:
    """Load into ``optimizer`` a state written by :func:`save_optimizer_state`."""
    per_param: dict[int, dict[str, Any]] = {}
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
        for name in f.keys():
            _, pid, key = name.split(".", 2)
            per_param.setdefault(int(pid), {})[key] = f.get_tensor(name)
    for name, value in json.loads(metadata.get("scalars", "{}")).items():
        pid, key = name.split(".", 1)
        per_param.setdefault(int(pid), {})[key] = value
    groups = [
        {k: (tuple(v) if isinstance(v, list) and k != "params" else v) for k, v in group.items()}  # JSON lists
        for group in json.loads(metadata["param_groups"])
    ]
    optimizer.load_state_dict({"state": per_param, "param_groups": groups})


def auroc(scores: Sequence[float] | np.ndarray, labels: Sequence[bool] | np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` for binary ``labels``: the probability that a random positive
    outscores a random negative, ties counting half (:func:`~hf_unlearn.evaluation.privacy.mia_auc`)."""
    from ...evaluation.privacy import mia_auc

    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels, dtype=bool).ravel()
    if s.shape != y.shape:
        raise ValueError(f"{s.size} scores but {y.size} labels.")
    if y.all() or not y.any():
        raise ValueError(f"AUROC needs both classes; got {int(y.sum())} positives and {int((~y).sum())} negatives.")
    return mia_auc(s[~y], s[y])


def answer_token_ids(
    tokenizer: Any, rows: Iterable[dict[str, Any]], template: str | PromptTemplate | None = None
) -> set[int]:
    """Every token id that occurs in the answers of ``rows``, tokenized as the trainers do
    (:func:`hf_unlearn.data.tokenize_qa` with ``template``: pass the run's ``prompt_template``)."""
    from ...data.prepare import prepare_qa
    from ...data.prompts import IGNORE_INDEX

    ids: set[int] = set()
    for f in prepare_qa(rows, tokenizer, template=template, validate=False):
        ids.update(t for t in f["labels"] if t != IGNORE_INDEX)
    return ids


def forget_specific_auroc(
    token_scores: Sequence[dict[str, Any]], retain_token_ids: set[int] | Iterable[int]
) -> float:
    """AUROC of per-token scores (``[{"token_ids": [...], "scores": [...]}]``, as :meth:`ATWUTrainer.token_scores`
    returns) against forget-specific tokens: ids not in ``retain_token_ids`` (:func:`answer_token_ids`)."""
    retain = set(retain_token_ids)
    scores, labels = [], []
    for example in token_scores:
        if len(example["token_ids"]) != len(example["scores"]):
            raise ValueError("Each example needs as many scores as token ids.")
        scores.extend(float(s) for s in example["scores"])
        labels.extend(int(t) not in retain for t in example["token_ids"])
    return auroc(scores, labels)


@torch.no_grad()
def score_token_features(
    model: Any, scorer: ATWUTokenWeighter, features: Sequence[dict[str, list[int]]], pad_token_id: int,
    tokenizer: Any = None, batch_size: int = 16, progress: bool = False,
) -> list[dict[str, Any]]:
    """One ``{"token_ids", "tokens", "scores", "token_nll"}`` dict per tokenized example (``input_ids``,
    ``labels``), in order: the answer tokens, their strings (with ``tokenizer``), their scores and
    ``-log p(y_t | y_<t)``, the model in eval mode."""
    from tqdm.auto import tqdm

    from ...data.prompts import collate_qa
    from ...logprobs import answer_mask, label_log_probs

    try:
        device = next(model.parameters()).device
    except StopIteration:
        device = torch.device("cpu")
    was_training = model.training
    model.eval()
    out: list[dict[str, Any]] = []
    try:
        for start in tqdm(range(0, len(features), batch_size), desc="scoring tokens", disable=not progress, leave=False):
            chunk = [{"input_ids": list(f["input_ids"]), "labels": list(f["labels"])} for f in features[start : start + batch_size]]
            batch = {k: v.to(device) for k, v in collate_qa(chunk, pad_token_id, "right").items()}
            outputs = model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], output_hidden_states=True, use_cache=False,
            )
            scores = scorer.label_scores(outputs.hidden_states[-1]).float().cpu()
            nll = (-label_log_probs(outputs.logits, batch["labels"])).float().cpu()
            mask = answer_mask(batch["labels"]).cpu()
            labels = batch["labels"].cpu()
            for i in range(labels.shape[0]):
                ids = labels[i][mask[i]].tolist()
                out.append({
                    "token_ids": ids,
                    "tokens": tokenizer.convert_ids_to_tokens(ids) if tokenizer is not None else None,
                    "scores": scores[i][mask[i]].tolist(), "token_nll": nll[i][mask[i]].tolist(),
                })
    finally:
        if was_training:
            model.train()
    return out


def score_tokens(
    model: Any, tokenizer: Any, scorer: ATWUTokenWeighter, rows: Iterable[dict[str, Any]],
    batch_size: int = 16, progress: bool = False, template: str | PromptTemplate | None = None,
    max_length: int | None = None,
) -> list[dict[str, Any]]:
    """Per-token scores of the answers of TOFU rows (``question``/``answer``) under ``model`` and ``scorer``, e.g.
    a reloaded ATWU output folder; the tokens are those of :func:`hf_unlearn.data.tokenize_qa` with ``template``
    and ``max_length`` (pass the run's ``prompt_template`` and ``max_length`` to score the tokens it trained on)."""
    from ...data.prepare import PromptTooLongError, prepare_qa
    from ...data.prompts import ensure_pad_token

    if scorer.hidden_size != model_hidden_size(model):
        raise ValueError(
            f"Hidden size mismatch: the scorer has hidden size {scorer.hidden_size}, the model {model_hidden_size(model)}."
        )
    ensure_pad_token(tokenizer)
    try:
        features = prepare_qa(rows, tokenizer, template=template, max_length=max_length, validate=False)
    except PromptTooLongError as err:  # tokenize_qa's own message
        raise ValueError(err.reason) from err.__cause__
    return score_token_features(model, scorer, features, tokenizer.pad_token_id, tokenizer, batch_size, progress)


def token_auroc_metrics(trainer: Any, tokenizer: Any, forget: Any, retain: Any) -> dict[str, float]:
    """``{"token_auroc": ...}``: :func:`forget_specific_auroc` of the trained weighter on the forget rows; ``{}``
    for documents (no answer tokens to rank)."""
    from ...data.documents import as_documents

    if as_documents(forget, plain_lists=True) is not None or as_documents(retain, plain_lists=True) is not None:
        return {}
    scores = trainer.token_scores(forget)
    retain_ids = answer_token_ids(tokenizer, retain, template=trainer.args.prompt_template)
    return {"token_auroc": forget_specific_auroc(scores, retain_ids)}
