"""``speculators-compat run --data-parallel 2`` on speculators' own offline script
(``scripts/data_generation_offline.py`` of the installed release, unchanged:
tests/e2e/scripts/upstream), real vLLM CPU build, the tiny Llama checkpoint.

One plain run of the script is the reference. The data-parallel run of the same command
(same relative ``--output-dir`` and ``--token-freq-path``, in another folder) has its
replica 1 killed (SIGKILL of its process group) once it has saved a sample; the launcher
reports the replica, its range and a resume command, exit 1. Then one file of replica 0's
finished block is deleted and another cut in half (what a crash of an in-place save
leaves), and the same command runs again: it generates exactly the deleted, the cut-off
and the never-written samples, nothing else. The result equals the plain run file for
file: the same names, ``input_ids`` and loss masks equal, ``sample_lengths.json`` equal,
``data_config.json`` equal but for its time stamp, hidden states within bf16 noise (see
:func:`compare`), and ``check-data`` passes on it.

Five vLLM starts (the reference beside the first attempt's two replicas, then two) and one
preprocessing-only start (the sample count; cached for the rerun); in the newest vLLM CPU
env only (the launcher does not depend on the vLLM release).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import (
    SCRIPTS,
    checkpoint,
    installed,
    require_speculators,
    run_in_own_session,
    vllm_version,
)
from packaging.version import Version
from test_offline_script import conversations

from speculators_compat._data_parallel import runs as runs_of

pytestmark = pytest.mark.e2e

UPSTREAM = SCRIPTS / "upstream"
LAYERS = [0, 2, 4, 5]
WORK = ".speculators-compat-dp"
#: Hidden states of one sample computed in another batch: per-token cosine at least this,
#: and the largest difference at most ABS_OF_MAX of the tensor's largest magnitude. bf16
#: keeps 8 significant bits (relative step 2**-8 = 0.0039); a different batch changes the
#: order of the reductions in matmul and attention, which moves values by a few steps
#: after six layers (one H100, vLLM 0.34, a random-weight Qwen2-0.5B: cosine >= 0.99991
#: between a sequence batched and alone). Equal batches give equal bits (vLLM 0.32 CPU,
#: 2026-12-06).
MIN_COSINE = 0.999
ABS_OF_MAX = 0.05
#: The vLLM CPU env these runs are made in (tools/envs.py builds 0.16.0 and 0.32.0).
NEWEST_CPU_ENV = Version("0.32.0")


def script() -> Path:
    if vllm_version() < NEWEST_CPU_ENV:
        pytest.skip(f"the launcher does not depend on the vLLM release: its runs (5 vLLM "
                    f"starts) are in the vLLM {NEWEST_CPU_ENV} env only, not {vllm_version()}")
    version = installed("speculators")
    path = UPSTREAM / f"speculators-{version}" / "data_generation_offline.py"
    if not path.exists():
        pytest.skip(f"speculators {version}'s offline script is not in {UPSTREAM} "
                    "(tests/e2e/scripts/upstream/README.md says how to add it)")
    return path


def conversations8() -> list[list[dict]]:
    """The offline-script test's six conversations and two more: two blocks of four."""
    extra = [[{"from": "human", "value": f"Question number {k} about layers?"},
              {"from": "gpt", "value": "Answer " * (3 + k)}] for k in range(2)]
    return conversations() + extra


def _env(tmp: Path) -> dict:
    env = dict(os.environ)
    env.pop("SPECULATORS_COMPAT_ACTIVE", None)
    env.pop("SPECULATORS_COMPAT_REPORT_FILE", None)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", SPECULATORS_COMPAT_DP_PROGRESS_S="5")
    if env.get("PYTHONPATH"):  # runs in a temp cwd: make entries absolute
        env["PYTHONPATH"] = os.pathsep.join(
            os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    return env


@pytest.fixture(scope="module")
def runs():
    require_speculators()
    path = script()
    model = checkpoint("llama")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = tmp / "conversations.jsonl"
        data.write_text("".join(json.dumps({"id": f"c{i}", "conversations": c}) + "\n"
                                for i, c in enumerate(conversations8())))
        env = _env(tmp)
        # relative --output-dir / --token-freq-path: both runs record the same command
        args = [str(path), "--target-model-path", model, "--train-data-path", str(data),
                "--output-dir", "out", "--layer-ids", *map(str, LAYERS), "--batch-size", "2",
                "--seq-length", "256", "--tensor-parallel-size", "1",
                "--num-preprocessing-workers", "1", "--hf-cache-dir", str(tmp / "hf"),
                "--token-freq-path", "token_freq.pt"]
        single, par = tmp / "single", tmp / "dp"
        single.mkdir()
        par.mkdir()
        run = [sys.executable, "-m", "speculators_compat", "run"]
        result = {"single": single / "out", "dp": par / "out", "env": env, "tmp": tmp}
        # the reference and the first data-parallel attempt side by side (a shorter test);
        # replica 1 is killed after its first save
        dp_cmd = [*run, "--data-parallel", "2", *args]
        log0, log1 = tmp / "single.log", tmp / "dp1.log"
        with open(log0, "w") as f0, open(log1, "w") as f1:
            ref = subprocess.Popen([*run, *args], env=env, cwd=single, stdout=f0,
                                   stderr=subprocess.STDOUT, start_new_session=True)
            proc = subprocess.Popen(dp_cmd, env=env, cwd=par, stdout=f1, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                result["killed_after"] = _kill_replica_1(par / "out" / WORK, proc)
                result["dp1_rc"] = proc.wait(timeout=900)
                rc = ref.wait(timeout=900)
            finally:
                _kill_group(proc)
                _kill_group(ref)
        assert rc == 0, log0.read_text(errors="replace")[-6000:]
        result["dp1_output"] = log1.read_text(errors="replace")
        out = par / "out"
        result["after_kill"] = sorted(p.name for p in out.glob("data_*.pt"))

        # a lost file and a cut-off one in replica 0's finished block
        (out / "data_1.pt").unlink()
        cut = (out / "data_2.pt").read_bytes()
        (out / "data_2.pt").write_bytes(cut[: len(cut) // 2])
        rc, output = run_in_own_session(dp_cmd, env, tmp / "dp2.log", 900, par)
        result.update(dp2_rc=rc, dp2_output=output)
        yield result


def _kill_replica_1(work: Path, proc: subprocess.Popen) -> int:
    """SIGKILL replica 1's process group once its saved-samples log has a line."""
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        logs = list(work.glob("saved-4-8.log")) if work.exists() else []
        pid_file = work / "replica-1.pid"
        if logs and logs[0].read_text().strip() and pid_file.exists():
            saved = len(logs[0].read_text().splitlines())
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
            return saved
        time.sleep(0.02)
    raise AssertionError("replica 1 saved nothing before the launcher ended")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def test_a_killed_replica_is_reported_with_its_range_and_resume_command(runs):
    out = runs["dp1_output"]
    assert runs["dp1_rc"] == 1, out[-6000:]
    assert "replica 0 (cores 0) data_0..data_3: 4/4 samples" in out, out[-6000:]
    assert "replica 1 (cores 1) FAILED (exit -9) in data_4..data_7" in out, out[-6000:]
    assert "resume it alone: speculators-compat run --data-parallel 1 --world-size 1 " \
           "--rank 0 --indices 4:8" in out, out[-6000:]
    # replica 0's block is whole; replica 1 left what it had saved, and no metadata
    assert {"data_0.pt", "data_1.pt", "data_2.pt", "data_3.pt"} <= set(runs["after_kill"])
    assert "data_7.pt" not in runs["after_kill"] or runs["killed_after"] == 4


def test_the_rerun_generates_exactly_what_is_missing(runs):
    out = runs["dp2_output"]
    assert runs["dp2_rc"] == 0, out[-6000:]
    missing_1 = [i for i in range(4, 8) if f"data_{i}.pt" not in runs["after_kill"]]
    assert "replica 0 (cores 0) block data_0..data_3: generates data_1..data_2; 1 incomplete " \
           "file(s) regenerated: 2" in out, out[-6000:]
    # the saves of the killed replica's pool may have finished out of order
    todo = ", ".join(f"data_{a}..data_{b - 1}" for a, b in runs_of(missing_1)) or "nothing"
    assert f"replica 1 (cores 1) block data_4..data_7: generates {todo}\n" in out, out[-6000:]
    assert f"{2 + len(missing_1)} sample(s) generated" in out, out[-6000:]
    wrote = "data_config.json" if installed("speculators") == "0.3.0" else \
        "sample_lengths.json, data_config.json"  # 0.3.0 writes no sample_lengths.json
    assert f"all 8 samples present in {runs['dp']}; wrote {wrote}\n" in out, out[-6000:]


def compare(a, b) -> tuple[float, float]:
    """(min per-token cosine, max |a - b| / max |a|) of two [tokens, hidden] tensors."""
    import torch

    x, y = a.float(), b.float()
    cos = torch.nn.functional.cosine_similarity(x, y, dim=-1, eps=1e-12)
    return float(cos.min()), float((x - y).abs().max() / x.abs().max().clamp_min(1e-12))


def test_the_result_equals_one_run_file_for_file(runs):
    import torch

    assert runs["dp2_rc"] == 0, runs["dp2_output"][-6000:]
    single, par = runs["single"], runs["dp"]
    names = sorted(p.name for p in single.iterdir())
    assert sorted(p.name for p in par.iterdir()) == names  # no work folder, no temporaries
    exact, worst = 0, (1.0, 0.0)
    for i in range(8):
        a = torch.load(single / f"data_{i}.pt", weights_only=True)
        b = torch.load(par / f"data_{i}.pt", weights_only=True)
        assert torch.equal(a["input_ids"], b["input_ids"]), i
        assert torch.equal(torch.as_tensor(a["loss_mask"]), torch.as_tensor(b["loss_mask"])), i
        assert len(a["hidden_states"]) == len(b["hidden_states"]) == len(LAYERS)
        for x, y in zip(a["hidden_states"], b["hidden_states"]):
            assert x.shape == y.shape and x.dtype == y.dtype == torch.bfloat16
            if torch.equal(x, y):
                exact += 1
                continue
            cos, rel = compare(x, y)
            worst = (min(worst[0], cos), max(worst[1], rel))
            assert cos >= MIN_COSINE and rel <= ABS_OF_MAX, (i, cos, rel)
    print(f"hidden states: {exact}/{8 * len(LAYERS)} bit-identical; others: min cosine "
          f"{worst[0]:.6f}, max |diff| / max |ref| {worst[1]:.4f}")
    assert exact > 0  # the samples generated in the reference's batches: equal bits
    # the tolerance catches a known-wrong result: rows one position late
    x = torch.load(single / "data_0.pt", weights_only=True)["hidden_states"][-1]
    cos, rel = compare(x, x.roll(1, dims=0))
    assert not (cos >= MIN_COSINE and rel <= ABS_OF_MAX), (cos, rel)
    if (single / "sample_lengths.json").exists():
        assert (par / "sample_lengths.json").read_text() == \
            (single / "sample_lengths.json").read_text()
    a = json.loads((single / "data_config.json").read_text())
    b = json.loads((par / "data_config.json").read_text())
    a.pop("generated_at")
    b.pop("generated_at")
    assert a == b
    assert (par.parent / "token_freq.pt").read_bytes() == \
        (single.parent / "token_freq.pt").read_bytes()


def test_check_data_passes_on_the_result(runs):
    proc = subprocess.run([sys.executable, "-m", "speculators_compat", "check-data",
                           str(runs["dp"]), "--json", "--jobs", "1"], env=runs["env"],
                          capture_output=True, text=True, timeout=600)
    result = json.loads(proc.stdout)
    assert proc.returncode == 0 and result["status"] == "ok", result
    assert result["files_checked"] == 8, result


def test_nothing_of_the_launcher_is_left(runs):
    """No work folder and no temporaries in the folder training reads."""
    leftovers = [p.name for p in runs["dp"].iterdir()
                 if not (p.name.startswith("data_") and p.name.endswith(".pt"))
                 and p.name not in ("sample_lengths.json", "data_config.json")]
    assert leftovers == [], leftovers
