"""Unlearning trainers on the tiny TOFU target: data preparation, pairing, the baselines' effect, LoRA,
save/reload, gradient-accumulation exactness and bad input."""

from __future__ import annotations

import warnings

import datasets
import pytest
import torch

from hf_unlearn.data import tokenize_qa
from hf_unlearn.logprobs import answer_nll, label_log_probs
from hf_unlearn.methods.base import BaseUnlearningConfig, NonFiniteLossError, UnlearningConfig
from hf_unlearn.methods.base.pairing import retain_partner_indices
from hf_unlearn.methods.baselines import (
    GradAscentTrainer,
    GradDiffTrainer,
    NPOTrainer,
    SimNPOConfig,
    SimNPOTrainer,
)

datasets.disable_progress_bars()

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # The tiny model is far faster on one thread than with several threads fighting over shared cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _config(tmp_path, cls=UnlearningConfig, **overrides) -> UnlearningConfig:
    values = dict(
        output_dir=str(tmp_path / "out"), report_to="none", save_strategy="no", gradient_checkpointing=False,
        disable_tqdm=True, per_device_train_batch_size=4, max_steps=2, logging_steps=1, seed=0,
        learning_rate=3e-4,
    )
    values.update(overrides)
    return cls(**values)


def _qa(rows):
    return [r["question"] for r in rows], [r["answer"] for r in rows]


def _logits(model, tok, rows):
    batch = tok([f"Question: {r['question']}\nAnswer: {r['answer']}" for r in rows], return_tensors="pt", padding=True)
    model.eval()
    with torch.no_grad():
        return model(**batch).logits


# ----- data preparation and pairing ------------------------------------------------------------------------------


def test_tofu_prompt_completion_and_conversational_rows_give_the_evaluator_tokens(tiny_target, synthetic, tmp_path):
    model, tok = tiny_target
    forget, retain = synthetic["forget10"][:6], synthetic["retain90"][:10]
    trainer = GradDiffTrainer(model, _config(tmp_path), train_dataset=forget, retain_dataset=retain, processing_class=tok)
    for i, row in enumerate(forget):
        ref = tokenize_qa(tok, row["question"], row["answer"])
        assert trainer.forget_dataset[i]["input_ids"] == ref["input_ids"]
        assert trainer.forget_dataset[i]["labels"] == ref["labels"]  # loss on answer tokens only
    # TRL prompt/completion rows pass through unchanged and give the same tokens
    pc = [{"prompt": f"Question: {r['question']}\nAnswer:", "completion": " " + r["answer"]} for r in forget]
    trainer_pc = GradAscentTrainer(model, _config(tmp_path), train_dataset=pc, processing_class=tok)
    assert trainer_pc.train_dataset["labels"] == trainer.forget_dataset["labels"]

    # batches pair forget example i with retain example retain_partner_indices(...)[i] of the epoch
    partners = retain_partner_indices(6, 10, seed=0, epoch=0)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(3)])
    assert set(batch) >= {"input_ids", "attention_mask", "labels", "retain_input_ids", "retain_attention_mask",
                          "retain_labels"}
    for i in range(3):
        ref = tokenize_qa(tok, retain[partners[i]]["question"], retain[partners[i]]["answer"])
        n = len(ref["input_ids"])
        assert batch["retain_input_ids"][i, :n].tolist() == ref["input_ids"]
        assert batch["retain_labels"][i, :n].tolist() == ref["labels"]
    trainer.train_dataset.set_epoch(1)
    assert trainer.train_dataset.partners == retain_partner_indices(6, 10, seed=0, epoch=1)

    # with a chat template, TOFU rows become conversational and match tokenize_qa's chat formatting
    tok.chat_template = CHAT_TEMPLATE
    trainer_chat = GradAscentTrainer(model, _config(tmp_path), train_dataset=forget, processing_class=tok)
    for i, row in enumerate(forget):
        ref = tokenize_qa(tok, row["question"], row["answer"])
        assert trainer_chat.train_dataset[i]["input_ids"] == ref["input_ids"]
        assert trainer_chat.train_dataset[i]["labels"] == ref["labels"]


def test_per_method_defaults_do_not_change_the_callers_config(tiny_target, synthetic, tmp_path):
    model, tok = tiny_target
    forget, retain = synthetic["forget10"][:4], synthetic["retain90"][:8]
    args = _config(tmp_path)
    npo = NPOTrainer(model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok)
    simnpo = SimNPOTrainer(model, _config(tmp_path, cls=SimNPOConfig), train_dataset=forget, retain_dataset=retain,
                           processing_class=tok)
    assert (npo.args.forget_loss, npo.args.beta, npo.args.forget_weight, npo.args.retain_weight) == ("npo", 0.1, 1.0, 1.0)
    assert (simnpo.args.forget_loss, simnpo.args.beta, simnpo.args.forget_weight, simnpo.args.retain_weight) == ("simnpo", 4.5, 0.125, 1.0)
    assert args.forget_loss == "grad_ascent" and (args.beta, args.forget_weight) == (0.1, 1.0)  # the caller's config unchanged
    # a plain UnlearningConfig keeps its own values in a preset trainer, with a warning naming the preset's defaults
    with pytest.warns(UserWarning, match=r"beta=0.1 \(SimNPOConfig: 4.5\)"):
        plain = SimNPOTrainer(model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok)
    assert (plain.args.forget_loss, plain.args.beta, plain.args.forget_weight) == ("simnpo", 0.1, 1.0)
    assert simnpo.ref_model is None and npo.ref_model is not None and npo.ref_model is not npo.model
    assert not npo.ref_model.training and not any(p.requires_grad for p in npo.ref_model.parameters())


# ----- the baselines do what they should -------------------------------------------------------------------------


def test_graddiff_raises_forget_nll_and_keeps_retain_nll_and_reloads(tiny_target, synthetic, tmp_path):
    """Measured (seed 0, 8 steps of 4, lr 5e-4) on the current tiny target: forget NLL 0.043 -> 0.280, retain NLL
    0.035 -> 0.073 (an earlier target recipe gave 0.087 -> 0.46 and 0.053 -> 0.16 with 6 steps): the forget NLL
    rises several-fold, the retain NLL several times less."""
    from transformers import AutoModelForCausalLM

    model, tok = tiny_target
    forget, retain = synthetic["forget10"], synthetic["retain90"]
    fq, fa = _qa(forget)
    rq, ra = _qa(retain[:60])
    f0, r0 = answer_nll(model, tok, fq, fa).mean(), answer_nll(model, tok, rq, ra).mean()

    trainer = GradDiffTrainer(model, _config(tmp_path, max_steps=8, learning_rate=5e-4), train_dataset=forget,
                              retain_dataset=retain, processing_class=tok)
    trainer.train()
    f1, r1 = answer_nll(model, tok, fq, fa).mean(), answer_nll(model, tok, rq, ra).mean()
    assert f1 > 3 * f0 and f1 - f0 > 0.15, (f0, f1)
    assert r1 - r0 < 0.15 and (f1 - f0) > 2.5 * (r1 - r0), (r0, r1)
    logged = [h for h in trainer.state.log_history if "forget_nll" in h]
    assert len(logged) == 8 and all("retain_nll" in h for h in logged)

    # save, reload, same outputs (safetensors)
    trainer.save_model(str(tmp_path / "saved"))
    assert (tmp_path / "saved" / "model.safetensors").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "saved"))
    assert torch.allclose(_logits(model, tok, forget[:4]), _logits(reloaded, tok, forget[:4]), atol=1e-5)


def test_npo_reference_is_the_frozen_initial_model_and_loss_starts_at_2_log2_over_beta(tiny_target, tiny_pair,
                                                                                      synthetic, tmp_path):
    from hf_unlearn.demo import load_tiny

    model, tok = tiny_target
    initial, _ = load_tiny(tiny_pair.target)
    forget = synthetic["forget10"]
    trainer = NPOTrainer(model, _config(tmp_path, max_steps=3, retain_weight=0.0, beta=0.5), train_dataset=forget,
                         processing_class=tok)
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(4)]))
    trainer.model.eval()
    with torch.no_grad():
        first = trainer.compute_loss(trainer.model, batch).item()
    assert first == pytest.approx(2 / 0.5 * torch.log(torch.tensor(2.0)).item(), rel=1e-5)
    trainer.train()
    # after training the policy moved, the reference did not (and does not share the policy's forward)
    ref = trainer.reference_scores(batch)
    with torch.no_grad():
        expected = label_log_probs(initial(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                                   batch["labels"])
    assert torch.allclose(ref.token_log_probs, expected, atol=1e-5)
    assert trainer.score(trainer.model, batch).sequence_log_probs.mean() < ref.sequence_log_probs.mean() - 0.2


def test_lora_trains_only_the_adapter_and_uses_the_disabled_adapter_as_reference(tiny_target, synthetic, tmp_path):
    from peft import LoraConfig, PeftModel

    model, tok = tiny_target
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    forget, retain = synthetic["forget10"], synthetic["retain90"][:40]
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    trainer = NPOTrainer(model, _config(tmp_path, max_steps=4, learning_rate=2e-2, retain_loss="kl"),
                         train_dataset=forget, retain_dataset=retain, processing_class=tok, peft_config=lora)
    assert trainer.ref_model is None  # no second copy: the reference is the model with its adapter disabled
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    trainer.train()

    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(4)]))
    ref = trainer.reference_scores(batch)
    fresh = type(model).from_pretrained(model.name_or_path)
    with torch.no_grad():
        expected = label_log_probs(fresh(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                                   batch["labels"])
    assert torch.allclose(ref.token_log_probs, expected, atol=1e-5)
    policy = trainer.score(trainer.model, batch).sequence_log_probs
    assert policy.mean() < ref.sequence_log_probs.mean() - 0.5  # the adapter did unlearn something
    for name, value in trainer.model.get_base_model().state_dict().items():
        if "lora_" not in name:
            key = name.replace(".base_layer", "")
            assert torch.equal(value, base_state[key]), name

    trainer.save_model(str(tmp_path / "adapter"))
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    reloaded = PeftModel.from_pretrained(type(model).from_pretrained(model.name_or_path), str(tmp_path / "adapter"))
    assert torch.allclose(_logits(trainer.model, tok, forget[:4]), _logits(reloaded, tok, forget[:4]), atol=1e-5)


def test_the_adapter_disabled_reference_pass_goes_through_the_wrapped_model(tiny_target, synthetic, tmp_path):
    """With a PEFT adapter the reference pass calls the model as the Trainer wrapped it (``model_wrapped``: what FSDP
    needs to gather its shards), with the adapter disabled: the wrapper is called and the figures are the base's."""
    from peft import LoraConfig

    model, tok = tiny_target
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    trainer = NPOTrainer(model, _config(tmp_path, max_steps=1), train_dataset=synthetic["forget10"][:8],
                         retain_dataset=synthetic["retain90"][:8], processing_class=tok, peft_config=lora)
    calls = []

    class Wrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, **kwargs):
            calls.append(sorted(kwargs))
            return self.inner(**kwargs)

    trainer.model_wrapped = Wrapper(trainer.model)
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(4)]))
    ref = trainer.reference_scores(batch)
    assert len(calls) == 1
    with torch.no_grad(), trainer.model.disable_adapter():
        expected = label_log_probs(trainer.model.get_base_model()(input_ids=batch["input_ids"],
                                                                  attention_mask=batch["attention_mask"]).logits,
                                   batch["labels"])
    assert torch.allclose(ref.token_log_probs, expected, atol=1e-5)


# ----- gradient accumulation -------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls,extra", [(GradDiffTrainer, {"retain_loss": "kl"}), (NPOTrainer, {}),
                                       (SimNPOTrainer, {})])
def test_two_micro_batches_with_accumulation_equal_one_batch(cls, extra, tiny_pair, synthetic, tmp_path):
    """2 micro-batches x accumulation 2 == one batch of 4: same SGD update (so the same gradient) and loss."""
    from hf_unlearn.demo import load_tiny

    forget, retain = synthetic["forget10"], synthetic["retain90"][:40]
    updates, losses = [], []
    for batch_size, accumulation in ((4, 1), (2, 2)):
        model, tok = load_tiny(tiny_pair.target)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        args = _config(tmp_path, per_device_train_batch_size=batch_size, gradient_accumulation_steps=accumulation,
                       max_steps=1, optim="sgd", learning_rate=1.0, max_grad_norm=0.0, weight_decay=0.0,
                       lr_scheduler_type="constant", **extra)
        trainer = cls(model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok)
        trainer.train()
        updates.append(torch.cat([(p.detach() - before[n]).flatten() for n, p in model.named_parameters()]))
        losses.append(trainer.state.log_history[0]["loss"])
    assert updates[0].abs().max() > 1e-3
    assert torch.allclose(updates[0], updates[1], rtol=1e-4, atol=1e-6), (updates[0] - updates[1]).abs().max()
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


# ----- bad input -------------------------------------------------------------------------------------------------


def test_bad_input_is_refused_before_training(tiny_target, synthetic, tmp_path):
    model, tok = tiny_target
    forget, retain = synthetic["forget10"][:6], synthetic["retain90"][:10]
    args = _config(tmp_path)
    with pytest.raises(ValueError, match="needs a `retain_dataset`"):
        GradDiffTrainer(model, args, train_dataset=forget, processing_class=tok)
    with pytest.raises(ValueError, match="needs a `retain_dataset`"):
        NPOTrainer(model, args, train_dataset=forget, processing_class=tok)
    with pytest.raises(ValueError, match="forget set .* is empty"):
        GradAscentTrainer(model, args, train_dataset=[], processing_class=tok)
    with pytest.raises(ValueError, match="retain set .* is empty"):
        GradDiffTrainer(model, args, train_dataset=forget, retain_dataset=[], processing_class=tok)
    with pytest.raises(ValueError, match="2 of the 6 forget examples also occur in the retain set"):
        GradDiffTrainer(model, args, train_dataset=forget, retain_dataset=retain + forget[:2], processing_class=tok)
    with pytest.warns(UserWarning, match="2 forget examples also occur"):
        GradDiffTrainer(model, _config(tmp_path, allow_overlap=True), train_dataset=forget,
                        retain_dataset=retain + forget[:2], processing_class=tok)
    # without a retain term the retain set only feeds the divergence guard: ignored (with a warning) when it is off
    with pytest.warns(UserWarning, match="`retain_dataset` is ignored"):
        GradAscentTrainer(model, _config(tmp_path, max_retain_loss_ratio=None), train_dataset=forget,
                          retain_dataset=retain, processing_class=tok)
    for bad in ({"beta": 0.0}, {"beta": -1.0}, {"retain_weight": -0.5}, {"retain_loss": "l2"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            _config(tmp_path, **bad)
    with pytest.raises(ValueError, match="packing"):
        GradAscentTrainer(model, _config(tmp_path, packing=True), train_dataset=forget, processing_class=tok)


def test_nan_loss_stops_training_naming_the_step(tiny_target, synthetic, tmp_path):
    model, tok = tiny_target
    trainer = GradAscentTrainer(model, _config(tmp_path, max_steps=3), train_dataset=synthetic["forget10"],
                                processing_class=tok)

    class PoisonAfterFirstStep(__import__("transformers").TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            with torch.no_grad():
                model.lm_head.weight[0, 0] = float("nan")

    trainer.add_callback(PoisonAfterFirstStep())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(NonFiniteLossError, match="at step 2"):
            trainer.train()


# ----- one config, variants chosen by a field --------------------------------------------------------------------


@pytest.mark.parametrize("preset_name,fields", [
    ("GradAscent", {"forget_loss": "grad_ascent", "retain_loss": "none"}),
    ("GradDiff", {"forget_loss": "grad_ascent", "retain_loss": "kl"}),
    ("NPO", {"forget_loss": "npo", "retain_loss": "nll"}),
    ("SimNPO", {"forget_loss": "simnpo", "retain_loss": "nll", "beta": 4.5, "forget_weight": 0.125}),
])
def test_preset_trainers_are_the_unlearning_trainer_with_their_fields(preset_name, fields, tiny_target, synthetic,
                                                                      tmp_path):
    """Each preset trainer with its own config gives the loss of the generic BaselineTrainer with the same
    objective fields, and the preset config's defaults are exactly those fields."""
    import hf_unlearn
    from hf_unlearn.methods.base.losses import nll_loss
    from hf_unlearn.methods.baselines.loss import grad_ascent_loss
    from hf_unlearn.methods.baselines.trainer import BaselineTrainer

    model, tok = tiny_target
    forget, retain = synthetic["forget10"][:8], synthetic["retain90"][:8]
    preset_cls = getattr(hf_unlearn, f"{preset_name}Trainer")
    preset_config = getattr(hf_unlearn, f"{preset_name}Config")
    extra = {"retain_loss": "kl"} if preset_name == "GradDiff" else {}
    preset = preset_cls(model, _config(tmp_path, cls=preset_config, **extra), train_dataset=forget,
                        retain_dataset=retain, processing_class=tok)
    generic = BaselineTrainer(model, _config(tmp_path, **fields), train_dataset=forget, retain_dataset=retain,
                              processing_class=tok)
    assert {k: getattr(preset.args, k) for k in fields} == fields
    assert type(generic.args) is UnlearningConfig and generic.needs_retain(generic.args) == (fields["retain_loss"] != "none")
    items = [generic.train_dataset[i] for i in range(4)]
    batch = generic._prepare_inputs(generic.data_collator(items))
    model.eval()
    with torch.no_grad():
        expected = generic.compute_loss(model, batch)
        got = preset.compute_loss(model, preset._prepare_inputs(preset.data_collator(
            [preset.train_dataset[i] for i in range(4)])))
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)
    if preset_name == "GradAscent":  # against the formula: -(mean forget NLL) * gamma
        scored = generic.score(model, batch)
        assert expected.item() == pytest.approx(grad_ascent_loss(scored.token_log_probs, scored.mask).item(), rel=1e-6)
    if preset_name == "NPO":  # ... and the retain term really is in it
        retain_scored = generic.score(model, batch, "retain_")
        with_retain = expected - nll_loss(retain_scored.token_log_probs, retain_scored.mask)
        assert with_retain.item() != pytest.approx(expected.item())
    # a config of the preset's class naming another objective is refused
    if preset_name != "GradDiff":
        with pytest.raises(ValueError, match=f"{preset_name}Trainer trains with forget_loss"):
            preset_cls(model, _config(tmp_path, cls=preset_config, forget_loss="npo" if preset_name != "NPO" else
                                      "simnpo"), train_dataset=forget, retain_dataset=retain, processing_class=tok)


def test_prompt_template_reaches_the_trainer_tokens(tiny_target, synthetic, tmp_path):
    model, tok = tiny_target
    forget, retain = synthetic["forget10"][:4], synthetic["retain90"][:8]
    trainer = GradDiffTrainer(model, _config(tmp_path, prompt_template="chatml"), train_dataset=forget,
                              retain_dataset=retain, processing_class=tok)
    default = GradDiffTrainer(model, _config(tmp_path), train_dataset=forget, retain_dataset=retain,
                              processing_class=tok)
    for i, row in enumerate(forget):
        ref = tokenize_qa(tok, row["question"], row["answer"], template="chatml")
        assert trainer.forget_dataset[i]["input_ids"] == ref["input_ids"]
        assert trainer.forget_dataset[i]["labels"] == ref["labels"]
    assert [list(r["input_ids"]) for r in trainer.forget_dataset] != [list(r["input_ids"]) for r in default.forget_dataset]
    with pytest.raises(ValueError, match="no-such-template"):
        _config(tmp_path, prompt_template="no-such-template")


def test_configs_are_written_as_trl_writes_them():
    """Every unlearning field has a real default, help metadata and a docstring entry; the presets differ from
    UnlearningConfig only in the documented fields."""
    import dataclasses

    from trl import SFTConfig

    import hf_unlearn

    sft = {f.name for f in dataclasses.fields(SFTConfig)}
    for cls in (BaseUnlearningConfig, hf_unlearn.UnlearningConfig):
        for f in dataclasses.fields(cls):
            if f.name in sft or f.name not in cls.__dict__.get("__annotations__", {}):
                continue
            assert "help" in f.metadata and f"{f.name} (`" in cls.__doc__, f.name
            assert f.default is not dataclasses.MISSING, f.name
            if f.name != "prompt_template":
                assert f.default is not None, f.name

    def differing(cls):
        base = {f.name: f.default for f in dataclasses.fields(hf_unlearn.UnlearningConfig)}
        return {f.name: f.default for f in dataclasses.fields(cls) if f.default != base[f.name]}

    assert differing(hf_unlearn.GradAscentConfig) == {"retain_loss": "none"}
    assert differing(hf_unlearn.GradDiffConfig) == {}
    assert differing(hf_unlearn.NPOConfig) == {"forget_loss": "npo"}
    assert differing(hf_unlearn.SimNPOConfig) == {"forget_loss": "simnpo", "beta": 4.5, "forget_weight": 0.125}
    for name in ("GradAscent", "GradDiff", "NPO", "SimNPO"):
        trainer_cls, config_cls = getattr(hf_unlearn, f"{name}Trainer"), getattr(hf_unlearn, f"{name}Config")
        assert trainer_cls.config_class is config_cls
        defaults = {f.name: f.default for f in dataclasses.fields(config_cls)}
        assert all(defaults[k] == v for k, v in trainer_cls.preset.items())  # the preset is its config's default


def test_bf16_on_a_cpu_only_machine_is_cpu_autocast_with_float32_master_weights(tiny_target, synthetic, tmp_path,
                                                                                monkeypatch):
    """`bf16=True` without an accelerator: transformers would refuse it unless `use_cpu`; the config sets it, and
    training runs under CPU bf16 autocast while the weights stay float32 and move."""
    from hf_unlearn.methods.base import config as unlearning_config

    monkeypatch.setattr(unlearning_config, "_accelerator_present", lambda: False)
    config = _config(tmp_path, bf16=True)
    assert config.bf16 and config.use_cpu
    model, tok = tiny_target
    model = type(model)(model.config)
    model.load_state_dict(tiny_target[0].state_dict())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    forget, retain = synthetic["forget10"], synthetic["retain90"]
    trainer = GradDiffTrainer(model, config, train_dataset=forget, retain_dataset=retain, processing_class=tok)
    trainer.train()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    # With an accelerator present the flag is left alone: transformers trains there, and refuses bf16 on one
    # that cannot do it (here: a pretend accelerator without bf16) instead of silently moving to the CPU.
    monkeypatch.setattr(unlearning_config, "_accelerator_present", lambda: True)
    if not unlearning_config._bf16_available():
        with pytest.raises(ValueError, match="bf16"):
            _config(tmp_path, bf16=True)


def _trainer_classes():
    from hf_unlearn import registry
    from hf_unlearn.methods.base.trainer import UnlearningTrainer

    classes = {UnlearningTrainer}
    for name in registry.method_names():
        cls = registry.get_method(name).trainer_cls
        if isinstance(cls, type) and issubclass(cls, UnlearningTrainer):
            classes.update(c for c in cls.__mro__ if isinstance(c, type) and issubclass(c, UnlearningTrainer))
    return sorted(classes, key=lambda c: c.__qualname__)


def test_trainer_constructors_name_every_parameter():
    """No trainer takes ``*args`` / ``**kwargs``: each constructor that a class defines lists its parameters with
    type hints, ``model`` and ``args`` first and the forget set under ``train_dataset``; a class that adds nothing
    inherits its parent's."""
    import inspect

    for cls in _trainer_classes():
        if "__init__" not in vars(cls):
            continue
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        assert [p.name for p in params[:2]] == ["model", "args"], cls
        assert "train_dataset" in {p.name for p in params} and "retain_dataset" in {p.name for p in params}, cls
        for p in params:
            assert p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD), (cls, p.name)
            assert p.annotation is not inspect.Parameter.empty, (cls, p.name)


def test_private_trainer_overrides_are_named_in_the_class_docstring():
    """Every private method of transformers' or TRL's trainer that a trainer overrides is named, with its reason,
    in the docstring of the class that overrides it."""
    from transformers import Trainer
    from trl import SFTTrainer

    private = {n for base in (Trainer, SFTTrainer) for n, v in vars(base).items()
               if n.startswith("_") and not n.startswith("__") and callable(v)}
    for cls in _trainer_classes():
        for name in private & set(vars(cls)):
            assert f"``{name}``" in (cls.__doc__ or ""), (cls.__qualname__, name)


def test_the_base_trainer_names_no_objective_for_its_reference_model():
    """The base needs the frozen reference only for its own KL retain term; NPO's forget term is the baselines'."""
    from hf_unlearn.methods.base.trainer import UnlearningTrainer

    npo_alone = UnlearningConfig("out", forget_loss="npo", retain_weight=0.0)
    kl = UnlearningConfig("out", retain_loss="kl")
    assert not UnlearningTrainer.needs_reference_model(npo_alone)
    assert UnlearningTrainer.needs_reference_model(kl)
    assert NPOTrainer.needs_reference_model(npo_alone) and not GradDiffTrainer.needs_reference_model(
        UnlearningConfig("out"))
