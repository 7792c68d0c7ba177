"""The memory plan on constructed configs: parameter counts against real (meta-device) models, the parts of the
peak against their formulas, and the one-line refusal with options that do fit."""

from __future__ import annotations

import warnings

import pytest
import torch

from hf_unlearn.memory_plan import (
    GIB,
    MethodNeeds,
    ModelShape,
    Settings,
    activation_bytes,
    check_plan_fits,
    check_run_memory,
    fitting_options,
    lora_parameter_count,
    parameter_count,
    plan_memory,
)
from hf_unlearn.options import UserError

LLAMA_31_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                   num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False)
LLAMA_2_7B = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False)
TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=200, tie_word_embeddings=False)


def _config(**numbers):
    from transformers import LlamaConfig

    return LlamaConfig(**numbers)


def _meta_model(config):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("tied", [False, True])
def test_parameter_count_matches_a_built_model(tied):
    config = _config(**{**TINY, "tie_word_embeddings": tied})
    model = _meta_model(config)
    assert parameter_count(ModelShape.from_config(config)) == sum(p.numel() for p in model.parameters())


def test_parameter_counts_of_the_published_shapes():
    assert parameter_count(ModelShape.from_config(_config(**LLAMA_31_8B))) == 8_030_261_248
    assert parameter_count(ModelShape.from_config(_config(**LLAMA_2_7B))) == 6_738_415_616


def test_lora_parameter_count_matches_peft():
    from peft import LoraConfig, get_peft_model

    config = _config(**TINY)
    shape = ModelShape.from_config(config)
    for targets in (None, ["q_proj", "k_proj", "down_proj"], "all-linear"):
        model = get_peft_model(_meta_model(config), LoraConfig(r=3, target_modules=targets))
        built = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
        assert lora_parameter_count(shape, 3, targets) == built, targets


def test_plan_parts_follow_their_formulas():
    shape = ModelShape.from_config(_config(**TINY))
    p = parameter_count(shape)
    full = plan_memory(shape, MethodNeeds(trains=True, reference=True), Settings(weight_bytes=2, batch=2, seq_len=8))
    assert full.parts["weights"] == 2 * p and full.parts["gradients"] == 2 * p and full.parts["optimizer"] == 4 * p
    assert full.parts["reference"] == 2 * p
    assert full.parts["activations"] == activation_bytes(shape, 2 * 2 * 8, 2, checkpointing=False, backward=True)
    lora = plan_memory(shape, MethodNeeds(trains=True, reference=True),
                       Settings(weight_bytes=2, batch=2, seq_len=8, lora_r=4))
    n_lora = lora_parameter_count(shape, 4)
    assert lora.parts["reference"] == 0 and lora.parts["gradients"] == 4 * n_lora
    assert lora.parts["weights"] == 2 * p + 4 * n_lora and lora.parts["optimizer"] == 8 * n_lora
    edit = plan_memory(shape, MethodNeeds(trains=False, extra={"second moments": 123}), Settings(batch=2, seq_len=8))
    assert edit.parts["gradients"] == edit.parts["optimizer"] == 0 and edit.parts["second moments"] == 123
    checkpointed = activation_bytes(shape, 32, 2, checkpointing=True, backward=True)
    assert checkpointed < full.parts["activations"]


def test_llama_31_8b_full_finetune_with_reference_is_refused_on_80_gib_with_options_that_fit():
    shape = ModelShape.from_config(_config(**LLAMA_31_8B))
    needs, settings = MethodNeeds(trains=True, reference=True), Settings(weight_bytes=2, batch=4, seq_len=256)
    capacity = 80 * GIB
    plan = plan_memory(shape, needs, settings)
    assert plan.parts["weights"] == plan.parts["reference"] == 2 * 8_030_261_248 and plan.total > capacity
    with pytest.raises(UserError) as raised:
        check_plan_fits(shape, needs, settings, capacity, "npo", "cuda:0")
    message = str(raised.value)
    assert "\n" not in message and "npo needs about" in message and "it fits with" in message
    fix = fitting_options(shape, needs, settings, capacity)
    assert fix and all(option in message for option in fix)
    changed = {"--use_peft": {"lora_r": 16}, "--gradient_checkpointing True": {"checkpointing": True},
               "--dtype bfloat16": {"weight_bytes": 2}, "--per_device_train_batch_size 1": {"batch": 1}}
    fixed = Settings(**{**settings.__dict__, **{k: v for o in fix for k, v in changed[o].items()}})
    assert plan_memory(shape, needs, fixed).total <= capacity
    lora = Settings(weight_bytes=2, batch=4, seq_len=256, lora_r=16)
    assert check_plan_fits(shape, needs, lora, capacity, "npo", "cuda:0").total < 40 * GIB


def test_check_run_memory_asks_the_registry_what_the_method_needs(tmp_path):
    from hf_unlearn.model_options import ModelOptions
    from hf_unlearn.registry import get_method

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        npo = get_method("npo").config_cls(output_dir=str(tmp_path), report_to="none",
                                                    per_device_train_batch_size=8)
        ga = get_method("grad_ascent").config_cls(output_dir=str(tmp_path), report_to="none",
                                                            per_device_train_batch_size=8)
    config = _config(**LLAMA_31_8B)
    with pytest.raises(UserError, match="--use_peft"):
        check_run_memory("npo", npo, config, ModelOptions(dtype="bfloat16"), "cuda:0", 256, 2, capacity=80 * GIB)
    plan = check_run_memory("npo", npo, config, ModelOptions(dtype="bfloat16", use_peft=True), "cuda:0", 256, 2,
                            capacity=80 * GIB)
    assert plan.parts["reference"] == 0 and plan.parts["gradients"] > 0
    no_reference = check_run_memory("grad_ascent", ga, config, ModelOptions(dtype="bfloat16", use_peft=True),
                                    "cuda:0", 256, 2, capacity=80 * GIB)
    assert no_reference.parts["activations"] < plan.parts["activations"]  # no retain pairing: half the tokens
    assert check_run_memory("npo", npo, config, ModelOptions(), "cpu", 256, 4) is None  # nothing to check on a CPU


def test_a_run_that_does_not_fit_the_gpu_is_refused_before_the_model_loads(tiny_pair, synthetic, tmp_path,
                                                                           monkeypatch):
    import hf_unlearn.memory_plan as memory_plan
    import hf_unlearn.run as run_path
    from hf_unlearn.model_options import ModelOptions
    from hf_unlearn.run import UnlearnRequest, unlearn

    monkeypatch.setattr(memory_plan, "device_capacity", lambda device: 1000 if device == "cuda:0" else None)
    monkeypatch.setattr(run_path, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    request = UnlearnRequest("npo", str(tiny_pair.target), tmp_path / "out", {"max_steps": 1}, "synthetic",
                             device="cuda:0", model_options=ModelOptions())
    with pytest.raises(UserError, match=r"npo needs about .* on cuda:0, which holds 0\.0 GiB"):
        unlearn(request)
