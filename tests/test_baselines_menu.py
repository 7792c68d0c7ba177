"""The token-level and preference baselines WGA, SatImp, CE-U, UNDIAL, DPO and IdkDPO: each loss against a slow
per-token loop of its formula, their configs, registration and command line, DPO's preferred answers (refused when
missing, carried beside each forget row), exact gradient accumulation and resume, and that each unlearns the
TOFU-tiny target."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import datasets
import pytest
import torch
from transformers import TrainerCallback

from hf_unlearn.data import tokenize_qa
from hf_unlearn.demo import load_tiny
from hf_unlearn.logprobs import answer_mask, answer_nll, label_log_probs
from hf_unlearn.methods.base import BaseUnlearningConfig
from hf_unlearn.methods.base.checkpoints import ResumeMismatchError
from hf_unlearn.methods.baselines import (
    CEUConfig,
    CEUTrainer,
    IdkDPOConfig,
    IdkDPOTrainer,
    SatImpConfig,
    SatImpTrainer,
    UNDIALConfig,
    UNDIALTrainer,
    UnlearnDPOConfig,
    UnlearnDPOTrainer,
    WGAConfig,
    WGATrainer,
)
from hf_unlearn.methods.baselines.dpo import load_idk_answers
from hf_unlearn.methods.baselines.loss import dpo_loss, npo_loss
from hf_unlearn.methods.baselines.token_loss import ceu_loss, satimp_loss, undial_loss, wga_loss

datasets.disable_progress_bars()

TRAINERS = {"wga": WGATrainer, "satimp": SatImpTrainer, "ceu": CEUTrainer, "undial": UNDIALTrainer,
            "dpo": UnlearnDPOTrainer, "idk_dpo": IdkDPOTrainer}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _config(cls, out, **overrides):
    values = dict(
        output_dir=str(out), report_to="none", save_strategy="no", gradient_checkpointing=False, disable_tqdm=True,
        per_device_train_batch_size=4, max_steps=2, logging_steps=1, seed=0, learning_rate=1e-3,
    )
    if cls is UnlearnDPOConfig:
        values["alternate_column"] = "perturbed_answer"
    values.update(overrides)
    return cls(**values)


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# ----- the pure losses against per-token loops --------------------------------------------------------------------


def _random_batch(seed=0, batch=3, length=7, vocab=11):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, length, vocab, generator=g) * 2
    labels = torch.randint(vocab, (batch, length), generator=g)
    labels[:, :2] = -100  # prompt
    labels[1, :4] = -100  # a longer prompt
    labels[2, -2:] = -100  # padding
    return logits, labels


def _scored(logits, labels):
    """Per-token loop: [(b, t, log_probs at t-1 as a [V] tensor, label)] over the scored positions."""
    out = []
    for b in range(labels.shape[0]):
        for t in range(1, labels.shape[1]):
            if labels[b, t] != -100:
                out.append((b, t, torch.log_softmax(logits[b, t - 1].double(), -1), int(labels[b, t])))
    return out


def test_wga_and_satimp_match_a_per_token_loop():
    logits, labels = _random_batch()
    lp, mask = label_log_probs(logits, labels), answer_mask(labels)
    tokens = _scored(logits, labels)
    for beta in (0.0, 1.0, 2.5):
        ce = [(math.exp(log_p[y]), -float(log_p[y])) for _, _, log_p, y in tokens]  # (p_t, CE_t)
        expected = sum(-(p ** beta) * c for p, c in ce) / len(tokens)
        assert wga_loss(lp, mask, beta).item() == pytest.approx(float(expected), rel=1e-5)
    for beta1, beta2 in ((5.0, 1.0), (1.0, 0.0), (2.0, 3.0)):
        terms = []
        for _, _, log_p, y in tokens:
            p = math.exp(log_p[y])
            terms.append(p ** beta1 * (1 - p) ** beta2 * float(log_p[y]))  # -(w * CE)
        assert satimp_loss(lp, mask, beta1, beta2).item() == pytest.approx(sum(terms) / len(terms), rel=1e-5)
    # a given token count replaces the batch's; beta = 0 is gradient ascent
    assert wga_loss(lp, mask, 0.0, num_tokens=5.0).item() == pytest.approx(
        float((lp * mask).sum() / 5.0), rel=1e-6)
    # the weight is detached: the gradient is w * d(log p)
    leaf = lp.clone().requires_grad_(True)
    wga_loss(leaf, mask, 2.0).backward()
    assert torch.allclose(leaf.grad, lp.exp() ** 2 * mask / mask.sum(), atol=1e-7)


def test_ceu_matches_a_per_token_loop_skipping_the_first_answer_tokens():
    logits, labels = _random_batch(1)
    for skip in (0, 1, 2):
        total, count, seen = 0.0, 0, {}
        for b, _t, log_p, y in _scored(logits, labels):
            seen[b] = seen.get(b, 0) + 1
            if seen[b] <= skip:
                continue
            target = log_p.clone()
            target[y] = -math.inf
            q = torch.softmax(target, -1)
            total += float(-(q[torch.arange(len(q)) != y] * log_p[torch.arange(len(q)) != y]).sum())
            count += 1
        assert ceu_loss(logits, labels, skip).item() == pytest.approx(total / count, rel=1e-5), skip
    # the target is the detached distribution: the gradient w.r.t. the logits is softmax(z) - q on the kept rows
    leaf = logits.clone().requires_grad_(True)
    ceu_loss(leaf, labels, 0).backward()
    b, t, log_p, y = _scored(logits, labels)[0]
    target = log_p.clone()
    target[y] = -math.inf
    expected = (log_p.exp() - torch.softmax(target, -1)) / len(_scored(logits, labels))
    assert torch.allclose(leaf.grad[b, t - 1].double(), expected, atol=1e-6)
    assert ceu_loss(logits, labels, 1).item() >= 0


def test_undial_matches_a_per_token_loop_and_uses_the_frozen_logits():
    logits, labels = _random_batch(2)
    ref_logits, _ = _random_batch(3)
    for beta in (1.0, 10.0):
        total, tokens = 0.0, _scored(logits, labels)
        for b, t, log_p, y in tokens:
            adjusted = ref_logits[b, t - 1].double().clone()
            adjusted[y] -= beta
            total += float(-(torch.softmax(adjusted, -1) * log_p).sum())
        assert undial_loss(logits, ref_logits, labels, beta).item() == pytest.approx(total / len(tokens), rel=1e-5)
    leaf_ref = ref_logits.clone().requires_grad_(True)
    undial_loss(logits.requires_grad_(True), leaf_ref, labels, 10.0).backward()
    assert leaf_ref.grad is None  # no gradient to the frozen model
    with pytest.raises(ValueError, match="beta > 0"):
        undial_loss(logits, ref_logits, labels, 0.0)


def test_dpo_matches_a_per_sequence_loop_and_is_npo_without_the_preferred_answer():
    g = torch.Generator().manual_seed(4)
    win, win_ref, lose, lose_ref = (torch.randn(5, generator=g) * 3 for _ in range(4))
    for beta in (0.1, 1.0):
        expected = sum(
            -(2 / beta) * math.log(1 / (1 + math.exp(-beta * ((float(w) - float(wr)) - (float(lo) - float(lr))))))
            for w, wr, lo, lr in zip(win, win_ref, lose, lose_ref)) / 5
        assert dpo_loss(win, win_ref, lose, lose_ref, beta).item() == pytest.approx(expected, rel=1e-5)
        zero = torch.zeros(5)
        assert dpo_loss(zero, zero, lose, lose_ref, beta).item() == pytest.approx(
            npo_loss(lose, lose_ref, beta).item(), rel=1e-6)
    assert dpo_loss(win, win, lose, lose, 0.1).item() == pytest.approx(2 / 0.1 * math.log(2), rel=1e-6)
    assert dpo_loss(win, win_ref, lose, lose_ref, 0.1, num_sequences=10.0).item() == pytest.approx(
        dpo_loss(win, win_ref, lose, lose_ref, 0.1).item() / 2, rel=1e-6)


# ----- configs, registry and command line ------------------------------------------------------------------------


def test_configs_carry_open_unlearnings_defaults_and_refuse_bad_values(tmp_path):
    out = str(tmp_path / "o")
    wga, satimp, ceu = WGAConfig(out), SatImpConfig(out), CEUConfig(out)
    undial, dpo, idk = UNDIALConfig(out), UnlearnDPOConfig(out), IdkDPOConfig(out)
    assert (wga.beta, wga.forget_weight, wga.retain_weight, wga.retain_loss, wga.learning_rate,
            wga.num_train_epochs) == (1.0, 1.0, 1.0, "nll", 1e-5, 5.0)
    assert (satimp.beta1, satimp.beta2, satimp.forget_weight, satimp.retain_weight) == (5.0, 1.0, 1.0, 0.1)
    assert (ceu.skip_first_answer_tokens, ceu.retain_weight) == (1, 0.0)
    assert (undial.beta, undial.learning_rate, undial.retain_weight) == (10.0, 1e-4, 0.0)
    assert (dpo.beta, dpo.alternate_column, dpo.retain_weight) == (0.1, "alternate_answer", 1.0)
    assert (idk.beta, idk.idk_answers_file) == (0.1, None)
    for cls, field, value in ((WGAConfig, "beta", -1.0), (SatImpConfig, "beta2", math.inf), (UNDIALConfig, "beta", 0.0),
                              (CEUConfig, "skip_first_answer_tokens", -1), (UnlearnDPOConfig, "beta", 0.0),
                              (IdkDPOConfig, "retain_weight", -0.5), (WGAConfig, "retain_loss", "mse"),
                              (UnlearnDPOConfig, "alternate_column", " ")):
        with pytest.raises(ValueError, match=field):
            cls(out, **{field: value})
    base = {f.name for f in dataclasses.fields(BaseUnlearningConfig)}
    for cls in (WGAConfig, SatImpConfig, CEUConfig, UNDIALConfig, UnlearnDPOConfig, IdkDPOConfig):
        own = [f for f in dataclasses.fields(cls) if f.name not in base]
        assert own and all(f.metadata.get("help") for f in own), cls


@pytest.mark.parametrize("method,option", [("wga", "--beta"), ("satimp", "--beta1"), ("ceu", "--skip_first_answer_tokens"),
                                           ("undial", "--beta"), ("dpo", "--alternate_column"),
                                           ("idk_dpo", "--idk_answers_file")])
def test_registered_with_cli_help_and_an_example_script(method, option, capsys):
    from hf_unlearn.cli import main
    from hf_unlearn.registry import get_method

    info = get_method(method)
    assert info.is_trainer and info.trainer_cls is TRAINERS[method]
    assert info.paper["id"] and info.artifact_kind == "unlearned_model"
    assert main(["unlearn", "--method", method, "--help"]) == 0
    assert option in capsys.readouterr().out
    script = Path(__file__).resolve().parents[1] / "examples" / "scripts" / f"{method}.py"
    assert f"{TRAINERS[method].__name__}(" in script.read_text()  # the script builds the method's trainer


def test_packaged_refusal_answers_and_seeded_draws(synthetic, tiny_target, tmp_path):
    answers = load_idk_answers()
    assert len(set(answers)) >= 50 and all(a.strip() == a and a for a in answers)
    own = tmp_path / "idk.txt"
    own.write_text("No idea.\n\nCannot say.\n")
    assert load_idk_answers(own) == ["No idea.", "Cannot say."]
    with pytest.raises(ValueError, match="does not exist"):
        load_idk_answers(tmp_path / "missing.txt")
    forget = synthetic["forget10"][:8]
    first = IdkDPOTrainer.preferred_answers(datasets.Dataset.from_list(forget), _config(IdkDPOConfig, tmp_path / "a"))
    again = IdkDPOTrainer.preferred_answers(datasets.Dataset.from_list(forget), _config(IdkDPOConfig, tmp_path / "b"))
    other = IdkDPOTrainer.preferred_answers(datasets.Dataset.from_list(forget),
                                            _config(IdkDPOConfig, tmp_path / "c", seed=1))
    assert first == again != other and set(first) <= set(answers) and len(set(first)) > 1
    mine = IdkDPOTrainer.preferred_answers(datasets.Dataset.from_list(forget),
                                           _config(IdkDPOConfig, tmp_path / "d", idk_answers_file=str(own)))
    assert set(mine) <= {"No idea.", "Cannot say."}


# ----- DPO's preferred answers -------------------------------------------------------------------------------------


def test_dpo_refuses_rows_without_the_preferred_answer_before_any_work(tiny_target, synthetic, tmp_path):
    from hf_unlearn.options import UserError
    from hf_unlearn.preconditions import check_run_preconditions

    model, tok = tiny_target
    forget, retain = synthetic["forget10"][:4], synthetic["retain90"][:8]
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="'alternate_answer'.*idk_dpo"):
        UnlearnDPOTrainer(model, _config(UnlearnDPOConfig, out, alternate_column="alternate_answer"), train_dataset=forget,
                   retain_dataset=retain, processing_class=tok)
    assert not out.exists()
    bad = [dict(r, alternate_answer="") for r in forget]
    with pytest.raises(ValueError, match="Forget row 0"):
        UnlearnDPOTrainer(model, _config(UnlearnDPOConfig, out, alternate_column="alternate_answer"), train_dataset=bad,
                   processing_class=tok)
    config = _config(UnlearnDPOConfig, out, alternate_column="alternate_answer")
    with pytest.raises(UserError, match="alternate_answer"):
        check_run_preconditions("dpo", config, model, tok, forget, retain)
    check_run_preconditions("dpo", config, model, tok, [dict(r, alternate_answer="No.") for r in forget], retain)


def test_each_batch_carries_the_preferred_answer_of_its_own_forget_row(tiny_target, synthetic, tmp_path):
    model, tok = tiny_target
    forget = synthetic["forget10_perturbed"][:6]
    trainer = UnlearnDPOTrainer(model, _config(UnlearnDPOConfig, tmp_path / "out"), train_dataset=forget,
                         retain_dataset=synthetic["retain90"][:10], processing_class=tok)
    chosen = UnlearnDPOTrainer.preferred_answers(datasets.Dataset.from_list(forget), trainer.args)
    assert all(c in row["perturbed_answer"] for c, row in zip(chosen, forget))
    batch = trainer.data_collator([trainer.train_dataset[i] for i in (4, 1, 2)])
    assert {"retain_input_ids", "alternate_input_ids", "alternate_attention_mask", "alternate_labels"} <= set(batch)
    for slot, i in enumerate((4, 1, 2)):
        ref = tokenize_qa(tok, forget[i]["question"], chosen[i])
        n = len(ref["input_ids"])
        assert batch["alternate_input_ids"][slot, :n].tolist() == ref["input_ids"]
        assert batch["alternate_labels"][slot, :n].tolist() == ref["labels"]
        own = tokenize_qa(tok, forget[i]["question"], forget[i]["answer"])
        assert batch["input_ids"][slot, :len(own["input_ids"])].tolist() == own["input_ids"]
    # at the start the policy is the reference: the loss is (2 / beta) log 2 + the retain NLL
    inputs = trainer._prepare_inputs(batch)
    trainer.model.eval()
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, inputs).item()
        retain = trainer.score(trainer.model, inputs, "retain_").mean_nll.item()
    assert loss == pytest.approx(2 / 0.1 * math.log(2) + retain, rel=1e-4)


def test_the_runner_hands_the_preferred_answer_column_to_the_trainer(tiny_pair, synthetic, tmp_path):
    from hf_unlearn.demo import forget_rows_with_other_answers
    from hf_unlearn.run import fit_or_train, prepare_inputs

    rows = forget_rows_with_other_answers("forget10", "synthetic")
    assert [(r["question"], r["answer"]) for r in rows] == [(r["question"], r["answer"]) for r in synthetic["forget10"]]
    assert all(r["perturbed_answer"] for r in rows)
    model, tok = load_tiny(tiny_pair.target)
    result = fit_or_train(prepare_inputs("dpo", model, tok, rows[:4], synthetic["retain90"][:8], tmp_path / "out", {"alternate_column": "perturbed_answer", "max_steps": 1, "per_device_train_batch_size": 4,
                         "learning_rate": 1e-4, "disable_tqdm": True}))
    assert result.info["global_step"] == 1


# ----- the trainers: exact accumulation, exact resume, and each unlearns ------------------------------------------


CONFIGS = {"wga": WGAConfig, "satimp": SatImpConfig, "ceu": CEUConfig, "undial": UNDIALConfig, "dpo": UnlearnDPOConfig,
           "idk_dpo": IdkDPOConfig}


@pytest.mark.parametrize("method", sorted(TRAINERS))
def test_two_micro_batches_with_accumulation_equal_one_batch(method, tiny_pair, synthetic, tmp_path):
    """2 micro-batches x accumulation 2 == one batch of 4 (CE-U's count skips one token per answer)."""
    forget, retain = synthetic["forget10_perturbed"][:4], synthetic["retain90"][:8]
    updates = []
    for batch_size, accumulation in ((4, 1), (2, 2)):
        model, tok = load_tiny(tiny_pair.target)
        before = _params(model)
        args = _config(CONFIGS[method], tmp_path / f"out{batch_size}", per_device_train_batch_size=batch_size,
                       gradient_accumulation_steps=accumulation, max_steps=1, optim="sgd", learning_rate=1.0,
                       max_grad_norm=0.0, weight_decay=0.0, lr_scheduler_type="constant", retain_weight=1.0)
        TRAINERS[method](model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok).train()
        updates.append(torch.cat([(p.detach() - before[n]).flatten() for n, p in model.named_parameters()]))
    scale = updates[0].abs().max()
    assert scale > 1e-5
    assert torch.allclose(updates[0], updates[1], rtol=1e-4, atol=1e-5 * float(scale)), (
        (updates[0] - updates[1]).abs().max(), scale)


class _Interrupted(Exception):
    pass


class _InterruptAt(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise _Interrupted(f"interrupted at step {self.step}")


@pytest.mark.parametrize("method", ["dpo", "undial"])
def test_resume_mid_run_equals_the_uninterrupted_run(method, tiny_pair, synthetic, tmp_path):
    """10 forget rows in batches of 4 (3 steps an epoch), killed after step 9, resumed from checkpoint-8 (mid-epoch):
    the weights of the uninterrupted run; a DPO checkpoint resumed with other preferred answers is refused."""
    forget = [dict(r) for r in synthetic["forget10_perturbed"][:10]]
    retain = list(synthetic["retain90"][:16])

    def make(out, rows, *callbacks, **extra):
        model, tok = load_tiny(tiny_pair.target)
        args = _config(CONFIGS[method], out, save_strategy="steps", save_steps=2, max_steps=11, retain_weight=1.0,
                       **extra)
        return TRAINERS[method](model, args, train_dataset=rows, retain_dataset=retain, processing_class=tok,
                                callbacks=list(callbacks))

    straight = make(tmp_path / "straight", forget)
    straight.train()
    expected = _params(straight.model)
    run = tmp_path / "resumed"
    with pytest.raises(_Interrupted):
        make(run, forget, _InterruptAt(9)).train()
    resumed = make(run, forget)
    resumed.train(resume_from_checkpoint=str(run / "checkpoint-8"))
    got = _params(resumed.model)
    assert resumed.state.global_step == 11
    assert all(torch.equal(got[n], expected[n]) for n in expected), max(
        (got[n] - expected[n]).abs().max().item() for n in expected)
    if method == "dpo":
        other = [dict(r, perturbed_answer=["Nobody knows."]) for r in forget]
        with pytest.raises(ResumeMismatchError, match="other forget rows"):
            make(run, other).train(resume_from_checkpoint=str(run / "checkpoint-8"))


# 8 steps of batch 4 on the synthetic forget10. Measured (forget NLL from 0.043, retain NLL from 0.035): DPO
# 1.16 / 0.42, IdkDPO 1.26 / 0.37 (the preference objectives move the retain answers most on the tiny model; at
# retain weight 1 and lr 1e-3 their forget rise is only 2-2.5 times the retain rise)
UNLEARN = {
    "wga": {"learning_rate": 1e-3},
    "satimp": {"learning_rate": 3e-3},
    "ceu": {"learning_rate": 4e-4},
    "undial": {"learning_rate": 1e-3, "retain_weight": 1.0},
    "dpo": {"learning_rate": 2e-3, "retain_weight": 5.0},
    "idk_dpo": {"learning_rate": 2e-3, "retain_weight": 5.0},
}


@pytest.mark.parametrize("method", sorted(TRAINERS))
def test_each_unlearns_the_tofu_tiny_target(method, tiny_target, synthetic, tmp_path):
    """Forget NLL up several-fold, and well over twice as much as the retain NLL, in 8 steps."""
    model, tok = tiny_target
    forget, retain = synthetic["forget10_perturbed"], synthetic["retain90"]
    fq, fa = [r["question"] for r in forget], [r["answer"] for r in forget]
    rq, ra = [r["question"] for r in retain[:60]], [r["answer"] for r in retain[:60]]
    f0, r0 = answer_nll(model, tok, fq, fa).mean(), answer_nll(model, tok, rq, ra).mean()
    trainer = TRAINERS[method](model, _config(CONFIGS[method], tmp_path / "out", max_steps=8, **UNLEARN[method]),
                               train_dataset=forget, retain_dataset=retain, processing_class=tok)
    trainer.train()
    f1, r1 = answer_nll(model, tok, fq, fa).mean(), answer_nll(model, tok, rq, ra).mean()
    assert f1 > 4 * f0 and f1 - f0 > 0.15, (f0, f1)
    assert (f1 - f0) > 2.5 * (r1 - r0), (r0, r1, f0, f1)
    logged = [h for h in trainer.state.log_history if "forget_loss" in h]
    assert len(logged) == 8 and all("forget_nll" in h and "retain_nll" in h for h in logged)


def test_dpo_example_script_parses_its_commands_refuses_rows_without_alternates_and_runs(tiny_pair, synthetic,
                                                                                          tmp_path, monkeypatch):
    import json
    import re
    import runpy
    import shlex
    import sys

    script = Path(__file__).resolve().parents[1] / "examples" / "scripts" / "dpo.py"
    namespace = runpy.run_path(str(script), run_name="example_under_test")
    parser = namespace["make_parser"]()
    commands = re.findall(r"python examples/scripts/\S+\.py((?:.*\\\n)*.*)", namespace["__doc__"])
    assert len(commands) == 2 and "tofu-tiny" in commands[0] and "locuslab/TOFU" in commands[1]
    for command in commands:
        assert parser.parse_known_args(shlex.split(command.replace("\\\n", " ")))[1] == []

    def run(rows, out, *extra):
        path = tmp_path / f"{out}.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        monkeypatch.setattr(sys, "argv", [
            str(script), "--model_name_or_path", str(tiny_pair.target), "--dataset_name", "synthetic",
            "--forget_file", str(path), "--output_dir", str(tmp_path / out), "--learning_rate", "1e-3",
            "--max_steps", "3", "--per_device_train_batch_size", "4", "--report_to", "none", "--save_strategy", "no",
            *extra])
        runpy.run_path(str(script), run_name="__main__")

    with pytest.raises(ValueError, match="'alternate_answer'"):  # by the trainer, before any work
        run(synthetic["forget10"], "plain")
    assert not (tmp_path / "plain").exists()
    run(synthetic["forget10_perturbed"], "perturbed", "--alternate_column", "perturbed_answer")
    assert (tmp_path / "perturbed" / "model.safetensors").is_file()
    assert (tmp_path / "perturbed" / "tokenizer.json").is_file()


def test_selection_picks_a_measured_step_of_a_menu_trainer(tiny_pair, synthetic, tmp_path):
    """The base trainer's selection callback works for the new trainers as for the others: the criterion is
    measured at step 0 and every 2 steps, and one of those steps is chosen and recorded."""
    from hf_unlearn.run import TrainOptions, fit_or_train, prepare_inputs
    from hf_unlearn.selection import SelectionCriterion

    criterion = SelectionCriterion(synthetic["forget10"][:8], synthetic["holdout10"][:8], synthetic["retain90"][150:158])
    model, tok = load_tiny(tiny_pair.target)
    settings = {"max_steps": 6, "learning_rate": 3e-3, "per_device_train_batch_size": 4, "disable_tqdm": True}
    result = fit_or_train(prepare_inputs("idk_dpo", model, tok, synthetic["forget10"], synthetic["retain90"][:40], tmp_path / "out", settings), TrainOptions(criterion=criterion, selection_steps=2))
    record = result.info["selection"]
    assert [c["step"] for c in record["candidates"]] == [0, 2, 4, 6]
    assert record["chosen"] == record["candidates"][record["index"]]
