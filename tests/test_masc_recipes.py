"""MASC's two recipes from its authors: the small-model (Qwen2.5) and the Llama-2-7B one, picked by the model's
size under ``recipe="auto"`` when the trainer sees the model; explicit values win; no gradient clipping unless
asked; the bench's v2 preset with the 8/8 continuation minimum; the count from the model's config (a partitioned
model's parameters report ``numel() == 0``); a budget-ended run named in the table."""

from __future__ import annotations

import pytest
import torch

from hf_unlearn.methods.masc import MASCConfig
from hf_unlearn.methods.masc.config import (
    MASC_RECIPES,
    MASC_SMALL_MODEL_MAX_PARAMETERS,
    masc_recipe_for,
    model_parameter_count,
)

SMALL = dict(forget_weight=0.1, margin_probability=0.5, buffer_eta=0.5, retain_weight=1.0, stop_trigger=0.2,
             stop_tolerance=0.2, confirm_examples=64)
LLAMA = dict(forget_weight=0.05, margin_probability=0.7, buffer_eta=0.25, retain_weight=0.0, stop_trigger=0.475,
             stop_tolerance=0.475, confirm_examples=32)


def _values(config: MASCConfig) -> dict:
    return {k: getattr(config, k) for k in SMALL}


def _config(tmp_path, **kwargs) -> MASCConfig:
    return MASCConfig(output_dir=str(tmp_path / "masc"), report_to="none", **kwargs)


class _Sized(torch.nn.Module):
    """A model of ``n`` parameters on the meta device (no memory)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(n, device="meta"))


def test_named_recipes_are_the_authors_scripts(tmp_path):
    assert MASC_RECIPES == {"small": SMALL, "llama2-7b": LLAMA}
    assert _values(_config(tmp_path, recipe="small")) == SMALL
    assert _values(_config(tmp_path, recipe="llama2-7b")) == LLAMA
    # what both scripts share stays the config's default under either recipe
    for recipe in ("small", "llama2-7b"):
        cfg = _config(tmp_path, recipe=recipe)
        assert (cfg.top_k, cfg.margin_beta, cfg.check_every, cfg.stop_probe_batches, cfg.confirm_rule) == (
            10, 1.0, 2, 2, "mean")
        assert (cfg.continuation_min_prefix_tokens, cfg.continuation_min_suffix_tokens) == (8, 8)  # not 32/32
        assert (cfg.continuation_cut_min_ratio, cfg.continuation_cut_max_ratio, cfg.learning_rate) == (0.2, 0.6, 1e-4)
    with pytest.raises(ValueError, match="recipe"):
        _config(tmp_path, recipe="qwen")


def test_explicit_values_win_over_every_recipe(tmp_path):
    given = dict(forget_weight=0.3, stop_tolerance=0.4)
    for recipe in ("small", "llama2-7b", "auto"):
        cfg = _config(tmp_path, recipe=recipe, **given)
        assert (cfg.forget_weight, cfg.stop_tolerance) == (0.3, 0.4)
        assert set(cfg.recipe_fields_given) == set(given)
    resolved = _config(tmp_path, **given).with_recipe("llama2-7b")
    assert _values(resolved) == {**LLAMA, **given}
    # an explicit value equal to the other recipe's is still explicit
    kept = _config(tmp_path, retain_weight=1.0).with_recipe("llama2-7b")
    assert kept.retain_weight == 1.0 and kept.margin_probability == 0.7


def test_auto_picks_by_parameter_count_and_leaves_the_config_alone(tmp_path):
    assert masc_recipe_for(MASC_SMALL_MODEL_MAX_PARAMETERS - 1) == "small"
    assert masc_recipe_for(MASC_SMALL_MODEL_MAX_PARAMETERS) == "llama2-7b"
    cfg = _config(tmp_path, confirm_examples=16)
    assert cfg.recipe == "auto" and _values(cfg) == {**SMALL, "confirm_examples": 16}  # provisional until resolved
    big, record = cfg.resolved_for(_Sized(7_000_000_000))
    assert big.recipe == "llama2-7b" and _values(big) == {**LLAMA, "confirm_examples": 16}
    assert record == {"requested": "auto", "used": "llama2-7b", "model_parameters": 7_000_000_000,
                      "given": ["confirm_examples"]}
    small, record = cfg.resolved_for(_Sized(135_000_000))
    assert small.recipe == "small" and record["used"] == "small" and record["model_parameters"] == 135_000_000
    assert cfg.recipe == "auto" and _values(cfg) == {**SMALL, "confirm_examples": 16}  # the caller's config unchanged
    named, record = _config(tmp_path, recipe="llama2-7b").resolved_for(_Sized(10))
    assert named.recipe == "llama2-7b" and record["used"] == "llama2-7b" and record["model_parameters"] is None


def test_parameter_count_of_a_path_a_module_and_a_lora_model(tiny_pair, tiny_target):
    from peft import LoraConfig, get_peft_model

    model, _ = tiny_target
    n = sum(p.numel() for p in model.parameters())
    assert model_parameter_count(model) == n
    assert model_parameter_count(str(tiny_pair.target)) == n  # from the config alone, on the meta device
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert sum(p.numel() for p in lora.parameters()) > n
    assert model_parameter_count(lora) == n


def test_parameter_count_from_the_config_equals_the_weights_and_ignores_partitioned_parameters(tiny_target):
    from transformers import LlamaConfig, Qwen2Config, Qwen2ForCausalLM

    from hf_unlearn.methods.masc.config import config_parameter_count

    model, _ = tiny_target
    assert config_parameter_count(model.config) == sum(p.numel() for p in model.parameters())  # untied Llama
    qwen = Qwen2ForCausalLM(Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))
    weights = sum(p.numel() for p in qwen.parameters())
    assert abs(config_parameter_count(qwen.config) - weights) / weights < 0.01  # tied, q/k/v biases not counted
    # ZeRO-3 (zero3_init_flag) leaves every process an empty placeholder for each parameter: numel() is 0
    for param in model.parameters():
        param.data = torch.empty(0)
    assert sum(p.numel() for p in model.parameters()) == 0
    model.config = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                               num_attention_heads=32)  # Llama-2-7B's shape: 6,738,415,616 parameters
    assert model_parameter_count(model) == 6_738_415_616
    resolved, record = MASCConfig(output_dir="unused", report_to="none").resolved_for(model)
    assert resolved.recipe == "llama2-7b" and record["model_parameters"] == 6_738_415_616


def test_trainer_resolves_auto_to_the_small_recipe_on_a_tiny_model_and_records_it(tiny_target, synthetic, tmp_path):
    from hf_unlearn.methods.masc import MASCTrainer

    model, tok = tiny_target
    n = sum(p.numel() for p in model.parameters())
    args = _config(tmp_path, use_peft=False, stop_tolerance=0.3, max_steps=2, save_strategy="no")
    trainer = MASCTrainer(model, args, train_dataset=synthetic["forget10"], retain_dataset=synthetic["retain90"],
                          processing_class=tok)
    assert trainer.args.recipe == "small" and args.recipe == "auto"
    assert _values(trainer.args) == {**SMALL, "stop_tolerance": 0.3}
    assert trainer.recipe == {"requested": "auto", "used": "small", "model_parameters": n, "given": ["stop_tolerance"]}
    assert trainer.stopping_callback.rule["recipe"] == trainer.recipe
    assert trainer.stopping_callback.summary()["rule"]["recipe"]["used"] == "small"
    assert (trainer.stopping_callback.trigger, trainer.stopping_callback.stop_tolerance) == (0.2, 0.3)
    assert trainer.stopping_callback.rule["confirm_examples"] == min(64, len(synthetic["forget10"]))


@pytest.mark.parametrize("max_grad_norm,clips", [(None, False), (1.0, True)])
def test_no_gradient_clipping_unless_asked(tiny_target, synthetic, tmp_path, monkeypatch, max_grad_norm, clips):
    from hf_unlearn.methods.masc import MASCTrainer

    model, tok = tiny_target
    extra = {} if max_grad_norm is None else {"max_grad_norm": max_grad_norm}
    args = _config(tmp_path, use_peft=False, retain_weight=0.0, learning_rate=1e-3, max_steps=2,
                   per_device_train_batch_size=4, save_strategy="no", disable_tqdm=True, **extra)
    assert args.max_grad_norm == (0.0 if max_grad_norm is None else max_grad_norm)
    trainer = MASCTrainer(model, args, train_dataset=synthetic["forget10"], processing_class=tok)
    calls = []
    original = trainer._clip_grad_norm
    monkeypatch.setattr(trainer, "_clip_grad_norm", lambda m: calls.append(1) or original(m))
    trainer.train()
    assert trainer.state.global_step == 2
    assert len(calls) == (2 if clips else 0)  # one clip per optimizer step when asked, none by default


def test_v2_bench_preset_uses_the_short_answer_continuation_minimum_and_the_auto_recipe(tmp_path):
    from pathlib import Path

    import tomllib

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "configs" / "smollm2-135m-v2.toml"
    presets = tomllib.loads(path.read_text(encoding="utf-8"))
    masc = presets["methods"]["masc"]
    settings = {k: v for name in masc["use"] for k, v in presets["shared"][name].items()}
    settings.update(masc["settings"], **masc["demo"], bf16=False)
    assert "continuation_min_prefix_tokens" not in settings and "continuation_min_suffix_tokens" not in settings
    cfg = _config(tmp_path, **settings)
    assert (cfg.continuation_min_prefix_tokens, cfg.continuation_min_suffix_tokens) == (8, 8)
    assert cfg.recipe == "auto" and cfg.max_grad_norm == 0.0
    assert cfg.resolved_for(_Sized(134_515_008))[0].recipe == "small"  # SmolLM2-135M's parameter count


def test_bench_table_says_when_masc_reached_its_step_ceiling():
    from unlearn_bench.report import markdown_table, step_ceiling_notes

    reference = {"forget_quality": 1.0, "model_utility": 0.3}
    budget = {"forget_quality": 1e-3, "steps": 600, "info": {"stop_reason": "budget", "global_step": 600}}
    rule = {"forget_quality": 1e-3, "steps": 178, "info": {"stop_reason": "rule", "global_step": 178}}
    results = {"target": reference, "retain_reference": reference, "rows": {"masc": budget, "npo": {"steps": 40}}}
    table = markdown_table(results)
    assert "masc reached its step ceiling (600 steps) without its own stop" in table
    assert step_ceiling_notes({"masc": rule, "npo": {"steps": 40}}) == []
    assert "step ceiling" not in markdown_table({**results, "rows": {"masc": rule}})
    assert step_ceiling_notes({"masc": {**budget, "error": "boom"}}) == []
