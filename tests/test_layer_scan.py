"""Repeated blocks run as one ``lax.scan`` (fbjax/lower/layer_scan.py, ``KernelOptions.layer_scan``).

The scan must compute what the unrolled graph computes: checked against the numpy reference
interpreter (independent of the lowering) and against the same model loaded with
``layer_scan=False``, on a model built here whose blocks look like an LLM's (a carried hidden
state, int8 hybrid weights with per-block per-channel scales, a per-block cache input updated by
DYNAMIC_UPDATE_SLICE and returned, an index computation the converter left inside the first
block only) and on the LLM fixtures. Structures the scan cannot take stay unrolled.
"""

from __future__ import annotations

import os
import re

import jax
import numpy as np
import pytest

import fbjax
from fbjax import reference
from fbjax.formats.tflite_builder import TFLiteBuilder
from fbjax.lower.layer_scan import find_layer_scan

from helpers import TOL, rel_err

HERE = os.path.dirname(os.path.abspath(__file__))
LLM = os.path.join(HERE, "data", "llm")
W, SLOTS, BLOCKS = 64, 4, 4  # W * W int8 weights: large enough to be weight buffers (BUFFER_MIN_ELEMENTS)


def _blocks_model(blocks: int = BLOCKS, *, skip_reads: bool = False, shape_differs: bool = False) -> bytes:
    """``h`` [1, W] through ``blocks`` blocks: ``h = h + FC(RMS-like(h), W_k)`` (hybrid int8 weights,
    scales per block and channel), the block's cache ``c_k`` [1, SLOTS, W] gets ``h`` written at slot
    ``pos`` (DYNAMIC_UPDATE_SLICE; the write index computed once, inside block 0) and ``h`` adds the
    cache's mean. ``skip_reads``: block k also reads block k - 2's hidden state (not scannable).
    ``shape_differs``: the last block's RESHAPE takes another (load-time) shape constant."""
    rng = np.random.default_rng(7)
    b = TFLiteBuilder()
    h = b.add_input((1, W), name="h")
    pos = b.add_input((1,), np.int32, name="pos")
    caches = [b.add_input((1, SLOTS, W), name=f"cache_{k}") for k in range(blocks)]
    zero = b.add_constant(np.array(0, np.int32), name="zero")
    axis = b.add_constant(np.array([-1], np.int32), name="axis")
    mid = b.add_constant(np.array([1], np.int32), name="mid")
    hist = [h]
    idx = None
    for k in range(blocks):
        if k == 0:  # the index every block uses, computed inside block 0 (as litert-torch's converter does)
            p = b.add_tensor((), np.int32, name="p")
            b.add_op("RESHAPE", [pos, b.add_constant(np.zeros(0, np.int32))], [p])
            idx = b.add_tensor((3,), np.int32, name="idx")
            b.add_op("PACK", [zero, p, zero], [idx], options=dict(values_count=3, axis=0))
        x = hist[-1]
        sq = b.add_tensor((1, W), name=f"sq{k}")
        b.add_op("MUL", [x, x], [sq])
        ms = b.add_tensor((1, 1), name=f"ms{k}")
        b.add_op("MEAN", [sq, axis], [ms], options=dict(keep_dims=True))
        r = b.add_tensor((1, 1), name=f"r{k}")
        b.add_op("RSQRT", [ms], [r])
        n = b.add_tensor((1, W), name=f"n{k}")
        b.add_op("MUL", [x, r], [n])
        scale = rng.uniform(0.004, 0.02, W).astype(np.float32)
        wq = rng.integers(-127, 128, (W, W)).astype(np.int8)
        w = b.add_constant(wq, name=f"w{k}", quant=dict(scale=scale, zero_point=np.zeros(W, np.int64),
                                                          quantized_dimension=0))
        f = b.add_tensor((1, W), name=f"f{k}")
        b.add_op("FULLY_CONNECTED", [n, w, -1], [f])
        y = b.add_tensor((1, W), name=f"y{k}")
        b.add_op("ADD", [x, f], [y])
        if skip_reads and k >= 2:
            y2 = b.add_tensor((1, W), name=f"skip{k}")
            b.add_op("ADD", [y, hist[-2]], [y2])
            y = y2
        shape = (1, 1, W) if not (shape_differs and k == blocks - 1) else (1, W, 1)
        row = b.add_tensor(shape, name=f"row{k}")
        b.add_op("RESHAPE", [y, b.add_constant(np.array(shape, np.int32), name=f"shape{k}")], [row])
        if shape == (1, W, 1):
            row2 = b.add_tensor((1, 1, W), name=f"row2_{k}")
            b.add_op("RESHAPE", [row, b.add_constant(np.array((1, 1, W), np.int32))], [row2])
            row = row2
        c = b.add_tensor((1, SLOTS, W), name=f"cache_{k}_out")
        b.add_op("DYNAMIC_UPDATE_SLICE", [caches[k], row, idx], [c])
        m = b.add_tensor((1, W), name=f"m{k}")
        b.add_op("MEAN", [c, mid], [m], options=dict(keep_dims=False))
        out = b.add_tensor((1, W), name=f"h{k + 1}")
        b.add_op("ADD", [y, m], [out])
        hist.append(out)
        b.add_output(c)
    b.add_output(hist[-1])
    return b.build()


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    return ([rng.normal(size=(1, W)).astype(np.float32), np.array([2], np.int32)]
            + [rng.normal(size=(1, SLOTS, W)).astype(np.float32) for _ in range(BLOCKS)])


def _scans(m) -> dict:
    return {gi: (p.count, p.period) for gi, p in m.program.scans.items()}


def test_blocks_run_as_one_scan_equal_to_reference_and_unrolled(tmp_path):
    path = tmp_path / "blocks.tflite"
    path.write_bytes(_blocks_model())
    m = fbjax.load(path)
    unrolled = fbjax.load(path, kernel_options=fbjax.KernelOptions(layer_scan=False))
    assert _scans(m) == {0: (BLOCKS, 10)}  # 10 nodes a block: block 0's two index nodes were hoisted out of it
    plan = m.program.scans[0]
    assert len(plan.carry) == 1 and len(plan.quant) == 1  # the hidden state; the per-block weight scales
    assert _scans(unrolled) == {}
    ins = _inputs()
    want = reference.run(m.ir, *ins)
    got, ref_unrolled = m(*ins), unrolled(*ins)
    assert len(got) == BLOCKS + 1
    for g, u, w in zip(got, ref_unrolled, want):
        # float32 against the float64-free numpy twin: sums of W products of order-1 values
        assert rel_err(g, w) < TOL and rel_err(g, u) < TOL
    # one compiled block: the lowered program has one loop and one FULLY_CONNECTED kernel call
    text = jax.jit(lambda p, b, *x: m.program.apply(p, None, *x, buffers=b)[0]).lower(
        m.params, m.buffers, *ins).as_text()
    assert text.count("stablehlo.while") == 1
    assert len(re.findall(r"fbjax_int8_matmul(_at)?\b", text)) in (1, 0)  # native kernel (or XLA's dot)


def test_weight_buffers_are_stacked_once_and_read_by_name(tmp_path):
    path = tmp_path / "blocks.tflite"
    path.write_bytes(_blocks_model())
    m = fbjax.load(path)
    names = sorted(m.program.buffers)
    assert sorted(m.buffers) == names  # the mapping names every weight ...
    assert len(m.buffers.held) < len(names)  # ... but holds the blocks' weights as one stacked array
    (stack,) = [a for a in m.buffers.held.values() if a.ndim == 3]
    assert stack.shape == (BLOCKS, W, W)
    for n in names:
        np.testing.assert_array_equal(np.asarray(m.buffers[n]), np.asarray(m.program.buffers[n]))


@pytest.mark.parametrize("variant", ["skip_reads", "shape_differs"])
def test_structures_the_scan_cannot_take_stay_unrolled(tmp_path, variant):
    path = tmp_path / "blocks.tflite"
    path.write_bytes(_blocks_model(**{variant: True}))
    m = fbjax.load(path)
    if variant == "skip_reads":  # block k reads block k - 2: no scan region of two or more blocks covers it
        assert all(c < 3 for c, _ in _scans(m).values())
    else:  # the last block's load-time shape differs: at most the first three blocks scan
        assert all(c <= BLOCKS - 1 for c, _ in _scans(m).values())
    ins = _inputs(1)
    for g, w in zip(m(*ins), reference.run(m.ir, *ins)):
        assert rel_err(g, w) < TOL


@pytest.mark.parametrize("name", ["llama_q8", "llama_q4b32", "llama_f32", "gemma_q8", "gemma_q4b32"])
def test_llm_fixtures_scan_their_layers_and_match_unrolled(name):
    path = os.path.join(LLM, name + ".tflite")
    m = fbjax.load(path)
    u = fbjax.load(path, kernel_options=fbjax.KernelOptions(layer_scan=False))
    dec = m.signature("decode")
    assert m.program.scans.get(dec.graph_index) is not None and m.program.scans[dec.graph_index].count == 2
    rng = np.random.default_rng(3)
    for key in m.signatures:
        sig = m.signature(key)
        ins = {s.name: (rng.integers(0, 8, s.shape) if np.issubdtype(s.dtype, np.integer)
                        else rng.normal(size=s.shape)).astype(s.dtype) for s in sig.inputs}
        a, b = sig(**ins), u.signature(key)(**ins)
        for k in a:  # the same ops compiled as a loop body and unrolled: float32 rounding apart
            assert rel_err(a[k], b[k]) < TOL, (key, k)


def test_find_layer_scan_needs_enough_repeated_nodes(tmp_path):
    path = tmp_path / "blocks.tflite"
    path.write_bytes(_blocks_model(2))
    m = fbjax.load(path, kernel_options=fbjax.KernelOptions(layer_scan=False))
    stackable = lambda v: id(v) in m.program.param_of or id(v) in m.program.buffer_of  # noqa: E731
    # two blocks of 10 nodes save 10 traced nodes: fewer than MIN_SAVED_NODES, not worth a loop
    assert find_layer_scan(m.ir, 0, m.program.registry, stackable) is None
    assert find_layer_scan(m.ir, 0, m.program.registry, stackable, min_saved=10).count == 2
