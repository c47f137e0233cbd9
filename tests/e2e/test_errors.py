"""Clear, actionable errors before anything runs; a failed call leaks nothing; speculators
releases the shim cannot serve are refused at activate()."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, checkpoint, require_speculators, run_script

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def errors():
    require_speculators()
    return run_script("errors.py", "--model", checkpoint("llama"))


def test_layer_ids_out_of_range_refused_before_engine_start(errors):
    e = errors["layer_out_of_range"]
    assert e["raised"] == "ValueError" and "99" in e["message"] and "out of bounds" in e["message"]
    assert e["seconds"] < 15, "must fail before vLLM starts workers or loads weights"


def test_empty_batch_and_sequence_and_bad_tokens(errors):
    assert errors["empty_batch"]["raised"] in ("ValueError", "CompatError")
    assert "empty" in errors["empty_batch"]["message"]
    e = errors["empty_sequence"]
    assert e["raised"] == "CompatError" and "sequence 1" in e["message"] and "empty" in e["message"]
    b = errors["bad_token"]
    assert b["raised"] == "CompatError" and "sequence 1" in b["message"] and "'x'" in b["message"]


def test_token_ids_outside_the_vocabulary_are_refused(errors):
    vocab = errors["vocab_size"]
    e = errors["token_too_large"]
    assert e["raised"] == "CompatError", e
    assert "sequence 1" in e["message"] and "position 2" in e["message"], e
    assert f"token id {vocab}" in e["message"] and f"0..{vocab - 1}" in e["message"], e
    e = errors["token_negative"]
    assert e["raised"] == "CompatError", e
    assert "sequence 0" in e["message"] and "position 1" in e["message"], e


def _section(errors, name):
    info = errors[name]
    assert "error" not in info, (info.get("error"), info.get("traceback"),
                                 errors.get("_stderr_tail"))
    return info


def test_failed_calls_leak_nothing_and_truncation_matches_upstream(errors):
    after = _section(errors, "after_errors")
    assert after["returned"] == after["expected"] == 5
    assert after["input_ids_truncated"], "over-long sequences are cut to max_model_len - 1"
    assert max(after["rows"]) == 63
    assert after["compare_ok"], after


def test_workers_are_asked_which_extension_they_run(errors):
    after = _section(errors, "workers_asked")
    # the workers themselves, not the driver's report or config
    assert after["workers_run"] == [[after["worker_extension_cls"]]], after
    assert after["worker_extension_cls"].startswith("speculators_compat.worker_extension."), after


@pytest.mark.parametrize("section", ["failed_step", "failed_second_step"])
def test_failed_model_step_leaks_nothing_into_the_next_call(errors, section):
    """A 40-sequence call whose first model step raises leaves 8 requests waiting; the
    next call must not run them as its own (0.3: every row wrong; 0.4: KeyError). With
    the second step raising, the first step's rows are already in the failed call's
    region: none of them may reach the next call, whose rows stream into a region of its
    own that speculators' clone() takes over."""
    info = _section(errors, section)
    assert info["failed"]["raised"] == "RuntimeError", info["failed"]
    assert "injected failure" in info["failed"]["message"], info["failed"]
    empty = {"requests": 0, "running": 0, "waiting": 0, "deferred": 0}
    assert info["scheduler_after_failure"] == empty, info
    # the failed call fetched nothing
    assert info["failed_call_stats"] == {"calls": 0, "streamed": 0, "handed_over": 0}, info
    nxt = info["next_call"]
    assert "raised" not in nxt, nxt
    assert nxt["returned"] == nxt["expected"] == 12, nxt
    assert nxt["input_order"], nxt
    assert nxt["compare_ok"], nxt
    assert nxt["plain_owned"], nxt
    assert info["scheduler_after_next_call"] == empty, info
    # the next call's rows went into its own region while the model ran, and
    # speculators' clone() took it over (zero copy)
    assert info["next_call_stats"] == {"calls": 1, "streamed": 1, "handed_over": 1}, info


def test_interrupt_issues_no_rpc_and_makes_the_generator_unusable(errors):
    info = _section(errors, "interrupted")
    assert info["raised"] == "KeyboardInterrupt", info
    assert info["rpcs_after_interrupt"] == [], info
    assert info["seconds"] < 5, info
    nxt = info["next_call"]
    assert nxt["raised"] == "CompatError", nxt
    assert "interrupted" in nxt["message"] and "new VllmHiddenStatesGenerator" in nxt["message"]


def test_live_generator_refuses_after_deactivate_and_reactivate(errors):
    info = _section(errors, "deactivated")
    for key in ("after_deactivate", "after_reactivate"):
        e = info[key]
        assert e["raised"] == "CompatError", (key, e)
        assert "deactivate()" in e["message"] and "new VllmHiddenStatesGenerator" in e["message"]
    e = info["unseen_generator"]
    assert e["raised"] == "CompatError", e
    assert "not built under the current activation" in e["message"], e
    assert "scheduler" in e["message"], e


def test_speculators_without_generator_is_refused():
    require_speculators()
    target = ROOT / ".envs" / "speculators-0.5.0"
    if not (target / "speculators").is_dir():
        pytest.skip("speculators 0.5.0 target not built (tools/envs.py build)")
    env = dict(os.environ, PYTHONPATH=str(target))
    env.pop("SPECULATORS_COMPAT_ACTIVE", None)
    code = ("import speculators_compat, os\n"
            "try:\n    speculators_compat.activate()\n"
            "except speculators_compat.UnsupportedError as e:\n    print('REFUSED', e)\n"
            "assert speculators_compat.report() is None\n"
            "assert 'SPECULATORS_COMPAT_ACTIVE' not in os.environ\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300, check=False, cwd=str(Path(target).parent))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REFUSED" in proc.stdout and "0.5.0" in proc.stdout
    assert "extract_hidden_states" in proc.stdout


def test_generator_built_outside_the_main_guard_is_refused_before_workers_start():
    """Spawned workers run the main script again: an unguarded script gets a CompatError
    naming its file, line and fix, before any worker starts."""
    require_speculators()
    r = run_script("unguarded.py", "--model", checkpoint("llama"))
    assert r["raised"] == "CompatError", r
    msg = r["message"]
    assert f"{r['script']} (line " in msg and 'if __name__ == "__main__":' in msg, msg
    assert r["children"] == 0 and r["seconds"] < 1, r  # about 1 ms; starting takes 10+ s


def test_hyper_connection_model_is_refused_before_anything_loads(tmp_path):
    """A DeepSeek-V4 config (transformers' own class, 4 residual streams) with no weights
    and no tokenizer: speculators' unchanged generator is refused at construction, naming
    the streams and what to use instead, before any worker starts."""
    require_speculators()
    import transformers

    config_class = getattr(transformers, "DeepseekV4Config", None)
    if config_class is None:
        pytest.skip(f"transformers {transformers.__version__} has no DeepseekV4Config")
    config_class(architectures=["DeepseekV4ForCausalLM"], num_hidden_layers=2).save_pretrained(
        tmp_path)
    r = run_script("refused_model.py", "--model", str(tmp_path))
    assert r["raised"] == "CompatError", r
    assert "4 residual streams" in r["message"] and "extract_hidden_states" in r["message"]
    assert r["children"] == 0 and r["seconds"] < 5, r


#: Config-only models whose layers' output the capture cannot read, with what the refusal
#: must name. Their ``model_type`` is one transformers does not know (as in a checkpoint
#: without remote code), so the refusal reads ``config.json`` as JSON.
UNREADABLE_LAYERS = {
    "kimi_k3_attention_residuals": (
        {"model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"],
         "text_config": {"model_type": "kimi_k3_text", "num_hidden_layers": 2,
                         "attn_res_block_size": 8}}, "attn_res_block_size"),
    "minimax_m3_sparse": (
        {"model_type": "minimax_m3_sparse", "architectures": ["MiniMaxM3SparseForCausalLM"],
         "num_hidden_layers": 2}, "forward_after_input_norm"),
}


def test_models_the_capture_cannot_read_are_refused_before_anything_loads(tmp_path):
    """Kimi-K3 with attention-residual blocks and MiniMax-M3 sparse, config-only:
    speculators' unchanged generator is refused at construction, naming the cause and
    vLLM's extract_hidden_states, before any worker starts (one interpreter for both)."""
    require_speculators()
    args = []
    for name, (config, _) in UNREADABLE_LAYERS.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        args += ["--model", str(tmp_path / name)]
    records = run_script("refused_model.py", *args)["models"]
    for (name, (_, says)), r in zip(UNREADABLE_LAYERS.items(), records, strict=True):
        assert r["raised"] == "CompatError", (name, r)
        assert says in r["message"] and "extract_hidden_states" in r["message"], (name, r)
        assert r["children"] == 0 and r["seconds"] < 5, (name, r)
