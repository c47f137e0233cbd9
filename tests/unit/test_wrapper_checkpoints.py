"""The multimodal wrapper checkpoints (``qwen3_5_mm``, ``gemma4_mm``) and their reference.

Why: vLLM starts a ``...ForConditionalGeneration`` model only with its processor files and
the multimodal tokens its processor looks up on the tokenizer, whose ids the wrapper config
must name; and the transformers reference must read the language model's layers whichever
class ``AutoModelForCausalLM`` loads for the wrapper (Gemma 4: the wrapper itself, whose
decoder layers sit under ``model.language_model``). Runs transformers on CPU, no vLLM.
"""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from speculators_compat.demo import checkpoints  # noqa: E402
from speculators_compat.demo.reference import reference_hidden_states  # noqa: E402

WRAPPERS = [("qwen3_5_mm", "Qwen3_5ForConditionalGeneration", 4),
            ("gemma4_mm", "Gemma4ForConditionalGeneration", 6)]


@pytest.mark.skipif(not hasattr(transformers, "Gemma4ForConditionalGeneration")
                    or not hasattr(transformers, "Qwen3_5ForConditionalGeneration"),
                    reason="needs transformers 5 with Qwen3.5 and Gemma 4")
@pytest.mark.parametrize("kind, arch, n", WRAPPERS, ids=[w[0] for w in WRAPPERS])
def test_wrapper_checkpoint_and_reference(tmp_path, kind, arch, n):
    path = checkpoints.build_checkpoint(kind, tmp_path / kind)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == [arch]
    assert cfg["text_config"]["num_hidden_layers"] == n
    assert "num_hidden_layers" not in cfg  # the wrapper's count is its text_config's
    for name in ("preprocessor_config.json", "processor_config.json",
                 "video_preprocessor_config.json", "chat_template.jinja"):
        assert (path / name).is_file(), name
    tok = transformers.AutoTokenizer.from_pretrained(path)
    spec = checkpoints._WRAPPERS[kind]
    for key, attr in spec["token_ids"].items():
        assert tok.convert_tokens_to_ids(getattr(tok, attr)) == cfg[key] < \
            cfg["text_config"]["vocab_size"], key
    # the reference: the wrapper's language-model layers, as its own forward reports them
    seq = list(range(5, 90))
    layers = [0, n - 2]
    ref = reference_hidden_states(path, [seq], layers)[0]
    model = transformers.AutoModelForImageTextToText.from_pretrained(
        path, dtype=torch.bfloat16).eval()
    with torch.inference_mode():
        hs = model(input_ids=torch.tensor([seq]), use_cache=False,
                   output_hidden_states=True).hidden_states
    for got, k in zip(ref, layers):
        cos = torch.nn.functional.cosine_similarity(got.float(), hs[k + 1][0].float(), dim=-1)
        assert float(cos.min()) > 0.9999, (kind, k)


def test_fast_builder_refuses_wrappers(tmp_path):
    with pytest.raises(ValueError, match="multimodal wrapper"):
        checkpoints.build_fast_checkpoint("gemma4_mm", tmp_path / "x")
