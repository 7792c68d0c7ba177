"""TRL's model options (``--dtype``, ``--use_peft``, ``--lora_*``, ``--gradient_checkpointing``) from the command
line and the scripts reach the trainer: the model's dtype, a PEFT adapter with the given rank, alpha and
targets, gradient checkpointing on, and no second model for the reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hf_unlearn.cli import main
from hf_unlearn.model_options import ModelOptions, parse_model_options
from hf_unlearn.options import UserError

LORA = ["--use_peft", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules", "q_proj", "v_proj"]


def test_model_options_are_trls_names_defaults_and_help():
    from trl import ModelConfig

    trl_fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
    for f in dataclasses.fields(ModelOptions):
        assert f.name in trl_fields, f.name
        assert f.default == trl_fields[f.name].default, f.name
        assert f.metadata["help"] == trl_fields[f.name].metadata["help"], f.name
    assert ModelOptions().dtype == "float32" and ModelOptions().torch_dtype() is torch.float32
    assert ModelOptions(dtype="auto").torch_dtype() == "auto"


def test_parse_model_options_leaves_the_method_its_own_fields():
    options, rest = parse_model_options([*LORA, "--dtype", "bfloat16", "--beta", "0.2"])
    assert rest == ["--beta", "0.2"] and options.torch_dtype() is torch.bfloat16
    peft = options.peft_config()
    assert (peft.r, peft.lora_alpha, set(peft.target_modules)) == (4, 8, {"q_proj", "v_proj"})
    # a config that trains its own adapter (same names) keeps the options
    options, rest = parse_model_options(["--use_peft", "False", "--lora_r", "8"], exclude={"use_peft", "lora_r"})
    assert rest == ["--use_peft", "False", "--lora_r", "8"] and not options.use_peft
    with pytest.raises(UserError, match="dtype"):
        parse_model_options(["--dtype", "float8"])



def test_cli_options_reach_the_trainer(tiny_pair, tmp_path, monkeypatch, capsys):
    from peft import PeftModel

    import hf_unlearn.run as run_path

    seen = {}
    real = run_path.unlearn

    def spy(request, **kwargs):
        done = real(request, **kwargs)
        seen["result"] = done.result
        return done

    monkeypatch.setattr(run_path, "unlearn", spy)
    code = main(["unlearn", "--method", "npo", "--model", str(tiny_pair.target), "--data", "synthetic",
                 "--output", str(tmp_path / "out"), "--dtype", "bfloat16", *LORA, "--gradient_checkpointing", "True",
                 "--max_steps", "1", "--per_device_train_batch_size", "2", "--learning_rate", "1e-3"])
    assert code == 0, capsys.readouterr().err
    trainer = seen["result"].info["trainer"]
    model = trainer.model
    assert isinstance(model, PeftModel)
    lora = model.peft_config["default"]
    assert (lora.r, lora.lora_alpha, set(lora.target_modules)) == (4, 8, {"q_proj", "v_proj"})
    base = model.get_base_model()
    assert base.model.embed_tokens.weight.dtype is torch.bfloat16
    assert trainer.args.gradient_checkpointing and base.is_activation_checkpointing
    assert trainer.ref_model is None  # NPO's reference is the base with its adapter disabled
    assert (tmp_path / "out" / "adapter_config.json").is_file()


def test_use_peft_is_refused_for_a_method_without_a_trainer(tiny_pair, tmp_path, capsys):
    code = main(["unlearn", "--method", "grom", "--model", str(tiny_pair.target), "--data", "synthetic",
                 "--output", str(tmp_path / "out"), "--use_peft"])
    assert code == 2 and "--use_peft" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_float16_weights_are_refused_for_a_full_finetune_before_work(tmp_path):
    from hf_unlearn.run import UnlearnRequest, check_request

    def run(method, **options):
        return UnlearnRequest(method, "model", tmp_path / method, {}, "synthetic", model_options=ModelOptions(**options))

    with pytest.raises(UserError, match="--dtype float16.*master weights"):
        check_request(run("npo", dtype="float16"))
    check_request(run("npo", dtype="float16", use_peft=True))  # the adapter trains in float32
    check_request(run("npo", dtype="bfloat16"))
    check_request(run("masc", dtype="float16"))  # MASC trains its own adapter
