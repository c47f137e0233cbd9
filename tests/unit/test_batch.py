"""generate()'s batch check (adapters/_batch.py): what upstream handles passes unchanged,
everything else gets a CompatError naming the input's type and what is expected;
over-long sequences are reported once per call (refused under SPECULATORS_COMPAT_STRICT).

The real-vLLM counterparts (both speculators releases) are in tests/e2e/test_reliability.py.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from speculators_compat._errors import CompatError
from speculators_compat.adapters._batch import check_batch, truncation
from speculators_compat.adapters.generate_guard import check_truncation


@pytest.mark.parametrize("batch, lengths", [
    ([[5, 6, 7], [1]], [3, 1]),
    (([5, 6, 7], [1, 2]), [3, 2]),                     # an outer tuple works upstream
    ([torch.tensor([5, 6]), [1, 2, 3]], [2, 3]),       # 1-D tensors: upstream .tolist()s them
    (torch.tensor([[5, 6, 7], [1, 2, 3]]), [3, 3]),    # a 2-D integer tensor
    ([[np.int64(5), 6]], [2]),                         # numpy integer scalars are ints
])
def test_what_upstream_handles_passes(batch, lengths):
    assert check_batch(batch, 100) == lengths


@pytest.mark.parametrize("batch, says", [
    ([5, 6, 7], "a list whose item 0 is an int, not a sequence"),
    (torch.tensor([5, 6, 7]), "a tensor with 1 dimension(s)"),
    ({"input_ids": [[5]]}, "got a dict"),
    (np.array([[5, 6, 7]]), "a numpy.ndarray (call .tolist() on it)"),
    ([(5, 6, 7)], "sequence 0 is a tuple"),
    ([[5, 6], np.array([5, 6])], "sequence 1 is a numpy.ndarray"),
    ([[5, 6], "abc"], "sequence 1 is a str"),
    (None, "got a NoneType"),
    (torch.tensor([[0.5, 1.0]]), "dtype torch.float32"),
])
def test_malformed_batches_name_the_type_and_what_is_expected(batch, says):
    with pytest.raises(CompatError) as e:
        check_batch(batch, 100)
    assert says in str(e.value)
    assert "list of lists of ints" in str(e.value) and "nothing was run" in str(e.value)


def test_bad_token_names_sequence_position_and_type():
    with pytest.raises(CompatError, match=r"sequence 0 contains None \(NoneType\) at position 1"):
        check_batch([[5, None]], 100)
    with pytest.raises(CompatError, match=r"sequence 1 contains True \(bool\) at position 0"):
        check_batch([[5], [True]], 100)
    with pytest.raises(CompatError, match=r"sequence 1 has token id 100 at position 1"):
        check_batch(torch.tensor([[1, 2], [3, 100]]), 100)
    with pytest.raises(CompatError, match=r"sequence 1 of the batch is empty"):
        check_batch([[1], torch.tensor([], dtype=torch.long)], 100)


def test_truncation_counts():
    assert truncation([300, 10, 130], 127) == (2, 173, 176)
    assert truncation([127], 127) == (0, 0, 0)


def test_truncation_warns_once_per_call_or_refuses_when_strict(caplog, monkeypatch):
    monkeypatch.delenv("SPECULATORS_COMPAT_STRICT", raising=False)
    with caplog.at_level(logging.WARNING, logger="speculators_compat"):
        check_truncation([300, 10, 130], 127)
        check_truncation([100], 127)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "2 of 3 sequence(s) are longer than max_model_len - 1 = 127" in warnings[0]
    assert "by 173 tokens, 176 tokens in all" in warnings[0]
    monkeypatch.setenv("SPECULATORS_COMPAT_STRICT", "1")
    with pytest.raises(CompatError, match="strict.*2 of 3 sequence"):
        check_truncation([300, 10, 130], 127)
    check_truncation([127], 127)  # nothing cut: nothing to refuse
