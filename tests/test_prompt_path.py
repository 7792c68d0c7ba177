"""One prompt path: with a non-default ``prompt_template``, what MASC's stopping probes and ATWU's weighter read
are the tokens the loss trains on (:func:`hf_unlearn.data.tokenize_qa` with that template), never the default
template's."""

from __future__ import annotations

import pytest
import torch

from hf_unlearn.data import tokenize_qa

TEMPLATE = "tofu-llama2"  # "[INST] {question} [/INST]{answer}": other tokens than the default "plain" template


def _sequences(tok, rows, template):
    return {tuple(tokenize_qa(tok, r["question"], r["answer"], template=template)["input_ids"]) for r in rows}


def _answers(tok, rows, template):
    out = []
    for r in rows:
        labels = tokenize_qa(tok, r["question"], r["answer"], template=template)["labels"]
        out.append([t for t in labels if t != -100])
    return out


class _Recorder:
    """Records the unpadded ``input_ids`` of every forward of ``model``, under the label set in ``self.where``."""

    def __init__(self, model):
        self.where = "loss"
        self.seen: dict[str, set[tuple[int, ...]]] = {}
        self.handle = model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
        for i in range(ids.shape[0]):
            row = ids[i][mask[i].bool()] if mask is not None else ids[i]
            self.seen.setdefault(self.where, set()).add(tuple(row.tolist()))


@pytest.mark.parametrize("stop_probe", ["train", "heldout"])
def test_masc_probes_read_the_loss_tokens(tiny_target, synthetic, tmp_path, stop_probe):
    from hf_unlearn.methods.masc import MASCConfig, MASCTrainer

    model, tok = tiny_target
    forget = list(synthetic["forget10"])
    extra = {"penalty": "full", "hinge": "plain", "margin_threshold": 0.0, "stop_tolerance": 0.3} \
        if stop_probe == "heldout" else {}
    args = MASCConfig(
        output_dir=str(tmp_path / "masc"), report_to="none", save_strategy="no", disable_tqdm=True, seed=0,
        gradient_checkpointing=False, use_peft=False, retain_weight=0.0, learning_rate=1e-7, max_steps=4,
        per_device_train_batch_size=4, check_every=2, continuation_min_prefix_tokens=4,
        continuation_min_suffix_tokens=4, prompt_template=TEMPLATE, stop_probe=stop_probe, **extra,
    )
    trainer = MASCTrainer(model, args, train_dataset=forget, processing_class=tok)
    recorder = _Recorder(trainer.model)
    probe = trainer.probe

    def recorded_probe(m, stage, step):
        recorder.where = stage
        try:
            return probe(m, stage, step)
        finally:
            recorder.where = "loss"

    trainer.stopping_callback.probe = recorded_probe
    with pytest.warns(UserWarning, match="step budget"):
        trainer.train()
    recorder.handle.remove()
    templated = _sequences(tok, forget, TEMPLATE)
    assert not templated & _sequences(tok, forget, None)  # the template changes every sequence
    assert recorder.seen["loss"] and recorder.seen["loss"] <= templated
    if stop_probe == "train":
        assert recorder.seen["trigger"] and recorder.seen["trigger"] <= templated
    else:  # the held-out slice is never trained on: its probe reads what the loss would, the templated tokens
        from datasets import Dataset

        from hf_unlearn.methods.masc.stopping import split_validation

        _, held = split_validation(Dataset.from_list(forget), args.validation_fraction, args.seed)
        assert len(held) == 2 and recorder.seen["heldout"] == _sequences(tok, held, TEMPLATE)
        assert not recorder.seen["heldout"] & recorder.seen["loss"]


def test_atwu_weighter_reads_the_loss_tokens(tiny_target, synthetic, tmp_path):
    from hf_unlearn.methods.atwu import ATWUConfig, ATWUTrainer
    from hf_unlearn.methods.atwu.weighter import answer_token_ids, score_tokens

    model, tok = tiny_target
    forget, retain = list(synthetic["forget10"]), list(synthetic["retain90"])
    args = ATWUConfig(
        output_dir=str(tmp_path / "atwu"), report_to="none", save_strategy="no", disable_tqdm=True, seed=0,
        gradient_checkpointing=False, learning_rate=1e-4, max_steps=3, per_device_train_batch_size=4,
        prompt_template=TEMPLATE,
    )
    trainer = ATWUTrainer(model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok)
    trainer.train()
    loss_answers = [[t for t in r["labels"] if t != -100] for r in trainer.forget_dataset]
    assert loss_answers == _answers(tok, forget, TEMPLATE) != _answers(tok, forget, None)
    scored = trainer.token_scores(forget)
    assert [s["token_ids"] for s in scored] == loss_answers
    # the weighter's scores of those tokens are the ones it gives the loss batch's hidden states
    batch = trainer.data_collator([{k: trainer.forget_dataset[i][k] for k in ("input_ids", "labels")} for i in range(2)])
    with torch.no_grad():
        hidden = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                               output_hidden_states=True).hidden_states[-1]
        want = trainer.scorer.label_scores(hidden)
    mask = batch["labels"] != -100
    for i in range(2):
        torch.testing.assert_close(torch.tensor(scored[i]["scores"]), want[i][mask[i]].float(), rtol=1e-5, atol=1e-6)
    # the module-level helpers, given the run's template, read the same tokens
    again = score_tokens(trainer.model, tok, trainer.scorer, forget, template=TEMPLATE, max_length=args.max_length)
    assert [s["token_ids"] for s in again] == loss_answers
    retain_loss_ids = {t for r in trainer.retain_dataset for t in r["labels"] if t != -100}
    assert answer_token_ids(tok, retain, template=TEMPLATE) == retain_loss_ids
