"""``speculators-compat check-data``: each kind of damage to an output directory of
speculators 0.3/0.4's offline script fails (exit 1, the file and the reason named, a
regeneration command for the index), and a healthy directory passes.

The directories are built here with torch the way the script writes them (``data_<i>.pt``
= ``{"input_ids", "hidden_states": [one tensor per layer], "loss_mask"}``,
``sample_lengths.json``, ``data_config.json``). ``--model`` is tested with a fake
generator (no vLLM): its arguments and the per-layer comparison.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from speculators_compat import _check_data as cd  # noqa: E402
from speculators_compat.__main__ import main  # noqa: E402

LAYERS = [0, 2, 4, 5]
HIDDEN = 8
COMMAND = ("data_generation_offline.py --target-model-path /m/llama --train-data-path "
           "data.jsonl --output-dir /old/out --max-samples 100 --seq-length 64")


def sample(n: int, layers: int = len(LAYERS), dtype=torch.bfloat16, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.arange(n, dtype=torch.long),
            "hidden_states": [torch.randn(n, HIDDEN, generator=g).to(dtype)
                              for _ in range(layers)],
            "loss_mask": torch.ones(n, dtype=torch.long)}


def make_dir(path, count: int = 6, config: bool = True, lengths: bool = True,
             command: str = COMMAND) -> str:
    path.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for i in range(count):
        n = 5 + i % 4
        torch.save(sample(n, seed=i), path / f"data_{i}.pt")
        sizes[str(i)] = n
    if lengths:
        (path / "sample_lengths.json").write_text(json.dumps(sizes))
    if config:
        (path / "data_config.json").write_text(json.dumps({
            "reproducibility": {"command": command},
            "model": {"target_model_path": "/m/llama", "hidden_size": HIDDEN},
            "data": {"num_samples": count, "seq_length": 64},
            "hidden_states": {"layer_ids": LAYERS},
            "format": {"schema": {"hidden_states": {"dtype": "list[torch.bfloat16]"}}}}))
    return str(path)


def bad(result: dict) -> dict[int, str]:
    return {b["index"]: "; ".join(b["reasons"]) for b in result["bad_files"]}


def test_a_healthy_directory_passes(tmp_path, capsys):
    d = make_dir(tmp_path / "ok")
    result = cd.check(d, jobs=1)
    assert result["exit"] == 0 and result["status"] == "ok", result
    assert result["files_checked"] == 6 and result["bad_files"] == []
    assert (result["layers"], result["layer_ids"], result["hidden_size"], result["dtype"]) \
        == (4, LAYERS, HIDDEN, "bfloat16")
    assert result["problems"] == [] and result["warnings"] == []
    assert main(["check-data", d]) == 0
    out = capsys.readouterr().out
    assert "6 files checked, 0 bad" in out and out.rstrip().endswith("OK")
    assert main(["check-data", d, "--json", "--jobs", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["files_checked"] == 6


def test_missing_index(tmp_path, capsys):
    d = make_dir(tmp_path / "out")
    os.remove(os.path.join(d, "data_3.pt"))
    result = cd.check(d, jobs=1)
    assert result["exit"] == 1 and bad(result) == {3: "missing"}
    regen = result["regenerate"]
    assert regen["ranges"] == [[3, 3]]
    assert "suggestion" in regen["note"] and "--data-parallel 1 --indices" in regen["note"]
    rm, run = regen["commands"][0]
    assert rm == f"rm -f {d}/data_3.pt"
    args = shlex.split(run)
    assert args[:7] == ["speculators-compat", "run", "--data-parallel", "1", "--indices",
                        "3:4", "scripts/data_generation_offline.py"]
    # the recorded options, the output directory set to this one
    assert "/old/out" not in args and args[args.index("--output-dir") + 1] == d
    assert args[args.index("--max-samples") + 1] == "100"
    assert args[args.index("--seq-length") + 1] == "64"
    assert regen["then"][-1] == f"speculators-compat check-data {d}"
    assert main(["check-data", d]) == 1
    out = capsys.readouterr().out
    assert "data_3.pt: missing" in out and run in out and out.rstrip().endswith("FAIL")


def test_missing_tail_without_sample_lengths(tmp_path):
    """speculators 0.3.0 writes no sample_lengths.json: data_config's num_samples tells
    how many files there must be."""
    d = make_dir(tmp_path / "out", count=6, lengths=False)
    for i in (4, 5):
        os.remove(os.path.join(d, f"data_{i}.pt"))
    result = cd.check(d, jobs=1)
    assert bad(result) == {4: "missing", 5: "missing"}
    assert result["regenerate"]["ranges"] == [[4, 5]]
    assert any("sample_lengths.json" in w for w in result["warnings"])
    assert result["regenerate"]["commands"][0][0] == f"rm -f {d}/data_{{4..5}}.pt"
    assert "--indices 4:6 " in result["regenerate"]["commands"][0][1]


def test_truncated_file(tmp_path):
    d = make_dir(tmp_path / "out")
    path = Path(d) / "data_2.pt"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    result = cd.check(d, jobs=1)
    assert list(bad(result)) == [2] and bad(result)[2].startswith("does not load")
    path.write_bytes(b"")  # empty, as a killed save leaves it
    assert bad(cd.check(d, jobs=1))[2].startswith("does not load")


@pytest.mark.parametrize("value, word", [(float("nan"), "1 NaN"), (float("inf"), "1 Inf")])
def test_nan_or_inf(tmp_path, value, word):
    d = make_dir(tmp_path / "out")
    s = sample(6, seed=1)
    s["hidden_states"][2][3, 1] = value
    torch.save(s, os.path.join(d, "data_1.pt"))
    reasons = bad(cd.check(d, jobs=1))
    assert list(reasons) == [1] and "hidden state 2" in reasons[1] and word in reasons[1]


def test_wrong_layer_count(tmp_path):
    d = make_dir(tmp_path / "out")
    torch.save(sample(5, layers=3), os.path.join(d, "data_4.pt"))
    assert bad(cd.check(d, jobs=1)) == {4: "3 hidden states, 4 layers captured"}


def test_layer_count_against_the_metadata_not_the_majority(tmp_path):
    """Every file holds 3 layers, data_config.json says 4: all are bad."""
    d = make_dir(tmp_path / "out", count=3)
    for i in range(3):
        torch.save(sample(5 + i, layers=3), os.path.join(d, f"data_{i}.pt"))
    assert set(bad(cd.check(d, jobs=1))) == {0, 1, 2}


def test_duplicated_index(tmp_path):
    d = make_dir(tmp_path / "out", count=10)
    torch.save(sample(6, seed=7), os.path.join(d, "data_007.pt"))
    result = cd.check(d, jobs=1)
    assert list(bad(result)) == [7]
    assert "2 files for index 7: data_007.pt, data_7.pt" in bad(result)[7]
    assert result["bad_files"][0]["files"] == ["data_007.pt", "data_7.pt"]
    assert result["regenerate"]["ranges"] == [[7, 7]]
    assert f"rm {d}/data_007.pt" in result["regenerate"]["then"]


def test_misnamed_file_is_renamed_not_regenerated(tmp_path):
    d = make_dir(tmp_path / "out")
    os.rename(os.path.join(d, "data_5.pt"), os.path.join(d, "data_05.pt"))
    result = cd.check(d, jobs=1)
    assert bad(result)[5].startswith("named data_05.pt, not data_5.pt")
    assert result["exit"] == 1 and "regenerate" not in result
    assert result["rename"] == [f"mv {d}/data_05.pt {d}/data_5.pt"]


def test_loss_mask_length(tmp_path):
    d = make_dir(tmp_path / "out")
    s = sample(5)
    s["loss_mask"] = s["loss_mask"][:4]
    torch.save(s, os.path.join(d, "data_0.pt"))
    assert bad(cd.check(d, jobs=1)) == {0: "loss_mask has 4 entries, input_ids 5"}
    del s["loss_mask"]
    torch.save(s, os.path.join(d, "data_0.pt"))
    assert bad(cd.check(d, jobs=1)) == {0: "no loss_mask"}


def test_length_mismatch_with_sample_lengths(tmp_path):
    d = make_dir(tmp_path / "out")
    path = Path(d) / "sample_lengths.json"
    lengths = json.loads(path.read_text())
    lengths["2"] += 1
    path.write_text(json.dumps(lengths))
    assert bad(cd.check(d, jobs=1)) == {2: "7 tokens, sample_lengths.json says 8"}


def test_sample_lengths_names_more_files_than_exist(tmp_path):
    d = make_dir(tmp_path / "out")
    path = Path(d) / "sample_lengths.json"
    lengths = json.loads(path.read_text())
    lengths["6"] = 5
    path.write_text(json.dumps(lengths))
    assert bad(cd.check(d, jobs=1)) == {6: "missing"}


def test_rows_dtype_and_width(tmp_path):
    d = make_dir(tmp_path / "out")
    s = sample(5)
    s["hidden_states"][1] = s["hidden_states"][1][:4]
    torch.save(s, os.path.join(d, "data_0.pt"))
    torch.save(sample(6, dtype=torch.float16), os.path.join(d, "data_1.pt"))
    s = sample(7)
    s["hidden_states"] = [torch.zeros(7, HIDDEN + 1, dtype=torch.bfloat16)] * 4
    torch.save(s, os.path.join(d, "data_2.pt"))
    reasons = bad(cd.check(d, jobs=1))
    assert reasons == {0: "hidden state 1 has 4 rows, input_ids 5",
                       1: "dtype float16, the other files bfloat16",
                       2: f"hidden size {HIDDEN + 1}, expected {HIDDEN}"}


def test_stacked_hidden_states_are_read(tmp_path):
    d = make_dir(tmp_path / "out", count=2)
    s = sample(5)
    s["hidden_states"] = torch.stack(s["hidden_states"])
    torch.save(s, os.path.join(d, "data_0.pt"))
    assert cd.check(d, jobs=1)["exit"] == 0


def test_other_pt_files_are_a_problem(tmp_path):
    """speculators' training reads every file ending in 'pt' below the directory."""
    d = make_dir(tmp_path / "out")
    torch.save({"freq": torch.ones(3)}, os.path.join(d, "token_freq.pt"))
    os.mkdir(os.path.join(d, "old"))
    torch.save(sample(5), os.path.join(d, "old", "data_0.pt"))
    result = cd.check(d, jobs=1)
    assert result["exit"] == 1 and result["bad_files"] == []
    assert "old/data_0.pt, token_freq.pt" in result["problems"][0]


def test_layer_metadata_disagreement(tmp_path):
    d = make_dir(tmp_path / "out")
    (tmp_path / "out" / "speculators-compat-layers.json").write_text(json.dumps(
        {"format": 1, "generators": [{"layer_ids": [1, 2, 4, 5]}]}))
    result = cd.check(d, jobs=1)
    assert result["exit"] == 1 and "disagree on the layers" in result["problems"][0]
    assert not any("no layer ids" in w for w in result["warnings"])


def test_without_metadata_the_files_agree_among_themselves(tmp_path):
    d = make_dir(tmp_path / "out", config=False, lengths=False)
    torch.save(sample(5, layers=2), os.path.join(d, "data_5.pt"))
    result = cd.check(d, jobs=1)
    assert bad(result) == {5: "2 hidden states, 4 layers captured"}
    assert any("data_config.json" in w for w in result["warnings"])
    run = result["regenerate"]["commands"][0][1]
    assert "--target-model-path MODEL" in run and "fill in" in result["regenerate"]["note"]


def test_recorded_dtype_differs_only_warns(tmp_path):
    """speculators writes list[torch.bfloat16] into data_config.json for every model."""
    d = make_dir(tmp_path / "out", count=2)
    for i in range(2):
        torch.save(sample(5 + i, dtype=torch.float16), os.path.join(d, f"data_{i}.pt"))
    result = cd.check(d, jobs=1)
    assert result["exit"] == 0 and "says bfloat16, the files hold float16" in \
        result["warnings"][0]


def test_loads_what_weights_only_loads_and_refuses_what_it_refuses(tmp_path):
    """A global outside the fast path's two (a dtype) is loaded by weights_only; an object
    of an arbitrary class and the legacy (non-zip, not mmap-able) format are not."""
    d = make_dir(tmp_path / "out", count=3)
    s = sample(5)
    s["dtype"] = torch.bfloat16
    torch.save(s, os.path.join(d, "data_0.pt"))
    s = sample(6)
    s["extra"] = cd.DATA_NAME  # a re.Pattern: weights_only refuses it
    torch.save(s, os.path.join(d, "data_1.pt"))
    torch.save(sample(7), os.path.join(d, "data_2.pt"), _use_new_zipfile_serialization=False)
    reasons = bad(cd.check(d, jobs=1))
    assert sorted(reasons) == [1, 2]
    assert all(r.startswith("does not load") for r in reasons.values())


def test_regeneration_ranges_and_start_idx():
    config = {"reproducibility": {"command": "data_generation_offline.py --target-model-path m "
                                             "--train-data-path d --start-idx 10 "
                                             "--output-dir=/x --turn-dropout"}}
    plan = cd.regeneration("/data/out/", [12, 13, 14, 20, 3], config, has_lengths=True)
    assert plan["ranges"] == [[3, 3], [12, 14], [20, 20]]
    assert plan["commands"][0][0].startswith("# 3-3: below the recorded --start-idx 10")
    rm, run = plan["commands"][1]
    assert rm == "rm -f /data/out/data_{12..14}.pt"
    args = shlex.split(run)
    assert "--output-dir=/x" not in args and args[args.index("--start-idx") + 1] == "10"
    assert args[args.index("--indices") + 1] == "12:15"
    assert args[args.index("--output-dir") + 1] == "/data/out"
    assert "--turn-dropout" in plan["note"]
    assert plan["then"] == ["speculators-compat check-data /data/out"]
    assert cd.regeneration("/d", [0, 1], {}, False)["commands"][0][0] == "rm -f /d/data_{0..1}.pt"


def test_not_a_directory_and_no_files(tmp_path, capsys):
    assert main(["check-data", str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().out
    assert main(["check-data", str(tmp_path)]) == 2
    assert "no data_<i>.pt files" in capsys.readouterr().out


def test_parallel_processes_give_the_same_verdict(tmp_path):
    d = make_dir(tmp_path / "out", count=80)
    os.remove(os.path.join(d, "data_41.pt"))
    s = sample(5)
    s["hidden_states"][0][0, 0] = float("nan")
    torch.save(s, os.path.join(d, "data_77.pt"))
    one, two = cd.check(d, jobs=1), cd.check(d, jobs=2)
    assert bad(one) == bad(two) and sorted(bad(two)) == [41, 77]
    assert two["jobs"] == 2 and two["files_checked"] == 79


def test_import_loads_no_torch():
    code = ("import sys, speculators_compat, speculators_compat._check_data, "
            "speculators_compat.__main__; print('torch' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout
    assert out.strip() == "False"


# ------------------------------------------------------------------------------ --model


def test_choose_sample():
    assert cd.choose_sample(range(10), 4) == [0, 3, 6, 9]
    assert cd.choose_sample([5, 1, 3], 10) == [1, 3, 5]
    assert cd.choose_sample(range(10), 1) == [0]
    with pytest.raises(ValueError):
        cd.choose_sample(range(3), 0)


def test_sample_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        main(["check-data", "x", "--model", "m", "--sample", "0"])
    assert "must be at least 1" in capsys.readouterr().err


def test_compare_layers():
    a = [torch.randn(5, HIDDEN), torch.zeros(5, HIDDEN)]
    same = cd.compare_layers(a, [x.clone() for x in a])
    assert same["ok"] and same["min_cosine_per_layer"] == [1.0, 1.0]
    noisy = cd.compare_layers(a, [a[0] + 1e-3 * torch.randn(5, HIDDEN), a[1]])
    assert noisy["ok"] and noisy["min_cosine_per_layer"][0] > 0.99
    flipped = [a[0].clone(), a[1]]
    flipped[0][2] = -flipped[0][2]
    out = cd.compare_layers(a, flipped)
    assert not out["ok"] and out["min_cosine_per_layer"][0] == pytest.approx(-1.0, abs=1e-5)
    assert "layer 0: min cosine" in out["reasons"][0]
    assert not cd.compare_layers(a, a[:1])["ok"]
    assert "shape" in cd.compare_layers(a, [a[0][:4], a[1]])["reasons"][0]
    # bf16 on disk against a float32 regeneration
    assert cd.compare_layers([a[0].to(torch.bfloat16)], [a[0]])["ok"]


class FakeGenerator:
    """What VllmHiddenStatesGenerator.generate returns, from the files (plus noise)."""

    def __init__(self, directory: str, flip_layer: int | None = None, **kwargs):
        self.directory, self.flip_layer, self.kwargs = directory, flip_layer, kwargs
        self.calls: list = []

    def generate(self, token_ids):
        self.calls.append(token_ids)
        by_ids = {}
        for name in os.listdir(self.directory):
            if cd.DATA_NAME.match(name):
                s = torch.load(os.path.join(self.directory, name), weights_only=True)
                by_ids[tuple(s["input_ids"].tolist())] = s
        out = []
        for ids in token_ids:
            states = [h.float() for h in by_ids[tuple(ids)]["hidden_states"]]
            if self.flip_layer is not None:
                states[self.flip_layer] = -states[self.flip_layer]
            out.append({"input_ids": torch.tensor(ids), "hidden_states": states,
                        "loss_mask": None})
        return out


def test_model_check_with_a_fake_generator(tmp_path):
    d = tmp_path / "out"
    make_dir(d)
    for i in range(6):  # distinct token ids per file
        s = torch.load(d / f"data_{i}.pt", weights_only=True)
        s["input_ids"] = s["input_ids"] + 100 * i
        torch.save(s, d / f"data_{i}.pt")
    made = []

    def factory(flip=None):
        def build(**kwargs):
            made.append(FakeGenerator(str(d), flip, **kwargs))
            return made[-1]
        return build

    result = cd.check(str(d), jobs=1)
    ok = cd.model_check(str(d), "/m/llama", result, sample=3, generator_factory=factory())
    assert ok["ok"] and [f["index"] for f in ok["files"]] == [0, 2, 5]
    assert made[0].kwargs == {"model_path": "/m/llama", "layer_ids": LAYERS,
                              "max_model_len": 64, "tensor_parallel_size": 1}
    assert len(made[0].calls) == 1 and len(made[0].calls[0]) == 3
    bad_run = cd.model_check(str(d), "/m/llama", result, sample=2, tensor_parallel_size=2,
                             generator_factory=factory(flip=3))
    assert not bad_run["ok"] and made[1].kwargs["tensor_parallel_size"] == 2
    assert all("layer 3: min cosine" in f["reasons"][0] for f in bad_run["files"])
    # the CLI: --model turns a healthy directory's verdict into FAIL
    import speculators_compat._check_data as mod

    orig = mod._speculators_generator
    mod._speculators_generator = factory(flip=0)
    try:
        assert main(["check-data", str(d), "--model", "/m/llama", "--sample", "2",
                     "--jobs", "1"]) == 1
    finally:
        mod._speculators_generator = orig


def test_model_check_needs_layer_ids(tmp_path):
    d = make_dir(tmp_path / "out", config=False)
    out = cd.model_check(d, "/m", cd.check(d, jobs=1),
                         generator_factory=lambda **kw: pytest.fail("built"))
    assert not out["ok"] and "no layer ids" in out["error"]
