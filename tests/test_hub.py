"""Hub round trips through a local Hub-compatible server (tests/hub_server.py), no other host.

Every push goes through the real huggingface_hub / transformers / peft client code and every pull
through ``from_pretrained`` / ``PeftModel.from_pretrained`` / ``ModelCard.load`` / ``evaluate.load``;
the server refuses (HTTP 501) anything it does not implement and each test checks that it saw the
traffic, that nothing was unimplemented and that no other host was contacted.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

REPORT = {
    "forget_quality": 0.01234,
    "model_utility": 0.5678,
    "forget_rouge_l": 0.4321,
    "forget_truth_ratio": 0.6543,
    "forget_prob": 0.2,
    "forget_split": "forget10",
}




def _logits(model, tokenizer) -> torch.Tensor:
    batch = tokenizer(["Question: Who wrote the book?\nAnswer:", "Question: Where was she born?\nAnswer: In"],
                      return_tensors="pt", padding=True)
    model.eval()
    with torch.no_grad():
        return model(**batch).logits


def _assert_same_floats(got: torch.Tensor, want: torch.Tensor, where: str = "") -> None:
    """float32 outputs of a model or head pulled from the Hub against the in-memory one. The weights round-trip
    byte for byte, but the pulled tensors are fresh contiguous copies, so the BLAS path (hence the last bits) may
    differ; 1e-5 of the largest output is ~100 float32 roundings, far below any real change of a weight."""
    scale = float(want[want.isfinite()].abs().max())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale, msg=lambda m: f"{where} {m}".strip())


def _card_metrics(card) -> dict[str, float]:
    return {r.metric_type: r.metric_value for r in card.data.eval_results}


def _expected_metrics(report) -> dict[str, float]:
    return {"forget_quality": report["forget_quality"], "model_utility": report["model_utility"],
            "rouge_l_recall": report["forget_rouge_l"], "truth_ratio": report["forget_truth_ratio"]}


def _push_base(hub, model, tokenizer, repo_id="tester/tiny-target") -> str:
    """Publish the base model with transformers' native push_to_hub (model + tokenizer)."""
    model.push_to_hub(repo_id, token=hub.token)
    tokenizer.push_to_hub(repo_id, token=hub.token)
    return repo_id


def test_model_round_trip_native_and_push_unlearned(hub, tiny_target):
    from huggingface_hub import ModelCard
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_unlearn.hub import push_unlearned
    from hf_unlearn.result import Unlearned

    model, tokenizer = tiny_target
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    reference = _logits(model, tokenizer)

    # native transformers push, then pull through the server
    base_id = _push_base(hub, model, tokenizer)
    pulled = AutoModelForCausalLM.from_pretrained(base_id)
    _assert_same_floats(_logits(pulled, tokenizer), reference)

    # an "unlearned" model (weights changed) pushed with card + report in one commit
    with torch.no_grad():
        model.lm_head.weight.mul_(0.9)
    unlearned = _logits(model, tokenizer)
    report = dict(REPORT, base_model=base_id)
    before = len(hub.requests)
    result = Unlearned(method="npo", model=model, artifact=model, settings={"beta": 0.1, "learning_rate": 1e-4},
                       trainable_params=1, total_params=1)  # what hf_unlearn.run.fit_or_train returns
    info = push_unlearned(result, "tester/tiny-npo", report, token=hub.token, tokenizer=tokenizer,
                          base_model=base_id, dataset="synthetic")
    commits = hub.commits("tester/tiny-npo")
    assert len(commits) == 2 and commits[-1].oid == info.oid  # repo creation + ONE upload commit
    files = hub.files("tester/tiny-npo")
    assert {"config.json", "model.safetensors", "README.md", "tokenizer.json", "unlearning_report.json"} <= set(files)
    assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in files)
    assert json.loads(files["unlearning_report.json"]) == report
    assert any(path.startswith("/api/models/tester/tiny-npo/commit/") for _, path in hub.requests[before:])

    pulled = AutoModelForCausalLM.from_pretrained("tester/tiny-npo")
    pulled_tok = AutoTokenizer.from_pretrained("tester/tiny-npo")
    pulled_tok.pad_token = pulled_tok.pad_token or pulled_tok.eos_token
    _assert_same_floats(_logits(pulled, pulled_tok), unlearned)
    assert not torch.equal(unlearned, reference)

    card = ModelCard.load("tester/tiny-npo")
    assert card.data.base_model == base_id
    assert card.data.library_name == "transformers"
    assert {"unlearning", "npo"} <= set(card.data.tags)
    assert _card_metrics(card) == _expected_metrics(report)
    assert "forget10" in card.text and "`beta` | `0.1`" in card.text
    assert 'AutoModelForCausalLM.from_pretrained("tester/tiny-npo")' in card.text


def test_peft_adapter_round_trip(hub, tiny_target, tmp_path):
    from huggingface_hub import HfApi, ModelCard
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from hf_unlearn.hub import push_unlearned

    model, tokenizer = tiny_target
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    local_base = str(model.config._name_or_path)
    base_id = _push_base(hub, model, tokenizer)
    base_logits = _logits(model, tokenizer)

    torch.manual_seed(0)
    adapter = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                               init_lora_weights=False))
    adapted = _logits(adapter, tokenizer)
    assert not torch.allclose(adapted, base_logits)

    report = dict(REPORT, base_model=local_base)  # the evaluator saw the local base folder
    push_unlearned(adapter, "tester/tiny-lora", report, token=hub.token, method="grad_diff", base_model=base_id)
    files = hub.files("tester/tiny-lora")
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= set(files)
    assert len(hub.commits("tester/tiny-lora")) == 2

    adapter.push_to_hub("tester/tiny-lora-native", token=hub.token)  # PEFT's own push
    adapter.save_pretrained(tmp_path / "saved-adapter")  # a saved folder is pushed the same way
    push_unlearned(tmp_path / "saved-adapter", "tester/tiny-lora-folder", report, token=hub.token,
                   method="grad_diff", base_model=base_id)
    assert ModelCard.load("tester/tiny-lora-folder").data.library_name == "peft"

    for repo_id in ("tester/tiny-lora", "tester/tiny-lora-native", "tester/tiny-lora-folder"):
        base = AutoModelForCausalLM.from_pretrained(base_id)
        pulled = PeftModel.from_pretrained(base, repo_id)
        _assert_same_floats(_logits(pulled, tokenizer), adapted, repo_id)

    card = ModelCard.load("tester/tiny-lora")
    assert card.data.base_model == base_id and card.data.library_name == "peft"
    assert {"unlearning", "grad_diff"} <= set(card.data.tags)
    assert _card_metrics(card) == _expected_metrics(report)
    assert 'PeftModel.from_pretrained(base, "tester/tiny-lora")' in card.text
    info = HfApi().model_info("tester/tiny-lora")  # the server reports the card metadata too
    assert info.card_data["library_name"] == "peft"


def test_grom_adapter_and_t3_head_round_trip(hub, tiny_target, synthetic):
    """A real GROM edit (PEFT LoRA) and a real T3 head pushed with push_unlearned and pulled back."""
    from huggingface_hub import ModelCard
    from peft import PeftModel
    from transformers import AutoModel, AutoModelForCausalLM

    from hf_unlearn.hub import detect_artifact_kind, push_unlearned
    from hf_unlearn.methods.grom import GROMConfig, fit_grom
    from hf_unlearn.methods.t3 import T3Classifier, T3ClassifierConfig, fit_t3, t3_log_probs

    model, tokenizer = tiny_target
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    local_base = str(model.config._name_or_path)
    base_id = _push_base(hub, model, tokenizer)
    forget, retain = synthetic["forget10"][:6], synthetic["retain90"][:24]
    report = dict(REPORT, model_name=local_base)  # evaluate_tofu names the evaluated (in-memory) model

    edit = fit_grom(model, tokenizer, forget, retain, GROMConfig(layers=[1], progress=False))
    assert detect_artifact_kind(edit) == "grom_adapter"
    push_unlearned(edit, "tester/tiny-grom", report, token=hub.token, base_model=base_id)
    files = hub.files("tester/tiny-grom")
    assert {"adapter_config.json", "adapter_model.safetensors", "grom_metadata.json", "README.md"} <= set(files)
    pulled = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_id), "tester/tiny-grom")
    pulled_logits = _logits(pulled, tokenizer)
    base_logits = _logits(model, tokenizer)
    edited = edit.to_peft(model)  # wraps the local model in place
    _assert_same_floats(pulled_logits, _logits(edited, tokenizer))
    assert not torch.allclose(pulled_logits, base_logits)
    card = ModelCard.load("tester/tiny-grom")
    assert card.data.library_name == "peft" and card.data.tags[:2] == ["unlearning", "grom"]
    assert _card_metrics(card) == _expected_metrics(REPORT) and "`ridge` | `0.01`" in card.text
    base = edited.unload()  # the plain base again for T3

    clf = fit_t3(base, tokenizer, forget, retain, T3ClassifierConfig(rank=4), steps=20, progress=False)
    assert detect_artifact_kind(clf) == "t3_classifier"
    push_unlearned(clf, "tester/tiny-t3", report, token=hub.token, base_model=base_id,
                   settings={"rank": 4, "temperature": 2.0})
    head = AutoModel.from_pretrained("tester/tiny-t3")
    assert isinstance(head, T3Classifier)
    batch = tokenizer(["Question: Who wrote the book?\nAnswer: A writer"], return_tensors="pt")
    labels = batch["input_ids"].clone()
    kwargs = dict(temperature=2.0)
    want = t3_log_probs(base, clf, batch["input_ids"], labels, batch["attention_mask"], **kwargs)
    got = t3_log_probs(base, head, batch["input_ids"], labels, batch["attention_mask"], **kwargs)
    _assert_same_floats(got, want)
    # The pulled head rebuilds an identical processor (its decoding defaults included): same steps, same tokens.
    from transformers import LogitsProcessorList

    from hf_unlearn.methods.t3 import T3LogitsProcessor

    enc = tokenizer(["Question: Who wrote the book?\nAnswer:", "Question: Where?\nAnswer:"], return_tensors="pt",
                    padding=True)
    runs = []
    for make in (lambda: T3LogitsProcessor(base, clf), lambda: T3LogitsProcessor.from_pretrained(base, "tester/tiny-t3")):
        with make() as t3:
            assert (t3.temperature, t3.tilt_weight) == (clf.config.temperature, clf.config.tilt_weight)
            steps = []
            out = base.generate(**enc, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                                logits_processor=LogitsProcessorList([lambda ids, s, t3=t3, steps=steps:
                                                                      steps.append(t3(ids, s)) or steps[-1]]))
        runs.append((out, torch.stack(steps)))
    assert torch.equal(runs[0][0], runs[1][0])  # token ids
    _assert_same_floats(runs[1][1], runs[0][1])  # the tilted scores of every step
    card = ModelCard.load("tester/tiny-t3")
    assert card.data.tags[:2] == ["unlearning", "t3"] and _card_metrics(card) == _expected_metrics(REPORT)
    assert 'T3LogitsProcessor.from_pretrained(base, "tester/tiny-t3")' in card.text
    assert "| `temperature` | `2.0` |" in card.text and "arxiv.org/abs/2602.10217" in card.text


METRIC_INPUTS = {
    "tofu_truth_ratio": dict(true_losses=[0.5, 1.2, 2.0, 0.1],
                             false_losses=[[1.0, 2.0], [0.9, 1.1], [1.5, 3.0], [2.2, 0.4]]),
    "tofu_forget_quality": dict(predictions=[0.2, 0.5, 0.9, 0.4, 0.7], references=[0.3, 0.6, 0.8, 0.45, 0.75]),
    "tofu_model_utility": dict(predictions=[0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]),
    "tofu_privleak": dict(predictions=[0.9, 0.2, 0.7, 0.4, 0.6], references=[0, 1, 0, 1, 1], reference_auc=0.5),
    "muse_verbmem": dict(predictions=["the cat sat on the mat", "a b c"], references=["the cat sat on a mat", "c b a"]),
    "muse_knowmem": dict(predictions=["1472\n\nQuestion: x", "Paris"], references=["1472", "in Paris"]),
    "muse_privleak": dict(predictions=[0.9, 0.2, 0.7, 0.4, 0.6], references=[0, 1, 0, 1, 1]),
}


def test_metric_spaces_load_by_name(hub):
    import evaluate

    from hf_unlearn import METRIC_NAMES, metric_path
    from hf_unlearn.hub import push_metric_space

    assert set(METRIC_INPUTS) == set(METRIC_NAMES)
    for name in METRIC_NAMES:
        push_metric_space(name, f"tester/{name}", token=hub.token)
        files = hub.files(f"tester/{name}", repo_type="space")
        assert {f"{name}.py", "README.md", "app.py"} <= set(files)
        assert hub.repos[("space", f"tester/{name}")].sdk == "gradio"

        before = len(hub.requests)
        remote = evaluate.load(f"tester/{name}")
        assert ("GET", f"/spaces/tester/{name}/resolve/main/{name}.py") in hub.requests[before:]
        local = evaluate.load(metric_path(name))
        got, want = remote.compute(**METRIC_INPUTS[name]), local.compute(**METRIC_INPUTS[name])
        assert got and got.keys() == want.keys()
        for key in want:
            np.testing.assert_array_equal(np.asarray(got[key], dtype=float), np.asarray(want[key], dtype=float))

    with pytest.raises(ValueError, match="<owner>/tofu_truth_ratio"):
        push_metric_space("tofu_truth_ratio", "tester/truth-ratio", token=hub.token)


def test_push_without_token_uploads_nothing(hub, tiny_target):
    from huggingface_hub.errors import HfHubHTTPError

    from hf_unlearn.hub import push_metric_space, push_unlearned

    model, _ = tiny_target
    with pytest.raises(ValueError, match="No Hugging Face token"):
        push_unlearned(model, "tester/no-token", REPORT, method="npo")
    with pytest.raises(ValueError, match="No Hugging Face token"):
        push_metric_space("tofu_truth_ratio", "tester/tofu_truth_ratio")
    assert hub.requests == [] and hub.repos == {}

    # a wrong token is refused by the Hub before any repo or file exists
    with pytest.raises(HfHubHTTPError):
        push_unlearned(model, "tester/bad-token", REPORT, token="hf_wrong", method="npo")
    assert hub.repos == {}


def test_mismatched_report_is_refused(hub, tiny_target, tmp_path):
    from hf_unlearn.hub import push_unlearned

    model, _ = tiny_target
    base = str(model.config._name_or_path)
    with pytest.raises(ValueError, match="computed for model 'someone/other-model'"):
        push_unlearned(model, "tester/x", dict(REPORT, base_model="someone/other-model"), token=hub.token,
                       method="npo")
    with pytest.raises(ValueError, match="computed for model '/elsewhere/model' \\(model_name\\)"):
        push_unlearned(model, "tester/x", dict(REPORT, model_name="/elsewhere/model"), token=hub.token,
                       method="npo")
    with pytest.raises(ValueError, match="forget split 'forget05'"):
        push_unlearned(model, "tester/x", dict(REPORT, base_model=base, forget_split="forget05"),
                       token=hub.token, method="npo", forget_split="forget10")
    bad = {k: v for k, v in REPORT.items() if k != "model_utility"}
    with pytest.raises(ValueError, match="lacks \\['model_utility'\\]"):
        push_unlearned(model, "tester/x", bad, token=hub.token, method="npo")
    with pytest.raises(ValueError, match="needs a method"):
        push_unlearned(model, "tester/x", REPORT, token=hub.token)
    model.save_pretrained(tmp_path / "pickled")
    torch.save({"w": torch.zeros(1)}, tmp_path / "pickled" / "pytorch_model.bin")  # what we must never publish
    with pytest.raises(ValueError, match="pickle files \\['pytorch_model.bin'\\]"):
        push_unlearned(tmp_path / "pickled", "tester/x", dict(REPORT, model_name=base), token=hub.token,
                       method="npo", base_model=base)
    assert hub.requests == [] and hub.repos == {}


def test_card_template_missing_field(tmp_path):
    from hf_unlearn.hub import build_model_card

    no_split = tmp_path / "no_split.md"
    no_split.write_text("---\n{{ card_data }}\n---\n# {{ repo_id }} {{ method }} of {{ base_model }}\n")
    with pytest.raises(ValueError, match="missing the required field\\(s\\) \\['forget_split'\\]"):
        build_model_card("unlearned_model", "org/base", "npo", report=REPORT, template_path=no_split)

    unknown = tmp_path / "unknown.md"
    unknown.write_text("---\n{{ card_data }}\n---\n{{ repo_id }} {{ method }} {{ forget_split }} {{ base_model }}"
                       " {{ learning_rate }}\n")
    with pytest.raises(ValueError, match="\\['learning_rate'\\]"):
        build_model_card("unlearned_model", "org/base", "npo", report=REPORT, template_path=unknown)

    attr = tmp_path / "attr.md"
    attr.write_text("---\n{{ card_data }}\n---\n{{ repo_id }} {{ method }} {{ forget_split }} {{ base_model }}"
                    " beta={{ settings.beta }}\n")
    with pytest.raises(ValueError, match="beta"):
        build_model_card("unlearned_model", "org/base", "npo", {"alpha": 1}, REPORT, template_path=attr)
    assert "beta=0.5" in build_model_card("unlearned_model", "org/base", "npo", {"beta": 0.5}, REPORT,
                                          template_path=attr).text

    with pytest.raises(ValueError, match="forget split"):
        build_model_card("unlearned_model", "org/base", "npo")
    with pytest.raises(ValueError, match="made by method 'grom'"):
        build_model_card("grom_adapter", "org/base", "npo", forget_split="forget10")
    with pytest.raises(ValueError, match="not finite"):
        build_model_card("grom_adapter", "org/base", report=dict(REPORT, forget_quality=math.nan))
    with pytest.raises(ValueError, match="Unknown artifact kind"):
        build_model_card("lora_thing", "org/base", "npo", forget_split="forget10")


def test_card_from_evaluator_style_report(tmp_path):
    """The evaluator names the evaluated model ``model_name`` and leaves forget quality None without a
    retain reference: the card omits it from model-index and says so."""
    from hf_unlearn.hub import build_model_card

    report = dict(REPORT, forget_quality=None, model_name="org/base", source="locuslab/TOFU")
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    card = build_model_card("unlearned_model", "org/base", "simnpo", report=path, repo_id="me/simnpo")
    metrics = _card_metrics(card)
    assert "forget_quality" not in metrics and metrics["model_utility"] == REPORT["model_utility"]
    assert "| Forget quality (KS-test p-value vs. retain model) | not computed |" in card.text
    with pytest.raises(ValueError, match="computed for model 'org/other'"):
        build_model_card("unlearned_model", "org/base", "simnpo", report=dict(report, model_name="org/other"))
    aliased = build_model_card("unlearned_model", "org/base", "simnpo", report=dict(report, model_name="/x/base"),
                               base_model_aliases=("/x/base",))
    assert aliased.data.base_model == "org/base"
    with pytest.raises(ValueError, match="no value for any"):
        build_model_card("unlearned_model", "org/base", "simnpo", report={k: None for k in REPORT},
                         forget_split="forget10")


def test_shipped_templates_render_every_kind():
    from hf_unlearn.hub import ARTIFACT_KINDS, build_model_card

    assert {"grom_adapter", "t3_classifier", "unlearned_model"} <= set(ARTIFACT_KINDS)
    for kind in ARTIFACT_KINDS:
        method = "npo" if kind == "unlearned_model" else None
        card = build_model_card(kind, "org/base", method, {"mu": 0.01}, dict(REPORT, base_model="org/base"),
                                quantization={"method": "bnb-nf4", "forget_quality": 0.02}, repo_id="me/edit")
        data = card.data
        assert data.base_model == "org/base" and data.datasets == ["locuslab/TOFU"]
        assert data.tags[:2] == ["unlearning", method or ARTIFACT_KINDS[kind].method]
        assert _card_metrics(card) == _expected_metrics(REPORT)
        assert "forget10" in card.text and "Quantization check" in card.text and "bnb-nf4" in card.text
        assert '"me/edit"' in card.text  # the loading snippet names the repo
        no_report = build_model_card(kind, "org/base", method, forget_split="forget05")
        assert no_report.data.eval_results is None and "forget05" in no_report.text


def test_server_refuses_unimplemented_requests(hub):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(token=hub.token)
    api.create_repo("tester/refuse")
    with pytest.raises(HfHubHTTPError) as err:
        api.delete_repo("tester/refuse")
    assert err.value.response.status_code == 501 and "not implemented" in str(err.value)
    assert hub.unhandled == [("DELETE", "/api/repos/delete")]
    hub.unhandled.clear()  # the fixture checks that no other test hits an unimplemented path


def test_trainer_push_to_hub_writes_card_with_report_and_paper(hub, tiny_target, synthetic, tmp_path):
    """The trainers' own push_to_hub publishes the evaluator's report in model-index and cites the paper."""
    from huggingface_hub import ModelCard

    from hf_unlearn import NPOTrainer, UnlearningConfig

    model, tokenizer = tiny_target
    local_base = str(model.config._name_or_path)
    rows = [{"question": r["question"], "answer": r["answer"]} for r in synthetic["forget10"][:4]]
    retain = [{"question": r["question"], "answer": r["answer"]} for r in synthetic["retain90"][:4]]
    args = UnlearningConfig(output_dir=str(tmp_path / "npo"), report_to="none", save_strategy="no", max_steps=1,
                            push_to_hub=True, hub_model_id="tester/tiny-npo-trainer", hub_token=hub.token)
    trainer = NPOTrainer(model=model, args=args, train_dataset=rows, retain_dataset=retain,
                         processing_class=tokenizer)
    with pytest.raises(ValueError, match="computed for model 'org/other'"):
        trainer.create_model_card(report=dict(REPORT, model_name="org/other"))
    trainer.push_to_hub(report=dict(REPORT, model_name=local_base))

    card = ModelCard.load("tester/tiny-npo-trainer")
    assert card.data.tags[:2] == ["unlearning", "npo"] and {"trl", "hf-unlearn"} <= set(card.data.tags)
    assert _card_metrics(card) == _expected_metrics(REPORT)
    assert "arxiv.org/abs/2404.05868" in card.text and "forget10" in card.text
    assert f"| `beta` | `{trainer.args.beta}` |" in card.text
    assert "model.safetensors" in hub.files("tester/tiny-npo-trainer")


def test_artifact_kind_is_dispatched_by_type_not_by_name(tiny_target, tmp_path):
    """A PEFT adapter whose metadata merely mentions "grom", or an object whose class name starts with GROM, is not
    a GROM edit; a folder is a GROM adapter only when it carries grom_metadata.json."""
    from peft import LoraConfig, get_peft_model

    from hf_unlearn.hub import detect_artifact_kind

    model, _ = tiny_target
    adapter = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    adapter.peft_config["default"].base_model_name_or_path = "org/grom-lookalike-base"
    assert detect_artifact_kind(adapter) == "unlearned_model"
    adapter.save_pretrained(tmp_path / "adapter")
    assert "grom" in (tmp_path / "adapter" / "adapter_config.json").read_text()
    assert detect_artifact_kind(tmp_path / "adapter") == "unlearned_model"

    class GROMLookalike:
        def save_pretrained(self, path):
            raise AssertionError("never saved")

    with pytest.raises(ValueError, match="Cannot push a GROMLookalike"):
        detect_artifact_kind(GROMLookalike())
