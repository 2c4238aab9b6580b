"""One model, one input, one machine: the same bits on every call, in every
process, whatever the caches hold (issue 27 item 2).

Each case runs fresh Python processes that load a list of models in
sequence and call each on one fixed input: the first call (which compiles
the program), then :meth:`fbjax.Model.wait_optimised` and two more calls.
The first process starts with an empty ``FBJAX_CACHE_DIR`` (JAX's
persistent compilation cache and fbjax's trace cache empty: everything is
traced and compiled), the second with the cache the first one filled (the
traced program and its executable read from disk). Every call of every
process must return the same bytes, output by output, and so must a third
process run with ``FBJAX_NO_CACHE=1`` (no cache at all: the prepared
program jitted directly instead of the cached export): tiered compilation
(``tiered_compile=True``, whose quick first tier computes differently
rounded floats) is off by default, so no call depends on timing or on what
the cache held. Bit equality is the claim under test here, not a tolerance:
both processes run the one optimised program.

The default run covers a representative set: a float model that runs the
prepared CPU executor through the trace cache (mediapipe_selfie_segmentation,
whose quick tier differed by 1.2e-4 relative), a tiny one that runs the
plain jit (tflm_sine_float), dynamic-range (hybrid) fixtures
(mediapipe_hand_recrop_dyn, transformer_block_dynamic) and an int8 one.
``-m slow`` runs every shared model and every quantized fixture.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, TFLITE_MODELS, SHARED_MISSING_REASON

QUANT = ROOT / "tests" / "data" / "quant" / "models"
QUANT_AEQ = ROOT / "tests" / "data" / "quant_aeq"

_CHILD = r"""
import hashlib, json, sys
import numpy as np
import fbjax

def digest(out):
    outs = out if isinstance(out, (tuple, list)) else (out,)
    h = hashlib.sha256()
    for o in outs:
        a = np.asarray(o)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()

def inputs(m, seed):
    rng = np.random.default_rng(seed)
    xs = []
    for s in m.inputs:
        dt = np.dtype(s.dtype)
        shape = [1 if d is None else int(d) for d in s.shape]
        if dt.kind == "f":
            xs.append(rng.uniform(-1, 1, shape).astype(dt))
        elif dt == np.bool_:
            xs.append(rng.random(shape) < 0.5)
        else:
            info = np.iinfo(dt)
            xs.append(rng.integers(max(info.min, -128), min(info.max, 127) + 1, shape).astype(dt))
    return xs

recs = {}
for i, path in enumerate(sys.argv[1:]):
    m = fbjax.load(path)
    xs = inputs(m, i)
    first = digest(m(*xs))
    m.wait_optimised()
    later = [digest(m(*xs)) for _ in range(2)]
    recs[path] = {"executor": m.executor.name, "calls": [first] + later}
print(json.dumps({"cache": fbjax.cache.trace_cache_dir(), "models": recs}))
"""


def _child(paths, cache_dir) -> dict:
    """One process loading and calling ``paths`` in sequence, fbjax's cache
    in ``cache_dir`` (None: ``FBJAX_NO_CACHE=1``, no cache at all)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("FBJAX_NO_CACHE", "FBJAX_CACHE_DIR", "FBJAX_TIERED_COMPILE", "JAX_COMPILATION_CACHE_DIR")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if cache_dir is None:
        env["FBJAX_NO_CACHE"] = "1"
    else:
        env["FBJAX_CACHE_DIR"] = str(cache_dir)
    p = subprocess.run([sys.executable, "-c", _CHILD, *map(str, paths)], env=env, capture_output=True, text=True,
                       timeout=1800, cwd=str(ROOT))
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _check(paths, tmp_path):
    missing = [str(p) for p in paths if not p.is_file()]
    assert not missing, f"committed fixtures missing: {missing}"
    cache = tmp_path / "cache" / "jax"
    cold = _child(paths, cache)
    assert cold["cache"] is not None, "the child ran without fbjax's trace cache"
    traces = list((tmp_path / "cache" / "traces").glob("*.exported"))
    warm = _child(paths, cache)
    none = _child(paths, None)  # no cache: the prepared program jitted directly, not the cached export
    assert none["cache"] is None
    bad = []
    for p in map(str, paths):
        a, b, c = cold["models"][p], warm["models"][p], none["models"][p]
        if len(set(a["calls"] + b["calls"] + c["calls"])) != 1:
            bad.append(f"{os.path.basename(p)} ({a['executor']} / {c['executor']}): cold process {a['calls']}, "
                       f"warm process {b['calls']}, no-cache process {c['calls']}")
    assert not bad, "calls on one input returned different bits:\n" + "\n".join(bad)
    return cold, warm, traces


def test_same_bits_every_call_cold_and_warm_cache(tmp_path):
    shared = [TFLITE_MODELS / "mediapipe_selfie_segmentation.tflite", TFLITE_MODELS / "tflm_sine_float.tflite"]
    if not TFLITE_MODELS.is_dir():
        pytest.skip(SHARED_MISSING_REASON)
    paths = shared + [QUANT_AEQ / "mediapipe_hand_recrop_dyn.tflite", QUANT / "transformer_block_dynamic.tflite",
                      QUANT / "mobilenet_v2_int8.tflite"]
    cold, warm, traces = _check(paths, tmp_path)
    selfie = str(shared[0])
    # the large model ran the prepared program through the trace cache, and the second process read it
    assert cold["models"][selfie]["executor"] == "trace_cache"
    assert traces, "the first process stored no traced program"
    assert warm["models"][str(shared[1])]["executor"] == "jit"


@pytest.mark.slow
def test_same_bits_every_call_all_models(tmp_path):
    if not TFLITE_MODELS.is_dir():
        pytest.skip(SHARED_MISSING_REASON)
    paths = sorted(TFLITE_MODELS.glob("*.tflite")) + sorted(QUANT.glob("*.tflite")) + sorted(QUANT_AEQ.glob("*.tflite"))
    assert len(paths) > 13 + 14, paths
    _check(paths, tmp_path)
