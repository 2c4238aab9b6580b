"""Benchmarks: fbjax against LiteRT (``.tflite``) and onnxruntime (``.rten`` from ONNX).

Used by ``fbjax bench MODEL`` and ``benchmarks/run.py`` (``nox -s bench``).
Every figure is a *ratio* measured in one process with the runtimes
interleaved (fbjax call, LiteRT invoke, onnxruntime run, fbjax call, ...), so
a machine loaded by other work slows all of them alike; absolute times are
reported too but are only indicative.

Figures per model:

* ``latency_ms`` (batch 1): median of ``runs`` (>= 20) calls after warm-up,
  fbjax jitted vs LiteRT (``num_threads``, default XNNPACK delegate) and,
  for ``.rten`` models converted from ONNX, onnxruntime on the source
  ``.onnx`` (``intra_op_num_threads = num_threads``; interleaved without
  spin-waiting, and alone with it, the faster one counts: see ``_ORT``);
  ratio fbjax / other
  (lower is better).
* ``batch`` throughput (default 32): fbjax on the model loaded with
  ``fbjax.load(path, batch_size=N)`` (else ``jax.vmap`` of ``Model.apply``
  when the graph cannot be re-batched; on CPU the Model runs a large batch
  as calls of cache-sized chunks, :class:`fbjax.executors.chunked.ChunkedCall`),
  vs the faster of LiteRT with the
  input resized to the batch (``resize_tensor_input``) and ``N`` repeated
  batch-1 invokes (taken as ``N`` x the batch-1 median); ratio fbjax
  images/s / LiteRT images/s (higher is better).
* ``first_call_s``: load + trace + compile + first result, in a fresh
  Python process, with an empty persistent compilation cache (``cold``) and
  again with the cache the first run filled (``warm``).
* ``peak_rss_mib``: that fresh process's peak resident set (``VmHWM``) minus its RSS
  after ``import jax, fbjax`` (the baseline), against the budget
  2 x (file size + largest activation set), where the activation set of a
  node is the bytes of its non-constant inputs and outputs. ``xla_floor``
  (:func:`xla_floor_mib`) is what one trivial ``jax.jit`` adds in a fresh
  process (~40 MiB with jaxlib 0.10.2 on CPU, more than most budgets); the
  table gives the warm-cache peak above baseline and above that floor too.
* ``max_rel_err``: fbjax vs the other runtime at batch 1 (max abs difference
  / max abs reference, per output, the worst one), so speed flags can be
  checked for correctness on the same run.

A model with no reference runtime (an ``.rten`` given as a file: onnxruntime
needs its source ``.onnx``; a StableHLO flatbuffer) gets fbjax's own figures
only, ``other`` ``None`` and a one-line ``no_reference`` explanation.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Optional, Sequence

import numpy as np

__all__ = ["bench_model", "bench_models", "light_onnx_path", "markdown_table", "geomean", "summary"]

DEFAULT_RUNS = 20
DEFAULT_BATCH = 32
DEFAULT_THREADS = 2
LIGHT_PREFIX = "light:"


# --- inputs and helpers --------------------------------------------------------

def _inputs(specs, batch: Optional[int] = None, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    xs = []
    for spec in specs:
        shape = [1 if d is None else int(d) for d in spec.shape]
        if batch is not None:
            shape[0] = batch
        dt = np.dtype(spec.dtype)
        if dt.kind == "f":
            xs.append(rng.random(shape, dtype=np.float32).astype(dt))
        elif dt == np.bool_:
            xs.append(rng.random(shape) < 0.5)
        else:
            xs.append(rng.integers(0, 4, shape).astype(dt))
    return xs


def _median(ts: Sequence[float]) -> float:
    return float(np.median(np.asarray(ts))) if ts else float("nan")


def geomean(xs) -> float:
    """Geometric mean of the finite positive entries (``nan`` if none)."""
    xs = [float(x) for x in xs if x is not None and math.isfinite(x) and x > 0]
    return float(math.exp(sum(math.log(x) for x in xs) / len(xs))) if xs else float("nan")


def _rel_err(ys, refs) -> float:
    worst = 0.0
    for y, r in zip(ys, refs):
        y = np.asarray(y, np.float64).reshape(-1)
        r = np.asarray(r, np.float64).reshape(-1)
        if y.shape != r.shape:
            return float("inf")
        scale = max(float(np.max(np.abs(r))) if r.size else 0.0, 1e-12)
        worst = max(worst, float(np.max(np.abs(y - r))) / scale if r.size else 0.0)
    return worst


def _tuple(ys):
    return ys if isinstance(ys, tuple) else (ys,)


def light_onnx_path(name: str) -> str:
    """Path of the onnx wheel's ``light_<name>.onnx`` test model."""
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"light_{name}.onnx")


def _onnx_to_rten(onnx_path: str) -> bytes:
    """``rten-convert`` (0.22) of an ONNX file, in process, as the v2 format."""
    import contextlib
    import io

    import onnx
    from rten_convert import converter as C
    from rten_convert.tensor_data import TensorDataBuilder
    from rten_convert.util import round_up

    m = onnx.load(onnx_path) if isinstance(onnx_path, str) else onnx_path
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
        graph = C.graph_from_onnx_graph(m.graph)
        tdata = TensorDataBuilder()
        data = C.serialize_model(graph, C.Metadata(description="fbjax bench"), tdata)
    out = io.BytesIO()
    toff = round_up(32 + len(data), 64)
    C.write_header(out, 32, len(data), toff)
    out.write(data)
    out.write(b"\0" * (toff - out.tell()))
    tdata.write(out)
    return out.getvalue()


def _activation_bytes(model) -> int:
    """Largest bytes of non-constant inputs + outputs over the main graph's nodes."""
    best = 0
    g = model.ir.main_graph
    for node in g.nodes:
        n = 0
        for v in list(node.inputs) + list(node.outputs):
            if v is None or v.data is not None or v.shape is None:
                continue
            try:
                n += int(np.prod([1 if d is None else d for d in v.shape])) * np.dtype(v.dtype).itemsize
            except TypeError:
                pass
        best = max(best, n)
    return best


# --- other runtimes ----------------------------------------------------------

class _LiteRT:
    def __init__(self, path: str, threads: int, batch: Optional[int] = None):
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError as e:
            raise ImportError("fbjax bench compares with LiteRT: pip install ai-edge-litert "
                              "(or fbjax's '.[test]' extra, which also brings onnxruntime)") from e

        self.it = Interpreter(model_path=path, num_threads=threads)
        ins = self.it.get_input_details()
        if batch is not None:
            for d in ins:
                shape = list(d["shape"])
                shape[0] = batch
                self.it.resize_tensor_input(d["index"], shape, strict=False)
        self.it.allocate_tensors()
        self.ins = [d["index"] for d in self.it.get_input_details()]
        self.outs = [d["index"] for d in self.it.get_output_details()]

    def __call__(self, *xs):
        for i, x in zip(self.ins, xs):
            self.it.set_tensor(i, x)
        self.it.invoke()
        return [self.it.get_tensor(o) for o in self.outs]


class _ORT:
    """onnxruntime on the ``.onnx``. ``spinning=False`` for the interleaved
    runs: with ORT's default spin-waiting, its idle intra-op threads keep the
    cores busy between its runs and slowed the interleaved fbjax runs of
    light_squeezenet from 7.9 to 12.8 ms (median; sleeping 2-30 ms between
    runs did not help), while ORT itself was ~10-15 % faster spinning. The
    spinning session is timed on its own afterwards and the faster of the
    two is the ratio's reference."""

    def __init__(self, onnx_path: str, threads: int, input_names: Sequence[str], spinning: bool = False):
        try:
            import onnxruntime as ort
        except ImportError as e:
            raise ImportError("fbjax bench compares .rten models with onnxruntime: pip install onnxruntime "
                              "(or fbjax's '.[test]' extra)") from e

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        self.sess = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])
        self.names = list(input_names)
        self.n_out = None

    def __call__(self, *xs):
        return self.sess.run(None, dict(zip(self.names, xs)))


# --- first call in a fresh process --------------------------------------------

_CHILD = r"""
import json, os, resource, sys, time
t_import = time.perf_counter()
import jax, numpy as np
import fbjax, fbjax.cache
from fbjax.bench import _inputs
def status_kib(key):
    # /proc/self/status (per address space: ru_maxrss would carry over the
    # parent's peak across fork + exec); ru_maxrss where there is no /proc
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
base = status_kib("VmRSS")
t0 = time.perf_counter()
m = fbjax.load(sys.argv[1])
xs = _inputs(m.inputs)
jax.block_until_ready(m(*xs))
t1 = time.perf_counter()
peak = status_kib("VmHWM")
print(json.dumps({"first_call_s": t1 - t0, "baseline_rss_mib": base / 1024, "peak_rss_mib": peak / 1024,
                  "cache_dir": fbjax.cache.cache_dir()}))
"""


_FLOOR_CHILD = r"""
import json
import jax, numpy as np
import fbjax
def status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
base = status_kib("VmRSS")
jax.block_until_ready(jax.jit(lambda x: x * 2.0 + 1.0)(np.ones((4,), np.float32)))
print(json.dumps({"floor_mib": (status_kib("VmHWM") - base) / 1024}))
"""

_floor: dict = {}


def xla_floor_mib(timeout: float = 120) -> Optional[float]:
    """RSS (MiB) a fresh process gains above the ``import jax, fbjax``
    baseline by compiling and running one trivial ``jax.jit`` function on the
    default backend (XLA's client, compiler and runtime), measured once per
    process in a child; ``None`` without ``/proc``. Every model pays it, so
    the table also gives each model's peak RSS above this floor."""
    if "v" not in _floor:
        try:
            p = subprocess.run([sys.executable, "-c", _FLOOR_CHILD], capture_output=True, text=True,
                               timeout=timeout, env=dict(os.environ, FBJAX_NO_CACHE="1"))
            _floor["v"] = json.loads(p.stdout.strip().splitlines()[-1])["floor_mib"] if p.returncode == 0 else None
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            _floor["v"] = None
    return _floor["v"]


def first_call(path: str, cache_dir: str, timeout: float = 600) -> dict:
    """Run load + first call of ``path`` in a fresh process using ``cache_dir``
    as the persistent compilation cache. Returns the child's JSON record
    (``first_call_s``, ``baseline_rss_mib``, ``peak_rss_mib``)."""
    env = dict(os.environ, FBJAX_CACHE_DIR=cache_dir)
    env.pop("FBJAX_NO_CACHE", None)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", _CHILD, path], env=env, capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"first-call child failed on {path}: {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# --- one model -----------------------------------------------------------------

def _no_reference(fmt: Optional[str]) -> str:
    if fmt == "rten":
        return ("no reference runtime for this .rten (onnxruntime needs the source .onnx; pass light:NAME "
                "for the onnx wheel's models)")
    return f"no reference runtime for {fmt or 'this'} models"


def _timed(fn, *xs, block=None):
    t = time.perf_counter()
    y = fn(*xs)
    if block is not None:
        block(y)
    return time.perf_counter() - t, y


def bench_model(model: str, *, runs: int = DEFAULT_RUNS, batch: int = DEFAULT_BATCH,
                threads: int = DEFAULT_THREADS, first: bool = True, warmup: int = 3) -> dict:
    """Benchmark one model (see the module docstring for the figures).

    Args:
        model: a ``.tflite`` / ``.rten`` path, or ``"light:NAME"`` for the onnx
            wheel's ``light_NAME.onnx`` converted to ``.rten`` (compared with
            onnxruntime on the ``.onnx``).
        runs: timed runs per figure (>= 1; the issue's protocol uses >= 20).
        batch: batch for the throughput figure (0 or 1: skipped).
        threads: LiteRT / onnxruntime threads.
        first: measure first call and peak RSS in fresh processes.

    Returns:
        a JSON-serialisable dict.
    """
    import jax

    import fbjax

    tmp = tempfile.mkdtemp(prefix="fbjax-bench-")
    onnx_path = None
    check_outputs = None  # output positions compared for max_rel_err (None: all)
    if model.startswith(LIGHT_PREFIX):
        name = model[len(LIGHT_PREFIX):]
        import onnx

        src = light_onnx_path(name)
        file_size = os.path.getsize(src)
        om = onnx.load(src)
        soft = [n for n in om.graph.node if n.op_type == "Softmax"]
        if soft:
            # rten-convert 0.22 writes these opset-9 Softmax nodes with axis 0 where
            # onnxruntime uses 1: expose the logits (same extra output on both sides)
            # and check correctness on them.
            om.graph.output.append(onnx.helper.make_tensor_value_info(soft[-1].input[0], onnx.TensorProto.FLOAT, None))
            check_outputs = [len(om.graph.output) - 1]
            # fbjax.load's warning about that axis-0 Softmax is known here (the logits are compared)
            warnings.filterwarnings("ignore", message=r".*softmax node\(s\) normalize over an axis of size 1",
                                    category=UserWarning)
        onnx_path = os.path.join(tmp, f"light_{name}.onnx")
        onnx.save(om, onnx_path)
        path = os.path.join(tmp, f"light_{name}.rten")
        with open(path, "wb") as f:
            f.write(_onnx_to_rten(om))
    else:
        path = model
        file_size = os.path.getsize(path)
    rec: dict = {"model": os.path.splitext(os.path.basename(model.split(":", 1)[-1]))[0],
                 "source": model, "file_bytes": file_size, "runs": runs, "threads": threads}
    m = fbjax.load(path)
    rec["format"] = m.format
    other_name = "onnxruntime" if onnx_path else ("litert" if m.format == "tflite" else None)
    rec["other"] = other_name
    if other_name is None:
        rec["no_reference"] = _no_reference(m.format)
    xs = _inputs(m.inputs)
    block = jax.block_until_ready
    other = None
    if other_name == "litert":
        other = _LiteRT(path, threads)
    elif other_name == "onnxruntime":
        other = _ORT(onnx_path, threads, [s.name for s in m.inputs])
    # warm-up (also compiles) and correctness
    for _ in range(max(warmup, 1)):
        ys = block(m(*xs))
        refs = other(*xs) if other else None
        m.wait_optimised()  # the timed calls run the optimised program, not the quick first tier
    if other:
        ys, refs = list(_tuple(ys)), list(refs)
        if check_outputs is not None:
            ys, refs = [ys[i] for i in check_outputs], [refs[i] for i in check_outputs]
        rec["max_rel_err"] = _rel_err(ys, refs)
        rec["checked_outputs"] = check_outputs
    else:
        rec["max_rel_err"] = None
    t_f, t_o = [], []
    for i in range(runs):  # interleaved, alternating which runs first
        if other and i % 2:
            t_o.append(_timed(other, *xs)[0])
        t_f.append(_timed(m, *xs, block=block)[0])
        if other and not i % 2:
            t_o.append(_timed(other, *xs)[0])
    if other_name == "onnxruntime":  # ORT's default (spinning) session, alone: keep its faster figure
        spin = _ORT(onnx_path, threads, [s.name for s in m.inputs], spinning=True)
        for _ in range(max(warmup, 1)):
            spin(*xs)
        t_s = [_timed(spin, *xs)[0] for _ in range(runs)]
        del spin
        rec["onnxruntime_ms"] = {"interleaved_no_spinning": 1e3 * _median(t_o), "alone_spinning": 1e3 * _median(t_s)}
        if _median(t_s) < _median(t_o):
            t_o = t_s
    rec["latency_ms"] = {"fbjax": 1e3 * _median(t_f), other_name or "other": 1e3 * _median(t_o) if other else None}
    rec["latency_ratio"] = _median(t_f) / _median(t_o) if other else None
    # min / min: less sensitive to other load on the machine than the medians
    rec["latency_ratio_min"] = min(t_f) / min(t_o) if other else None

    if batch and batch > 1:
        rec["batch"] = batch
        rec.update(_bench_batch(path, m, other_name, other, threads, batch, runs, _median(t_o) if other else None,
                                min(t_o) if other else None, _median(t_f)))
    del m, other
    if first:
        cache = os.path.join(tmp, "jax-cache")
        cold = first_call(path, cache)
        warm = first_call(path, cache)
        act = _activation_bytes(fbjax.load(path))
        rss = cold["peak_rss_mib"] - cold["baseline_rss_mib"]
        budget = 2 * (file_size + act) / 2**20
        rec["first_call_s"] = {"cold": cold["first_call_s"], "warm": warm["first_call_s"]}
        rec["peak_rss_mib"] = {"above_baseline": rss, "baseline": cold["baseline_rss_mib"],
                               "above_baseline_warm": warm["peak_rss_mib"] - warm["baseline_rss_mib"],
                               "budget": budget, "activation_mib": act / 2**20, "xla_floor": xla_floor_mib()}
    return rec


def _bench_batch(path, m, other_name, other, threads, batch, runs, other_b1, other_b1_min=None,
                 fbjax_b1=None) -> dict:
    import jax

    import fbjax

    out: dict = {}
    try:
        mb = fbjax.load(path, batch_size=batch)
        fn, how = mb, "batch_size"
    except Exception as e:  # noqa: BLE001 - the graph cannot be re-batched: vmap the batch-1 model
        out["batch_note"] = f"load(batch_size={batch}) refused ({type(e).__name__}): vmap over Model.apply"
        from .cache import compiler_options

        vf = jax.jit(jax.vmap(m.apply, in_axes=(None,) + (0,) * len(m.inputs)), compiler_options=compiler_options())
        params = m.params
        fn, how = (lambda *xs: vf(params, *[x[:, None] for x in xs])), "vmap"
    out["fbjax_batch_mode"] = how
    xs = _inputs(m.inputs, batch=batch, seed=1)
    block = jax.block_until_ready
    for _ in range(2):
        block(fn(*xs))
    lb = None
    if other_name == "litert":
        try:
            lb = _LiteRT(path, threads, batch)
            lb(*xs)
            shapes = [tuple(y.shape) for y in lb(*xs)]
            if any(not sh or sh[0] != batch for sh in shapes):
                # the resize did not reach every output (a RESHAPE with the batch baked in):
                # the resized graph is not computing the batch, so it is not a fair figure
                out["litert_resize_error"] = f"resized outputs have shapes {shapes}, not batch-leading"
                lb = None
        except Exception as e:  # noqa: BLE001 - LiteRT cannot resize this graph
            out["litert_resize_error"] = f"{type(e).__name__}: {e}"[:300]
            lb = None
    t_f, t_o = [], []
    for _ in range(runs):
        t_f.append(_timed(fn, *xs, block=block)[0])
        if lb is not None:
            t_o.append(_timed(lb, *xs)[0])
    f = _median(t_f)
    out["batch_ms"] = {"fbjax": 1e3 * f}
    if other_b1 is not None:
        repeated = batch * other_b1
        resized = _median(t_o) if t_o else float("inf")
        best = min(repeated, resized)
        key = other_name or "other"
        out["batch_ms"][key] = 1e3 * best
        out["batch_ms"][f"{key}_resized"] = 1e3 * resized if t_o else None
        out["batch_ms"][f"{key}_repeated"] = 1e3 * repeated
        out["throughput_ratio"] = best / f  # fbjax images/s over the other's
        best_min = min(batch * other_b1_min, min(t_o) if t_o else float("inf"))
        out["throughput_ratio_min"] = best_min / min(t_f)
    out["fbjax_images_per_s"] = batch / f
    if fbjax_b1 is not None:
        # for information: N batch-1 calls (the official figure is the batch-N graph)
        out["batch_ms"]["fbjax_repeated"] = 1e3 * batch * fbjax_b1
        if other_b1 is not None:
            out["throughput_ratio_best_mode"] = min(batch * other_b1, resized if t_o else float("inf")) / min(
                f, batch * fbjax_b1)
    return out


def bench_models(models: Sequence[str], *, on_record=None, **kw) -> list:
    """:func:`bench_model` over several models, printing progress to stderr;
    a model that fails gets ``{"model": ..., "error": ...}``. ``on_record``
    is called with each record as it is done."""
    res = []
    for name in models:
        t = time.perf_counter()
        try:
            rec = bench_model(name, **kw)
        except Exception as e:  # noqa: BLE001 - one bad model must not lose the table
            rec = {"model": os.path.basename(name), "source": name, "error": f"{type(e).__name__}: {e}"[:500]}
        print(f"[bench] {name}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        res.append(rec)
        if on_record is not None:
            on_record(rec)
    return res


# --- reporting -----------------------------------------------------------------

def summary(records: Sequence[dict]) -> dict:
    """Geometric means of the ratios: TFLite models (vs LiteRT) and ``.rten``
    models (vs onnxruntime) separately."""
    lite = [r for r in records if r.get("other") == "litert" and "error" not in r]
    ort = [r for r in records if r.get("other") == "onnxruntime" and "error" not in r]
    return {
        "tflite_models": len(lite),
        "geomean_latency_ratio_vs_litert": geomean(r.get("latency_ratio") for r in lite),
        "geomean_throughput_ratio_vs_litert": geomean(r.get("throughput_ratio") for r in lite),
        "geomean_first_call_cold_s": geomean(r["first_call_s"]["cold"] for r in lite if "first_call_s" in r),
        "geomean_first_call_warm_s": geomean(r["first_call_s"]["warm"] for r in lite if "first_call_s" in r),
        "geomean_latency_ratio_min_vs_litert": geomean(r.get("latency_ratio_min") for r in lite),
        "geomean_throughput_ratio_min_vs_litert": geomean(r.get("throughput_ratio_min") for r in lite),
        "geomean_throughput_ratio_best_mode_vs_litert": geomean(r.get("throughput_ratio_best_mode") for r in lite),
        "rten_models": len(ort),
        "geomean_latency_ratio_min_vs_onnxruntime": geomean(r.get("latency_ratio_min") for r in ort),
        "geomean_latency_ratio_vs_onnxruntime": geomean(r.get("latency_ratio") for r in ort),
        "geomean_throughput_ratio_vs_onnxruntime": geomean(r.get("throughput_ratio") for r in ort),
    }


def _f(x, fmt="{:.2f}"):
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)


def _has(x) -> bool:
    return x is not None and not (isinstance(x, float) and not math.isfinite(x))


def _sentence(head: str, parts: Sequence[str]) -> Optional[str]:
    """``head`` + the clauses whose figure exists, or None when none does."""
    parts = [p for p in parts if p]
    return f"{head}{', '.join(parts)}." if parts else None


def markdown_table(records: Sequence[dict], summ: Optional[dict] = None) -> str:
    """The records as a markdown table plus the geometric means."""
    nb = next((r["batch"] for r in records if r.get("batch")), DEFAULT_BATCH)
    head = (f"| model | vs | b1 fbjax ms | b1 other ms | **b1 ratio** | b{nb} fbjax ms | b{nb} other ms "
            f"| **b{nb} thr. ratio** | first call s | warm cache s | RSS MiB cold / warm / warm above floor "
            f"(budget: 2 x (file + largest activation set)) | max rel err |")
    lines = [head, "|" + "|".join(["---"] * 12) + "|"]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['model']} | error: {r['error'][:120]} |" + " |" * 10)
            continue
        o = r.get("other") or "none"
        lat, bm = r.get("latency_ms", {}), r.get("batch_ms", {})
        fc, rss = r.get("first_call_s", {}), r.get("peak_rss_mib", {})
        mode = "" if r.get("fbjax_batch_mode", "batch_size") == "batch_size" else " (vmap)"
        fl = rss.get("xla_floor")
        rss_s = (f"{_f(rss.get('above_baseline'), '{:.0f}')} / {_f(rss.get('above_baseline_warm'), '{:.0f}')} "
                 f"/ {_f(None if fl is None else rss.get('above_baseline_warm') - fl, '{:.0f}')} "
                 f"({_f(rss.get('budget'), '{:.1f}')})") if rss else "-"
        lines.append(
            f"| {r['model']} | {o} | {_f(lat.get('fbjax'))} | {_f(lat.get(o))} | {_f(r.get('latency_ratio'))} "
            f"| {_f(bm.get('fbjax'), '{:.1f}')}{mode} | {_f(bm.get(o), '{:.1f}')} | {_f(r.get('throughput_ratio'))} "
            f"| {_f(fc.get('cold'))} | {_f(fc.get('warm'))} | {rss_s} | {_f(r.get('max_rel_err'), '{:.1e}')} |"
        )
    notes = [f"{r['model']}: {r.get('no_reference') or _no_reference(r.get('format'))}; fbjax's own figures only."
             for r in records if "error" not in r and not r.get("other")]
    notes += [f"{r['model']}: {r['error']}" for r in records if "error" in r and len(r["error"]) > 120]  # in full
    if notes or summ:
        lines.append("")
    lines.extend(notes)
    if summ:
        g = lambda k: summ.get(k)  # noqa: E731
        n_lite, n_rten = summ.get("tflite_models", 0), summ.get("rten_models", 0)
        if n_lite:
            cold, warm = g("geomean_first_call_cold_s"), g("geomean_first_call_warm_s")
            lines.append(_sentence(f"Geometric means over {n_lite} TFLite models (fbjax / LiteRT): ", [
                _has(g("geomean_latency_ratio_vs_litert"))
                and f"batch-1 latency ratio **{_f(g('geomean_latency_ratio_vs_litert'))}** "
                f"(fbjax takes {_f(g('geomean_latency_ratio_vs_litert'))}x LiteRT's time per call; goal: at most 1.5x)",
                _has(g("geomean_throughput_ratio_vs_litert"))
                and f"batch-{nb} throughput ratio **{_f(g('geomean_throughput_ratio_vs_litert'))}** "
                f"(fbjax gets through {_f(g('geomean_throughput_ratio_vs_litert'))}x LiteRT's examples per second; "
                "goal: at least 1.0x)",
                _has(cold) and f"first call {_f(cold)} s cold / {_f(warm)} s warm cache"]))
            lines.append(_sentence("Same with min / min instead of medians (less sensitive to other load): ", [
                _has(g("geomean_latency_ratio_min_vs_litert"))
                and f"batch-1 latency ratio {_f(g('geomean_latency_ratio_min_vs_litert'))}",
                _has(g("geomean_throughput_ratio_min_vs_litert"))
                and f"throughput ratio {_f(g('geomean_throughput_ratio_min_vs_litert'))}"]))
            if _has(g("geomean_throughput_ratio_best_mode_vs_litert")):
                lines.append("Throughput with each runtime in its faster mode (fbjax: the batch graph or repeated "
                             f"batch-1 calls): {_f(g('geomean_throughput_ratio_best_mode_vs_litert'))}.")
        fl = next((r["peak_rss_mib"].get("xla_floor") for r in records if r.get("peak_rss_mib")), None)
        if fl is not None:
            within = [r for r in records if r.get("peak_rss_mib")
                      and r["peak_rss_mib"]["above_baseline"] <= r["peak_rss_mib"]["budget"]]
            within_fl = [r for r in records if r.get("peak_rss_mib")
                         and r["peak_rss_mib"]["above_baseline_warm"] - fl <= r["peak_rss_mib"]["budget"]]
            n = sum(1 for r in records if r.get("peak_rss_mib"))
            lines.append("The RSS budget is 2 x (file size + largest activation set: the bytes of one node's "
                         "non-constant inputs and outputs), what the model needs twice over; it is a target, not "
                         "a limit fbjax enforces. "
                         f"Cold start: {len(within)} of {n} model(s) stayed within their budget (peak RSS above the "
                         f"`import jax, fbjax` baseline); the others used more memory than that. XLA floor (what a "
                         f"fresh process compiling and running one trivial jit adds): {fl:.0f} MiB; with a warm "
                         f"cache and that floor set aside, {len(within_fl)} of {n} stayed within budget.")
        if n_rten:
            lines.append(_sentence(f"Geometric mean over {n_rten} .rten models (fbjax / onnxruntime): ", [
                _has(g("geomean_latency_ratio_vs_onnxruntime"))
                and f"batch-1 latency ratio **{_f(g('geomean_latency_ratio_vs_onnxruntime'))}** "
                f"(fbjax takes {_f(g('geomean_latency_ratio_vs_onnxruntime'))}x onnxruntime's time per call; "
                "goal: at most 1.5x)",
                _has(g("geomean_latency_ratio_min_vs_onnxruntime"))
                and f"min / min {_f(g('geomean_latency_ratio_min_vs_onnxruntime'))}"]))
    lines = [ln for ln in lines if ln is not None]
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def environment() -> dict:
    """Versions and settings the numbers depend on."""
    import jax

    env = {"jax": jax.__version__, "backend": jax.default_backend(), "cpus": os.cpu_count(),
           "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""), "python": sys.version.split()[0],
           "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None}
    for mod in ("ai_edge_litert", "onnxruntime"):
        try:
            from importlib.metadata import version

            env[mod] = version(mod.replace("_", "-"))
        except Exception:  # noqa: BLE001 - not installed
            env[mod] = None
    return env


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``fbjax bench`` / ``benchmarks/run.py`` entry point (argparse)."""
    import argparse

    p = argparse.ArgumentParser(prog="fbjax bench", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run_cli(p.parse_args(argv))


def add_arguments(p) -> None:
    """Add ``fbjax bench``'s arguments to the argparse parser ``p``."""
    p.add_argument("models", nargs="+", metavar="MODEL",
                   help=".tflite / .rten files, or light:NAME for the onnx wheel's light_NAME.onnx")
    p.add_argument("--runs", type=int, default=DEFAULT_RUNS, help=f"timed runs per figure (default {DEFAULT_RUNS})")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, help=f"throughput batch (default {DEFAULT_BATCH}; 0 skips)")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="LiteRT / onnxruntime threads (default 2)")
    p.add_argument("--no-first-call", action="store_true", help="skip first-call / peak-RSS (fresh processes)")
    p.add_argument("--json", metavar="OUT.json", help="write the records and summary as JSON")
    p.add_argument("--md", metavar="OUT.md", help="write the markdown table")


def _check_models(models) -> None:
    """Refuse, before any benchmark runs, a model path that does not exist
    and a ``light:NAME`` the onnx wheel lacks (listing the names it has).

    Raises:
        SystemExit: with the message for the user.
    """
    for m in models:
        if m.startswith(LIGHT_PREFIX):
            try:
                src = light_onnx_path(m[len(LIGHT_PREFIX):])
            except ImportError:
                raise SystemExit(f"fbjax bench: {m} needs the onnx package (pip install '.[test]')") from None
            if not os.path.isfile(src):
                names = sorted(f[len("light_"):-len(".onnx")] for f in os.listdir(os.path.dirname(src))
                               if f.startswith("light_") and f.endswith(".onnx"))
                raise SystemExit(f"fbjax bench: the onnx wheel has no light model {m[len(LIGHT_PREFIX):]!r}; "
                                 f"light:NAME takes one of: {', '.join(names)}")
        elif not os.path.isfile(m):
            raise SystemExit(f"fbjax bench: no such file {m}")
    _check_runtimes(models)


def _check_runtimes(models) -> None:
    """Refuse, before any benchmark runs, models whose reference runtime is
    not installed: LiteRT for ``.tflite``, onnxruntime for ``light:NAME``
    (bench's figures are ratios against it).

    Raises:
        SystemExit: naming the runtime, how to install it, and what runs without it.
    """
    from .errors import FbjaxError
    from .formats import detect_format

    need = {}
    for m in models:
        if m.startswith(LIGHT_PREFIX):
            need.setdefault(("onnxruntime", "onnxruntime", "onnxruntime"), []).append(m)
            continue
        try:
            fmt = detect_format(m)
        except (FbjaxError, OSError):
            continue  # fbjax.load's own refusal is the model's row in the table
        if fmt == "tflite":
            need.setdefault(("ai_edge_litert.interpreter", "LiteRT", "ai-edge-litert"), []).append(m)
    for (module, runtime, package), ms in need.items():
        try:
            importlib.import_module(module)
        except ImportError:
            raise SystemExit(f"fbjax bench: compares fbjax with {runtime}, which is not installed "
                             f"(needed for {', '.join(ms)}): pip install {package} (or fbjax's '.[test]' extra); "
                             "`fbjax run MODEL` times fbjax alone") from None


def run_cli(args) -> int:
    """Run ``fbjax bench`` with parsed ``args``: benchmark, print the markdown
    table, write ``--json`` / ``--md`` when given; returns the exit status."""
    _check_models(args.models)
    recs = bench_models(args.models, runs=args.runs, batch=args.batch, threads=args.threads,
                        first=not args.no_first_call)
    summ = summary(recs)
    table = markdown_table(recs, summ)
    print(table)
    doc = {"environment": environment(), "command": " ".join(sys.argv), "records": recs, "summary": summ}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=float)
    if args.md:
        with open(args.md, "w") as f:
            f.write(table)
    return 1 if any("error" in r for r in recs) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
