"""The one-folder-per-method layout: the registry names the method packages, the baseline trainers train exactly
their pure loss function, the forget/retain weights have one name, and the scored positions have one definition."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch


def test_the_registered_classes_live_in_the_method_packages():
    from hf_unlearn.methods import BUILTIN_PACKAGES
    from hf_unlearn.registry import get_method, method_names

    assert method_names()[:8] == ("grom", "t3", "masc", "atwu", "grad_ascent", "grad_diff", "npo", "simnpo")
    for name in method_names():
        info = get_method(name)
        classes = [info.config_cls, info.trainer_cls if info.is_trainer else type(info.fit), info.described_by]
        for cls in classes:
            module = cls.__module__
            assert any(module == p or module.startswith(p + ".") for p in BUILTIN_PACKAGES), (name, cls)


# ----- the baseline trainers train their pure loss function -------------------------------------------------


def _trainer_and_batch(cls_name: str, tmp_path, tiny_target, synthetic, **fields):
    import hf_unlearn.methods.baselines as baselines

    model, tok = tiny_target
    config = getattr(baselines, f"{cls_name}Config")(
        output_dir=str(tmp_path / "out"), report_to="none", save_strategy="no", gradient_checkpointing=False,
        disable_tqdm=True, per_device_train_batch_size=4, max_steps=1, seed=0, learning_rate=1e-4, **fields)
    trainer = getattr(baselines, f"{cls_name}Trainer")(
        model, config, train_dataset=synthetic["forget10"][:6], retain_dataset=synthetic["retain90"][:6],
        processing_class=tok)
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(4)]))
    return trainer, model, batch


def _scores(model, batch, prefix=""):
    from hf_unlearn.logprobs import answer_mask, label_log_probs

    logits = model(input_ids=batch[prefix + "input_ids"], attention_mask=batch[prefix + "attention_mask"]).logits
    labels = batch[prefix + "labels"]
    return logits, label_log_probs(logits, labels), answer_mask(labels)


@pytest.mark.parametrize("cls_name,fields", [
    ("GradAscent", {"forget_weight": 0.7}),
    ("GradDiff", {"forget_weight": 0.7, "retain_weight": 1.3}),
    ("GradDiff", {"forget_weight": 0.7, "retain_weight": 1.3, "retain_loss": "kl"}),
    ("NPO", {"forget_weight": 0.6, "retain_weight": 1.4, "beta": 0.3}),
    ("SimNPO", {"forget_weight": 0.5, "retain_weight": 1.2, "beta": 2.5, "delta": 0.4}),
])
def test_baseline_trainer_loss_is_its_pure_loss_function(cls_name, fields, tiny_target, synthetic, tmp_path):
    """The loss a baseline trainer computes on a batch equals ``baseline_loss`` (and, for GradDiff, the weighted
    sum written out) on scores computed here from plain forward passes."""
    from hf_unlearn.methods.base.losses import kl_retain_loss, nll_loss, sequence_log_probs
    from hf_unlearn.methods.baselines.loss import baseline_loss

    trainer, model, batch = _trainer_and_batch(cls_name, tmp_path, tiny_target, synthetic, **fields)
    args = trainer.args
    model.eval()
    with torch.no_grad():
        got = trainer.compute_loss(model, batch)
        logits, token_lp, mask = _scores(model, batch)
        retain = None
        if args.retain_loss != "none":
            r_logits, r_lp, r_mask = _scores(model, batch, "retain_")
            if args.retain_loss == "kl":
                ref_logits = _scores(trainer.ref_model, batch, "retain_")[0]
                retain = kl_retain_loss(r_logits, ref_logits, batch["retain_labels"])
            else:
                retain = nll_loss(r_lp, r_mask)
        ref = None
        if args.forget_loss == "npo":
            _, ref_lp, ref_mask = _scores(trainer.ref_model, batch)
            ref = sequence_log_probs(ref_lp, ref_mask)
        expected = baseline_loss(args.forget_loss, token_lp, mask, retain, ref_log_probs=ref, beta=args.beta,
                                 delta=args.delta, forget_weight=args.forget_weight,
                                 retain_weight=args.retain_weight)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    if cls_name == "GradDiff":
        by_hand = args.forget_weight * (token_lp * mask).sum() / mask.sum() + args.retain_weight * retain
        torch.testing.assert_close(got, by_hand, rtol=1e-5, atol=1e-6)
    if cls_name == "GradAscent":  # the weight is in it: -forget_weight * mean forget NLL
        torch.testing.assert_close(got, args.forget_weight * (token_lp * mask).sum() / mask.sum(), rtol=1e-5, atol=1e-6)


def test_baseline_loss_formula_by_hand():
    from hf_unlearn.methods.baselines.loss import baseline_loss

    token_lp = torch.tensor([[0.0, -1.0, -2.0, 0.0], [0.0, -0.5, -0.5, -1.0]])
    mask = torch.tensor([[False, True, True, False], [False, True, True, True]])
    retain = torch.tensor(0.8)
    seq = torch.tensor([-3.0, -2.0])
    ga = baseline_loss("grad_ascent", token_lp, mask, retain, forget_weight=0.5, retain_weight=2.0)
    torch.testing.assert_close(ga, torch.tensor(0.5 * (-5.0 / 5) + 2.0 * 0.8))
    ref = torch.tensor([-2.0, -2.5])
    npo = baseline_loss("npo", token_lp, mask, None, ref_log_probs=ref, beta=0.5, forget_weight=1.0)
    per = -(2 / 0.5) * torch.nn.functional.logsigmoid(-0.5 * (seq - ref))
    torch.testing.assert_close(npo, per.mean())
    simnpo = baseline_loss("simnpo", token_lp, mask, retain, beta=2.0, delta=0.3, forget_weight=0.25, retain_weight=1.0)
    per = -(2 / 2.0) * torch.nn.functional.logsigmoid(-2.0 * seq / torch.tensor([2.0, 3.0]) - 0.3)
    torch.testing.assert_close(simnpo, 0.25 * per.mean() + 0.8)
    with pytest.raises(ValueError, match="ref_log_probs"):
        baseline_loss("npo", token_lp, mask)
    with pytest.raises(ValueError, match="Unknown baseline forget loss"):
        baseline_loss("kl", token_lp, mask)


# ----- one naming of the forget/retain weights ---------------------------------------------------------------


@pytest.mark.parametrize("config_name", ["UnlearningConfig", "SimNPOConfig", "ATWUConfig"])
def test_forget_and_retain_weights_have_one_name(config_name, tmp_path):
    import hf_unlearn
    from hf_unlearn.methods.base.checkpoints import fingerprint_differences
    from hf_unlearn.methods.masc import MASCConfig

    cls = getattr(hf_unlearn, config_name)
    common = {"output_dir": str(tmp_path), "report_to": "none"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the weights' names: no warning
        config = cls(forget_weight=0.3, retain_weight=0.6, **common)
    assert (config.forget_weight, config.retain_weight) == (0.3, 0.6)
    with pytest.raises(ValueError, match="retain_weight"):
        cls(retain_weight=-1.0, **common)
    for klass in (cls, MASCConfig):
        names = {f.name for f in dataclasses.fields(klass)}
        assert names >= {"forget_weight", "retain_weight"} and not names & {"gamma", "alpha"}, klass
    # a checkpoint with another forget weight is another run, named by the field
    fp = {"method": "m", "data": {}}
    changed = dict(config.to_dict(), forget_weight=0.4)
    assert fingerprint_differences({**fp, "settings": changed}, {**fp, "settings": config.to_dict()}) == [
        "forget_weight=0.4 (now 0.3)"]


# ----- one definition of a scored token -----------------------------------------------------------------------


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_label_log_probs_and_the_answer_mask_score_the_same_positions(padding_side, tiny_target, tofu_dir):
    """On real TOFU rows padded into one batch (prompt tokens and padding carry -100), the positions that
    ``label_log_probs`` scores are exactly ``answer_mask``'s, and each scored value is the model's
    log-probability of the label given the tokens before it."""
    from hf_unlearn.data.prompts import collate_qa, tokenize_qa
    from hf_unlearn.data.tofu import load_tofu_rows
    from hf_unlearn.logprobs import answer_mask, label_log_probs, vocab_statistics
    from hf_unlearn.methods.base import losses

    assert losses.answer_mask is answer_mask
    model, tok = tiny_target
    rows = load_tofu_rows("forget01", str(tofu_dir))[:4]
    features = [tokenize_qa(tok, r["question"], r["answer"]) for r in rows]
    assert len({len(f["input_ids"]) for f in features}) > 1  # padding happens
    batch = collate_qa(features, tok.pad_token_id, padding_side)
    labels = batch["labels"]
    mask = answer_mask(labels)
    assert mask.dtype == torch.bool and not mask[:, 0].any()
    assert (labels[mask] != -100).all() and (labels[:, 1:] != -100).sum() == mask.sum()
    prompt_or_pad = labels == -100
    assert prompt_or_pad.any(-1).all() and not mask[prompt_or_pad].any()
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
    lp = label_log_probs(logits, labels)
    assert (lp[~mask] == 0).all() and (lp[mask] < 0).all()
    b, t = mask.nonzero()[0].tolist()
    manual = torch.log_softmax(logits[b, t - 1].float(), -1)[labels[b, t]]
    torch.testing.assert_close(lp[b, t], manual)
    stats = vocab_statistics(logits, labels)
    torch.testing.assert_close(stats["log_prob"], lp, rtol=1e-5, atol=1e-6)
