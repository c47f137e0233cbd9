"""Fresh-interpreter ordering scenarios (dd-trace's style): run by test_ordering.py.

``after``: ``activate()``, then import speculators' generator; ``deactivate()`` restores
every name; ``activate()`` again patches the same names again; a third activation with
``only=`` starts a spawned child (as vLLM starts its workers), which activates on its
first import of speculators as a worker honouring ``only``; after ``deactivate()`` a spawned child
inherits no activation flag and changes nothing.
``before``: import the generator first, then ``activate()``: fine where no import-time
adapter applies, a ``CompatError`` naming the fix where one had to precede the import.

Writes a JSON result to ``--out``; the test asserts on it.
"""

import argparse
import json
import multiprocessing
import sys

GEN = "speculators.data_generation.vllm_hidden_states_generator"
#: The child's selection: an import-time adapter (acts in workers too) whose probe does
#: not import vLLM (the child stays cheap: the disabled adapters are not probed).
ONLY = ["transformers5_config_torch"]


def child(conn) -> None:
    """Runs in the spawned child: what activation did there (``None``: nothing). The
    child imports speculators first: an inherited activation acts on the first import
    of speculators or vLLM (the bootstrap's finder), not at interpreter start."""
    try:  # the activation (if any) runs before this import; the import itself may fail
        import speculators  # noqa: F401  (with `only`, transformers 5 still breaks it)
    except Exception:  # noqa: BLE001
        pass
    import speculators_compat

    rep = speculators_compat.report()
    conn.send(None if rep is None else rep.as_dict())
    conn.close()


def spawn_child():
    ctx = multiprocessing.get_context("spawn")
    parent, there = ctx.Pipe()
    p = ctx.Process(target=child, args=(there,))
    p.start()
    result = parent.recv()
    p.join(60)
    return result


def bindings(act, gen):
    """The objects now bound at the targets the activation changed in the generator."""
    import importlib

    out = {}
    for targets in act.touched.values():
        for t in targets:
            module, _, qual = t.partition(":")
            obj = importlib.import_module(module)
            for part in qual.split("."):
                obj = vars(obj).get(part) if part == qual.split(".")[-1] else getattr(obj, part)
            out[t] = obj
    return out


def after() -> dict:
    import speculators_compat
    from speculators_compat._process import ACTIVATION

    first = speculators_compat.activate()
    import importlib

    gen = importlib.import_module(GEN)
    touched = {k: list(v) for k, v in ACTIVATION.touched.items()}
    patched = bindings(ACTIVATION, gen)
    speculators_compat.deactivate()
    restored = bindings(type("A", (), {"touched": touched})(), gen)
    second = speculators_compat.activate()
    repatched = bindings(ACTIVATION, gen)
    speculators_compat.deactivate()
    speculators_compat.activate(only=ONLY)
    with_flag = spawn_child()
    speculators_compat.deactivate()
    without_flag = spawn_child()
    return {
        "applied": first.applied, "applied_again": second.applied,
        "targets": sorted(patched), "targets_again": sorted(repatched),
        "changed": sorted(t for t in patched if patched[t] is not restored[t]),
        "changed_again": sorted(t for t in repatched if repatched[t] is not restored[t]),
        "same_objects_again": sorted(t for t in repatched if repatched[t] is patched[t]),
        "only": ONLY, "with_flag": with_flag, "without_flag": without_flag,
    }


def before() -> dict:
    import importlib

    try:
        importlib.import_module(GEN)
        imported = None
    except Exception as exc:  # transformers 5: speculators' own import fails first
        imported = f"{type(exc).__name__}: {exc}"
    import speculators_compat

    try:
        rep = speculators_compat.activate()
    except speculators_compat.CompatError as exc:
        return {"import_error": imported, "activate_error": str(exc),
                "active": speculators_compat.report() is not None}
    return {"import_error": imported, "activate_error": None, "applied": rep.applied,
            "import_time_applied": [n for n in rep.applied if n in (
                "transformers5_config_torch", "kv_cache_helpers_relocated")]}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=["after", "before"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    result = {"after": after, "before": before}[args.scenario]()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, default=str)
    sys.exit(0)
