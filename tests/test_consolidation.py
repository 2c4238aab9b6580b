"""Issue 16: op facts on the registry, Node.regions, LoadOptions, write_model, infer's step_size."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fbjax
from fbjax._registry import Registry
from fbjax.errors import InputError
from fbjax.formats import read_model, write_model
from fbjax.lower import LOWERINGS
from fbjax.options import KernelOptions, LoadOptions
from fbjax.formats.tflite_builder import single_op_model

F32 = np.float32


def test_unknown_fact_is_refused():
    reg = Registry("test")
    with pytest.raises(TypeError, match="unknown op facts"):
        reg.register("x", "Y", batchh=None)(lambda ctx, x: x)


def test_facts_reach_the_opdef():
    reg = Registry("test")
    rule = lambda node, carrying, batch: None  # noqa: E731
    reg.register("x", ["A", "B"], batch=rule, foldable=False, weights=((1, "OI"),))(lambda ctx, x, w: x)
    for name in "AB":
        od = reg.get("x", name)
        assert od.batch is rule and od.foldable is False and od.weights == ((1, "OI"),)
    assert reg.names_with("x", "batch") == frozenset("AB")
    assert reg.names_with("x", "int_passthrough") == frozenset()


def test_facts_replace_the_old_tables():
    """The facts the passes read, spot-checked against what the old op tables said."""
    assert LOWERINGS.get("tflite", "RESHAPE").int_passthrough
    assert not LOWERINGS.get("tflite", "CONV_2D").int_passthrough  # it has an integer kernel of its own
    assert LOWERINGS.get("tflite", "CONV_2D").weights[0] == (1, "OHWI")
    assert LOWERINGS.get("onnx", "Conv").weights[0] == (1, "OIHW")
    assert not LOWERINGS.get("tflite", "RANDOM_UNIFORM").foldable
    assert not LOWERINGS.get("onnx", "Loop").foldable
    assert LOWERINGS.get("tflite", "ADD").foldable
    assert LOWERINGS.get("onnx", "Softmax").reads_input_twice
    assert LOWERINGS.get("stablehlo", "stablehlo.reduce").scalar_regions == ("computation",)
    assert LOWERINGS.get("tflite.int", "CONV_2D").fq_rounding is not None
    assert LOWERINGS.get("tflite", "TRANSPOSE").batch is not None
    assert LOWERINGS.get("tflite", "ADD").batch is None  # elementwise: keeps the batch in dimension 0


def test_custom_op_facts_reach_the_registry():
    name = "fbjax_test.consolidation_identity"

    def rule(node, carrying, batch):
        raise fbjax.InputError("batch_size: refused by the custom op's rule")

    fbjax.register_custom_op(name, batch=rule, replace=True)(lambda ctx, x: x)
    try:
        assert LOWERINGS.get("tflite.custom", name).batch is rule
    finally:
        LOWERINGS._ops.pop(("tflite.custom", name), None)


def test_tflite_reader_fills_regions():
    """Every graph a node runs is in Node.regions: a TFLite WHILE names its
    cond and body subgraphs (fixture from tests/data/tflite_builtins)."""
    from pathlib import Path

    ir = read_model(Path(__file__).parent / "data" / "tflite_builtins" / "while_input_trip_count.tflite")
    (loop,) = [n for n in ir.main_graph.nodes if n.op_name == "WHILE"]
    assert set(loop.regions) == {"cond_subgraph_index", "body_subgraph_index"}
    assert loop.regions["cond_subgraph_index"] == (int(loop.attrs["cond_subgraph_index"]),)
    assert loop.regions["body_subgraph_index"] == (int(loop.attrs["body_subgraph_index"]),)
    called = {i for n in ir.iter_nodes() for refs in n.regions.values() for i in refs}
    assert called == set(range(len(ir.graphs))) - {ir.main}
    assert all(not n.regions for n in ir.main_graph.nodes if n.op_name != "WHILE")


def test_load_options_validate_once():
    assert LoadOptions(batch_size="dynamic").batch_size is None
    assert not LoadOptions().rewrites_batch and LoadOptions(batch_size=None).rewrites_batch
    assert LoadOptions(batch_size=4).replace(batch_size=2).as_kwargs() == dict(
        format=None, batch_size=2, quantized="exact", while_max_iterations=None, static_bounds=False,
        compute_dtype="float32", composites="litert", max_value_bytes=2 ** 32, tiered_compile=False,
        kernel_options=KernelOptions())
    assert LoadOptions(compute_dtype=np.dtype("float16")).compute_dtype == "float16"
    with pytest.raises(InputError, match="compute_dtype must be one of"):
        LoadOptions(compute_dtype="float64")
    with pytest.raises(InputError, match="batch_size must be"):
        LoadOptions(batch_size=0)
    with pytest.raises(InputError, match="quantized must be one of"):
        LoadOptions(quantized="int")
    with pytest.raises(InputError, match="while_max_iterations"):
        LoadOptions(while_max_iterations=-1)
    with pytest.raises(InputError, match="composites must be one of"):
        LoadOptions(composites="fast")
    with pytest.raises(Exception):  # frozen: the cache key cannot change under the model
        LoadOptions().batch_size = 3


def test_write_model_beside_read_model():
    src = single_op_model("ABS", [(1, 3)])
    ir = read_model(src)
    assert write_model(ir, {}) == bytes(src)  # nothing updated: the file's bytes
    ir.format = "onnx"
    with pytest.raises(InputError, match="not supported"):
        write_model(ir, {})


def test_infer_step_size_and_deprecated_batch_size():
    m = fbjax.load(single_op_model("ABS", [(1, 3)]), batch_size=None)
    x = -np.arange(12, dtype=F32).reshape(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fbjax.infer(m, x, step_size=2, progress=False)
    np.testing.assert_array_equal(np.asarray(got), np.abs(x))
    with pytest.warns(DeprecationWarning, match="step_size"):
        old = fbjax.infer(m, x, batch_size=2, progress=False)
    np.testing.assert_array_equal(np.asarray(old), np.abs(x))
    with pytest.raises(InputError, match="step_size only"):
        fbjax.infer(m, x, 2, batch_size=2, progress=False)
    with pytest.raises(InputError, match="step_size must be positive"):
        fbjax.infer(m, x, step_size=0, progress=False)


def test_state_facts_and_no_cross_op_set_imports():
    """Run state (variables, PRNG key) is one module, lower/state.py, fed by
    the ops' stateful/init_state facts; the TFLite and ONNX op sets no longer
    import each other for the key."""
    import ast
    from pathlib import Path

    from fbjax.lower import state

    assert LOWERINGS.get("tflite", "VAR_HANDLE").stateful is True
    assert LOWERINGS.get("tflite", "ADD").stateful is False
    assert callable(LOWERINGS.get("onnx", "Dropout").stateful)  # only a training-mode Dropout draws
    orders = sorted({od.init_state[0] for od in LOWERINGS if od.init_state})
    assert orders == [0, 1, 2]  # CALL_ONCE initialisers, TFLite key seeding, ONNX key seeding
    assert state.KEY == "prng_key"
    root = Path(state.__file__).parent
    for a, b in (("tflite", "onnx"), ("onnx", "tflite")):
        for f in (root / a).glob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 2:
                    assert not (node.module or "").startswith(b), f"{f} imports lower/{b}"
