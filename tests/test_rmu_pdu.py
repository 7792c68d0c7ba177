"""RMU and PDU: their formulas against slow per-element references, their checks before any work, their effect on
the TOFU-tiny target, gradient accumulation, and exact resumes (the control vector, the dual variable)."""

from __future__ import annotations

import math
from pathlib import Path

import datasets
import pytest
import torch
from transformers import TrainerCallback

from hf_unlearn.demo import load_tiny
from hf_unlearn.logprobs import answer_nll
from hf_unlearn.methods.base.checkpoints import TRAINER_STATE_NAME
from hf_unlearn.methods.pdu import PDUConfig, PDUTrainer
from hf_unlearn.methods.pdu.loss import dual_update, pdu_forget_loss, pdu_loss
from hf_unlearn.methods.rmu import RMUConfig, RMUTrainer
from hf_unlearn.methods.rmu.loss import activation_mse, rmu_control_vector, rmu_loss
from hf_unlearn.methods.rmu.trainer import CONTROL_VECTOR_NAME

datasets.disable_progress_bars()


def _config(cls, out: Path, **overrides):
    values = dict(
        output_dir=str(out), report_to="none", save_strategy="no", activation_checkpointing=False,
        disable_tqdm=True, per_device_train_batch_size=4, max_steps=2, logging_steps=1, seed=0, learning_rate=1e-3,
    )
    if cls is RMUConfig:
        values["layer"] = 1
    if cls is PDUConfig:
        values["retain_loss_eps"] = 0.1
    values.update(overrides)
    return cls(**values)


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# ----- the formulas against slow references ---------------------------------------------------------------------


def test_activation_mse_and_rmu_loss_match_a_per_element_loop():
    g = torch.Generator().manual_seed(0)
    B, L, H = 3, 5, 4
    acts, ref = torch.randn(B, L, H, generator=g), torch.randn(B, L, H, generator=g)
    mask = torch.tensor([[0, 1, 1, 0, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    control = rmu_control_vector(H, 2.0, torch.Generator().manual_seed(1))

    def slow(a, c, m, num_sequences):
        total = 0.0
        for b in range(a.shape[0]):
            tokens = [t for t in range(a.shape[1]) if m[b, t]]
            if not tokens:
                continue
            seq = 0.0
            for t in tokens:
                target = c[b, t] if c.dim() == 3 else c
                seq += sum((a[b, t, d].item() - target[d].item()) ** 2 for d in range(a.shape[2])) / a.shape[2]
            total += seq / len(tokens)
        return total / num_sequences

    assert activation_mse(acts, control, mask).item() == pytest.approx(slow(acts, control, mask, B), rel=1e-5)
    assert activation_mse(acts, ref, mask, 7).item() == pytest.approx(slow(acts, ref, mask, 7), rel=1e-5)
    expected = 0.5 * slow(acts, control, mask, 2) + 3.0 * slow(acts, ref, mask, 5)
    got = rmu_loss(acts, control, mask, acts, ref, mask, forget_weight=0.5, retain_weight=3.0,
                   num_forget_sequences=2, num_retain_sequences=5)
    assert got.item() == pytest.approx(expected, rel=1e-5)
    # the forget term alone without retain activations
    assert rmu_loss(acts, control, mask).item() == pytest.approx(slow(acts, control, mask, B), rel=1e-5)
    with pytest.raises(ValueError, match="frozen model"):
        rmu_loss(acts, control, mask, acts)


def test_control_vector_is_a_seeded_nonnegative_vector_of_length_steering_coeff():
    first = rmu_control_vector(64, 2.0, torch.Generator().manual_seed(0))
    again = rmu_control_vector(64, 2.0, torch.Generator().manual_seed(0))
    other = rmu_control_vector(64, 2.0, torch.Generator().manual_seed(1))
    assert first.shape == (64,) and first.dtype == torch.float32
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert first.norm().item() == pytest.approx(2.0, rel=1e-6) and (first >= 0).all()
    with pytest.raises(ValueError):
        rmu_control_vector(64, 0.0)


def test_pdu_forget_loss_matches_a_per_position_loop_and_vanishes_on_flat_logits():
    g = torch.Generator().manual_seed(0)
    B, L, V = 2, 6, 7
    logits = torch.randn(B, L, V, generator=g) * 3
    labels = torch.tensor([[-100, -100, 3, 1, 4, -100], [-100, 5, 2, -100, -100, -100]])

    def slow(num_tokens):
        total = 0.0
        for b in range(B):
            for t in range(1, L):
                if labels[b, t] != -100:
                    row = [logits[b, t - 1, v].item() for v in range(V)]
                    total += (max(row) - sum(row) / V) ** 2
        return total / num_tokens

    assert pdu_forget_loss(logits, labels).item() == pytest.approx(slow(5), rel=1e-5)
    assert pdu_forget_loss(logits, labels, 11).item() == pytest.approx(slow(11), rel=1e-5)
    assert pdu_forget_loss(torch.full((B, L, V), 2.5), labels).item() == 0.0
    forget, retain = torch.tensor(3.0), torch.tensor(0.7)
    assert pdu_loss(forget, retain, 4.0, 0.2, forget_weight=0.5).item() == pytest.approx(0.5 * 3 + 4 * (0.7 - 0.2))


def test_dual_update_is_projected_ascent():
    assert dual_update(1.0, 0.5, 0.2, 2.0) == pytest.approx(1.6)  # above the bound: grows
    assert dual_update(1.0, 0.1, 0.2, 2.0) == pytest.approx(0.8)  # below it: shrinks
    assert dual_update(0.1, 0.0, 0.2, 2.0) == 0.0  # never below 0
    assert dual_update(3.0, 9.0, 0.2, 0.0) == 3.0  # step 0: fixed weight


# ----- checks before any work ------------------------------------------------------------------------------------


def test_pdu_refuses_a_missing_eps_in_the_api_and_on_the_command_line(tiny_pair, tmp_path, capsys):
    from hf_unlearn.cli import main

    with pytest.raises(ValueError, match="PDU needs `retain_loss_eps`"):
        PDUConfig(output_dir=str(tmp_path / "api"), report_to="none")
    out = tmp_path / "cli"
    assert main(["unlearn", "--method", "pdu", "--model", str(tiny_pair.target), "--data", "synthetic",
                 "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "PDU needs `retain_loss_eps`" in err and "--retain_loss_eps" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    for bad in ({"retain_loss_eps": math.nan}, {"retain_loss_eps": 0.1, "dual_step_size": -1.0},
                {"retain_loss_eps": 0.1, "retain_loss": "none"}):
        with pytest.raises(ValueError):
            PDUConfig(output_dir=str(tmp_path / "api"), report_to="none", **bad)


@pytest.mark.parametrize("method,option", [("rmu", "--steering_coeff"), ("pdu", "--retain_loss_eps")])
def test_method_help_lists_the_options(method, option, capsys):
    from hf_unlearn.cli import main

    assert main(["unlearn", "--method", method, "--help"]) == 0
    assert option in capsys.readouterr().out


def test_rmu_refuses_a_layer_the_model_lacks_and_a_pattern_matching_nothing(tiny_target, tiny_pair, synthetic,
                                                                           tmp_path, capsys):
    from hf_unlearn.cli import main

    model, tok = tiny_target
    before = _params(model)
    forget, retain = synthetic["forget10"][:4], synthetic["retain90"][:4]
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"layer=7 does not exist: the model has 2 decoder layers \(0..1\)"):
        RMUTrainer(model, _config(RMUConfig, out, layer=7), train_dataset=forget, retain_dataset=retain,
                   processing_class=tok)
    with pytest.raises(ValueError, match="matches none of the model's"):
        RMUTrainer(model, _config(RMUConfig, out, trainable_params=r"encoder\..*"), train_dataset=forget,
                   retain_dataset=retain, processing_class=tok)
    with pytest.raises(ValueError, match="layer=7 does not exist"):  # a model path: read from its config
        RMUTrainer(str(tiny_pair.target), _config(RMUConfig, out, layer=7), train_dataset=forget,
                   retain_dataset=retain)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters()) and not out.exists()
    cli_out = tmp_path / "cli"
    assert main(["unlearn", "--method", "rmu", "--model", str(tiny_pair.target), "--data", "synthetic",
                 "--output", str(cli_out), "--layer", "7"]) == 2
    err = capsys.readouterr().err
    assert "layer=7 does not exist" in err and len(err.strip().splitlines()) == 1 and not cli_out.exists()
    with pytest.raises(ValueError, match="`layer` must be None or an integer >= 0"):
        RMUConfig(output_dir=str(out), report_to="none", layer=-1)


def test_rmu_default_layer_is_relative_to_the_model_depth(tiny_pair, tmp_path, capsys):
    """``floor(7 * depth / 32)``: open-unlearning's layer 7 for a 32-layer model, a layer of any shallower one,
    so the command line's default runs on the 2-layer tiny model (it steers layer 0)."""
    import torch

    from hf_unlearn.cli import main
    from hf_unlearn.methods.rmu.config import default_layer

    assert default_layer(32) == 7 and default_layer(None) == 7
    for depth in range(1, 129):  # the deepest layer at or above 7/32 of the depth, by search
        assert default_layer(depth) == max(k for k in range(depth) if 32 * k <= 7 * depth)
    out = tmp_path / "cli"
    assert main(["unlearn", "--method", "rmu", "--model", str(tiny_pair.target), "--data", "synthetic",
                 "--output", str(out), "--max_steps", "1"]) == 0, capsys.readouterr().err
    assert torch.load(out / "training_args.bin", weights_only=False).layer == 0


def test_rmu_trains_only_the_chosen_parameters(tiny_target, synthetic, tmp_path):
    model, tok = tiny_target
    before = _params(model)
    pattern = r"model\.layers\.(0|1)\.mlp\.down_proj\.weight"
    trainer = RMUTrainer(model, _config(RMUConfig, tmp_path / "out", trainable_params=pattern),
                         train_dataset=synthetic["forget10"], retain_dataset=synthetic["retain90"][:40],
                         processing_class=tok)
    trainer.train()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed == {"model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"}
    assert {n for n, p in model.named_parameters() if p.requires_grad} == changed
    logged = [h for h in trainer.state.log_history if "forget_activation_loss" in h]
    assert logged and all("retain_activation_loss" in h and "retain_nll" in h for h in logged)


def test_rmu_with_lora_uses_the_disabled_adapter_as_the_frozen_model(tiny_target, synthetic, tmp_path):
    from peft import LoraConfig

    model, tok = tiny_target
    trainer = RMUTrainer(model, _config(RMUConfig, tmp_path / "out", max_steps=1), train_dataset=synthetic["forget10"],
                         retain_dataset=synthetic["retain90"][:40], processing_class=tok,
                         peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert trainer.ref_model is None
    trainer.train()
    first = trainer.state.log_history[0]
    # LoRA starts as the identity: at step 1 the retain hidden states equal the disabled adapter's
    assert first["retain_activation_loss"] == 0.0 and first["forget_activation_loss"] > 0.1
    assert all("lora_" in n for n, p in trainer.model.named_parameters() if p.requires_grad)


# ----- effect on the TOFU-tiny target (the shipped demo settings) ---------------------------------------------------


@pytest.mark.parametrize("method,cls", [("rmu", RMUTrainer), ("pdu", PDUTrainer)])
def test_the_demo_setting_unlearns_the_tofu_tiny_target(method, cls, tiny_target, synthetic, tmp_path):
    """The TOFU-tiny demo setting (benchmarks/configs/tofu_tiny.toml). Measured (seed 0, 30 steps of 8): RMU forget
    NLL 0.043 -> 2.76, retain NLL 0.035 -> 0.071; PDU 0.043 -> 7.36 and 0.035 -> 0.35, the dual weight 10 -> 26.3."""
    from unlearn_bench.registry import PRESETS

    model, tok = tiny_target
    forget, retain = synthetic["forget10"], synthetic["retain90"]
    fq, fa = [r["question"] for r in forget], [r["answer"] for r in forget]
    rq, ra = [r["question"] for r in retain[:60]], [r["answer"] for r in retain[:60]]
    f0, r0 = answer_nll(model, tok, fq, fa).mean().item(), answer_nll(model, tok, rq, ra).mean().item()
    settings = dict(PRESETS[method].demo)
    args = cls.config_class(output_dir=str(tmp_path / "out"), report_to="none", save_strategy="no",
                            disable_tqdm=True, **settings)
    trainer = cls(model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok)
    trainer.train()
    f1, r1 = answer_nll(model, tok, fq, fa).mean().item(), answer_nll(model, tok, rq, ra).mean().item()
    assert f1 - f0 > 1.0 and f1 > 10 * f0, (f0, f1)
    assert (f1 - f0) > 8 * (r1 - r0), (r0, r1, f0, f1)
    if method == "pdu":  # the retain NLL rose above eps after the warm-up, so the dual weight grew
        assert trainer.dual_weight > settings["retain_weight"] and trainer.dual.updates > 0


# ----- gradient accumulation -------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [RMUConfig, PDUConfig])
def test_two_micro_batches_with_accumulation_equal_one_batch(cls, tiny_pair, synthetic, tmp_path):
    """2 micro-batches x accumulation 2 == one batch of 4: the same SGD update, loss and (PDU) dual step."""
    trainer_cls = RMUTrainer if cls is RMUConfig else PDUTrainer
    forget, retain = synthetic["forget10"], synthetic["retain90"][:40]
    updates, losses, duals = [], [], []
    for batch_size, accumulation in ((4, 1), (2, 2)):
        model, tok = load_tiny(tiny_pair.target)
        before = _params(model)
        extra = {"dual_warmup_epochs": 0.0} if cls is PDUConfig else {}
        args = _config(cls, tmp_path / "out", per_device_train_batch_size=batch_size,
                       gradient_accumulation_steps=accumulation, max_steps=1, optim="sgd", learning_rate=1.0,
                       max_grad_norm=0.0, weight_decay=0.0, lr_scheduler_type="constant", **extra)
        trainer = trainer_cls(model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok)
        trainer.train()
        updates.append(torch.cat([(p.detach() - before[n]).flatten() for n, p in model.named_parameters()]))
        losses.append(trainer.state.log_history[0]["loss"])
        duals.append(getattr(trainer, "dual_weight", 0.0))
    assert updates[0].abs().max() > 1e-4
    assert torch.allclose(updates[0], updates[1], rtol=1e-4, atol=1e-6), (updates[0] - updates[1]).abs().max()
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert duals[0] == pytest.approx(duals[1], rel=1e-5)
    if cls is PDUConfig:
        assert duals[0] != 1.0


# ----- exact resume ----------------------------------------------------------------------------------------------


class _Interrupted(Exception):
    pass


class _InterruptAt(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise _Interrupted(f"interrupted at step {self.step}")


class _DualTrace(TrainerCallback):
    """The dual weight at each optimizer step's begin (the weight that step trains with)."""

    def __init__(self):
        self.trainer = None
        self.seen: list[tuple[int, float]] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.seen.append((state.global_step + 1, self.trainer.dual_weight))


@pytest.mark.parametrize("cls,restore", [(RMUConfig, False), (PDUConfig, False), (PDUConfig, True)])
def test_resume_mid_run_equals_the_uninterrupted_run(cls, restore, tiny_pair, synthetic, tmp_path):
    """10 forget rows in batches of 4: 3 steps an epoch; PDU's dual weight moves from epoch 2 (warm-up 1 epoch).
    Killed after step 11, resumed from checkpoint-10 (mid-epoch 4): same weights, same dual weights at every step,
    whether or not transformers restores the callbacks itself (``restore_callback_states_from_checkpoint``)."""
    trainer_cls = RMUTrainer if cls is RMUConfig else PDUTrainer
    forget, retain = list(synthetic["forget10"][:10]), list(synthetic["retain90"][:16])
    extra = {"dual_warmup_epochs": 1.0, "retain_loss_eps": 0.05} if cls is PDUConfig else {}

    def make(out: Path, *callbacks, **more):
        model, tok = load_tiny(tiny_pair.target)
        args = _config(cls, out, save_strategy="steps", save_steps=2, max_steps=13, **extra, **more)
        trainer = trainer_cls(model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok,
                              callbacks=list(callbacks))
        for cb in callbacks:
            if isinstance(cb, _DualTrace):
                cb.trainer = trainer
        return trainer

    straight_trace = _DualTrace() if cls is PDUConfig else TrainerCallback()
    straight = make(tmp_path / "straight", straight_trace)
    straight.train()
    expected = _params(straight.model)

    run = tmp_path / "resumed"
    killed = make(run, _InterruptAt(11))
    with pytest.raises(_Interrupted):
        killed.train()
    checkpoint = run / "checkpoint-10"
    assert (checkpoint / TRAINER_STATE_NAME).is_file()
    if cls is RMUConfig:
        assert (checkpoint / CONTROL_VECTOR_NAME).is_file()
    resumed_trace = _DualTrace() if cls is PDUConfig else TrainerCallback()
    resumed = make(run, resumed_trace, restore_callback_states_from_checkpoint=restore)
    if cls is RMUConfig:  # the checkpoint's vector is the one the run steers to
        resumed.control_vector = torch.zeros_like(resumed.control_vector)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 13
    got = _params(resumed.model)
    worst = max((got[n] - expected[n]).abs().max().item() for n in expected)
    assert all(torch.equal(got[n], expected[n]) for n in expected), f"max weight difference {worst}"
    if cls is RMUConfig:
        assert torch.equal(resumed.control_vector, straight.control_vector)
    else:
        weights = dict(straight_trace.seen)
        assert [w for s, w in weights.items() if s <= 4] == [1.0] * 4  # the warm-up epoch (and its end) hold it
        assert len(set(weights.values())) > 5  # then it moves every step
        assert resumed_trace.seen == [(s, weights[s]) for s in range(11, 14)]
        assert resumed.dual_weight == straight.dual_weight and resumed.dual.updates == straight.dual.updates
