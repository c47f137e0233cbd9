"""``run --data-parallel N --replicas-per-gpu M``: M replicas on each GPU (toy replicas, no
vLLM): which GPUs each replica gets, each one's ``--gpu-memory-utilization``, the refusals,
and the start order on a shared GPU (the second replica waits for the first one's engine)."""

from __future__ import annotations

import io
import json

import pytest
from test_data_parallel import FakeScript

from speculators_compat import _data_parallel as dp


def test_replicas_share_gpus_m_at_a_time():
    one = dp.Task()
    assert dp.assign_gpus(["0"], 2, 1, one, 2) == [["0"], ["0"]]
    assert dp.assign_gpus(list("0123"), 4, 1, one, 2) == [["0"], ["0"], ["1"], ["1"]]
    # 3 replicas, 2 per GPU: two GPUs, the second holds one replica
    assert dp.assign_gpus(list("01"), 3, 1, one, 2) == [["0"], ["0"], ["1"]]
    # K=2 GPUs per replica, 2 replicas per group: 4 replicas on 4 GPUs
    assert dp.assign_gpus(list("0123"), 4, 2, one, 2) == [["0", "1"], ["0", "1"],
                                                          ["2", "3"], ["2", "3"]]
    # torchrun --nproc-per-node 2 on 2 GPUs, 2 replicas per GPU each: one GPU per task
    task = dp.Task(rank=1, world=2, local_rank=1, local_world=2)
    assert dp.assign_gpus(list("01"), 2, 1, task, 2) == [["1"], ["1"]]


def test_too_few_gpus_names_the_option():
    with pytest.raises(dp.DataParallelError, match=r"needs 2 GPUs, this task sees 1 .*"
                                                   r"--replicas-per-gpu M"):
        dp.assign_gpus(["0"], 2, 1, dp.Task())
    with pytest.raises(dp.DataParallelError,
                       match="--data-parallel 4 / --replicas-per-gpu 2 x --gpus-per-replica "
                             "1 needs 2 GPUs, this task sees 1"):
        dp.assign_gpus(["0"], 4, 1, dp.Task(), 2)


def test_memory_share_is_the_scripts_default_divided_unless_given():
    args = ["--output-dir", "o"]
    assert dp.shared_gpu_args(args, 1) == args  # one replica per GPU: untouched
    assert dp.option(dp.shared_gpu_args(args, 2), "--gpu-memory-utilization") == "0.4"
    assert dp.option(dp.shared_gpu_args(args, 4), "--gpu-memory-utilization") == "0.2"
    assert dp.option(dp.shared_gpu_args(args, 3), "--gpu-memory-utilization") == "0.2667"
    given = [*args, "--gpu-memory-utilization=0.45"]
    assert dp.shared_gpu_args(given, 2) == given  # the user's share per replica
    assert dp.shared_gpu_args([*args, "--gpu-memory-utilization", "0.5"], 2)[-1] == "0.5"


@pytest.mark.parametrize("value, message", [
    ("0.6", r"2 replicas per GPU x 0.6 = 1.2 of the GPU; pass at most 0.5 \(or leave it "
            r"out: 0.8 / 2 = 0.4 each\)"),
    ("half", "'half' is not a number"),
    ("0", "= 0 of the GPU"),
])
def test_a_memory_share_that_cannot_fit_is_refused(value, message):
    with pytest.raises(dp.DataParallelError, match=message):
        dp.shared_gpu_args(["--gpu-memory-utilization", value], 2)


def _launch(tmp_path, monkeypatch, fake, args=(), replicas=2, per_gpu=2, gpus="0",
            samples=6):
    script = tmp_path / "data_generation_offline.py"
    script.write_text("")
    monkeypatch.setattr(dp.subprocess, "Popen", fake)
    monkeypatch.setattr(dp.os, "killpg", lambda *a: None)
    monkeypatch.setattr(dp.Launch, "count", lambda self: samples)
    stream = io.StringIO()
    launch = dp.Launch(str(script), ["--output-dir", str(tmp_path / "out"), *args],
                       replicas, 1, None, dp.Task(), {"CUDA_VISIBLE_DEVICES": gpus}, stream,
                       replicas_per_gpu=per_gpu)
    return launch, stream


def test_two_replicas_on_one_gpu_get_half_its_memory_and_start_one_after_the_other(
        tmp_path, monkeypatch):
    started = []
    script = FakeScript()

    def fake(cmd, env, **kwargs):
        # the second replica starts only after the first one's saves are on record
        started.append((env["CUDA_VISIBLE_DEVICES"], dp.option(cmd, "--gpu-memory-utilization"),
                        sorted(script.ranges)))
        return script(cmd, env, **kwargs)

    launch, stream = _launch(tmp_path, monkeypatch, fake)
    assert launch.run() == 0, stream.getvalue()
    assert started == [("0", "0.4", []), ("0", "0.4", [(0, 3)])]
    text = stream.getvalue()
    assert "replica 1 (GPU 0) block data_3..data_5: generates data_3..data_5; shares its " \
           "GPU with replica 0 (--gpu-memory-utilization 0.4 each)" in text, text
    assert "all 6 samples present" in text
    # one run's command, not the replicas' memory share
    config = json.loads((tmp_path / "out" / "data_config.json").read_text())
    assert "gpu-memory-utilization" not in config["reproducibility"]["command"]


def test_may_start_waits_for_the_first_replica_on_the_gpu(tmp_path, monkeypatch):
    launch, _ = _launch(tmp_path, monkeypatch, FakeScript())
    first, second = launch.plan(6)
    assert second.after is first and first.after is None
    assert launch.may_start(first) and not launch.may_start(second)  # first not started
    first.launched = True
    first.proc = object()  # running, nothing saved yet: its engine may still be loading
    assert not launch.may_start(second)
    first.saved = 1
    assert launch.may_start(second)
    first.saved, first.proc = 0, None  # ended (done or failed) without a save
    assert launch.may_start(second)


def test_a_first_replica_with_nothing_to_do_does_not_hold_the_second_back(
        tmp_path, monkeypatch):
    launch, _ = _launch(tmp_path, monkeypatch, FakeScript())
    first, second = launch.plan(6)
    first.todo.clear()
    assert launch.may_start(second)


def test_disjoint_gpus_are_unchanged_without_the_option(tmp_path, monkeypatch):
    launch, _ = _launch(tmp_path, monkeypatch, FakeScript(), per_gpu=1, gpus="0,1")
    reps = launch.plan(6)
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in reps] == ["0", "1"]
    assert all(r.after is None for r in reps)
    assert launch.replica_args == launch.args


def test_replicas_per_gpu_is_refused_without_a_gpu_and_with_too_large_a_share(
        tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("")
    out = ["--output-dir", str(tmp_path / "o")]
    assert dp.main(str(script), out, 2, environ={"CUDA_VISIBLE_DEVICES": ""},
                   replicas_per_gpu=2) == 2
    assert "this task sees no GPU" in capsys.readouterr().err
    assert dp.main(str(script), [*out, "--gpu-memory-utilization", "0.8"], 2,
                   environ={"CUDA_VISIBLE_DEVICES": "0"}, replicas_per_gpu=2) == 2
    assert "x 0.8 = 1.6 of the GPU" in capsys.readouterr().err


def test_the_cli_flag_needs_data_parallel(capsys):
    from speculators_compat.__main__ import main

    assert main(["run", "--replicas-per-gpu", "2", "x.py"]) == 2
    assert "--replicas-per-gpu only with --data-parallel N" in capsys.readouterr().err
