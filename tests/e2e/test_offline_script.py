"""``speculators-compat run`` on an offline data-generation script shaped like upstream's.

The script (scripts/offline_generate.py) imports speculators at module level, so vLLM's
spawned workers, which re-run it before any vLLM code, need the shim active at
interpreter start (the ``_bootstrap`` hook on ``PYTHONPATH``). It preprocesses a local
ShareGPT-style ``.jsonl`` with speculators' own preprocessing and the checkpoint's chat
template, and saves one file per conversation. Here: every saved sample's hidden states
equal a transformers forward, its loss mask is there and marks some (not all) tokens, its
tokens are the chat-template encoding of exactly one conversation, and the workers
report an activation of kind ``worker`` that the driver's report file did not overwrite.
One generator start per env x speculators combination.

The same files then train an EAGLE-3 draft (the rest of the pipeline in the
same environment): scripts/train_draft.py, again under ``speculators-compat run``, builds
the draft with speculators' own classes, loads the samples with ``speculators.train.data``,
runs forward + backward + an optimizer step on CPU, saves, reloads and compares config,
weights and forward exactly (with known-wrong controls in every run). The saved draft's
config names the target layers it was trained on in vLLM's numbering (the
``draft_aux_layers`` adapter, from the layers file the generation wrote next to the
data), and ``speculators-compat check-draft`` confirms it, and reports a copy saved
without them (what speculators writes on its own).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from helpers import SCRIPTS, checkpoint, installed, require_speculators, run_in_own_session

from speculators_compat._draft_layers import FIELD, LAYERS_FILE

pytestmark = pytest.mark.e2e

#: Four layers: EAGLE-3 trains on three auxiliary layers + the last one (the target).
LAYERS = [0, 2, 4, 5]
#: vLLM's ids of the three auxiliary layers' outputs (its id k is the input of layer k).
VLLM_AUX = [1, 3, 5]
TOPICS = ["the quick brown fox", "speculative decoding", "hidden states of the verifier",
          "hello world", "a small draft model", "tokens and layers"]


def conversations() -> list[list[dict]]:
    """Six ShareGPT-style conversations (1-3 turns each, distinct texts)."""
    convs = []
    for i, topic in enumerate(TOPICS):
        turns = []
        for t in range(1 + i % 3):
            turns.append({"from": "human", "value": f"Tell me about {topic}, part {t}."})
            turns.append({"from": "gpt", "value": f"Here is {topic} " * (2 + (i + t) % 4)})
        convs.append(turns)
    return convs


def chat_ids(tokenizer, conv: list[dict]) -> tuple[int, ...]:
    """The conversation through the chat template, tokenised (what preprocessing yields)."""
    roles = {"human": "user", "gpt": "assistant"}
    messages = [{"role": roles[t["from"]], "content": t["value"]} for t in conv]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.fixture(scope="module")
def offline_run():
    require_speculators()
    model = checkpoint("llama")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = tmp / "conversations.jsonl"
        data.write_text("".join(json.dumps({"id": f"c{i}", "conversations": c}) + "\n"
                                for i, c in enumerate(conversations())))
        out = tmp / "out"  # created by the script: the report goes there once it exists
        env = dict(os.environ)
        env.pop("SPECULATORS_COMPAT_ACTIVE", None)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                   SPECULATORS_COMPAT_REPORT_FILE=str(out / "compat-report.json"))
        if env.get("PYTHONPATH"):  # runs in a temp cwd: make entries absolute
            env["PYTHONPATH"] = os.pathsep.join(
                os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
        cmd = [sys.executable, "-m", "speculators_compat", "run",
               str(SCRIPTS / "offline_generate.py"), "--target-model-path", model,
               "--train-data-path", str(data), "--output-dir", str(out),
               "--layer-ids", *map(str, LAYERS), "--batch-size", "4",
               "--hf-cache-dir", str(tmp / "hf"), "--token-freq-path", str(tmp / "freq.pt")]
        rc, output = run_in_own_session(cmd, env, tmp / "output.log", 900, tmp)
        import torch

        files = sorted(out.glob("data_*.pt"), key=lambda p: int(p.stem[5:])) if out.exists() \
            else []
        samples = [torch.load(f, weights_only=False) for f in files]
        info = json.loads((out / "run_info.json").read_text()) \
            if (out / "run_info.json").exists() else None
        report_path = out / "compat-report.json"
        report = json.loads(report_path.read_text()) if report_path.exists() else None
        layers_path = out / LAYERS_FILE
        layers = json.loads(layers_path.read_text()) if layers_path.exists() else None
        yield {"rc": rc, "output": output[-8000:], "samples": samples, "info": info,
               "report": report, "layers": layers, "model": model, "out": out, "tmp": tmp,
               "env": env}


def test_run_saves_one_file_per_conversation(offline_run):
    assert offline_run["rc"] == 0, offline_run["output"]
    n = len(conversations())
    assert len(offline_run["samples"]) == n, offline_run["output"]
    assert offline_run["info"]["samples"] == n
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(offline_run["model"])
    expected = Counter(chat_ids(tok, c) for c in conversations())
    assert len(expected) == n  # distinct conversations
    saved = Counter(tuple(int(t) for t in s["input_ids"]) for s in offline_run["samples"])
    assert saved == expected


def test_saved_hidden_states_match_transformers(offline_run):
    from speculators_compat.demo.reference import compare, reference_hidden_states

    samples = offline_run["samples"]
    assert samples, offline_run["output"]
    assert offline_run["info"]["layer_ids"] == LAYERS
    seqs = [[int(t) for t in s["input_ids"]] for s in samples]
    actual = [s["hidden_states"] for s in samples]
    assert all(len(h) == len(LAYERS) for h in actual)
    ref = reference_hidden_states(offline_run["model"], seqs, LAYERS)
    assert len(ref) == len(actual) == len(seqs)
    result = compare(actual, ref)
    assert result["ok"], result["reasons"][:5]


def test_loss_masks_present_and_non_trivial(offline_run):
    samples = offline_run["samples"]
    assert samples, offline_run["output"]
    for s in samples:
        mask = [int(m) for m in s["loss_mask"]]
        assert len(mask) == len(s["input_ids"])
        assert set(mask) <= {0, 1}
        assert 0 < sum(mask) < len(mask), mask


def test_workers_activated_at_start_and_report_file_is_the_drivers(offline_run):
    info, report = offline_run["info"], offline_run["report"]
    assert info is not None, offline_run["output"]
    workers = info["worker_reports"]
    assert workers and all(w is not None for w in workers), workers
    for w in workers:
        assert w["process"] == "worker" and w["active"]
        assert w["pid"] != info["driver_pid"]
        statuses = {a["name"]: a["status"] for a in w["adapters"]}
        if installed("transformers").startswith("5"):
            assert statuses["transformers5_config_torch"] == "applied", statuses
    # Written by the explicit activate() of `run` only, not by a child's activation.
    assert report is not None and report["process"] == "driver"
    assert report["pid"] == info["driver_pid"]


def test_generator_layers_travel_with_the_data(offline_run):
    """The layers the generator captured are recorded next to the data (the report's
    ``data`` section and the layers file), where a later training process finds them."""
    assert offline_run["rc"] == 0, offline_run["output"]
    records = offline_run["layers"]["generators"]
    assert len(records) == 1, records
    rec = records[0]
    assert rec["layer_ids"] == LAYERS and rec["num_hidden_layers"] == 6
    assert rec[FIELD] == VLLM_AUX and rec["pid"] == offline_run["info"]["driver_pid"]
    assert offline_run["report"]["data"]["hidden_states"] == records


@pytest.fixture(scope="module")
def trained(offline_run):
    """scripts/train_draft.py on the files the generator just wrote (one interpreter)."""
    assert offline_run["rc"] == 0, offline_run["output"]
    tmp = offline_run["tmp"]
    env = dict(offline_run["env"])
    # speculators 0.3.0 wraps the draft's forward in torch.compile; compiling on CPU costs
    # minutes and changes no result (0.4 compiles only with CUDA): eager here.
    env["TORCHDYNAMO_DISABLE"] = "1"
    result_path = tmp / "train.json"
    cmd = [sys.executable, "-m", "speculators_compat", "run", str(SCRIPTS / "train_draft.py"),
           "--model", offline_run["model"], "--data", str(offline_run["out"]),
           "--token-freq", str(tmp / "freq.pt"), "--work", str(tmp / "train"),
           "--out", str(result_path)]
    rc, output = run_in_own_session(cmd, env, tmp / "train.log", 600, tmp)
    assert rc == 0 and result_path.exists(), output[-8000:]
    return json.loads(result_path.read_text())


def test_draft_trains_on_generated_samples(trained):
    assert trained["files"] == len(conversations())
    assert trained["loss_finite"] and len(trained["losses"]) == 1, trained["losses"]
    assert trained["trainable"], trained
    assert trained["params_without_grad"] == [], trained["params_without_grad"]
    assert trained["changed_by_step"] == trained["trainable"]


def test_draft_round_trip_is_exact(trained):
    assert trained["config_class"] == "Eagle3SpeculatorConfig"
    assert trained["saved_speculators_model_type"] == "eagle3"
    assert trained["config_json_diff"] == [] and trained["config_dict_diff"] == []
    assert trained["unexpected_keys"] == []
    # only what speculators does not save (derived from the verifier at construction)
    assert set(trained["missing_keys"]) <= {"verifier_lm_head.weight", "verifier_norm.weight"}
    assert trained["weights_compared"] > 0 and trained["weights_diff"] == []
    assert trained["forward_diff"] == []
    dense, flex = trained["dense_vs_flex_loss"]
    assert abs(dense - flex) <= 1e-4 * max(1.0, abs(flex)), (dense, flex)


def test_saved_draft_names_the_layers_it_was_trained_on(trained):
    """The training process (which inherits the generation's report path, and so
    overwrites that report with its own) read the layers file next to the data: the
    saved config names vLLM's ids of the captured layers, as the reloaded config does."""
    assert trained["saved_aux_layer_ids"] == VLLM_AUX
    assert trained["reloaded_aux_layer_ids"] == VLLM_AUX


def check_draft(draft, data, env, tmp) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "speculators_compat", "check-draft", str(draft),
           "--data", str(data)]
    rc, output = run_in_own_session(cmd, env, tmp / "check-draft.log", 120, tmp)
    return rc, output


def test_check_draft_confirms_the_saved_draft(offline_run, trained):
    draft = offline_run["tmp"] / "train" / "draft"
    rc, output = check_draft(draft, offline_run["out"], offline_run["env"], offline_run["tmp"])
    assert rc == 0, output
    assert "OK: vLLM feeds the draft the layers it was trained on" in output
    assert f"auxiliary hidden states {VLLM_AUX} (named in config.json)" in output


def test_check_draft_reports_a_draft_saved_without_layers(offline_run, trained):
    """What speculators saves without the shim (the field null): vLLM would feed its
    default for the 6-layer target, (2, 3, 3) taken once each, not the layers the draft
    learned from."""
    tmp = offline_run["tmp"]
    bare = tmp / "bare-draft"
    shutil.copytree(tmp / "train" / "draft", bare)
    config = json.loads((bare / "config.json").read_text())
    config[FIELD] = None
    (bare / "config.json").write_text(json.dumps(config))
    rc, output = check_draft(bare, offline_run["out"], offline_run["env"], tmp)
    assert rc == 1, output
    assert "vLLM feeds its default for a 6-layer target, [2, 3] ((2, n//2, n-3) = [2, 3, 3]" \
        in output
    assert 'MISMATCH' in output and f'"{FIELD}": {VLLM_AUX}' in output


def test_round_trip_checks_see_known_wrong_reloads(trained):
    assert trained["control_weights_diff"] == ["fc.weight"]
    assert trained["control_forward_diff"], "a reload with a changed weight went unnoticed"
    assert trained["control_config_diff"] == ["draft_vocab_size"]


def _check_data(directory: Path, env: dict, *extra: str) -> tuple[int, dict]:
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "speculators_compat", "check-data",
                           str(directory), "--json", *extra], env=env, capture_output=True,
                          text=True, timeout=600)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"check-data rc={proc.returncode}, no JSON on stdout:\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}") from None


def test_check_data_accepts_the_output_and_names_each_damage(offline_run):
    """``check-data`` on what the pipeline really wrote: every file whole, once, with the
    captured layers; then a copy with one file deleted and NaN in another fails, naming
    exactly those two indices (a known-wrong directory must fail the check)."""
    import torch

    assert offline_run["rc"] == 0, offline_run["output"]
    out, env = offline_run["out"], offline_run["env"]
    rc, result = _check_data(out, env)
    assert rc == 0 and result["status"] == "ok", result
    assert result["files_checked"] == len(offline_run["samples"]) > 2, result
    damaged = offline_run["tmp"] / "damaged"
    shutil.copytree(out, damaged)
    (damaged / "data_1.pt").unlink()
    sample = torch.load(damaged / "data_2.pt", weights_only=False)
    sample["hidden_states"][0][0, 0] = float("nan")
    torch.save(sample, damaged / "data_2.pt")
    rc, result = _check_data(damaged, env)
    assert rc == 1 and result["status"] == "bad", result
    assert sorted(b["index"] for b in result["bad_files"]) == [1, 2], result["bad_files"]


def test_check_data_model_regenerates_through_vllm(offline_run):
    """``check-data --model``: speculators' generator (through the shim, on real vLLM)
    regenerates sampled files and compares every layer. On a copy where one file's first
    captured layer holds the second's rows (right shape and dtype, wrong meaning: what the
    structural checks cannot see), that file fails and the untouched one passes."""
    import torch

    assert offline_run["rc"] == 0, offline_run["output"]
    wrong = offline_run["tmp"] / "layer-swapped"
    shutil.copytree(offline_run["out"], wrong)
    sample = torch.load(wrong / "data_0.pt", weights_only=False)
    hs = sample["hidden_states"]
    hs[0] = hs[1].clone()
    torch.save(sample, wrong / "data_0.pt")
    rc, result = _check_data(wrong, offline_run["env"], "--model", offline_run["model"],
                             "--sample", "2")
    mc = result["model_check"]
    assert rc == 1 and mc["ok"] is False, result
    verdicts = {f["index"]: f for f in mc["files"]}
    last = len(offline_run["samples"]) - 1
    assert sorted(verdicts) == [0, last], verdicts
    assert not verdicts[0]["ok"] and "layer 0" in verdicts[0]["reasons"][0], verdicts[0]
    assert verdicts[last]["ok"], verdicts[last]
    # the command's default bar is 0.99 (bf16 batch noise on GPUs); here, on the same CPU
    # engine, a regeneration matches to the last bits (1.0 measured, 2026-12-06)
    assert min(verdicts[last]["min_cosine_per_layer"]) >= 0.9999, verdicts[last]
