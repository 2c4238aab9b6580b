"""Shared test helpers: where the real models live, and LiteRT as the oracle.

Real models come from the read-only ``../shared`` folder next to the
repository (``../shared/models/tflite/*.tflite``). Tests that need it are
skipped, with a message saying so, where it is absent.

The oracle for TFLite semantics is LiteRT (``ai_edge_litert``), run through
:func:`litert_run`; fbjax's own numpy interpreter (``fbjax.reference``) is a
second, independent oracle.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Sequence, Union

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
TFLITE_MODELS = SHARED / "models" / "tflite"

SHARED_MISSING_REASON = (
    f"real-model tests need the shared model folder {TFLITE_MODELS} "
    "(../shared/models/tflite next to the repository); it is absent here"
)


def tflite_model_params() -> list:
    """pytest params, one per ``../shared/models/tflite/*.tflite`` (id: file
    stem); a single skipped param with a clear reason when the folder is absent."""
    paths = sorted(TFLITE_MODELS.glob("*.tflite")) if TFLITE_MODELS.is_dir() else []
    if not paths:
        return [pytest.param(None, id="no-shared-models", marks=pytest.mark.skip(reason=SHARED_MISSING_REASON))]
    return [pytest.param(p, id=p.stem) for p in paths]


def _model_bytes(model: Union[bytes, bytearray, memoryview, str, os.PathLike]) -> bytes:
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model)
    return Path(model).read_bytes()


def model_io_indices(model) -> tuple[list[int], list[int]]:
    """Tensor indices of subgraph 0's inputs and outputs, in the model's order,
    read with the generated flatbuffer bindings (not with fbjax's frontend)."""
    from fbjax.formats._generated import tflite_generated as T

    m = T.Model.GetRootAs(_model_bytes(model), 0)
    sg = m.Subgraphs(0)
    return ([int(sg.Inputs(i)) for i in range(sg.InputsLength())],
            [int(sg.Outputs(i)) for i in range(sg.OutputsLength())])


def declared_output_shapes(model) -> list[tuple]:
    """Output shapes as written in the model file (subgraph 0)."""
    from fbjax.formats._generated import tflite_generated as T

    m = T.Model.GetRootAs(_model_bytes(model), 0)
    sg = m.Subgraphs(0)
    return [tuple(int(d) for d in sg.Tensors(sg.Outputs(i)).ShapeAsNumpy())
            if sg.Tensors(sg.Outputs(i)).ShapeLength() else ()
            for i in range(sg.OutputsLength())]


def litert_builtin(path, inputs: Sequence[np.ndarray], *, resolver: str = "BUILTIN_WITHOUT_DEFAULT_DELEGATES",
                   preserve: bool = False):
    """Run a ``.tflite`` file with LiteRT's builtin kernels (no XNNPACK): the
    oracle of the quantized tests, whose integer kernels round like TFLite's
    own (XNNPACK rounds differently).

    Args:
        path: the model file.
        inputs: one array per model input, in ``get_input_details`` order.
        resolver: an ``OpResolverType`` name (``"BUILTIN_REF"``: the
            reference kernels).
        preserve: keep every intermediate tensor readable
            (``experimental_preserve_all_tensors``).

    Returns:
        ``(outputs, interpreter)``: the outputs in ``get_output_details``
        order and the interpreter (for tensor details and intermediates).
    """
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(model_path=os.fspath(path), experimental_preserve_all_tensors=preserve,
                     experimental_op_resolver_type=getattr(OpResolverType, resolver))
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()], it


def litert_run(model, inputs: Sequence[np.ndarray], *, num_threads: int = 2) -> list[np.ndarray]:
    """Run a TFLite model with LiteRT (default op resolver, XNNPACK applied).

    Args:
        model: ``.tflite`` bytes or a path.
        inputs: one array per model input, in the model's input order.

    Returns:
        the outputs in the model's (subgraph 0) output order, as numpy copies.
    """
    from ai_edge_litert.interpreter import Interpreter

    if isinstance(model, (bytes, bytearray, memoryview)):
        interp = Interpreter(model_content=bytes(model), num_threads=num_threads)
    else:
        interp = Interpreter(model_path=os.fspath(model), num_threads=num_threads)
    in_idx, out_idx = model_io_indices(model)
    if len(inputs) != len(in_idx):
        raise ValueError(f"the model has {len(in_idx)} inputs, {len(inputs)} given")
    in_details = {d["index"]: d for d in interp.get_input_details()}
    for t, x in zip(in_idx, inputs):
        if tuple(in_details[t]["shape"]) != tuple(np.shape(x)):
            interp.resize_tensor_input(t, list(np.shape(x)))
    interp.allocate_tensors()
    for t, x in zip(in_idx, inputs):
        interp.set_tensor(t, np.ascontiguousarray(x, dtype=in_details[t]["dtype"]))
    interp.invoke()
    out_details = {d["index"]: d for d in interp.get_output_details()}
    missing = [t for t in out_idx if t not in out_details]
    if missing:
        raise AssertionError(f"LiteRT does not report model outputs {missing}")
    return [np.array(interp.get_tensor(t)) for t in out_idx]


def max_abs_err(actual, expected) -> float:
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    return float(np.max(np.abs(a - e))) if e.size else 0.0


def assert_close(actual, expected, rtol: float, what: str = "") -> None:
    """``max|actual - expected| <= rtol * max(1, max|expected|)``, with equal
    shapes, finite values where the oracle is finite, and a message giving the
    error and the bound."""
    a = np.asarray(actual)
    e = np.asarray(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != oracle shape {e.shape}"
    if e.dtype.kind in "biu":
        np.testing.assert_array_equal(a, e, err_msg=what)
        return
    fin = np.isfinite(e)
    assert np.array_equal(np.isfinite(a), fin), f"{what}: non-finite values differ from the oracle"
    scale = max(1.0, float(np.max(np.abs(e[fin])))) if fin.any() else 1.0
    err = max_abs_err(np.where(fin, a, 0), np.where(fin, e, 0))
    bound = rtol * scale
    assert err <= bound, f"{what}: max|err| = {err:.3g} > {bound:.3g} (= {rtol:g} * {scale:.3g})"


@pytest.fixture(scope="session")
def shared_models_dir() -> Path:
    """``../shared/models/tflite``; skips the test when it is absent."""
    if not TFLITE_MODELS.is_dir():
        pytest.skip(SHARED_MISSING_REASON)
    return TFLITE_MODELS


# --- float32 error bounds for comparing two differently compiled programs ------------
#
# Two programs that compute the same float32 expression (Model.__call__'s
# CPU-prepared program vs jax.jit(Model.apply) with XLA's defaults, batch N vs
# batch 1, an exported artifact vs the loaded model, fbjax vs onnxruntime) may
# sum in different orders (SIMD width, tiling, FMA contraction differ with the
# CPU). Neither is bit-exact; each lies within the standard rounding-error
# bound of the exact result, so they differ by at most the sum of the two
# bounds. The helpers below give those bounds; tests print the measured
# err/bound ratio (``pytest -s``) so a bound can be seen not to be vacuous.

#: unit roundoff of float32 (half an ULP of 1)
U32 = 2.0 ** -24


def gamma(n: int, u: float = U32) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: a float32 sum of ``n`` terms
    (or dot product of length ``n``), in any order, with or without FMA, lies
    within ``gamma_n * sum|t_i|`` of the exact sum."""
    return n * u / (1 - n * u)


def abs_magnitude(model, *xs, params=None) -> np.ndarray:
    """``model.apply`` on ``|params|`` and ``|x|``: for a graph of linear ops
    (convolutions, matmuls, bias adds, sums, average/max pools, reshapes)
    and ReLU, each output element is then at least ``sum|a_i b_i|`` of every
    sum leading to it, propagated through ``|W|`` (ReLU is 1-Lipschitz and
    monotone). A chain of sums of lengths ``n_1, n_2, ...`` then has rounding
    error at most ``gamma(n_1 + n_2 + ...) * abs_magnitude``. Not valid for
    other nonlinearities (bound those through their slope)."""
    p = model.params if params is None else params
    out = model.apply({k: np.abs(np.asarray(v)) for k, v in p.items()},
                      *[np.abs(np.asarray(x, np.float32)) for x in xs])
    if isinstance(out, (tuple, list)):
        return [np.asarray(o, np.float64) for o in out]
    return np.asarray(out, np.float64)


def softmax_bound(y, dz, n: int, exp_ulps: float = 4.0) -> np.ndarray:
    """Elementwise bound on ``|softmax_a(z) - softmax_b(z')|`` where
    ``|z - z'| <= dz`` (a scalar or broadcastable array: take its max over the
    softmax axis) and the two sides evaluate softmax over ``n`` terms in
    float32 with their own ``exp``. The slope ``dy_i/dz_j = y_i (d_ij - y_j)``
    moves ``y_i`` by at most ``2 y_i max|dz|``; each side's own evaluation
    (``exp`` within ``exp_ulps`` ULP, a sum of ``n`` terms, a division, the
    max subtraction) adds ``(2 exp_ulps + n + 2) u`` relative, for both
    sides twice that."""
    y = np.abs(np.asarray(y, np.float64))
    return y * (2 * np.asarray(dz, np.float64) + 2 * (2 * exp_ulps + n + 2) * U32)


def bilinear_bound(max_abs: float, extent: float, coordinate_roundings: int = 5) -> float:
    """Bound on two implementations of 2-D bilinear sampling (Resize, affine
    transforms) of values up to ``max_abs``: each output is ``sum w_i x_i``
    over 4 taps with weights in [0, 1] summing to 1, computed per axis with at
    most 4 roundings of values up to ``max_abs`` (8 in all); the fraction
    behind the weights comes from a source coordinate computed with up to
    ``coordinate_roundings`` roundings of terms up to ``extent`` (the largest
    coordinate), so a float32 side has it off by up to
    ``coordinate_roundings * u * extent``, which moves the output by
    ``|x1 - x0| <= 2 max_abs`` per axis. Per side
    ``(8 + 2 * 2 * coordinate_roundings * extent) u max_abs``; twice that."""
    return 2 * (8 + 2 * 2 * coordinate_roundings * extent) * U32 * max_abs


def assert_within(actual, expected, bound, what: str = "") -> float:
    """``|actual - expected| <= bound`` elementwise (shapes equal, non-finite
    values equal where they occur); prints and returns the largest
    ``err / bound`` so the margin of a derived bound can be read with
    ``pytest -s``."""
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    fin = np.isfinite(e)
    assert np.array_equal(np.isfinite(a), fin) and np.array_equal(a[~fin], e[~fin], equal_nan=True), \
        f"{what}: non-finite values differ"
    b = np.broadcast_to(np.asarray(bound, np.float64), e.shape)
    err = np.abs(np.where(fin, a - e, 0.0))
    ratio = float(np.max(np.where(b > 0, err / np.where(b > 0, b, 1), np.where(err > 0, np.inf, 0)))) if e.size else 0.0
    scale = float(np.max(np.abs(e[fin]))) if fin.any() else 0.0
    print(f"[bound] {what}: max err {float(err.max()) if e.size else 0:.3g}, max err/bound {ratio:.3g}, "
          f"max bound/max|expected| {float(b[fin].max()) / scale if scale else float('nan'):.2g}")
    if ratio > 1:
        i = np.unravel_index(int(np.argmax(err - b)), e.shape)
        raise AssertionError(f"{what}: {int(np.sum(err > b))} of {e.size} elements over the derived bound; "
                             f"worst at {i}: |{a[i]:.9g} - {e[i]:.9g}| = {err[i]:.3g} > {b[i]:.3g} "
                             f"(max err/bound {ratio:.3g})")
    return ratio


#: the packages of the ``test`` extra (pyproject.toml): a test needing one fails when it is missing
TEST_EXTRA = ("ai_edge_litert", "flax", "matplotlib", "onnx", "onnxruntime", "optax", "rten_convert", "PIL",
              "sentencepiece", "tokenizers", "jinja2", "apache_beam", "ray", "nox", "xdist")


def require(module: str, reason: str = ""):
    """Import ``module``, a package of the ``test`` extra (:data:`TEST_EXTRA`)
    or a submodule of one. A missing one fails the test -- ``pip install
    '.[test]'`` installs them, so a skip would hide a broken install.
    (Optional packages outside the extra, torch say, stay
    ``pytest.importorskip``.)"""
    assert module.split(".")[0] in TEST_EXTRA, f"{module} is not in the test extra: use pytest.importorskip"
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"{module} ({reason or 'a test dependency'}) cannot be imported: {e}; "
                    "install the test dependencies with pip install '.[test]'")


@pytest.fixture(autouse=True)
def _registrations_stay_in_their_test():
    """Ops a test registers (``register_custom_op``, ``register_custom_call``)
    are removed after it, and ones it replaced are put back, so that no test
    sees another's ops (a gradient-coverage check would otherwise count a
    custom op registered by an earlier test module)."""
    import fbjax  # noqa: F401  (every op family registers at import)
    from fbjax.lower import LOWERINGS
    from fbjax.reference.registry import REFERENCE

    before = [(reg, dict(reg._ops)) for reg in (LOWERINGS, REFERENCE)]
    yield
    for reg, ops in before:
        if reg._ops != ops:
            reg._ops.clear()
            reg._ops.update(ops)


# --- one line per test file as it finishes (the README's `pytest -q` runs on 2 xdist workers) ---------

class _FileProgress:
    """Prints ``tests/test_x.py: 12 passed, 1 skipped (34 s, gw1) [7/84 files]``
    (seconds from the file's first report to its last) when the last test of a file has reported, in the process that reports
    (xdist's controller, or the only process without ``-n``). Under ``--dist
    loadfile`` a file runs on one worker, so its tests report together."""

    def __init__(self, config):
        self.config = config
        self.total: dict = {}      # file -> number of tests collected
        self.done: dict = {}       # file -> Counter of outcomes
        self.start: dict = {}      # file -> time of its first report
        self.finished = 0

    def _collected(self, nodeids):
        if self.total:
            return  # every xdist worker collects the same ids
        for nid in nodeids:
            f = nid.split("::", 1)[0]
            self.total[f] = self.total.get(f, 0) + 1

    def pytest_collection_finish(self, session):
        if not hasattr(self.config, "workerinput"):  # not inside an xdist worker
            self._collected([item.nodeid for item in session.items])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self._collected(ids)

    @pytest.hookimpl(trylast=True)  # after the terminal reporter has written the test's letter
    def pytest_runtest_logreport(self, report):
        import time
        from collections import Counter

        f = report.nodeid.split("::", 1)[0]
        self.start.setdefault(f, time.monotonic())
        c = self.done.setdefault(f, Counter())
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            outcome = ("xfailed" if report.outcome == "skipped" else "xpassed") if hasattr(report, "wasxfail") \
                else ("error" if report.when == "setup" and report.failed else report.outcome)
            c[outcome] += 1
        elif report.when == "teardown" and report.failed:
            c["error"] += 1
        if report.when != "teardown":
            return
        c["_n"] += 1
        if c["_n"] != self.total.get(f):
            return
        self.finished += 1
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is None:
            return
        parts = ", ".join(f"{n} {k}" for k, n in sorted(c.items()) if k != "_n")
        where = getattr(getattr(report, "node", None), "gateway", None)
        worker = f", {where.id}" if where is not None else ""
        if tr._tw.width_of_current_line:
            tr._tw.line()
        tr._tw.line(f"{f}: {parts} ({time.monotonic() - self.start[f]:.0f} s{worker}) "
                      f"[{self.finished}/{len(self.total)} files]")


def pytest_configure(config):
    if not hasattr(config, "workerinput") and config.getoption("verbose") <= 0:
        config.pluginmanager.register(_FileProgress(config), "fbjax-file-progress")
