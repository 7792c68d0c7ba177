"""Faults and bad inputs (issue #12): every test here provokes a failure a user could meet and asserts that
hf-unlearn refuses it before work, or stops cleanly without destroying or mixing outputs and without saving a
broken model.

Sections (each engineer appends theirs at the end of the file, with targeted edits):

* outputs never destroyed or mixed (refused overwrite, swapped-in output after a simulated write failure);
* no broken model saved (non-finite weights never reach disk, divergence guard, no-op settings refused);
* exact resume after an interrupt (GradDiff, MASC, ATWU);
* length limits (trainer truncation on a GPT-2 config with ``n_positions=64``);
* GROM base mismatch, reference mismatch, evaluator truncation, T3 padding independence and T3 length limits.

Shared fixtures/helpers (use them in appended tests):

* ``fault_rows`` -- ``(forget, retain)`` lists of TOFU-shaped synthetic rows, small;
* ``model_dir`` -- a fresh copy of the tiny target model folder (model + tokenizer) in ``tmp_path``;
* ``fault_config(tmp_path, cls=UnlearningConfig, **overrides)`` -- a fast config (a few steps, no reporting);
* ``params_of(model)`` -- ``{name: tensor clone}`` of a model's parameters;
* ``short_gpt2(n_positions=64)`` -- ``(model, tokenizer)``: a randomly initialised GPT-2 with few positions and
  a tiny word-level tokenizer built offline, for length-limit tests.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import datasets
import pytest
import torch

from hf_unlearn.methods.base import UnlearningConfig

datasets.disable_progress_bars()


# ----- shared fixtures and helpers --------------------------------------------------------------------------------


@pytest.fixture()
def fault_rows(synthetic) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(forget, retain)``: 8 forget rows and 16 retain rows of the synthetic TOFU set."""
    return list(synthetic["forget10"][:8]), list(synthetic["retain90"][:16])


@pytest.fixture()
def model_dir(tiny_pair, tmp_path) -> Path:
    """A fresh copy of the tiny target's folder (safetensors + tokenizer) that a test may treat as the user's model."""
    dst = tmp_path / "user-model"
    shutil.copytree(tiny_pair.target, dst)
    return dst


def fault_config(tmp_path: Path, cls: type = UnlearningConfig, **overrides: Any) -> Any:
    """A fast unlearning config writing under ``tmp_path / "out"`` (overridable)."""
    values: dict[str, Any] = dict(
        output_dir=str(tmp_path / "out"), report_to="none", save_strategy="no", gradient_checkpointing=False,
        disable_tqdm=True, per_device_train_batch_size=4, max_steps=2, logging_steps=1, seed=0,
        learning_rate=3e-4,
    )
    values.update(overrides)
    return cls(**values)


def params_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``{name: detached clone}`` of every parameter of ``model``."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def short_gpt2(n_positions: int = 64, seed: int = 0) -> tuple[Any, Any]:
    """A random GPT-2 with ``n_positions`` positions and a word-level tokenizer over a small vocabulary (offline)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = ["<unk>", "<eos>", "Question:", "Answer:", *[f"w{i}" for i in range(60)]]
    words += [w for w in "the a of and is in to was by his her who what where when born wrote author".split()]
    vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>")
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(vocab), n_positions=n_positions, n_embd=32, n_layer=2, n_head=2,
        bos_token_id=vocab["<eos>"], eos_token_id=vocab["<eos>"], pad_token_id=vocab["<eos>"],
    )
    return GPT2LMHeadModel(config), tok


# ----- outputs never destroyed or mixed ---------------------------------------------------------------------------


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_output_dir_overlapping_the_model_or_not_empty_is_refused_before_work(model_dir, fault_rows, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_unlearn.methods.baselines import GradDiffTrainer
    from hf_unlearn.safe_output import OutputDirError

    forget, retain = fault_rows
    before = _snapshot(model_dir)
    model, tok = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    for bad in (model_dir, model_dir / "unlearned", tmp_path):  # equal to, inside, containing the model folder
        for source in (model, str(model_dir)):
            with pytest.raises(OutputDirError, match="overlaps the input"):
                GradDiffTrainer(source, fault_config(tmp_path, output_dir=str(bad), overwrite=True),
                                train_dataset=forget, retain_dataset=retain, processing_class=tok)
    assert _snapshot(model_dir) == before and not (model_dir / "unlearned").exists()

    # a non-empty output folder is refused unless overwrite=True, and left as it was
    out = tmp_path / "previous"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"the user's earlier result")
    with pytest.raises(OutputDirError, match="not empty; pass overwrite=True"):
        GradDiffTrainer(model, fault_config(tmp_path, output_dir=str(out)), train_dataset=forget,
                        retain_dataset=retain, processing_class=tok)
    assert (out / "model.safetensors").read_bytes() == b"the user's earlier result"
    trainer = GradDiffTrainer(model, fault_config(tmp_path, output_dir=str(out), overwrite=True, max_steps=1),
                              train_dataset=forget, retain_dataset=retain, processing_class=tok)
    trainer.train()
    assert (out / "model.safetensors").read_bytes() == b"the user's earlier result"  # untouched until the save
    trainer.save_model()
    assert (out / "model.safetensors").read_bytes() != b"the user's earlier result"
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(), model.state_dict().values()))
    # saving elsewhere: a non-empty folder is refused too (the trainer's own overwrite flag aside)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    strict = GradDiffTrainer(model, fault_config(tmp_path, output_dir=str(tmp_path / "run")), train_dataset=forget,
                             retain_dataset=retain, processing_class=tok)
    with pytest.raises(OutputDirError, match="not empty"):
        strict.save_model(str(other))
    assert _snapshot(other) == {"notes.txt": b"keep me"}


def test_checkpoints_of_an_earlier_run_are_resumed_or_replaced_never_mixed(tiny_target, fault_rows, tmp_path):
    from hf_unlearn.methods.baselines import GradDiffTrainer
    from hf_unlearn.safe_output import OutputDirError

    model, tok = tiny_target
    forget, retain = fault_rows
    args = fault_config(tmp_path, save_strategy="steps", save_steps=1, max_steps=2)
    GradDiffTrainer(model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok).train()
    out = Path(args.output_dir)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "checkpoint-1", "checkpoint-2"]
    first = _snapshot(out)
    again = GradDiffTrainer(model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok)
    with pytest.raises(OutputDirError, match="checkpoints of an earlier run"):
        again.train()  # a fresh run would write checkpoint-1/2 over the earlier run's
    assert _snapshot(out) == first
    fresh = fault_config(tmp_path, save_strategy="steps", save_steps=1, max_steps=1, overwrite=True)
    GradDiffTrainer(model, fresh, train_dataset=forget, retain_dataset=retain, processing_class=tok).train()
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "checkpoint-1"]  # the earlier run's are gone
    assert _snapshot(out)["checkpoint-1/model.safetensors"] != first["checkpoint-1/model.safetensors"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing left aside


@pytest.mark.parametrize("failure", ["partial_write", "final_rename"])
def test_a_failed_save_leaves_the_previous_output_intact(failure, tiny_target, fault_rows, tmp_path, monkeypatch):
    import errno
    import os

    from hf_unlearn.methods.baselines import GradDiffTrainer
    from hf_unlearn.safe_output import OutputWriteError

    model, tok = tiny_target
    forget, retain = fault_rows
    trainer = GradDiffTrainer(model, fault_config(tmp_path, max_steps=1), train_dataset=forget,
                              retain_dataset=retain, processing_class=tok)
    trainer.train()
    trainer.save_model()
    out = Path(trainer.args.output_dir)
    previous = _snapshot(out)
    assert "model.safetensors" in previous
    trainer.train()  # the weights change, so a new save would differ

    if failure == "partial_write":  # the disk fills up halfway through the weights
        def save_pretrained(path, *args, **kwargs):
            Path(path).mkdir(parents=True, exist_ok=True)
            (Path(path) / "model.safetensors").write_bytes(b"half a model")
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(trainer.model, "save_pretrained", save_pretrained)
    else:  # the folder becomes read-only before the new result is swapped in
        real_replace = os.replace

        def replace(src, dst):
            if Path(dst).resolve() == out.resolve() and ".tmp-" in Path(src).name:
                raise PermissionError(errno.EACCES, "Permission denied")
            return real_replace(src, dst)

        monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OutputWriteError) as info:
        trainer.save_model()
    message = str(info.value)
    assert "\n" not in message and str(out) in message and "unchanged" in message
    assert ("No space left" if failure == "partial_write" else "Permission denied") in message
    assert _snapshot(out) == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary folder left behind


# ----- no broken model saved --------------------------------------------------------------------------------------


def test_non_finite_weights_never_reach_disk(tiny_target, fault_rows, tmp_path):
    from transformers import TrainerCallback
    from transformers.trainer_utils import get_last_checkpoint

    from hf_unlearn.methods.base import NonFiniteWeightsError
    from hf_unlearn.methods.baselines import GradDiffTrainer

    model, tok = tiny_target
    forget, retain = fault_rows
    name, poisoned = next((n, p) for n, p in model.named_parameters() if "mlp" in n)

    class PoisonAtStep2(TrainerCallback):  # after step 2's update, before its checkpoint
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                with torch.no_grad():
                    poisoned.view(-1)[3] = float("nan")

    args = fault_config(tmp_path, save_strategy="steps", save_steps=1, max_steps=4)
    trainer = GradDiffTrainer(model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok,
                              callbacks=[PoisonAtStep2()])
    out = Path(args.output_dir)
    with pytest.raises(NonFiniteWeightsError, match=rf"at step 2 \(first: {name}\).*latest good checkpoint is "
                                                    rf".*checkpoint-1"):
        trainer.train()
    assert get_last_checkpoint(str(out)) == str(out / "checkpoint-1")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "checkpoint-1"]  # no staging leftovers either
    from safetensors.torch import load_file

    saved = load_file(out / "checkpoint-1" / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in saved.values())
    # and the final save refuses too, writing nothing
    with pytest.raises(NonFiniteWeightsError, match="the model was not written"):
        trainer.save_model()
    with pytest.raises(NonFiniteWeightsError):
        trainer.save_model(str(tmp_path / "elsewhere"))
    assert not (out / "model.safetensors").exists() and not (tmp_path / "elsewhere").exists()


def test_divergence_guard_stops_the_run_before_a_diverged_checkpoint(tiny_target, fault_rows, tmp_path):
    import re

    from transformers.trainer_utils import get_last_checkpoint

    from hf_unlearn.methods.base import TrainingDivergedError
    from hf_unlearn.methods.baselines import GradDiffConfig, GradDiffTrainer

    model, tok = tiny_target
    forget, retain = fault_rows
    # a forget-dominated objective at a high learning rate drags the retain NLL up quickly
    args = fault_config(tmp_path, cls=GradDiffConfig, retain_weight=0.01, learning_rate=3e-3, max_steps=30, save_steps=1,
                        save_strategy="steps", max_retain_loss_ratio=3.0, min_retain_loss_reference=0.01)
    trainer = GradDiffTrainer(model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok)
    with pytest.raises(TrainingDivergedError) as info:
        trainer.train()
    message = str(info.value)
    step, value = re.search(r"at step (\d+): the retain NLL is ([0-9.e+-]+)", message).groups()
    step, value = int(step), float(value)
    logged = [h["retain_nll"] for h in trainer.state.log_history if "retain_nll" in h]
    start = logged[0]  # the first step's retain NLL, before any update
    limit = 3.0 * max(start, 0.01)
    assert trainer.divergence_guard.reference == pytest.approx(start, rel=1e-4)
    assert value > limit and all(v <= limit for v in logged) and len(logged) == step - 1
    assert get_last_checkpoint(args.output_dir).endswith(f"checkpoint-{step - 1}")  # the diverged step is not kept

    # the same run without the guard goes on past that step; the default guard leaves ordinary runs alone
    unguarded, _ = __import__("hf_unlearn.demo", fromlist=["load_tiny"]).load_tiny(model.name_or_path)
    free = fault_config(tmp_path, cls=GradDiffConfig, retain_weight=0.01, learning_rate=3e-3, max_steps=step, save_strategy="no",
                        max_retain_loss_ratio=None, output_dir=str(tmp_path / "free"))
    GradDiffTrainer(unguarded, free, train_dataset=forget, retain_dataset=retain, processing_class=tok).train()


@pytest.mark.parametrize("bad", [{"learning_rate": 0.0}, {"num_train_epochs": 0, "max_steps": -1}, {"max_steps": 0}])
def test_no_op_settings_are_refused_before_work(bad, model_dir, fault_rows, tmp_path, monkeypatch):
    import transformers

    from hf_unlearn.methods.baselines import GradDiffTrainer

    forget, retain = fault_rows

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the settings were checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_loading)
    with pytest.raises(ValueError, match="leave the model unchanged|zero steps"):
        GradDiffTrainer(str(model_dir), fault_config(tmp_path, **bad), train_dataset=forget, retain_dataset=retain)
    assert not (tmp_path / "out").exists()


def test_low_precision_weights_warn_when_updates_round_to_zero(tiny_target, fault_rows, tmp_path):
    from hf_unlearn.methods.base.guards import fraction_of_vanishing_updates
    from hf_unlearn.methods.baselines import GradDiffTrainer

    # slow reference on known values: bf16 spacing at 1.0 is 2**-7, at 2.0 2**-6; 1e-4 and 0 move by 1e-3
    weights = torch.nn.Linear(2, 2, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        weights.weight.copy_(torch.tensor([[1.0, 2.0], [1e-4, 0.0]]))
    assert fraction_of_vanishing_updates(weights, 1e-3) == 0.5
    assert fraction_of_vanishing_updates(weights, 1e-1) == 0.0
    assert fraction_of_vanishing_updates(weights.float(), 1e-9) == 0.0
    expected = sum(float((torch.tensor(w, dtype=torch.bfloat16).double() + 1e-3).to(torch.bfloat16)) == w
                   for w in weights.weight.flatten().tolist()) / 4
    assert expected == 0.5

    model, tok = tiny_target
    forget, retain = fault_rows
    low = model.to(torch.bfloat16)
    trainer = GradDiffTrainer(low, fault_config(tmp_path, learning_rate=1e-6, max_steps=1), train_dataset=forget,
                              retain_dataset=retain, processing_class=tok)
    with pytest.warns(UserWarning, match="rounds to zero in torch.bfloat16"):
        trainer.train()
    with __import__("warnings").catch_warnings(record=True) as caught:
        __import__("warnings").simplefilter("always")
        GradDiffTrainer(low.float(), fault_config(tmp_path, learning_rate=1e-6, max_steps=1), train_dataset=forget,
                        retain_dataset=retain, processing_class=tok).train()
    assert not [w for w in caught if "rounds to zero" in str(w.message)]


# ----- GROM: provenance (a mismatched base is refused) -----------------------------------------------------------


def test_grom_adapter_on_a_mismatched_base_is_refused(tiny_target, tiny_retain, fault_rows, tmp_path):
    from peft import PeftModel

    from hf_unlearn.integrity import BaseModelMismatchError
    from hf_unlearn.methods.grom import GROMConfig, GROMEdit, fit_grom, load_grom_adapter

    model, tok = tiny_target
    forget, retain = fault_rows
    edit = fit_grom(model, tok, forget, retain, GROMConfig(target_modules=["down_proj", "lm_head"], layers=[1],
                                                           progress=False))
    edit.save_pretrained(tmp_path / "grom")
    other, _ = tiny_retain  # same architecture and shapes, other weights (the retain reference)
    before = params_of(other)
    with pytest.raises(BaseModelMismatchError, match=r"another base model .*weights differ"):
        GROMEdit.from_pretrained(tmp_path / "grom", model=other)
    with pytest.raises(BaseModelMismatchError, match="another base model"):
        load_grom_adapter(other, tmp_path / "grom")
    with pytest.raises(BaseModelMismatchError, match="another base model"):
        edit.to_peft(other)
    after = params_of(other)  # refused before anything touched the other model
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    # the right base loads
    assert load_grom_adapter(model, tmp_path / "grom") is not None
    # what plain PEFT does: it loads the adapter onto the wrong base silently, changing that model's outputs
    silent = PeftModel.from_pretrained(other, tmp_path / "grom")
    assert silent is not None


# ----- exact resume -----------------------------------------------------------------------------------------------

# trainer, config and the method's settings (small and fast; each method's owner may tune its entry)
RESUMABLE = {
    "graddiff": ("GradDiffTrainer", "GradDiffConfig", {}),
    "masc": ("MASCTrainer", "MASCConfig", {"check_every": 2}),
    "atwu": ("ATWUTrainer", "ATWUConfig", {"forget_loss": "satga", "budget": 0.2, "scorer_lr": 1e-2,
                                            "weight_decay": 0.0}),
}


class _Interrupted(Exception):
    pass


def _interrupt_at(step: int):
    from transformers import TrainerCallback

    class InterruptAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == step:
                raise _Interrupted(f"interrupted at step {step}")

    return InterruptAt()


class _StepCounter(__import__("transformers").TrainerCallback):
    def __init__(self):
        self.count = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.count += 1


@pytest.mark.parametrize("method", list(RESUMABLE))
def test_interrupt_then_resume_equals_uninterrupted(method, tiny_pair, synthetic, tmp_path):
    """An uninterrupted run of 5 steps vs. a run killed after step 3 (its latest checkpoint is step 2) and resumed
    in a fresh trainer on a freshly loaded model: the final weights are identical (same seed, CPU, one thread)."""
    import hf_unlearn
    from hf_unlearn.demo import load_tiny

    trainer_name, config_name, extra = RESUMABLE[method]
    trainer_cls, config_cls = getattr(hf_unlearn, trainer_name), getattr(hf_unlearn, config_name)
    forget, retain = list(synthetic["forget10"][:10]), list(synthetic["retain90"][:16])

    def make(out: Path, callbacks=()):
        model, tok = load_tiny(tiny_pair.target)
        args = fault_config(tmp_path, cls=config_cls, output_dir=str(out), save_strategy="steps", save_steps=2,
                            max_steps=5, learning_rate=1e-3, **extra)
        return trainer_cls(model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok,
                           callbacks=list(callbacks))

    straight = make(tmp_path / "straight")
    straight.train()
    expected = params_of(straight.model)

    killed = make(tmp_path / "resumed", [_interrupt_at(3)])
    with pytest.raises(_Interrupted):
        killed.train()
    assert sorted(p.name for p in (tmp_path / "resumed").glob("checkpoint-*")) == ["checkpoint-2"]
    interrupted = params_of(killed.model)
    assert any(not torch.equal(interrupted[n], expected[n]) for n in expected)  # it really stopped short

    steps = _StepCounter()
    resumed = make(tmp_path / "resumed", [steps])
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == straight.state.global_step
    assert steps.count == straight.state.global_step - 2  # it continued from checkpoint-2, not from scratch
    assert resumed.divergence_guard.reference == straight.divergence_guard.reference
    got = params_of(resumed.model)
    assert got.keys() == expected.keys()
    worst = max((got[n] - expected[n]).abs().max().item() for n in expected)
    assert all(torch.equal(got[n], expected[n]) for n in expected), f"max weight difference {worst}"
    for attr in ("stopped_at_step", "violation_history"):  # MASC's stopping record, when the trainer has one
        assert getattr(resumed, attr, None) == getattr(straight, attr, None), attr


# ----- length limits ----------------------------------------------------------------------------------------------


def test_trainer_truncates_to_the_models_positions(tmp_path):
    from hf_unlearn.data import tokenize_qa
    from hf_unlearn.methods.baselines import GradDiffTrainer

    model, tok = short_gpt2(n_positions=64)
    words = [f"w{i}" for i in range(60)]
    long_answer = " ".join(words[i % 60] for i in range(100))
    forget = [{"question": f"who wrote {w}", "answer": f"{w} {long_answer}"} for w in words[:4]]
    retain = [{"question": f"where was {w} born", "answer": f"in {w} " + " ".join(words[:10])} for w in words[4:12]]
    full = tokenize_qa(tok, forget[0]["question"], forget[0]["answer"])["input_ids"]
    assert len(full) > 64
    with pytest.raises((IndexError, RuntimeError, ValueError)):  # what an untruncated sequence would do
        model(torch.tensor([full]))

    with pytest.warns(UserWarning, match="4 forget examples were truncated to max_length=64"):
        trainer = GradDiffTrainer(model, fault_config(tmp_path, max_steps=1), train_dataset=forget,
                                  retain_dataset=retain, processing_class=tok)
    assert trainer.args.max_length == 64
    for i in range(len(forget)):
        row = trainer.forget_dataset[i]
        assert len(row["input_ids"]) == 64 and (i > 0 or row["input_ids"] == full[:64])
        assert any(label != -100 for label in row["labels"])
    trainer.train()
    assert trainer.state.global_step == 1 and all(torch.isfinite(p).all() for p in model.parameters())

    # a user's shorter max_length is kept
    short = GradDiffTrainer(model, fault_config(tmp_path, max_length=32, max_steps=1), train_dataset=forget,
                            retain_dataset=retain, processing_class=tok)
    assert short.args.max_length == 32 and max(len(r["input_ids"]) for r in short.forget_dataset) == 32

    # a prompt that fills the whole context leaves nothing to unlearn: refused with a clear error
    hopeless = [{"question": long_answer, "answer": "w1 w2"}, *forget[1:]]
    with pytest.raises(ValueError, match="1 of the 4 forget examples have no answer token within max_length=64"):
        GradDiffTrainer(model, fault_config(tmp_path), train_dataset=hopeless, retain_dataset=retain,
                        processing_class=tok)


# ----- retain-reference provenance (evaluation) -------------------------------------------------------------------


def test_mismatched_retain_reference_is_refused(tiny_target, tiny_retain, tmp_path):
    """A retain reference records how it was made (data rows, prompt template, tokenizer, dtype); an evaluation
    made differently is refused before any scoring, a matching one is accepted without warnings."""
    import copy
    import warnings

    from hf_unlearn.evaluation import evaluate_tofu, save_truth_ratios

    fast = {"source": "synthetic", "max_examples": 2, "max_new_tokens": 2, "progress": False}
    reference = save_truth_ratios(evaluate_tofu(*tiny_retain, **fast), tmp_path / "retain.json")
    model, tokenizer = tiny_target
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # everything is recorded, so nothing is left unchecked
        report = evaluate_tofu(model, tokenizer, retain_reference=reference, **fast)
    assert report.forget_quality is not None and report.retain_reference["provenance"]["max_examples"] == 2

    calls = []
    model.register_forward_hook(lambda *args: calls.append(1))
    with pytest.raises(ValueError, match="prompt template 'plain'"):
        evaluate_tofu(model, tokenizer, retain_reference=reference, template="tofu-phi", **fast)
    with pytest.raises(ValueError, match="2 forget truth ratios but this evaluation has 3"):
        evaluate_tofu(model, tokenizer, retain_reference=reference, **dict(fast, max_examples=3))
    other = copy.deepcopy(tokenizer)
    other.add_tokens(["<an-extra-token>"])
    with pytest.raises(ValueError, match="tokenizer vocabulary"):
        evaluate_tofu(model, other, retain_reference=reference, **fast)
    with pytest.raises(ValueError, match="dtype 'float32'"):
        evaluate_tofu(model.to(torch.float64), tokenizer, retain_reference=reference, **fast)
    assert calls == []  # refused before the model ran


# ----- T3: padding independence and length limits ---------------------------------------------------------------


def test_t3_batch_of_16_left_padded_with_eos_equals_one_prompt_at_a_time(tiny_target, synthetic):
    """T3 takes padding from the attention mask: left padding with pad = EOS gives the tokens of batch size 1."""
    from test_t3 import Recording, left_pad, prompt_ids, random_head
    from transformers import LogitsProcessorList

    model, tok = tiny_target
    model.eval()
    eos = tok.eos_token_id
    questions = [r["question"] for r in synthetic["forget10"][:8] + synthetic["retain90"][:8]]
    prompts = prompt_ids(tok, questions)
    assert len({len(p) for p in prompts}) > 1  # the batch really is padded
    clf = random_head(model, layer=1, seed=3)
    kw = dict(max_new_tokens=10, do_sample=False, pad_token_id=eos, eos_token_id=eos)
    with Recording(model, clf, temperature=1.5, tilt_weight=2.0) as t3:
        batch = model.generate(**left_pad(prompts, eos), **kw, logits_processor=LogitsProcessorList([t3]))
        width = batch.shape[1] - 10
        changed = 0
        for i, p in enumerate(prompts):
            single = model.generate(torch.tensor([p]), **kw, logits_processor=LogitsProcessorList([t3]))[0, len(p):]
            row = batch[i, width:]
            assert torch.equal(row[: len(single)], single), i
            assert torch.all(row[len(single):] == eos)
            changed += not torch.equal(single, model.generate(torch.tensor([p]), **kw)[0, len(p):])
    assert changed >= 4  # the tilt changed most outputs, so equal outputs say something


def test_t3_truncation_to_the_base_positions():
    """T3 fitting truncates to the base's positions; scoring and generating past them is refused clearly."""
    from transformers import LogitsProcessorList

    from hf_unlearn.data import tokenize_qa
    from hf_unlearn.methods.t3 import T3ClassifierConfig, T3LogitsProcessor, fit_t3, t3_log_probs

    model, tok = short_gpt2(64)
    model.eval()
    long = lambda i: " ".join(f"w{(i * 7 + j) % 40}" for j in range(90))  # noqa: E731
    forget = [{"question": f"w{i} w{i + 1}", "answer": long(i)} for i in range(4)]
    retain = [{"question": f"w{i} w{i + 2}", "answer": long(i + 10)} for i in range(4, 10)] + \
        [{"question": "w1 w2", "answer": "w3 w4"}]
    clf = fit_t3(model, tok, forget, retain, T3ClassifierConfig(rank=2), steps=5, progress=False)
    report = clf.fit_report
    assert report["max_positions"] == 64 and report["truncated_examples"] == 10
    prompt_len = len(tokenize_qa(tok, "w0 w1", "w2")["input_ids"]) - 2
    assert report["n_forget_positions"] == 4 * (64 - prompt_len)
    # Scoring an over-long input is refused with a clear message (not an index error inside the base).
    ids = torch.randint(2, 40, (1, 80))
    with pytest.raises(ValueError, match="at most 64"):
        t3_log_probs(model, clf, ids, ids)
    # Generating past the positions is refused before the base indexes past them.
    with T3LogitsProcessor(model, clf) as t3, pytest.raises(ValueError, match="at most 64"):
        model.generate(torch.randint(2, 40, (1, 60)), max_new_tokens=10, do_sample=False, pad_token_id=1,
                       logits_processor=LogitsProcessorList([t3]))
    # Prompts alone filling the positions: a clear refusal.
    with pytest.raises(ValueError, match="first 64 positions"):
        fit_t3(model, tok, [{"question": long(1), "answer": "w1"}], retain, steps=5, progress=False)
