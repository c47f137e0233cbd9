"""The draft-layer bookkeeping: speculators' numbering vs. vLLM's, the metadata files a
data folder's layers are read from, the generator records that travel with the report,
the ``draft_aux_layers`` adapter's decisions, and ``check-draft``.

Pure Python (no torch, transformers or vLLM): the adapter's decisions are checked on
plain objects here; on speculators' real classes in
tests/contract/adapters/test_draft_aux_layers.py and the offline-script e2e chain.
"""

from __future__ import annotations

import json
import types
import warnings

import pytest

import speculators_compat
from speculators_compat import _check_draft, _draft_layers, _env, _layer_record
from speculators_compat.__main__ import main
from speculators_compat._draft_layers import FIELD, DataLayers, Lookup
from speculators_compat._errors import DraftLayersWarning
from speculators_compat.adapters.draft_aux_layers import (
    captures_layer_output,
    dataset_layers,
    settle,
)

LAYERS = [2, 16, 29, 31]  # speculators' default for a 32-layer target


@pytest.fixture(autouse=True)
def _no_records():
    _layer_record.clear()
    yield
    _layer_record.clear()


def test_numbering():
    assert _draft_layers.speculators_default(32) == tuple(LAYERS)
    assert _draft_layers.vllm_default(32) == (2, 16, 29)
    # the hazard: vLLM's default ids are the outputs of the layers one below
    assert _draft_layers.speculators_ids(_draft_layers.vllm_default(32)) == (1, 15, 28)
    dl = DataLayers(tuple(LAYERS), "x")
    assert dl.aux == (2, 16, 29) and dl.target == 31
    assert dl.vllm_aux_ids == (3, 17, 30) != _draft_layers.vllm_default(32)


def layers_file(folder, *layer_sets, n=32):
    _draft_layers.write_layers_file(
        folder, [_draft_layers.generator_record("m", ids, n) for ids in layer_sets], "0.0")


def data_config(folder, ids):
    (folder / _draft_layers.DATA_CONFIG_FILE).write_text(json.dumps(
        {"version": "2.0", "model": {"target_model_path": "m"},
         "hidden_states": {"layer_ids": ids}}))


def test_read_dir_and_for_dirs(tmp_path):
    a, b, c = (tmp_path / x for x in "abc")
    for d in (a, b, c):
        d.mkdir()
    layers_file(a, LAYERS)
    data_config(b, LAYERS)
    assert _draft_layers.for_dirs([c]).layers is None
    assert "no speculators-compat-layers.json or data_config.json" in \
        _draft_layers.for_dirs([c]).reason
    got = _draft_layers.for_dirs([a, b])
    assert got.layers is not None and got.layers.layer_ids == tuple(LAYERS)
    assert got.layers.num_hidden_layers == 32  # the record that knows it is preferred
    data_config(a, [1, 2, 3, 4])
    assert _draft_layers.for_dirs([a]).layers is None
    assert "disagree" in _draft_layers.for_dirs([a]).reason
    layers_file(c, LAYERS, [0, 1, 2, 3])  # two generators of one process, other layers
    assert _draft_layers.for_dirs([c]).layers is None
    # unreadable, malformed or oversized files say nothing
    (c / _draft_layers.LAYERS_FILE).write_text("{not json")
    assert _draft_layers.read_dir(c) == []
    (c / _draft_layers.LAYERS_FILE).write_text(json.dumps({"generators": [
        {"layer_ids": [True, 2]}, {"layer_ids": "x"}, 5]}))
    assert _draft_layers.read_dir(c) == []
    (c / _draft_layers.DATA_CONFIG_FILE).write_text(
        json.dumps({"hidden_states": {"layer_ids": LAYERS}, "pad": "x" * (1 << 20)}))
    assert _draft_layers.read_dir(c) == []


def test_generator_record_reaches_report_file_and_layers_file(toy_global, toy, tmp_path,
                                                              monkeypatch):
    out = tmp_path / "data"
    out.mkdir()
    monkeypatch.setenv(_env.REPORT_FILE, str(out / "compat-report.json"))
    act = toy_global(toy("a"))
    speculators_compat.activate()
    assert act.report_path == str(out / "compat-report.json")
    first = json.loads((out / "compat-report.json").read_text())
    assert "data" not in first and not (out / _draft_layers.LAYERS_FILE).exists()
    _layer_record.record_generator(_draft_layers.generator_record("/m", LAYERS, 32))
    report = json.loads((out / "compat-report.json").read_text())
    rec = report["data"]["hidden_states"][0]
    assert rec["layer_ids"] == LAYERS and rec[FIELD] == [3, 17, 30]
    assert rec["draft_inputs"] == [2, 16, 29] and rec["target_layer"] == 31
    assert _draft_layers.for_dirs([out]).layers.vllm_aux_ids == (3, 17, 30)
    # save_report elsewhere: the report and the layers file go there too
    other = tmp_path / "elsewhere"
    other.mkdir()
    speculators_compat.save_report(other / "r.json")
    assert json.loads((other / "r.json").read_text())["data"] == report["data"]
    assert _draft_layers.for_dirs([other]).layers.layer_ids == tuple(LAYERS)
    speculators_compat.deactivate()
    assert act.report_path is None


def test_report_folder_made_later(toy_global, toy, tmp_path, monkeypatch):
    """The data folder (where the report is to go) often exists only once the script
    runs: the report and the layers file are written when the generator is built."""
    out = tmp_path / "not-yet"
    monkeypatch.setenv(_env.REPORT_FILE, str(out / "compat-report.json"))
    toy_global(toy("a"))
    speculators_compat.activate()
    assert not out.exists()
    _layer_record.record_generator(_draft_layers.generator_record("/m", LAYERS, 32))
    assert json.loads((out / "compat-report.json").read_text())["data"]
    assert _draft_layers.for_dirs([out]).layers.layer_ids == tuple(LAYERS)


def test_save_report_without_a_generator_writes_no_layers_file(toy_global, toy, tmp_path):
    toy_global(toy("a"))
    speculators_compat.activate()
    speculators_compat.save_report(tmp_path / "r.json")
    assert "data" not in json.loads((tmp_path / "r.json").read_text())
    assert not (tmp_path / _draft_layers.LAYERS_FILE).exists()


def test_a_child_activation_writes_no_file(make_activation, toy, tmp_path, monkeypatch):
    monkeypatch.setenv(_env.REPORT_FILE, str(tmp_path / "r.json"))
    act = make_activation(toy("a"))
    act.activate(process="driver", write_report=False)
    assert act.report_path is None


# --------------------------------------------------------------------------- the adapter


def test_where_speculators_captures():
    after = "hidden_states, residual = layer(\n ...)\n aux_hidden_states.append((h + r))"
    before = "aux_hidden_states.append(h + r)\n hidden_states, residual = layer(...)"
    assert captures_layer_output(after) is True
    assert captures_layer_output(before) is False
    assert captures_layer_output("nothing") is None


def known(ids=LAYERS, source="d/data_config.json"):
    return Lookup(DataLayers(tuple(ids), source), "ok")


def unknown(reason="no metadata"):
    return Lookup(None, reason)


def config(value=None):
    return types.SimpleNamespace(**{FIELD: value})


def test_settle_names_the_layers_of_the_data():
    c = config()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settle(c, [known(), known(source="e/speculators-compat-layers.json")])
    assert getattr(c, FIELD) == [3, 17, 30]


def test_settle_leaves_a_config_alone_without_training_data():
    c = config()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settle(c, [])
    assert getattr(c, FIELD) is None


@pytest.mark.parametrize("seen, match", [
    ([unknown("nothing in /d")], "nothing in /d"),
    ([known(), unknown()], "no metadata"),
    ([known(), known([0, 1, 2, 3])], "disagree"),
])
def test_settle_warns_when_it_cannot_tell(seen, match):
    c = config()
    with pytest.warns(DraftLayersWarning, match=match):
        settle(c, seen)
    assert getattr(c, FIELD) is None


def test_settle_keeps_an_explicit_value():
    c = config([2, 16, 29])  # speculators' ids where vLLM's belong: the hazard, spelled out
    with pytest.warns(DraftLayersWarning, match=r"set eagle_aux_hidden_state_layer_ids=\[3, 17"):
        settle(c, [known()])
    assert getattr(c, FIELD) == [2, 16, 29]
    right = config([3, 17, 30])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settle(right, [known()])
        settle(config([5, 6, 7]), [unknown()])  # explicit, and nothing to compare with
    assert getattr(right, FIELD) == [3, 17, 30]


def test_dataset_layers(tmp_path):
    data_config(tmp_path, LAYERS)
    std = object()
    ds = types.SimpleNamespace(data=[str(tmp_path / "data_0.pt"), tmp_path / "data_1.pt"],
                               standardize_fn=std)
    assert dataset_layers(ds, std).layers.layer_ids == tuple(LAYERS)
    assert "own standardize_fn" in dataset_layers(ds, object()).reason
    assert dataset_layers(types.SimpleNamespace(data=[], standardize_fn=std), std).layers is None


# --------------------------------------------------------------------------- check-draft


def draft(folder, value=None, verifier=None, kind="eagle3"):
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"speculators_model_type": kind, FIELD: value,
           "speculators_config": {"verifier": {"name_or_path": str(verifier)}}}
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder)


def target(folder, n=32):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"num_hidden_layers": n}))
    return folder


def test_check_draft_verdicts(tmp_path):
    tgt = target(tmp_path / "target")
    data = tmp_path / "data"
    data.mkdir()
    data_config(data, LAYERS)
    unnamed = draft(tmp_path / "unnamed", None, tgt)
    r = _check_draft.check(unnamed, str(data))
    assert (r["status"], r["exit"]) == ("mismatch", 1)
    assert r["vllm_feeds"] == [2, 16, 29] and r["vllm_feeds_outputs_of"] == [1, 15, 28]
    assert r["expected"] == [3, 17, 30] and r["num_hidden_layers"] == 32
    text = "\n".join(_check_draft.lines(r))
    assert "MISMATCH" in text and '"eagle_aux_hidden_state_layer_ids": [3, 17, 30]' in text
    assert _check_draft.check(unnamed)["status"] == "default"
    assert _check_draft.check(unnamed)["exit"] == 1
    named = draft(tmp_path / "named", [3, 17, 30], tgt)
    assert _check_draft.check(named, str(data))["status"] == "match"
    assert _check_draft.check(named)["exit"] == 0
    # the data file may be given instead of its folder
    assert _check_draft.check(named, str(data / "data_config.json"))["exit"] == 0
    # a target given by size; an unknown target with an unnamed draft is not confirmed
    lost = draft(tmp_path / "lost", None, tmp_path / "nowhere")
    assert _check_draft.check(lost, str(data))["status"] == "unknown"
    assert _check_draft.check(lost, str(data), target="32")["status"] == "mismatch"
    # a target whose default happens to be what the data holds
    tgt_data = tmp_path / "data2"
    tgt_data.mkdir()
    data_config(tgt_data, [1, 15, 28, 31])
    assert _check_draft.check(unnamed, str(tgt_data))["status"] == "match"
    # errors
    assert _check_draft.check(str(tmp_path / "none"))["exit"] == 2
    assert _check_draft.check(draft(tmp_path / "mlp", None, tgt, kind="mlp"))["exit"] == 2


def test_check_draft_command(tmp_path, capsys):
    tgt = target(tmp_path / "target")
    data = tmp_path / "data"
    data.mkdir()
    layers_file(data, LAYERS)
    unnamed = draft(tmp_path / "unnamed", None, tgt)
    assert main(["check-draft", unnamed, "--data", str(data)]) == 1
    out = capsys.readouterr().out
    assert "vLLM feeds its default for a 32-layer target, [2, 16, 29]" in out
    assert "the outputs of layers [2, 16, 29] (target layer 31), vLLM ids [3, 17, 30]" in out
    assert main(["check-draft", draft(tmp_path / "named", [3, 17, 30], tgt), "--data",
                 str(data), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "match"


def test_check_draft_knows_a_vllm_that_drops_named_layers(tmp_path, monkeypatch):
    """vLLM 0.11's speculators-format loader never passes the draft's layer ids on: a draft
    naming its layers is still fed vLLM's default there, and check-draft says so."""
    loader = tmp_path / "vllm" / _check_draft._LOADER
    loader.parent.mkdir(parents=True)
    loader.write_text("def update_eagle3(config_dict, vllm_config):\n"
                      "    vllm_config['draft_vocab_size'] = config_dict.get('draft_vocab_size')\n")
    assert _check_draft.vllm_reads_named_layers(str(tmp_path / "vllm")) is False
    loader.write_text(loader.read_text() + f"    vllm_config[{FIELD!r}] = config_dict[{FIELD!r}]\n")
    assert _check_draft.vllm_reads_named_layers(str(tmp_path / "vllm")) is True
    assert _check_draft.vllm_reads_named_layers(str(tmp_path / "elsewhere")) is None

    tgt = target(tmp_path / "target")
    data = tmp_path / "data"
    data.mkdir()
    data_config(data, LAYERS)
    named = draft(tmp_path / "named", [3, 17, 30], tgt)
    monkeypatch.setattr(_check_draft, "vllm_reads_named_layers", lambda: False)
    r = _check_draft.check(named, str(data))
    assert (r["status"], r["exit"]) == ("mismatch", 1)
    assert r["vllm_feeds"] == [2, 16, 29]
    text = "\n".join(_check_draft.lines(r))
    assert "loader drops" in text and "serve with vLLM 0.12 or newer" in text
    assert _check_draft.check(named)["status"] == "default"
    monkeypatch.setattr(_check_draft, "vllm_reads_named_layers", lambda: None)
    assert _check_draft.check(named, str(data))["status"] == "match"


def test_check_draft_reads_only_the_keys_the_installed_reader_reads(tmp_path):
    """vLLM 0.24's reader looks at the named field and ``dflash_config.target_layer_ids``
    only; a DSpark config's ids mean nothing there, and ``deepseek_v41`` ids are shifted by
    0.28 and taken as they are by 0.33+ (the reader's source says which)."""
    reader = tmp_path / "vllm" / _check_draft._READER
    reader.parent.mkdir(parents=True)
    reader.write_text('layer_ids = getattr(hf_config, "eagle_aux_hidden_state_layer_ids")\n'
                      'layer_ids = [i + 1 for i in dflash_config.get("target_layer_ids")]\n')
    old = _check_draft.vllm_id_reads(str(tmp_path / "vllm"))
    assert old == {"dflash_target_layer_ids"}
    dspark = {"dspark_target_layer_ids": [2, 16], "model_type": "deepseek_v41"}
    assert _draft_layers.named_layers(dspark, old) is None
    assert _draft_layers.named_layers(dspark) == (2, 16)
    reader.write_text(reader.read_text() + 'x = getattr(hf_config, "dspark_target_layer_ids")\n')
    assert _draft_layers.named_layers(dspark, _check_draft.vllm_id_reads(
        str(tmp_path / "vllm"))) == (3, 17)
    assert _check_draft.vllm_id_reads(str(tmp_path / "elsewhere")) == _draft_layers.READS_0_34
