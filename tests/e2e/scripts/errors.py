"""Bad input and failures: clear errors, nothing run, nothing leaked into the next call.

Usage: errors.py --out FILE --model PATH [--layers 0,2,5]

One generator, in this order: bad input (refused before anything runs); a good batch
after those; a 40-sequence call whose first model step raises (injected on the
generator's executor instance), then a 12-sequence call checked against transformers;
the same with the second step raising (rows of the first already in the failed call's
region);
a call interrupted by KeyboardInterrupt (no RPC, generator unusable afterwards);
deactivate() and a new activate() while the generator is alive (refused).
"""

import argparse
import json
import os
import time
import traceback


def attempt(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the message is what the test checks
        return {"raised": type(exc).__name__, "message": str(exc)}
    return {"raised": None}


def section(out, name, fn):
    """Run one part; record its result or its error (later parts still run)."""
    try:
        out[name] = fn()
    except BaseException as exc:  # noqa: BLE001 - recorded for the test to report
        out[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


def scheduler_state(gen):
    s = gen.scheduler
    return {"requests": len(s.requests), "running": len(s.running), "waiting": len(s.waiting),
            "deferred": len(getattr(s, "_compat_deferred", ()) or ())}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--layers", default="0,2,5", help="captured layers (comma-separated)")
    a = p.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import speculators_compat

    speculators_compat.activate()
    from speculators.data_generation.vllm_hidden_states_generator import (
        VllmHiddenStatesGenerator,
    )

    from speculators_compat.demo.reference import compare, reference_hidden_states
    from speculators_compat.demo.runner import make_sequences, owns_exactly

    LAYERS = [int(x) for x in a.layers.split(",")]
    out = {}
    t = time.perf_counter()
    out["layer_out_of_range"] = attempt(
        lambda: VllmHiddenStatesGenerator(a.model, layer_ids=[0, 99], max_model_len=64))
    out["layer_out_of_range"]["seconds"] = time.perf_counter() - t

    gen = VllmHiddenStatesGenerator(a.model, layer_ids=LAYERS, max_model_len=64)
    out["empty_batch"] = attempt(lambda: gen.generate([]))
    out["empty_sequence"] = attempt(lambda: gen.generate([[5, 6, 7], []]))
    out["bad_token"] = attempt(lambda: gen.generate([[5, 6, 7], [5, "x"]]))
    vocab = gen.vllm_config.model_config.get_vocab_size()
    out["vocab_size"] = vocab
    out["token_too_large"] = attempt(lambda: gen.generate([[5, 6, 7], [5, 6, vocab]]))
    out["token_negative"] = attempt(lambda: gen.generate([[5, -1, 7]]))

    def checked(seqs, res):
        ref = reference_hidden_states(a.model, seqs, LAYERS)
        cmp = compare([r["hidden_states"] for r in res], ref)
        return {"returned": len(res), "expected": len(seqs),
                "input_order": len(res) == len(seqs) and all(
                    r["input_ids"].tolist() == list(s) for r, s in zip(res, seqs)),
                "rows": [r["hidden_states"][0].shape[0] for r in res],
                "plain_owned": all(owns_exactly(h) for r in res for h in r["hidden_states"]),
                "compare_ok": cmp["ok"], "min_cosine": cmp["min_cosine"],
                "reasons": cmp["reasons"][:5]}

    def after_errors():
        # After the refusals, a good batch (with over-long sequences, truncated to
        # max_model_len - 1 as upstream documents) must come back exactly right.
        seqs = make_sequences(5, seed=3, min_len=20, max_len=100)
        res = gen.generate(seqs)
        truncated = [s[:63] for s in seqs]
        info = checked(truncated, res)
        info["input_ids_truncated"] = [r["input_ids"].tolist() for r in res] == truncated
        return info

    section(out, "after_errors", after_errors)

    def workers_asked():
        from speculators_compat.adapters._worker_extensions import running_extensions

        return {"workers_run": running_extensions(gen.executor),
                "worker_extension_cls": gen.vllm_config.parallel_config.worker_extension_cls}

    section(out, "workers_asked", workers_asked)

    def transport_stats():
        receiver = getattr(gen.executor, "compat_receiver", None)
        return None if receiver is None else dict(receiver.stats)

    def failed_step_then_next_call(step=1, seed=11, next_len=(5, 40)):
        # Model step ``step`` of a 40-sequence call (32 scheduled, 8 waiting) raises.
        ex = gen.executor
        calls = []

        def execute_model(*args, **kwargs):
            calls.append(1)
            if len(calls) == step:
                raise RuntimeError(f"injected failure in model step {step}")
            return type(ex).execute_model(ex, *args, **kwargs)

        ex.execute_model = execute_model
        at_start = transport_stats() or {}
        try:
            failed = attempt(lambda: gen.generate(make_sequences(40, seed=seed, min_len=5,
                                                                 max_len=40)))
        finally:
            del ex.execute_model
        info = {"failed": failed, "scheduler_after_failure": scheduler_state(gen)}
        at_end = transport_stats() or {}
        info["failed_call_stats"] = {k: at_end.get(k, 0) - at_start.get(k, 0)
                                     for k in ("calls", "streamed", "handed_over")}
        seqs = make_sequences(12, seed=seed + 1, min_len=next_len[0], max_len=next_len[1])
        before = transport_stats() or {}
        try:
            res = gen.generate(seqs)
        except Exception as exc:  # noqa: BLE001 - today's main: KeyError 'req_0_32' (0.4)
            info["next_call"] = {"raised": type(exc).__name__, "message": str(exc)}
            return info
        info["next_call"] = checked(seqs, res)
        info["scheduler_after_next_call"] = scheduler_state(gen)
        after = transport_stats() or {}
        info["next_call_stats"] = {k: after.get(k, 0) - before.get(k, 0)
                                   for k in ("calls", "streamed", "handed_over")}
        return info

    section(out, "failed_step", failed_step_then_next_call)
    section(out, "failed_second_step",
            lambda: failed_step_then_next_call(step=2, seed=21, next_len=(20, 40)))

    def interrupted():
        # Ctrl+C in the middle of a call: no RPC afterwards, prompt, generator unusable.
        ex = gen.executor
        rpcs, mark = [], []

        def collective_rpc(method, *args, **kwargs):
            rpcs.append(getattr(method, "__name__", str(method)))
            return type(ex).collective_rpc(ex, method, *args, **kwargs)

        def execute_model(*args, **kwargs):
            mark.append(len(rpcs))
            raise KeyboardInterrupt

        ex.collective_rpc, ex.execute_model = collective_rpc, execute_model
        t = time.perf_counter()
        try:
            gen.generate(make_sequences(40, seed=13, min_len=5, max_len=40))
            raised = None
        except KeyboardInterrupt:
            raised = "KeyboardInterrupt"
        seconds = time.perf_counter() - t
        del ex.collective_rpc, ex.execute_model
        return {"raised": raised, "seconds": seconds,
                "rpcs_after_interrupt": rpcs[mark[0]:] if mark else None,
                "next_call": attempt(lambda: gen.generate([[5, 6, 7]]))}

    section(out, "interrupted", interrupted)

    def deactivated():
        # deactivate() while the generator is alive: its generate() must refuse (it would
        # run half-patched), and still after a new activate().
        speculators_compat.deactivate()
        info = {"after_deactivate": attempt(lambda: gen.generate([[5, 6, 7]] * 12))}
        # (the pre-import adapters refuse a late activate(); they do not matter here)
        from speculators_compat.adapters import ADAPTERS

        late = ("transformers5_config_torch", "kv_cache_helpers_relocated")
        speculators_compat.activate(only=[x.name for x in ADAPTERS if x.name not in late])
        info["after_reactivate"] = attempt(lambda: gen.generate([[5, 6, 7]] * 12))
        # A generator the current activation never saw (as one built before activate()):
        # drop the marks and let the current guard look at it on its own.
        from speculators_compat.adapters import generate_guard

        vars(gen).pop("generate", None)
        getattr(generate_guard, "_UNUSABLE", {}).pop(gen, None)
        info["unseen_generator"] = attempt(lambda: gen.generate([[5, 6, 7]] * 12))
        return info

    section(out, "deactivated", deactivated)
    del gen
    with open(a.out, "w") as f:
        json.dump(out, f, default=str)
