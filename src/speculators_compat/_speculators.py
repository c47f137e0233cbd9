"""The names and formats of speculators 0.3/0.4 that the shim relies on (one home).

The generator module the adapters patch, the worker extension it names, the training
modules where a draft meets its data, the two result contracts of that extension, and the
grammar of the request ids its generator assigns:
every module that needs one of these facts reads it here (adapters in the driver, the
capture and the transport in vLLM's workers), so they cannot drift apart.
"""

from __future__ import annotations

import re

#: speculators' in-process generator (``VllmHiddenStatesGenerator``): the consumer whose
#: names the generator-stage adapters rebind.
GENERATOR_MODULE = "speculators.data_generation.vllm_hidden_states_generator"
#: speculators' worker extension module and class (named by string in ``ParallelConfig``).
WORKER_MODULE = "speculators.data_generation.custom_worker"
WORKER_EXTENSION = f"{WORKER_MODULE}.HiddenStatesWorkerExtension"
#: speculators 0.4's offline-script metadata module (``get_device_name``).
CONFIG_MODULE = "speculators.data_generation.config_generator"
#: speculators' EAGLE-3 draft config (``Eagle3SpeculatorConfig``) and its training data
#: (``Eagle3SampleFileDataset``, ``standardize_data_v1``): where a draft meets its data.
EAGLE3_CONFIG_MODULE = "speculators.models.eagle3.config"
TRAIN_DATA_MODULE = "speculators.train.data"

#: The worker extension's result contract: a list of per-layer tensors (0.3.x)...
CONTRACT_LIST = "list"
#: ... or a dict request id -> per-layer tensors, with per-step metadata (0.4.x).
CONTRACT_BY_REQUEST = "by_request"
CONTRACTS = (CONTRACT_LIST, CONTRACT_BY_REQUEST)

#: The request ids speculators' generator assigns: ``req_<call>_<index in the batch>``.
REQUEST_ID = re.compile(r"^req_(\d+)_(\d+)$")


def request_index(req_id: object) -> tuple[int, int] | None:
    """``(call, index)`` of one of speculators' request ids; ``None`` for any other value."""
    if not isinstance(req_id, str):
        return None
    m = REQUEST_ID.match(req_id)
    return (int(m.group(1)), int(m.group(2))) if m else None
