"""Quantization and relearning attacks: the int8 round trip equals a slow reference and the real ``Linear8bitLt``
layers agree with it (bitsandbytes' AVX512-BF16 flag forced on and off), relearning on 10% of the forget rows
after gradient ascent recovers part of the gap on the other 90% (and nothing with no steps or a zero learning
rate), and no attack changes the caller's model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from hf_unlearn.data import collate_qa, tokenize_qa
from hf_unlearn.evaluation.attack_measure import DECODING_KEPT, artifact_decoding, recovered_fraction
from hf_unlearn.evaluation.attack_relearn import split_forget_rows
from hf_unlearn.evaluation.attacks import (
    attack_summary,
    format_attacks,
    parse_attacks,
    quantization_attack,
    relearning_attack,
)
from hf_unlearn.evaluation.quantization import INT8_MAX, int8_roundtrip, quantize_int8
from hf_unlearn.logprobs import causal_lm_scorer, mean_answer_nll


def int8_roundtrip_reference(weight: torch.Tensor) -> torch.Tensor:
    """Slow pure-torch LLM.int8() round trip, one row at a time."""
    rows = weight.detach().to(torch.float16).float()
    out = torch.zeros_like(rows)
    for r in range(rows.shape[0]):
        scale = rows[r].abs().max()
        if scale == 0:
            continue
        codes = torch.round(rows[r] * (INT8_MAX / scale)).clamp(-INT8_MAX, INT8_MAX)
        out[r] = codes * scale / INT8_MAX
    return out.to(weight.dtype)


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_unchanged(model: nn.Module, snapshot: dict[str, torch.Tensor]) -> None:
    state = model.state_dict()
    assert state.keys() == snapshot.keys()
    for key, value in snapshot.items():  # the same tensors, re-read: bit-identical
        assert torch.equal(state[key], value), key
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("shape", [(176, 64), (64, 176), (5, 13), (1, 300)])
def test_int8_roundtrip_equals_slow_reference(shape):
    torch.manual_seed(0)
    weight = torch.randn(*shape) * 0.05
    weight[0, 0] = 0.3  # an outlier: its row's scale is much larger
    if shape[0] > 2:
        weight[2] = 0.0  # a row of zeros stays zero (no 0/0)
    fast = int8_roundtrip(weight)
    reference = int8_roundtrip_reference(weight)
    torch.testing.assert_close(fast, reference, rtol=1e-6, atol=1e-7)
    assert torch.isfinite(fast).all()
    assert not torch.equal(fast, weight)
    step = weight.half().float().abs().amax(dim=1, keepdim=True) / 127
    # within half a quantization step (of the float16 cast, itself within 2^-11 relative)
    assert ((fast - weight).abs() <= 0.501 * step + weight.abs() * 2.0**-10).all()
    for row in range(shape[0]):
        assert len(torch.unique(fast[row])) <= 255


def _tiny_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=64, tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("avx512bf16", [False, True])
def test_int8_bnb_layers_agree_with_the_roundtrip(monkeypatch, avx512bf16):
    import bitsandbytes as bnb
    import bitsandbytes.functional as functional
    import bitsandbytes.nn.modules as bnb_modules

    monkeypatch.setattr(bnb_modules, "has_avx512bf16", lambda: avx512bf16)
    monkeypatch.setattr(functional, "has_avx512bf16", lambda: avx512bf16)
    model = _tiny_llama()
    before = _snapshot(model)
    real = quantize_int8(model, method="bnb")
    roundtrip = quantize_int8(model)
    layer = real.model.layers[0].mlp.down_proj
    assert isinstance(layer, bnb.nn.Linear8bitLt)
    weight = model.model.layers[0].mlp.down_proj.weight
    # the stored int8 weights are the round trip's
    stored = layer.weight.data.float() * layer.weight.SCB.float().unsqueeze(-1) / 127
    torch.testing.assert_close(stored, int8_roundtrip(weight), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(roundtrip.model.layers[0].mlp.down_proj.weight, int8_roundtrip(weight))
    torch.testing.assert_close(roundtrip.lm_head.weight, model.lm_head.weight)  # the head stays full precision
    ids = torch.arange(24).reshape(2, 12) % 96
    with torch.no_grad():
        full, out, reference = (m(input_ids=ids).logits for m in (model, real, roundtrip))
    assert torch.isfinite(out).all()
    # same weights; the real layers also quantize activations row-wise (int8), a small extra error
    assert (out - reference).abs().max() <= 0.05 * reference.abs().max() + 1e-3
    assert (reference - full).abs().max() > 1e-6  # quantization really happened
    _assert_unchanged(model, before)
    with pytest.raises(ValueError, match="method"):
        quantize_int8(model, method="int4")


class _MeanNLLCriterion:
    """A reference-free stand-in criterion: mean answer NLL on fixed rows (records what it was given)."""

    def __init__(self, rows):
        self.rows, self.calls = rows, 0

    def measure(self, model, tokenizer, scorer=None):
        self.calls += 1
        return {"nll": mean_answer_nll(model, tokenizer, self.rows, scorer=scorer)}


@pytest.mark.parametrize("avx512bf16", [False, True])
def test_quantization_attack_reports_each_bit_width_and_leaves_the_model(monkeypatch, tiny_pair, tiny_target,
                                                                         synthetic, avx512bf16):
    import bitsandbytes.nn.modules as bnb_modules
    from peft import LoraConfig, get_peft_model

    from hf_unlearn.demo import load_tiny

    monkeypatch.setattr(bnb_modules, "has_avx512bf16", lambda: avx512bf16)
    model, tokenizer = tiny_target
    original, _ = load_tiny(tiny_pair.target)
    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["down_proj"], init_lora_weights=False))
    before = _snapshot(peft_model)
    forget = synthetic["forget10"][:6]
    criterion = _MeanNLLCriterion(synthetic["retain90"][:3])
    result = quantization_attack(peft_model, tokenizer, forget, original=original, criterion=criterion,
                                 method="bnb" if avx512bf16 else "roundtrip", max_new_tokens=8, batch_size=8)
    _assert_unchanged(peft_model, before)
    assert result["attack"] == "quantization" and result["decoding"] is None
    assert set(result["bits"]) == {"4", "8"}
    full = result["full_precision"]
    merged_nll = mean_answer_nll(peft_model, tokenizer, forget)
    np.testing.assert_allclose(full["forget_nll"], merged_nll, rtol=1e-6)  # the adapter is part of the model
    assert criterion.calls == 4  # full precision, original, 4-bit, 8-bit
    for bits, entry in result["bits"].items():
        assert entry["bits"] == int(bits) and entry["scheme"] == ("nf4" if bits == "4" else "int8")
        assert 0 <= entry["forget_rouge_l"] <= 1 and "nll" in entry["criterion"]
        np.testing.assert_allclose(entry["delta_forget_nll"], entry["forget_nll"] - full["forget_nll"])
        assert entry["forget_nll"] != full["forget_nll"]  # really quantized
    # 8-bit moves the answers less than 4-bit does
    assert abs(result["bits"]["8"]["delta_forget_nll"]) < abs(result["bits"]["4"]["delta_forget_nll"])
    summary = attack_summary({"quantization": result})
    assert summary["attack_nf4_forget_rouge_l"] == result["bits"]["4"]["forget_rouge_l"]
    assert summary["attack_relearn_recovered"] is None
    assert "8-bit int8" in format_attacks({"quantization": result})
    with pytest.raises(ValueError, match="bits"):
        quantization_attack(peft_model, tokenizer, forget, bits=(3,))
    with pytest.raises(ValueError, match="measure"):
        quantization_attack(peft_model, tokenizer, forget, criterion=object())


def _gradient_ascent(model: nn.Module, tokenizer, rows, steps: int = 4, lr: float = 1e-3) -> None:
    """A few full-batch gradient-ascent steps on the forget rows (maximise the answer NLL)."""
    batch = collate_qa([tokenize_qa(tokenizer, r["question"], r["answer"]) for r in rows], tokenizer.pad_token_id)
    scorer = causal_lm_scorer(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    n = (batch["labels"][:, 1:] != -100).sum()
    model.train()
    for _ in range(steps):
        log_probs = scorer(batch["input_ids"], batch["attention_mask"], batch["position_ids"], batch["labels"])
        loss = log_probs.sum() / n  # = -NLL: descending it ascends the NLL
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.zero_grad(set_to_none=True)
    model.eval()


def test_relearning_on_a_tenth_of_the_forget_rows_recovers_the_rest(tiny_pair, tiny_target, synthetic):
    from hf_unlearn.demo import load_tiny

    model, tokenizer = tiny_target
    original, _ = load_tiny(tiny_pair.target)
    forget, retain = synthetic["forget10"], synthetic["retain90"][:16]
    _gradient_ascent(model, tokenizer, forget)
    assert mean_answer_nll(model, tokenizer, forget) > mean_answer_nll(original, tokenizer, forget) + 1.0
    before = _snapshot(model)
    common = {"original": original, "learning_rate": 3e-3, "max_new_tokens": 12, "progress": False}
    result = relearning_attack(model, tokenizer, forget, retain, **common)
    _assert_unchanged(model, before)
    attack_rows, eval_rows = split_forget_rows(forget, 0.1, 0)
    assert result["num_attack_rows"] == len(attack_rows) == 2 and result["num_eval_rows"] == len(eval_rows) == 18
    assert not {r["question"] for r in attack_rows} & {r["question"] for r in eval_rows}
    np.testing.assert_allclose(result["forget_nll_before"], mean_answer_nll(model, tokenizer, eval_rows), rtol=1e-6)
    np.testing.assert_allclose(result["forget_nll_original"], mean_answer_nll(original, tokenizer, eval_rows),
                               rtol=1e-6)
    assert len(result["train_loss"]) == 10
    # the attack trained on 2 rows recovers a measurable part of the gap on the 18 others
    assert result["forget_nll_after"] < result["forget_nll_before"]
    assert result["recovered_fraction"] > 0.2, result["recovered_fraction"]
    np.testing.assert_allclose(result["recovered_fraction"], recovered_fraction(
        result["forget_nll_before"], result["forget_nll_after"], result["forget_nll_original"]))
    assert result["benign"] is not None and result["benign"]["num_train_rows"] == 16
    assert np.isfinite(result["benign"]["recovered_fraction"])
    assert 0 <= result["forget_rouge_l_after"] <= 1
    # no steps, or a zero learning rate: the attack changes nothing
    for null in ({"steps": 0}, {"learning_rate": 0.0}):
        nothing = relearning_attack(model, tokenizer, forget, **{**common, **null}, rouge=False)
        assert abs(nothing["recovered_fraction"]) < 1e-4, (null, nothing["recovered_fraction"])
        assert nothing["forget_rouge_l_after"] is None and nothing["benign"] is None
    _assert_unchanged(model, before)
    summary = attack_summary({"relearning": result})
    assert summary["attack_relearn_recovered"] == result["recovered_fraction"]
    assert summary["attack_benign_recovered"] == result["benign"]["recovered_fraction"]
    with pytest.raises(ValueError, match="share"):
        relearning_attack(model, tokenizer, forget, share=1.0)
    with pytest.raises(ValueError, match="steps"):
        relearning_attack(model, tokenizer, forget, steps=-1)


def test_attacks_on_a_t3_result_keep_the_head(tiny_target, synthetic):
    from hf_unlearn.methods.t3 import T3Classifier, T3ClassifierConfig, t3_scorer

    model, tokenizer = tiny_target
    torch.manual_seed(0)
    head = T3Classifier(T3ClassifierConfig(rank=4, tilt_weight=4.0).for_base(model)).eval()
    with torch.no_grad():
        head.up.weight.normal_(0.0, 3.0)  # a head that really tilts the distribution
    before, head_before = _snapshot(model), _snapshot(head)
    decoding = artifact_decoding(head)
    forget = synthetic["forget10"][:6]
    quant = quantization_attack(model, tokenizer, forget, bits=(8,), decoding=decoding, rouge=False)
    relearn = relearning_attack(model, tokenizer, forget, decoding=decoding, steps=2, learning_rate=1e-3, rouge=False,
                                progress=False)
    _assert_unchanged(model, before)
    _assert_unchanged(head, head_before)
    assert quant["decoding"] == relearn["decoding"] == DECODING_KEPT
    tilted = mean_answer_nll(model, tokenizer, forget, scorer=t3_scorer(model, head))
    np.testing.assert_allclose(quant["full_precision"]["forget_nll"], tilted, rtol=1e-6)  # scored through the head
    assert abs(tilted - mean_answer_nll(model, tokenizer, forget)) > 1e-3
    _, eval_rows = split_forget_rows(forget, 0.1, 0)
    np.testing.assert_allclose(relearn["forget_nll_before"], mean_answer_nll(
        model, tokenizer, eval_rows, scorer=t3_scorer(model, head)), rtol=1e-6)
    assert abs(relearn["forget_nll_after"] - relearn["forget_nll_before"]) > 1e-3  # the base was fine-tuned
    unchanged = relearning_attack(model, tokenizer, forget, decoding=decoding, steps=0, rouge=False, progress=False)
    np.testing.assert_allclose(unchanged["forget_nll_after"], unchanged["forget_nll_before"], rtol=1e-6)
    assert "decoding-time artifact kept, not refitted" in format_attacks({"quantization": quant})


def test_evaluate_tofu_adds_the_attack_section(tiny_target):
    from hf_unlearn.evaluation import evaluate_tofu

    model, tokenizer = tiny_target
    before = _snapshot(model)
    report = evaluate_tofu(model, tokenizer, source="synthetic", max_examples=4, max_new_tokens=8, progress=False,
                           membership_inference=False,
                           attacks={"quant": {"bits": (8,)}, "relearn": {"steps": 1, "share": 0.25}})
    _assert_unchanged(model, before)
    attacks = report.attacks
    assert set(attacks) == {"quantization", "relearning"}
    assert attacks["relearning"]["num_eval_rows"] == 3 and attacks["relearning"]["benign"] is not None
    assert report.attack_int8_forget_rouge_l == attacks["quantization"]["bits"]["8"]["forget_rouge_l"]
    assert report.attack_nf4_forget_rouge_l is None
    assert report.settings["attacks"] == ["quant", "relearn"]
    with pytest.raises(ValueError, match="Unknown attack"):
        evaluate_tofu(model, tokenizer, source="synthetic", max_examples=4, attacks=["prune"])
    with pytest.raises(ValueError, match="decoding"):  # a custom scorer cannot score the attacked copies
        evaluate_tofu(model, tokenizer, source="synthetic", max_examples=4, attacks="quant",
                      scorer=causal_lm_scorer(model))

    # the model card's model-index carries the attack figures that were computed
    from hf_unlearn.hub import build_model_card

    card = build_model_card("unlearned_model", report.model_name, method="grad_ascent", report=report)
    metrics = {r.metric_type: r.metric_value for r in card.data.eval_results}
    assert metrics["rouge_l_recall_int8_attack"] == pytest.approx(report.attack_int8_forget_rouge_l)
    assert metrics["forget_nll_relearn_attack"] == pytest.approx(attacks["relearning"]["forget_nll_after"])
    assert "rouge_l_recall_nf4_attack" not in metrics  # not computed: left out

    # the benchmark's attack table: a column per attack figure for every row, the references as anchors
    from unlearn_bench.report import attacks_table

    anchor = {"forget_rouge_l": report.forget_rouge_l, **attack_summary(attacks), "attacks": attacks}
    results = {"target": anchor, "retain_reference": dict(anchor), "rows": {"npo": {"attack_error": "ValueError: x"}}}
    table = attacks_table(results)
    lines = table.splitlines()
    assert "relearning recovered" in lines[0] and "forget ROUGE-L (int8 attack)" in lines[0]
    assert lines[2].startswith("| target |") and lines[3].startswith("| retain reference |")
    assert f"{report.attack_int8_forget_rouge_l:.3f}" in lines[2] and "failed: ValueError" in lines[4]
    assert attacks_table({"target": {}, "retain_reference": {}, "rows": {}}) is None


def test_cli_eval_refuses_bad_attacks_before_loading(capsys):
    from hf_unlearn.cli import main

    missing = "/nonexistent/model"  # never loaded: the options are refused first
    assert main(["eval", "--model", missing, "--data", "synthetic", "--attacks", "quant,prune"]) == 2
    assert "Unknown attack 'prune'" in capsys.readouterr().err
    assert main(["eval", "--model", missing, "--data", "synthetic", "--attack-original", missing]) == 2
    assert "--attack-original needs --attacks" in capsys.readouterr().err
    assert main(["eval", "--model", missing, "--data", "synthetic", "--attacks", "relearn",
                 "--relearn-steps", "-1"]) == 2
    assert "steps must be a non-negative integer" in capsys.readouterr().err


def test_parse_attacks():
    assert parse_attacks(None) == {} and parse_attacks("") == {}
    assert parse_attacks("quant, relearning") == {"quant": {}, "relearn": {}}
    assert parse_attacks({"quantization": {"bits": (4,)}}) == {"quant": {"bits": (4,)}}
    with pytest.raises(ValueError, match="Unknown attack"):
        parse_attacks("quant,prune")
    with pytest.raises(ValueError, match="dict"):
        parse_attacks({"quant": 4})
    assert recovered_fraction(2.0, 2.0, 2.0) is None and recovered_fraction(3.0, 2.0, 1.0) == 0.5
