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
    assert LOWERINGS.get("tflite", "RESHAPE").fact("int_passthrough")
    assert not LOWERINGS.get("tflite", "CONV_2D").fact("int_passthrough")  # it has an integer kernel of its own
    assert LOWERINGS.get("tflite", "CONV_2D").weights[0] == (1, "OHWI")
    assert LOWERINGS.get("onnx", "Conv").weights[0] == (1, "OIHW")
    assert not LOWERINGS.get("tflite", "RANDOM_UNIFORM").foldable
    assert not LOWERINGS.get("onnx", "Loop").foldable
    assert LOWERINGS.get("tflite", "ADD").foldable
    assert LOWERINGS.get("onnx", "Softmax").reads_input_twice
    assert LOWERINGS.get("stablehlo", "stablehlo.reduce").scalar_regions == ("computation",)
    assert LOWERINGS.get("tflite.int", "CONV_2D").fact("fq_rounding") is not None
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


# --- issue 27: every fact beside its op ---------------------------------------------

#: op-set folders, where op names belong (the registrations and their twins)
_OP_SET_DIRS = ("tflite", "tflite_int", "onnx", "stablehlo", "gpu")

#: op-name literals left outside the op sets, after issue 27 (was 199 at fdc718d, counted the same way):
#: readers' opcode tables (formats/stablehlo*.py, formats/gpu_cl.py), the nodes the quantization
#: rewrite emits (quantization.py), TFLite's fused-activation enum names (lower/kernels.py), the
#: test-model builder's option tables (formats/tflite_builder.py), rten-convert's Softmax axis quirk
#: (formats/rten.py, convert.py, bench.py)
OP_NAME_LITERALS_MAX = 133


def _op_name_literals() -> list:
    """``(file, line, name)`` of every string constant outside the op-set
    folders that spells a registered op name (ast: comments and docstrings
    are not string constants equal to a name)."""
    import ast
    from pathlib import Path

    from fbjax.reference import REFERENCE

    names = {od.name for reg in (LOWERINGS, REFERENCE) for od in reg if len(od.name) > 1}
    pkg = Path(fbjax.__file__).parent
    out = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).parts
        if "_generated" in rel or (rel[0] in ("lower", "reference") and len(rel) > 2 and rel[1] in _OP_SET_DIRS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                out.append((str(path.relative_to(pkg.parent)), node.lineno, node.value))
    return out


def test_op_name_literals_stay_in_the_op_sets():
    found = _op_name_literals()
    listing = "\n".join(f"{f}:{line} {name!r}" for f, line, name in found)
    assert len(found) <= OP_NAME_LITERALS_MAX, (
        f"{len(found)} op-name literals outside fbjax/lower/<set>/ and fbjax/reference/<set>/ (at most "
        f"{OP_NAME_LITERALS_MAX}): declare what the code needs to know about an op as a fact at its "
        f"registration (fbjax._registry.OpDef) instead:\n{listing}")
    # the tables issue 27 removed stay removed
    files = {f for f, _, _ in found}
    for gone in ("fbjax/formats/rten.py", "fbjax/lower/build.py", "fbjax/executors/planner.py", "fbjax/passes/quantization.py"):
        names = sorted({n for f, _, n in found if f == gone})
        assert gone not in files or not set(names) & {"Shape", "Size", "ArgMax", "NonZero", "SHAPE", "RANK",
                                                      "DENSIFY", "EMBEDDING_LOOKUP", "If", "Loop", "Cast"}, \
            (gone, names)


def test_old_fact_tables_are_gone():
    """The removed fact tables stay removed (their rules live beside the ops)."""
    import importlib.util

    for mod in ("fbjax.batch_rules", "fbjax.bound_rules", "fbjax.formats.regions"):
        assert importlib.util.find_spec(mod) is None, f"{mod} is back: its facts belong at the ops' registrations"


def _resolves(name: str) -> bool:
    """Whether a dotted ``fbjax.…`` name is a module, or an attribute reached
    from the longest importable module prefix (an instance attribute of a
    class counts when the class assigns ``self.<attr>`` or declares it)."""
    import importlib
    import inspect

    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
                continue
            if inspect.isclass(obj):
                declared = set(getattr(obj, "__dataclass_fields__", {})) | set(getattr(obj, "__annotations__", {}))
                return attr in declared or f"self.{attr} =" in inspect.getsource(obj)
            return False
        return True
    return False


def test_dotted_names_in_the_code_and_docs_exist():
    """Every ``fbjax.x.y`` that fbjax's modules, the README and docs/ name
    (docstrings, messages, comments) is a module or attribute that exists:
    a module moved or removed leaves no reference behind."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]  # the repository (CI installs fbjax into site-packages)
    assert (root / "fbjax" / "__init__.py").is_file() and (root / "README.md").is_file()
    pattern = re.compile(r"(?<![\w.<])fbjax(?:\.[A-Za-z_]\w*)+")
    files = [p for p in sorted((root / "fbjax").rglob("*.py")) if "_generated" not in p.parts]
    files += [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    stale = {}
    for path in files:
        for m in pattern.finditer(path.read_text()):
            name = m.group(0).rstrip(".")
            if name not in stale and not _resolves(name):
                stale[name] = str(path.relative_to(root))
    assert not stale, f"names of modules or attributes that do not exist (name: first file): {stale}"


def test_resolves_tells_stale_names():
    assert _resolves("fbjax.passes.reading.complete") and _resolves("fbjax.Model.params")
    assert not _resolves("fbjax.batch_rules") and not _resolves("fbjax.passes.reading.no_such_function")


def test_new_facts_reach_the_registry():
    assert LOWERINGS.get("tflite", "SHAPE").shape_only and LOWERINGS.get("onnx", "Size").shape_only
    assert not LOWERINGS.get("tflite", "ADD").shape_only
    assert LOWERINGS.get("tflite", "DENSIFY").fact("layout_passthrough") is not None
    assert LOWERINGS.get("tflite.int", "QUANTIZE").fact("quant_conversion") == "quantize"
    assert LOWERINGS.get("tflite.int", "DEQUANTIZE").fact("quant_conversion") == "dequantize"
    assert LOWERINGS.get("tflite", "EMBEDDING_LOOKUP").fact("table_lookup")
    assert LOWERINGS.get("onnx", "Loop").static_bound is not None
    assert LOWERINGS.get("tflite", "WHILE").regions.keys() == {"cond_subgraph_index", "body_subgraph_index"}
    assert LOWERINGS.get("stablehlo", "stablehlo.sort").scalar_regions == ("comparator",)
    assert LOWERINGS.get("onnx", "Equal").out_dtype is not None


def _sample_nodes(op_set: str, name: str, graphs: list) -> list:
    """Nodes of ``name`` with 1 to 4 inputs and 1 to 3 outputs, inputs typed
    float32/int8/untyped, and the attributes the dtype rules read."""
    from fbjax.ir import Node, Value

    out = []
    for n_in in (1, 2, 3, 4):
        for n_out in (1, 2, 3):
            for dt in (np.float32, np.int8, None):
                ins = [Value(f"i{k}", None if dt is None else np.dtype(dt), (2,)) for k in range(n_in)]
                outs = [Value(f"o{k}", None, (2,)) for k in range(n_out)]
                attrs = {"then_branch": 0, "else_branch": 0, "body": 0}
                out.append(Node(op_set, name, ins, outs, attrs, "test"))
    return out


def test_lowering_and_reference_declare_the_same_format_facts():
    """The facts both executors need to read a file (region arities, open
    output dtypes) are declared at both registrations; they agree on every
    op both have, evaluated on generated nodes."""
    from fbjax.ir import Graph, Value
    from fbjax.reference import REFERENCE

    body = Graph("body", [Value("a", np.dtype(np.int32), ())],
                 [Value(f"r{k}", np.dtype(d), ()) for k, d in enumerate((np.bool_, np.int32, np.float32, np.int8))],
                 [])
    graphs = [body]
    checked = 0
    for lo in LOWERINGS:
        ref = REFERENCE.get(lo.op_set, lo.name)
        if ref is None:
            continue
        assert set(lo.regions) == set(ref.regions), lo.key
        assert (lo.out_dtype is None) == (ref.out_dtype is None), lo.key
        for node in _sample_nodes(lo.op_set, lo.name, graphs):
            for attr in lo.regions:
                a, b = lo.regions[attr], ref.regions[attr]
                assert (a.arity(node), a.scalar, a.required) == (b.arity(node), b.scalar, b.required), (lo.key, attr)
            if lo.out_dtype is not None:
                for k in range(len(node.outputs)):
                    assert lo.out_dtype(node, k, graphs) == ref.out_dtype(node, k, graphs), (lo.key, k)
        checked += bool(lo.regions or lo.out_dtype)
    assert checked >= 40  # 10 ops with regions, 30-odd ONNX ops with an out_dtype


def test_reading_pass_fills_open_dtypes_from_the_facts():
    """A value the file leaves untyped takes its op's out_dtype fact, else its
    first typed input's dtype; a required region that is missing is a
    ModelFormatError."""
    from fbjax.errors import ModelFormatError
    from fbjax.ir import Graph, ModelIR, Node, Value
    from fbjax.op_rules import Region, any_arity, int32_out
    from fbjax.passes.reading import complete

    reg = Registry("test")
    reg.register("x", "Cmp", out_dtype=int32_out)(lambda ctx, a: a)
    reg.register("x", "Loop", regions={"body": Region(any_arity, required=True)})(lambda ctx, a: a)
    a = Value("a", np.dtype(np.int8), (2,))
    c, d = Value("c", None, (2,)), Value("d", None, (2,))
    g = Graph("main", [a], [d], [Node("x", "Cmp", [a], [c], {}, "n0"), Node("x", "Other", [c], [d], {}, "n1")],
              [a, c, d])
    ir = ModelIR("rten", [g])
    complete(ir, reg)
    assert c.dtype == np.int32 and d.dtype == np.int32  # d: its first typed input's
    bad = ModelIR("rten", [Graph("main", [a], [a], [Node("x", "Loop", [a], [a], {}, "n0")], [a])])
    with pytest.raises(ModelFormatError, match="n0 \\(Loop\\): the body graph is missing"):
        complete(bad, reg)


def test_custom_op_format_facts_reach_the_reference_too():
    from fbjax.op_rules import Region, n_in
    from fbjax.reference import REFERENCE

    name = "fbjax_test.consolidation_region_op"
    regions = {"body": Region(lambda n: (n_in(n), 1))}
    fbjax.register_custom_op(name, reference=lambda ctx, x: x, regions=regions, foldable=False,
                             replace=True)(lambda ctx, x: x)
    try:
        assert LOWERINGS.get("tflite.custom", name).regions is regions
        assert REFERENCE.get("tflite.custom", name).regions is regions
        assert REFERENCE.get("tflite.custom", name).foldable  # a lowering-only fact stays on the lowering
    finally:
        LOWERINGS._ops.pop(("tflite.custom", name), None)
        REFERENCE._ops.pop(("tflite.custom", name), None)


def test_op_set_facts_live_in_their_op_sets_tables():
    """Issue 36: a fact only some op sets have is declared in their fact table
    (``Registry.declare_facts``), refused on another op set, and read with
    ``OpDef.fact``; ``OpDef`` carries only the facts every op set shares."""
    import dataclasses

    from fbjax._registry import OpDef

    fields = {f.name for f in dataclasses.fields(OpDef)}
    for name in ("int_passthrough", "fq_rounding", "hybrid_eligible", "bias_scale", "xnnpack_kernel",
                 "traced_weights", "quant_conversion", "table_lookup", "layout_passthrough"):
        assert name not in fields, name
    reg = Registry("test")
    reg.declare_facts("x.int", fq_rounding=None)
    rule = lambda node, orig: {}  # noqa: E731
    reg.register("x.int", "A", fq_rounding=rule)(lambda ctx, x: x)
    assert reg.get("x.int", "A").fact("fq_rounding") is rule
    with pytest.raises(TypeError, match="unknown op facts \\['fq_rounding'\\] for op set 'x'"):
        reg.register("x", "B", fq_rounding=rule)(lambda ctx, x: x)
    reg.register("x", "C")(lambda ctx, x: x)
    assert reg.get("x", "C").fact("fq_rounding") is None  # the declared default, also for other op sets
    with pytest.raises(TypeError, match="no op fact"):
        reg.get("x", "C").fact("fq_roundingg")
    with pytest.raises(TypeError, match="declared with default"):
        reg.declare_facts("y", fq_rounding=False)
    # the real tables: a TFLite fact on an ONNX registration is refused
    with pytest.raises(TypeError, match="unknown op facts \\['int_passthrough'\\]"):
        LOWERINGS.register("onnx", "fbjax_test.never", int_passthrough=True)(lambda ctx, x: x)
    assert ("onnx", "fbjax_test.never") not in LOWERINGS


def _tiny_files() -> dict:
    """One valid file per flatbuffer reader: ``{module name: (bytes, function its parsing calls after
    verifying)}``."""
    from pathlib import Path

    import jax.numpy as jnp

    from fbjax.export import to_stablehlo_flatbuffer
    from rten_builders import rten_file, value_node

    tfl = single_op_model("RELU", [(2,)])
    shlo = to_stablehlo_flatbuffer(lambda x: x + 1.0, jnp.zeros((2,), F32))
    rten = rten_file([value_node("x", [2])], [0], [0])
    import fbjax.data

    gpu = Path(fbjax.data.SINE_GPU_CL).read_bytes()  # the GPU-delegate file fbjax ships
    return {"tflite": (tfl, "_to_ir"), "stablehlo": (shlo, "_to_ir"), "rten": (rten, "_Reader"),
            "gpu_cl.reader": (gpu, "parse_nodes")}


@pytest.mark.parametrize("fmt", ["tflite", "stablehlo", "rten", "gpu_cl.reader"])
def test_readers_share_one_corrupt_file_policy_and_strict_switch(fmt, monkeypatch):
    """Issue 36: the last-resort conversion of a parser's IndexError (and the
    like) into ModelFormatError, and the STRICT switch that lets it through
    raw, are one definition (fbjax.formats.verify) for every flatbuffer reader."""
    import importlib
    import inspect

    from fbjax.errors import ModelFormatError
    from fbjax.formats import verify

    mod = importlib.import_module(f"fbjax.formats.{fmt}")
    data, inner = _tiny_files()[fmt]
    src = inspect.getsource(mod.read)
    assert "corrupt_file_errors" in src and "OverflowError" not in src and not hasattr(mod, "STRICT")

    def broken(*args, **kwargs):
        raise IndexError("offset past the end")

    monkeypatch.setattr(mod, inner, broken)
    with pytest.raises(ModelFormatError, match="<bytes>: corrupt or truncated .*\\(IndexError: offset past the end\\)"):
        mod.read(data)
    monkeypatch.setattr(verify, "STRICT", True)
    with pytest.raises(IndexError, match="offset past the end"):
        mod.read(data)


def test_compute_dtype_is_the_dtype_name_everywhere():
    """Issue 36: compute_dtype is the dtype's name on LoadOptions, in the
    lowering options and on Model (a dtype given is converted at the boundary)."""
    import ml_dtypes

    for given, name in (("float32", "float32"), (np.float32, "float32"), (ml_dtypes.bfloat16, "bfloat16"),
                        ("float16", "float16")):
        opts = LoadOptions(compute_dtype=given)
        assert opts.compute_dtype == name and opts.lowering()["compute_dtype"] == name
    m = fbjax.load(single_op_model("RELU", [(2,)]), compute_dtype=np.dtype("float16"))
    assert m.compute_dtype == "float16"


def test_build_takes_completed_ir_only():
    """Issue 36 item 4: ``build`` lowers what the read step returns
    (``fbjax.loading.read``); a reader's IR is refused, not completed on the
    side, so the read sequence runs in one order."""
    from fbjax import loading, reference
    from fbjax.lower.build import build

    data = single_op_model("ADD", [(2, 3), (2, 3)])
    raw = read_model(data)
    assert not raw.completed
    with pytest.raises(ValueError, match="completed IR"):
        build(raw)
    assert loading.read(raw) is raw and raw.completed  # a reader's IR completes in place
    prog = build(loading.read(data))
    x = np.arange(6, dtype=F32).reshape(2, 3)
    (y,), _ = prog.apply(prog.params, None, x, x)
    np.testing.assert_array_equal(np.asarray(y), x + x)
    assert reference.run(data, x, x)[0].tolist() == (x + x).tolist()


def test_one_module_name_per_job_and_the_task_bundles_named_apart():
    """Issue 36 item 5: one ``llm_bundle`` module (the ``LlmBundle`` runtime,
    :mod:`fbjax.llm_bundle`); the container reader is ``formats.llm_container``,
    the vision ``.task`` bundle ``formats.vision_task.VisionTaskBundle``. The
    old names keep working, each with a ``DeprecationWarning``."""
    import importlib
    from pathlib import Path

    from fbjax.formats import llm_container, vision_task

    pkg = Path(fbjax.__file__).parent
    stems = [p.stem for p in pkg.rglob("*.py") if "_generated" not in p.parts]
    assert stems.count("llm_bundle") == 1 and "task_bundle" not in stems
    assert fbjax.VisionTaskBundle is vision_task.VisionTaskBundle and "TaskBundle" not in fbjax.__all__
    old = [(fbjax, "TaskBundle", vision_task.VisionTaskBundle),
           (importlib.import_module("fbjax.formats"), "llm_bundle", llm_container),
           (importlib.import_module("fbjax.formats"), "task_bundle", vision_task),
           (vision_task, "TaskBundle", vision_task.VisionTaskBundle),
           (vision_task, "write_bundle", vision_task.write_vision_task),
           (llm_container, "BundleFile", llm_container.LlmBundleFile)]
    for mod, name, new in old:
        with pytest.warns(DeprecationWarning, match="deprecated"):
            assert getattr(mod, name) is new, (mod.__name__, name)
    with pytest.raises(AttributeError):
        fbjax.formats.no_such_module  # noqa: B018


def test_gpu_is_the_backend_and_gpu_cl_the_op_set():
    """Issue 36 item 5: the TFLite GPU delegate files' op set is ``"gpu_cl"``
    (its format's name), so ``"gpu"`` means only JAX's backend;
    ``supported_ops("gpu")`` still answers, with a ``DeprecationWarning``."""
    from fbjax.formats import gpu_cl
    from fbjax.reference import REFERENCE

    ops = fbjax.supported_ops()
    assert "gpu" not in ops and "convolution_2d" in ops["gpu_cl"] and gpu_cl.OP_SET == "gpu_cl"
    assert "gpu" not in REFERENCE.ops() and set(REFERENCE.ops()["gpu_cl"]) == set(ops["gpu_cl"])
    assert {n.op_set for n in read_model(fbjax.data.SINE_GPU_CL).iter_nodes()} == {"gpu_cl"}
    with pytest.warns(DeprecationWarning, match="gpu_cl"):
        assert fbjax.supported_ops("gpu") == {"gpu_cl": ops["gpu_cl"]}
