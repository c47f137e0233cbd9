"""``speculators-compat run --data-parallel``'s own logic on toy data: the blocks, the
task of a torchrun / SLURM / Open MPI launch, devices, the script's options, which files
are missing or cut off, the merged metadata, and what the replicas' processes change
(whole saves, a replica's range). The runs of speculators' real script on vLLM are in
tests/e2e/test_data_parallel.py.
"""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")

from speculators_compat import _data_parallel as dp  # noqa: E402
from speculators_compat import _offline_hooks as hooks  # noqa: E402
from speculators_compat._draft_layers import LAYERS_FILE  # noqa: E402


def sample(n: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.arange(n), "loss_mask": torch.ones(n, dtype=torch.long),
            "hidden_states": [torch.randn(n, 4, generator=g).bfloat16() for _ in range(2)]}


# ---------------------------------------------------------------------------- blocks
@pytest.mark.parametrize("start,count,parts", [(0, 10, 3), (5, 7, 7), (0, 3, 5), (100, 1, 1)])
def test_split_covers_the_range_once_in_order(start, count, parts):
    blocks = dp.split(start, count, parts)
    assert len(blocks) == parts
    assert [i for a, b in blocks for i in range(a, b)] == list(range(start, start + count))
    sizes = [b - a for a, b in blocks]
    assert max(sizes) - min(sizes) <= 1


def test_split_depends_only_on_its_arguments():
    """Tasks that start at different times compute the same blocks."""
    assert dp.split(0, 8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    with pytest.raises(ValueError):
        dp.split(0, 8, 0)


def test_runs_are_contiguous_half_open_ranges():
    assert dp.runs([7, 1, 2, 3, 9, 8, 5]) == [(1, 4), (5, 6), (7, 10)]
    assert dp.runs([]) == []


# ---------------------------------------------------------------------------- tasks
@pytest.mark.parametrize("env,expected", [
    ({}, (0, 1, "single task")),
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
     (3, 4, "torchrun / Ray Train")),
    ({"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0",
      "SLURM_NTASKS_PER_NODE": "1(x3)"}, (2, 3, "SLURM")),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, (1, 2, "Open MPI")),
    # torchrun inside a SLURM allocation: torchrun's ranks count
    ({"RANK": "5", "WORLD_SIZE": "8", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"},
     (5, 8, "torchrun / Ray Train")),
])
def test_task_from_the_launchers_variables(env, expected):
    task = dp.detect_task(env)
    assert (task.rank, task.world, task.source) == expected


def test_task_flags_win_and_bad_values_are_named():
    assert dp.detect_task({"RANK": "1", "WORLD_SIZE": "2"}, 0, 1).world == 1
    with pytest.raises(dp.DataParallelError, match="WORLD_SIZE is missing"):
        dp.detect_task({"RANK": "1"})
    with pytest.raises(dp.DataParallelError, match=r"rank 4 of 4 tasks"):
        dp.detect_task({"SLURM_PROCID": "4", "SLURM_NTASKS": "4"})
    with pytest.raises(dp.DataParallelError, match="not a number"):
        dp.detect_task({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(dp.DataParallelError, match="go together"):
        dp.detect_task({}, 1, None)


# ---------------------------------------------------------------------------- devices
def test_gpus_from_cuda_visible_devices():
    assert dp.visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 3,5"}) == ["2", "3", "5"]
    assert dp.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_gpus_are_disjoint_per_replica_and_per_local_task():
    one = dp.Task()
    assert dp.assign_gpus(list("01234567"), 4, 2, one) == [["0", "1"], ["2", "3"],
                                                           ["4", "5"], ["6", "7"]]
    # torchrun --nproc-per-node 2 on an 8-GPU node: local rank 1 takes the upper half
    task = dp.Task(rank=3, world=4, local_rank=1, local_world=2)
    assert dp.assign_gpus(list("01234567"), 2, 2, task) == [["4", "5"], ["6", "7"]]
    with pytest.raises(dp.DataParallelError, match="needs 6 GPUs, this task sees 4"):
        dp.assign_gpus(list("0123"), 3, 2, one)


def test_cores_are_split_on_a_cpu_host():
    assert dp.assign_cores([0, 1, 2, 3, 4], 2) == ["0,1", "2,3,4"]
    assert dp.assign_cores([0], 2) is None


# ---------------------------------------------------------------------------- options
def test_script_options_read_and_replaced_as_argparse_sees_them():
    args = ["--output-dir", "a", "--batch-size", "4", "--output-dir=b", "--layer-ids", "1"]
    assert dp.option(args, "--output-dir") == "b"
    assert dp.option(args, "--start-idx") is None
    assert dp.with_option(args, "--output-dir", "c") == ["--batch-size", "4", "--layer-ids",
                                                         "1", "--output-dir", "c"]


def test_indices_option():
    assert dp.parse_indices("4:9") == (4, 9)
    for bad in ("9:4", "4", "a:b", "3:3"):
        with pytest.raises(dp.DataParallelError, match="--indices"):
            dp.parse_indices(bad)


# ---------------------------------------------------------------------------- the folder
def test_missing_and_cut_off_files(tmp_path):
    for i in (0, 1, 3, 4):
        torch.save(sample(3, i), tmp_path / f"data_{i}.pt")
    whole = (tmp_path / "data_4.pt").read_bytes()
    (tmp_path / "data_4.pt").write_bytes(whole[: len(whole) // 2])  # a crash mid-write
    (tmp_path / "data_1.pt").write_bytes(b"")
    (tmp_path / "data_7.tmp0123456789ab").write_bytes(whole)  # a killed save's temporary
    absent, incomplete = dp.missing(str(tmp_path), 0, 6)
    assert absent == [2, 5]
    assert incomplete == [1, 4]
    assert dp.whole(str(tmp_path / "data_0.pt"))


def _record(tmp_path, a, b, finished, lengths=None, config=None, layers=None, report=None):
    work = tmp_path / dp.WORK
    work.mkdir(exist_ok=True)
    (work / f"done-{a}-{b}.json").write_text(json.dumps({
        "range": [a, b], "finished": finished, "sample_lengths": lengths,
        "data_config": config, "layers": layers, "report": report}))


def _config(when, command, num_samples):
    return {"version": "2.0", "generated_at": when,
            "reproducibility": {"command": command, "gpu": "CPU ONLY"},
            "data": {"num_samples": num_samples, "max_samples": None, "seed": 0},
            "hidden_states": {"layer_ids": [0, 2]}}


def test_merge_writes_what_one_run_writes(tmp_path):
    """Records of three ranges (one replica killed and resumed: its first samples are
    only in its saved log; one sample's length only in its file) merge into the
    sample_lengths.json and data_config.json of one run of the user's command."""
    for i in range(6):
        torch.save(sample(3 + i, i), tmp_path / f"data_{i}.pt")
    layers = {"speculators_compat": "0.3.0", "format": 1, "generators": [
        {"model": "/m", "layer_ids": [0, 2], "num_hidden_layers": 4, "pid": 1}]}
    _record(tmp_path, 0, 3, 10.0, {"0": 3, "1": 4, "2": 5},
            _config("2026-12-06T10:00:00+00:00", "x.py --output-dir /w/range-0-3", 3),
            layers, {"process": "driver", "pid": 1})
    _record(tmp_path, 5, 6, 20.0, {"5": 8},
            _config("2026-12-06T11:00:00+00:00", "x.py --output-dir /w/range-5-6", 6),
            {**layers, "generators": [{**layers["generators"][0], "pid": 2}]},
            {"process": "driver", "pid": 2})
    (tmp_path / dp.WORK / "saved-3-6.log").write_text("3 6 1.0\n")  # killed after data_3
    report = tmp_path / "meta" / "compat-report.json"
    written = dp.merge(str(tmp_path), 0, 6, "x.py --output-dir out", str(report))
    assert json.loads((tmp_path / "sample_lengths.json").read_text()) == {
        str(i): 3 + i for i in range(6)}  # data_4's from its file
    config = json.loads((tmp_path / "data_config.json").read_text())
    assert config["reproducibility"]["command"] == "x.py --output-dir out"
    assert config["data"]["num_samples"] == 6
    assert config["generated_at"] == "2026-12-06T11:00:00+00:00"
    assert json.loads(report.read_text())["pid"] == 2
    generators = json.loads((tmp_path / "meta" / LAYERS_FILE).read_text())["generators"]
    assert len(generators) == 1 and generators[0]["layer_ids"] == [0, 2]
    assert written[:2] == ["sample_lengths.json", "data_config.json"]
    dp.clean(str(tmp_path))
    assert not (tmp_path / dp.WORK).exists()


def test_merge_writes_no_sample_lengths_where_the_release_writes_none(tmp_path):
    """speculators 0.3.0 writes no sample_lengths.json: neither does the merge."""
    torch.save(sample(3), tmp_path / "data_0.pt")
    _record(tmp_path, 0, 1, 1.0, None, _config("t", "x.py", 1))
    assert dp.merge(str(tmp_path), 0, 1, "x.py") == ["data_config.json"]
    assert not (tmp_path / "sample_lengths.json").exists()


# ---------------------------------------------------------------------------- hooks
def test_saves_are_whole_and_byte_identical(tmp_path):
    obj = sample(5)
    (tmp_path / "plain").mkdir()
    torch.save(obj, tmp_path / "plain" / "data_3.pt")
    save = hooks.make_save(torch.save, None)
    save(obj, str(tmp_path / "data_3.pt"))
    assert (tmp_path / "data_3.pt").read_bytes() == (tmp_path / "plain" / "data_3.pt").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["data_3.pt", "plain"]


def test_a_failed_save_leaves_no_file(tmp_path):
    def broken(obj, f, *a, **k):
        with open(f, "wb") as fh:
            fh.write(b"PK partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        hooks.make_save(broken, None)({}, str(tmp_path / "data_0.pt"))
    assert os.listdir(tmp_path) == []


def test_other_saves_are_untouched_outside_replicas(tmp_path):
    calls = []
    save = hooks.make_save(lambda obj, f, *a, **k: calls.append(f), None)
    save({}, str(tmp_path / "model.pt"))
    buffer = object()
    save({}, buffer)
    assert calls == [str(tmp_path / "model.pt"), buffer]


def test_a_replicas_saves_land_in_the_output_folder_and_are_logged(tmp_path):
    out, scratch = tmp_path / "out", tmp_path / "out" / dp.WORK / "range-4-6"
    scratch.mkdir(parents=True)
    log = tmp_path / "saved.log"
    cfg = {"mode": "range", "out": str(out), "scratch": str(scratch), "log": str(log),
           "stop": 6, "samples": 6}
    save = hooks.make_save(torch.save, cfg)
    save(sample(7), scratch / "data_4.pt")
    save({"freq": 1}, str(scratch / "token_freq.pt"))
    assert (out / "data_4.pt").exists() and not (scratch / "data_4.pt").exists()
    assert (scratch / "token_freq.pt").exists()
    assert log.read_text().split()[:2] == ["4", "7"]


class ToyDataset:
    def __init__(self, n: int) -> None:
        self.rows = list(range(n))

    def __len__(self) -> int:
        return len(self.rows)

    def select(self, indices):
        out = ToyDataset(0)
        out.rows = [self.rows[i] for i in indices]
        return out


def test_a_replicas_dataset_is_cut_after_its_range(tmp_path):
    cfg = {"mode": "range", "stop": 4, "samples": 6, "log": str(tmp_path / "saved.log")}
    load = hooks.make_load(lambda **kw: (ToyDataset(6), "tokenizer"), cfg)
    dataset, tokenizer = load(train_data_path="x")
    assert dataset.rows == [0, 1, 2, 3] and tokenizer == "tokenizer"
    with pytest.raises(hooks.ReplicaError, match="has 5 samples, the data-parallel plan 6"):
        hooks.make_load(lambda **kw: (ToyDataset(5), None), cfg)()


def test_count_mode_stops_after_preprocessing(tmp_path):
    cfg = {"mode": "count", "count_file": str(tmp_path / "count.json")}
    with pytest.raises(SystemExit) as exc:
        hooks.make_load(lambda: (ToyDataset(9), None), cfg)()
    assert exc.value.code == 0
    assert json.loads((tmp_path / "count.json").read_text()) == {"samples": 9}


def test_replica_settings_from_the_environment():
    assert hooks.replica_config({}) is None
    assert hooks.replica_config({hooks.ENV: '{"mode": "count"}'})["mode"] == "count"
    with pytest.raises(hooks.ReplicaError, match="not JSON"):
        hooks.replica_config({hooks.ENV: "{"})
    with pytest.raises(hooks.ReplicaError, match="names no mode"):
        hooks.replica_config({hooks.ENV: "{}"})


# ---------------------------------------------------------------------------- errors
def test_launcher_refuses_a_command_without_output_dir(tmp_path, capsys):
    script = tmp_path / "data_generation_offline.py"
    script.write_text("")
    assert dp.main(str(script), ["--target-model-path", "m"], 2, environ={}) == 2
    assert "no --output-dir" in capsys.readouterr().err


def test_launcher_refuses_tensor_parallel_other_than_gpus_per_replica(tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("")
    rc = dp.main(str(script), ["--output-dir", str(tmp_path / "o"), "--tensor-parallel-size",
                               "4"], 2, 2, environ={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert rc == 2
    assert "--tensor-parallel-size 4 and --gpus-per-replica 2 differ" in capsys.readouterr().err


def test_launcher_refuses_a_missing_script(tmp_path, capsys):
    assert dp.main(str(tmp_path / "nope.py"), [], 2, environ={}) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_plain_run_warns_of_samples_its_resume_skips(tmp_path):
    for i in (0, 2, 3):
        torch.save(sample(2, i), tmp_path / f"data_{i}.pt")
    text = dp.plain_run_gaps(["--output-dir", str(tmp_path)])
    assert "1 sample(s) below the highest file data_3.pt have no file (1)" in text
    assert "--data-parallel 1" in text
    assert dp.plain_run_gaps(["--output-dir", str(tmp_path), "--start-idx", "2"]) is None
    assert dp.plain_run_gaps(["--output-dir", str(tmp_path / "new")]) is None
    assert dp.plain_run_gaps([]) is None


# ---------------------------------------------------------------------------- the flow
class FakeScript:
    """Stands in for a replica's process: does what speculators 0.4's offline script does
    for its range (through the same torch.save wrapper), or dies after ``die_after``
    saves. Records the ranges it was asked for."""

    def __init__(self, die_after: dict[int, int] | None = None) -> None:
        self.ranges: list[tuple[int, int]] = []
        self.die_after = die_after or {}

    def __call__(self, cmd, env, **kwargs):
        cfg = json.loads(env[hooks.ENV])
        scratch = cfg["scratch"]
        resume_at = max([int(n[5:-3]) + 1 for n in os.listdir(scratch)
                         if n.startswith("data_") and n.endswith(".pt")], default=0)
        a, b = resume_at, cfg["stop"]
        self.ranges.append((a, b))
        save = hooks.make_save(torch.save, cfg)
        lengths = {}
        for i in range(a, b):
            if self.die_after.get(a) == i - a:
                return FakeProc(-9)
            save(sample(2 + i % 3, i), os.path.join(scratch, f"data_{i}.pt"))
            lengths[str(i)] = 2 + i % 3
        with open(os.path.join(scratch, "sample_lengths.json"), "w") as f:
            json.dump(lengths, f)
        with open(os.path.join(scratch, "data_config.json"), "w") as f:
            json.dump(_config(f"2026-12-06T10:00:{a:02d}", " ".join(cmd[4:]), b), f)
        return FakeProc(0)


class FakeProc:
    pid = 0

    def __init__(self, rc: int) -> None:
        self.returncode = rc

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        return self.returncode


def _launch(tmp_path, monkeypatch, fake, replicas=2, rank=0, world=1, samples=10,
            gpus=""):
    script = tmp_path / "data_generation_offline.py"
    script.write_text("")
    monkeypatch.setattr(dp.subprocess, "Popen", fake)
    monkeypatch.setattr(dp.os, "killpg", lambda *a: None)
    monkeypatch.setattr(dp.Launch, "count", lambda self: samples)
    monkeypatch.setattr(dp.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    import io

    stream = io.StringIO()
    launch = dp.Launch(str(script), ["--output-dir", str(tmp_path / "out"), "--seed", "0"],
                       replicas, 1, None, dp.Task(rank, world), {"CUDA_VISIBLE_DEVICES": gpus},
                       stream)
    return launch.run(), stream.getvalue()


def test_two_tasks_fill_one_folder_and_the_last_one_merges(tmp_path, monkeypatch):
    """Rank 0 of 2 writes its blocks and waits for the others; rank 1 completes the set
    and writes the metadata of one run; the work folder goes."""
    fake = FakeScript()
    rc, text = _launch(tmp_path, monkeypatch, fake, rank=0, world=2)
    out = tmp_path / "out"
    assert rc == 0 and "waiting on other tasks (5-9)" in text, text
    assert not (out / "sample_lengths.json").exists()
    rc, text = _launch(tmp_path, monkeypatch, fake, rank=1, world=2)
    assert rc == 0 and "all 10 samples present" in text, text
    assert sorted(fake.ranges) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert json.loads((out / "sample_lengths.json").read_text()) == {
        str(i): 2 + i % 3 for i in range(10)}
    config = json.loads((out / "data_config.json").read_text())
    assert config["data"]["num_samples"] == 10
    assert config["reproducibility"]["command"] == \
        f"data_generation_offline.py --output-dir {out} --seed 0"
    assert sorted(os.listdir(out)) == sorted(
        [f"data_{i}.pt" for i in range(10)] + ["sample_lengths.json", "data_config.json"])


def test_a_dead_replica_is_reported_and_a_rerun_generates_only_what_is_missing(
        tmp_path, monkeypatch):
    fake = FakeScript(die_after={5: 2})  # the replica of data_5..9 dies after 2 saves
    rc, text = _launch(tmp_path, monkeypatch, fake)
    assert rc == 1, text
    assert "replica 1 (CPU) FAILED (exit -9) in data_5..data_9 of its block data_5..data_9" \
        in text, text
    assert "resume it alone: speculators-compat run --data-parallel 1 --world-size 1 " \
           "--rank 0 --indices 5:10" in text, text
    out = tmp_path / "out"
    (out / "data_1.pt").unlink()  # and a file lost in the other block
    fake2 = FakeScript()
    rc, text = _launch(tmp_path, monkeypatch, fake2)
    assert rc == 0, text
    assert sorted(fake2.ranges) == [(1, 2), (7, 10)]
    assert "4 sample(s) generated" in text
    assert json.loads((out / "sample_lengths.json").read_text()) == {
        str(i): 2 + i % 3 for i in range(10)}
    assert not (out / dp.WORK).exists()


def test_a_dead_replica_on_a_gpu_is_resumed_on_its_gpu(tmp_path, monkeypatch):
    envs = []

    def fake(cmd, env, **kwargs):
        envs.append(env)
        return FakeScript(die_after={5: 0})(cmd, env, **kwargs)

    rc, text = _launch(tmp_path, monkeypatch, fake, gpus="6,7")
    assert rc == 1
    assert sorted(e["CUDA_VISIBLE_DEVICES"] for e in envs) == ["6", "7"]
    assert "replica 1 (GPU 7) FAILED" in text
    assert "resume it alone: CUDA_VISIBLE_DEVICES=7 speculators-compat run --data-parallel 1 " \
        in text, text


def test_the_launcher_flags_need_data_parallel_and_a_script(capsys):
    from speculators_compat.__main__ import main

    assert main(["run", "--indices", "1:3", "--rank", "0", "x.py"]) == 2
    assert "--indices, --rank only with --data-parallel N" in capsys.readouterr().err
    assert main(["run", "--data-parallel", "2", "-m", "json.tool"]) == 2
    assert "not a module (-m)" in capsys.readouterr().err
