"""What a new user meets on the command line (a fresh-eyes pass over the
README): names that ``fbjax inspect`` prints are accepted back, refusals say
what to do next, and options a message names exist where it is read.

Each test builds its own tiny model (``fbjax.formats.tflite_builder``) or uses a committed
fixture; none needs the shared models.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fbjax
import fbjax.data
from fbjax.cli import main
from fbjax.formats.tflite_builder import single_op_model
from helpers import TOL, relu_model as _relu_model, rel_err as _rel_err, where_model as _where_model
from conftest import require  # noqa: E402

LLAMA = Path(__file__).parent / "data" / "llm" / "llama_f32.tflite"


def _reshape_model(tmp_path) -> Path:
    """RESHAPE(input0 [2, 3] float32, input1 [2] int32) -> [3, 2]: the target
    shape is a graph input, so it must be bound at load."""
    path = tmp_path / "reshape.tflite"
    path.write_bytes(single_op_model("RESHAPE", [(2, 3), (2,)], input_dtypes=[np.float32, np.int32],
                                     output_shapes=[(3, 2)]))
    return path


def test_inspect_code_takes_a_fused_node_name_as_inspect_lists_it(capsys):
    """The bundled sine .bin's first node is FULLY_CONNECTED fused with RELU;
    ``inspect`` lists it as 'fully_connected 0 -> relu 1', and ``--code``
    given that name prints the same OpenCL source as ``--code 0``."""
    sine = str(fbjax.data.SINE_GPU_CL)
    assert main(["inspect", sine]) == 0
    listed = re.search(r"^\s+\[0\] (.+?)  in ", capsys.readouterr().out, re.M).group(1)
    assert " -> " in listed  # a fused node: the case that was refused
    assert main(["inspect", sine, "--code", "0"]) == 0
    by_position = capsys.readouterr().out
    assert main(["inspect", sine, "--code", listed]) == 0
    by_name = capsys.readouterr().out
    assert "__kernel" in by_position and by_name == by_position
    assert main(["inspect", sine, "--code", "fully_connected 99"]) == 2  # still refused: no such node
    assert "no node 'fully_connected 99'" in capsys.readouterr().err


def test_inspect_takes_the_constant_input_its_refusal_asks_for(tmp_path, capsys):
    """A RESHAPE whose shape is a graph input: ``inspect`` says to bind it
    (and no longer suggests registering a custom op: RESHAPE lowers);
    ``inspect --constant-input`` then judges the model runnable, marks the
    bound input, shows the output shape the bound value gives, and names the
    run command with the same binding, which runs."""
    path = _reshape_model(tmp_path)
    np.save(tmp_path / "shape.npy", np.array([3, 2], np.int32))
    assert main(["inspect", str(path)]) == 1
    out = capsys.readouterr().out
    assert "fbjax cannot run this model" in out and "--constant-input input1=FILE.npy" in out
    assert "register_custom_op" not in out
    binding = f"input1={tmp_path / 'shape.npy'}"
    assert main(["inspect", str(path), "--constant-input", binding]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\s+input1: int32\[2\]\s+\(bound at load", out, re.M), out
    assert re.search(r"^\s+\S+: float32\[3x2\]$", out, re.M), out  # the output, at the bound shape
    assert f"--constant-input {binding}`" in out
    assert main(["run", str(path), "--constant-input", binding, "--repeat", "0"]) == 0
    assert re.search(r"^output \S+: float32\[3x2\]", capsys.readouterr().out, re.M)


def test_inspect_static_bounds_lists_the_count_outputs(tmp_path, capsys):
    """GREATER then WHERE on a model input: refused as loaded; with
    ``--static-bounds`` inspect lists the padded output (bound: the 12
    elements of the [3, 4] condition, 2 coordinates each) and its count."""
    path = tmp_path / "where.tflite"
    path.write_bytes(_where_model())
    assert main(["inspect", str(path)]) == 1
    assert "static_bounds=True" in capsys.readouterr().out
    assert main(["inspect", str(path), "--static-bounds"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\s+coords: int64\[12x2\]$", out, re.M), out
    assert re.search(r"^\s+coords:valid_count: int32\[\]$", out, re.M), out
    assert "--static-bounds`" in out


@pytest.mark.parametrize("suffix,advice", [(".onnx", "fbjax convert MODEL.onnx MODEL.rten"),
                                           (".h5", "TFLiteConverter"), (".dat", None)])
def test_a_file_of_another_format_is_refused_with_how_to_convert_it(tmp_path, suffix, advice):
    """An ONNX protobuf (its first bytes: field 1, ir_version) is no
    flatbuffer fbjax reads: the refusal says how to convert it; a file
    without a known extension gets no advice."""
    path = tmp_path / f"model{suffix}"
    path.write_bytes(b"\x08\x07\x12\x07pytorch" + bytes(64))
    with pytest.raises(fbjax.ModelFormatError, match="not a model file fbjax recognises") as e:
        fbjax.load(path)
    if advice:
        assert advice in str(e.value)
    else:
        assert str(e.value).endswith("supported formats: gpu_cl, rten, stablehlo, tflite, and the bundles "
                                     ".litertlm, MediaPipe LLM .task and MediaPipe Tasks vision .task")


def test_an_empty_file_is_called_empty(tmp_path):
    (tmp_path / "m.tflite").write_bytes(b"")
    with pytest.raises(fbjax.ModelFormatError, match=r"the file is empty \(0 bytes\)"):
        fbjax.load(tmp_path / "m.tflite")


def test_cli_warnings_are_one_line_naming_the_command(tmp_path):
    """uint8 data for a float input warns (README: "with a warning the first
    time"); the CLI prints it as ``fbjax run: warning: ...``, without Python's
    file:line prefix and source line. (A subprocess: pytest records warnings
    instead of printing them.)"""
    path = _relu_model(tmp_path)
    np.save(tmp_path / "x.npy", np.full((1, 4), 200, np.uint8))
    proc = subprocess.run([sys.executable, "-m", "fbjax.cli", "run", str(path), "-i", str(tmp_path / "x.npy"),
                           "--repeat", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "fbjax run: warning: input 0 ('x') is float32 but got uint8 data" in proc.stderr, proc.stderr
    assert "UserWarning" not in proc.stderr and "cli.py" not in proc.stderr, proc.stderr
    assert "output out: float32[1x4]  min 200  max 200" in proc.stdout  # cast as is, then RELU


def test_signature_on_a_file_without_signatures_says_to_leave_it_out(tmp_path, capsys):
    path = _relu_model(tmp_path)
    with pytest.raises(fbjax.InputError, match="its file defines no signatures"):
        fbjax.load(path).signature("decode")
    with pytest.raises(SystemExit) as e:
        main(["run", str(path), "--signature", "decode"])
    assert "the file defines no signatures; leave out --signature" in str(e.value)
    assert "signatures are none" not in str(e.value)


def test_run_on_a_file_with_several_signatures_says_which_one_runs(capsys):
    """The llama fixture has the signatures prefill_16 (graph 0) and decode
    (tests/data/llm/generate.py); a plain ``fbjax run`` runs graph 0 and says
    so, naming --signature for the other."""
    assert main(["run", str(LLAMA), "--repeat", "0"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "2 signatures: prefill_16, decode" in first and "signature prefill_16's" in first
    assert "--signature KEY" in first


def test_infer_header_shows_an_example_without_its_batch_dimension(tmp_path, capsys):
    """``fbjax infer`` prints what one example file must hold: the input's
    shape without the batch dimension, [4] for a [1, 4] input."""
    path = _relu_model(tmp_path)
    (tmp_path / "d").mkdir()
    for i in range(3):
        np.save(tmp_path / "d" / f"{i}.npy", np.full((4,), i - 1, np.float32))
    assert main(["infer", str(path), "--input-dir", str(tmp_path / "d"), "--out", str(tmp_path / "o.npy"),
                 "--no-progress"]) == 0
    assert "per example x: float32[4] (the model's inputs without the batch dimension)" in capsys.readouterr().out
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), [[0] * 4, [0] * 4, [1] * 4])


def test_export_of_a_file_with_several_signatures_says_which_one_and_signature_exports_another(tmp_path, capsys):
    """``fbjax export`` writes the first subgraph and says so, pointing to
    --signature; ``--signature decode`` writes an artifact whose call takes
    the decode signature's inputs and returns its outputs by name, within
    test_llm's float32 bound (TOL: sums over the fixture's width-128 blocks,
    compiled and so ordered independently) of the signature runner's, with
    the weights file next to it."""
    import jax

    assert main(["export", str(LLAMA), "--to", "mlir", str(tmp_path / "m.mlir")]) == 0
    out = capsys.readouterr().out
    assert "2 signatures: prefill_16, decode; this exports its first subgraph: --signature KEY" in out
    assert main(["export", str(LLAMA), "--signature", "decode", "--to", "stablehlo", str(tmp_path / "d.jax")]) == 0
    out = capsys.readouterr().out
    model = fbjax.load(LLAMA)
    sig = model.signature("decode")
    assert f"call(params, {', '.join(s.name for s in sig.inputs)})" in out
    exported = jax.export.deserialize(bytearray((tmp_path / "d.jax").read_bytes()))
    params = dict(np.load(tmp_path / "d.params.npz"))
    rng = np.random.default_rng(0)
    ins = [np.asarray(rng.integers(0, 4, s.shape) if np.dtype(s.dtype).kind in "iu"
                      else rng.standard_normal(s.shape), s.dtype) for s in sig.inputs]
    got = exported.call(params, *ins)
    want = sig(*ins)
    assert list(got) == [s.name for s in sig.outputs]
    for k, w in want.items():  # the same function compiled twice (artifact and runner): float32 rounding apart
        if np.asarray(w).dtype.kind == "f":
            assert _rel_err(got[k], w) <= TOL, k
        else:
            np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(w), err_msg=k)
    with pytest.raises(SystemExit, match="no signature 'nope'"):
        main(["export", str(LLAMA), "--signature", "nope", "--to", "mlir", str(tmp_path / "n.mlir")])


def test_infer_on_a_model_it_cannot_batch_says_what_it_needs(tmp_path, capsys):
    """A [2, 3] input has no leading 1, so ``fbjax infer`` (which batches the
    examples itself) cannot use it: the refusal says so and points to
    ``fbjax run``; the LLM fixture's refusal points to --signature."""
    path = tmp_path / "add.tflite"
    path.write_bytes(single_op_model("ADD", [(2, 3), (2, 3)]))
    (tmp_path / "d").mkdir()
    np.savez(tmp_path / "d" / "0.npz", input0=np.ones(3, np.float32), input1=np.ones(3, np.float32))
    with pytest.raises(SystemExit) as e:
        main(["infer", str(path), "--input-dir", str(tmp_path / "d"), "--out", str(tmp_path / "o.npz")])
    msg = str(e.value)
    assert "it batches the examples itself" in msg and "leading batch dimension of 1" in msg
    assert "fbjax run MODEL --input" in msg
    with pytest.raises(SystemExit) as e:
        main(["infer", str(LLAMA), "--input-dir", str(tmp_path / "d"), "--out", str(tmp_path / "o.npz")])
    assert "The file has signatures (prefill_16, decode): --signature KEY" in str(e.value)


def test_bench_refuses_unknown_models_before_running_anything(tmp_path):
    """``fbjax bench light:NAME`` with a name the onnx wheel lacks listed a
    truncated FileNotFoundError in the results table; now it is refused up
    front with the names there are (squeezenet: the one benchmarks/ uses)."""
    require("onnx", reason="light:NAME models come with the onnx wheel (a test extra)")
    with pytest.raises(SystemExit) as e:
        main(["bench", "light:nosuch", "--runs", "1"])
    assert "no light model 'nosuch'" in str(e.value) and "squeezenet" in str(e.value)
    with pytest.raises(SystemExit, match="no such file"):
        main(["bench", str(tmp_path / "missing.tflite"), "--runs", "1"])


def test_top_level_help_shows_an_example_of_each_main_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    examples = capsys.readouterr().out.split("Examples:")[1]
    for command in ("inspect", "run", "infer", "generate", "export", "convert"):
        assert re.search(rf"^  fbjax {command}\b", examples, re.M), command


def test_generate_top_k_without_temperature_names_the_cli_options(tmp_path):
    """--top-k without --temperature: refused in the CLI's own terms (it
    said "top_k needs temperature > 0", fbjax.generate's parameter names),
    before the model is read (the path here does not exist)."""
    with pytest.raises(SystemExit) as e:
        main(["generate", str(tmp_path / "missing.tflite"), "-p", "1,2", "--top-k", "5"])
    assert "--top-k K samples" in str(e.value) and "needs --temperature > 0" in str(e.value)


# --- issue 28's papercuts ------------------------------------------------------------


def test_a_damaged_gpu_delegate_file_says_why_its_reader_refuses_it(tmp_path, capsys):
    """A truncated GPU delegate .bin probes as no format: the refusal gives
    each schema generation's reason (was only "not a model file"), and
    ``--format`` reads a file as a named format."""
    data = Path(fbjax.data.SINE_GPU_CL).read_bytes()
    bad = tmp_path / "damaged.bin"
    bad.write_bytes(data[:len(data) // 2])
    assert main(["inspect", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "named like a gpu_cl file (extension .bin) but damaged or not one" in out, out
    assert all(f"{gen}: " in out for gen in ("seed", "tf2.5", "tf2.7", "litert")), out
    assert main(["inspect", str(bad), "--format", "tflite"]) == 1
    assert "not a TFLite file" in capsys.readouterr().out
    good = tmp_path / "sine.weights"  # no telling extension: --format gpu_cl reads it
    good.write_bytes(data)
    assert main(["inspect", str(good), "--format", "gpu_cl"]) == 0
    assert "fbjax can run this model" in capsys.readouterr().out


def test_inspect_recognises_a_jax_export_artifact(tmp_path, capsys):
    """``fbjax export --to stablehlo`` output handed back to ``inspect``: it
    says what the file is and how to run it (was "not a model file")."""
    model = tmp_path / "relu.tflite"
    model.write_bytes(single_op_model("RELU", [(1, 4)]))
    art = tmp_path / "relu.jax"
    assert main(["export", str(model), "--to", "stablehlo", str(art)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(art)]) == 1
    out = capsys.readouterr().out
    assert "a serialized jax.export program" in out and "jax.export.deserialize" in out, out


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_an_image_in_the_other_layout_is_named(layout):
    """An NCHW array for an NHWC model (and the reverse): the InputError
    names the layouts and the transpose that fixes it, and that transpose
    is accepted."""
    shape = (1, 8, 6, 3) if layout == "NHWC" else (1, 3, 8, 6)
    m = fbjax.load(single_op_model("RELU", [shape]))
    other = (0, 3, 1, 2) if layout == "NHWC" else (0, 2, 3, 1)  # the array in the other layout
    fix = (0, 2, 3, 1) if layout == "NHWC" else (0, 3, 1, 2)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    wrong = np.transpose(x, other)
    with pytest.raises(fbjax.InputError, match=re.escape(f"this model takes {layout}")) as e:
        m(wrong)
    assert f"np.transpose(x, {fix})" in str(e.value)
    np.testing.assert_array_equal(np.asarray(m(np.transpose(wrong, fix))), np.maximum(x, 0))
