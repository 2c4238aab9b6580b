"""Batch-polymorphic loading (fbjax.passes.shapes) and fbjax.infer.

Oracle: the same model loaded with the file's batch-1 shapes, run one sample
at a time. A batched run must give the same numbers up to float32
summation order: each program within ``gamma_n`` times the model run on
``|x|`` and ``|weights|`` of the exact result (:func:`per_sample_bound`,
``conftest.gamma``), while a sample mixed into another or a misplaced
padding row is off by O(1). Copies and single IEEE operations are exact. The 8-device and two-process runs are
subprocesses, so the XLA flags and jax.distributed state never leak into this
process.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import fbjax
from fbjax.batch_inference import stepping
from fbjax.errors import InputError
from fbjax.formats.tflite_builder import TFLiteBuilder

from conftest import TFLITE_MODELS, abs_magnitude, assert_close, assert_within, gamma
from helpers import K_VIT

ROOT = Path(__file__).resolve().parents[1]
F32 = np.float32
#: float32 terms summed along conv_reshape_fc's chain: CONV_2D's 3*3*3 products and bias, then
#: (RELU and RESHAPE add no rounding) FULLY_CONNECTED's 36 products
CONV_FC_TERMS = 28 + 36
#: the shared-model bound (tests/test_tflite_models.py): a real model's outputs are within
#: 1e-4 * max(1, max|y|) of the exact result in any float32 summation order
MODEL_RTOL = 1e-4


def conv_reshape_fc(reshape_to=(1, 36), transpose=None, mean_axes=None) -> bytes:
    """x[1,6,6,3] -> CONV_2D -> [1,3,3,4] -> RESHAPE(reshape_to) -> FULLY_CONNECTED -> [1,5];
    optionally a TRANSPOSE or MEAN in between to test refusals."""
    rng = np.random.default_rng(0)
    b = TFLiteBuilder()
    x = b.add_input((1, 6, 6, 3), name="x")
    w = b.add_tensor(data=rng.standard_normal((4, 3, 3, 3)).astype(F32), name="conv/w")
    cb = b.add_tensor(data=rng.standard_normal(4).astype(F32), name="conv/b")
    y = b.add_tensor((1, 3, 3, 4), name="conv")
    b.add_op("CONV_2D", [x, w, cb], [y], options=dict(padding="SAME", stride_h=2, stride_w=2,
                                                     fused_activation_function="RELU"))
    if transpose is not None:
        perm = b.add_tensor(data=np.asarray(transpose, np.int32), name="perm")
        t = b.add_tensor(tuple(np.asarray((1, 3, 3, 4))[list(transpose)]), name="transposed")
        b.add_op("TRANSPOSE", [y, perm], [t])
        y = t
    if mean_axes is not None:
        axes = b.add_tensor(data=np.asarray(mean_axes, np.int32), name="axes")
        m = b.add_tensor((1, 3, 3, 4), name="mean")
        b.add_op("MEAN", [y, axes], [m], options=dict(keep_dims=True))
        y = m
    shape = b.add_tensor(data=np.asarray(reshape_to, np.int32), name="shape")
    r = b.add_tensor(tuple(d if d != -1 else 36 for d in reshape_to), name="flat")
    b.add_op("RESHAPE", [y, shape], [r])
    fw = b.add_tensor(data=rng.standard_normal((5, 36)).astype(F32), name="fc/w")
    out = b.add_tensor((1, 5), name="out")
    b.add_op("FULLY_CONNECTED", [r, fw, -1], [out], options=dict(keep_num_dims=True))
    b.add_output(out)
    return b.build()


def two_input_model() -> bytes:
    b = TFLiteBuilder()
    x = b.add_input((1, 3), name="a")
    y = b.add_input((1, 3), name="b")
    s = b.add_tensor((1, 3), name="sum")
    p = b.add_tensor((1, 3), name="prod")
    b.add_op("ADD", [x, y], [s], options=dict(fused_activation_function="NONE"))
    b.add_op("MUL", [x, y], [p], options=dict(fused_activation_function="NONE"))
    b.add_output(s)
    b.add_output(p)
    return b.build()


def per_sample_bound(src, xs, n: int = CONV_FC_TERMS) -> np.ndarray:
    """Bound on a batched program vs per-sample runs of ``src``
    (conv_reshape_fc) at ``xs`` (no batch axis): two summation orders,
    each within ``gamma_n`` of the batch-1 model on ``|x|`` and ``|weights|``."""
    m = fbjax.load(src)
    return 2 * gamma(n) * np.concatenate([abs_magnitude(m, np.asarray(x)[None]) for x in xs])


def assert_per_sample(got, src, xs, what: str) -> None:
    """``got`` equals per-sample runs of ``src`` within :func:`per_sample_bound`."""
    assert_within(got, one_by_one(src, list(xs))[0], per_sample_bound(src, xs), what)


def one_by_one(model_bytes, xs) -> list:
    m = fbjax.load(model_bytes)
    outs = [m(*(x[None] for x in (xi if isinstance(xi, tuple) else (xi,)))) for xi in xs]
    outs = [o if isinstance(o, tuple) else (o,) for o in outs]
    return [np.concatenate([np.asarray(o[k]) for o in outs]) for k in range(len(outs[0]))]


# --- batch-polymorphic load -----------------------------------------------------

def test_batch_polymorphic_load_matches_per_sample_runs():
    src = conv_reshape_fc()
    model = fbjax.load(src, batch_size=None)
    assert model.inputs[0].shape == (None, 6, 6, 3) and model.outputs[0].shape == (None, 5)
    xs = np.random.default_rng(1).standard_normal((5, 6, 6, 3)).astype(F32)
    want, bound = one_by_one(src, list(xs))[0], per_sample_bound(src, xs)
    for n in (1, 3, 5):
        assert_within(model(xs[:n]), want[:n], bound[:n], f"batch {n}")
    # RESHAPE target rewritten to [-1, 36]; the file itself is untouched
    node = next(n for n in model.ir.main_graph.nodes if n.op_name == "RESHAPE")
    assert node.inputs[1].data.tolist() == [-1, 36]
    assert fbjax.load(model.save(None)).inputs[0].shape == (1, 6, 6, 3)


def test_batch_size_int_fixes_the_batch():
    model = fbjax.load(conv_reshape_fc(), batch_size=4)
    assert model.inputs[0].shape == (4, 6, 6, 3)
    with pytest.raises(InputError):
        model(np.zeros((3, 6, 6, 3), F32))
    with pytest.raises(InputError):
        fbjax.load(conv_reshape_fc(), batch_size=0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(reshape_to=(3, 12)), "leading dimension"),           # merges/moves the batch
    (dict(transpose=(3, 1, 2, 0), reshape_to=(4, 9)), "moves the batch"),
    (dict(mean_axes=(0, 1)), "reduces over the batch"),
], ids=["reshape-not-batch", "transpose-batch", "mean-over-batch"])
def test_batch_rewrite_refuses_what_it_cannot_prove(kwargs, match):
    with pytest.raises(InputError, match=match) as e:
        fbjax.load(conv_reshape_fc(**kwargs), batch_size=None)
    assert "operator" in str(e.value)  # names the node


@pytest.mark.parametrize("op, consts, options, out_shape", [
    ("STRIDED_SLICE", [[0, 1], [1, 5], [1, 2]], {}, (1, 2)),
    ("STRIDED_SLICE", [[0, 1], [0, 5], [1, 1]], dict(begin_mask=1, end_mask=1), (1, 4)),
    ("SLICE", [[0, 2], [1, 3]], None, (1, 3)),
], ids=["strided-slice-0-to-1", "strided-slice-masked", "slice-size-1"])
def test_batch_rewrite_takes_whole_batch_in_slices(op, consts, options, out_shape):
    """A slice taking [0, 1) of the batch-1 dimension takes the whole batch."""
    from fbjax.lower import LOWERINGS
    from fbjax.formats.tflite_builder import single_op_model

    if LOWERINGS.get("tflite", op) is None:
        pytest.skip(f"{op} has no TFLite lowering yet")
    src = single_op_model(op, [(1, 6), *[np.asarray(c, np.int32) for c in consts]], options=options,
                          output_shapes=[out_shape])
    model = fbjax.load(src, batch_size=None)
    xs = np.random.default_rng(10).standard_normal((4, 6)).astype(F32)
    np.testing.assert_array_equal(np.asarray(model(xs)), one_by_one(src, list(xs))[0])  # a slice: copies only


def test_batch_rewrite_refuses_a_slice_of_the_batch():
    from fbjax.formats.tflite_builder import single_op_model

    src = single_op_model("STRIDED_SLICE", [(1, 6), *[np.asarray(c, np.int32) for c in ([0, 0], [1, 6], [1, 1])]],
                          options=dict(shrink_axis_mask=1), output_shapes=[(6,)])
    with pytest.raises(InputError, match="batch"):
        fbjax.load(src, batch_size=None)


@pytest.mark.skipif(not TFLITE_MODELS.is_dir(), reason="needs ../shared/models/tflite")
def test_batch_polymorphic_real_model():
    path = TFLITE_MODELS / "mediapipe_iris_landmark.tflite"
    model = fbjax.load(path, batch_size=None)
    xs = np.random.default_rng(2).random((3, 64, 64, 3), dtype=F32)
    got = model(xs)
    single = fbjax.load(path)
    for i in range(3):
        for k, (g, w) in enumerate(zip(got, single(xs[i:i + 1]))):
            # both runs within the shared-model bound of the exact result: at most twice it apart
            assert_close(np.asarray(g)[i:i + 1], np.asarray(w), 2 * MODEL_RTOL, f"sample {i} output {k}")


# --- infer, one process ----------------------------------------------------------

def test_infer_array_and_padding():
    src = conv_reshape_fc()
    xs = np.random.default_rng(3).standard_normal((11, 6, 6, 3)).astype(F32)  # 11 = 2 full batches of 4 + 3
    got = fbjax.infer(fbjax.load(src, batch_size=None), xs, step_size=4, progress=False)
    assert got.shape == (11, 5)
    assert_per_sample(got, src, xs, "infer vs per-sample")


def test_infer_multi_input_tuples_and_npz_dir(tmp_path):
    src = two_input_model()
    rng = np.random.default_rng(4)
    exs = [(rng.standard_normal(3).astype(F32), rng.standard_normal(3).astype(F32)) for _ in range(7)]
    s, p = fbjax.infer(fbjax.load(src, batch_size=None), exs, step_size=3, progress=False)
    # one correctly rounded ADD / MUL per element: exact in any program
    np.testing.assert_array_equal(s, np.stack([a + b for a, b in exs]))
    np.testing.assert_array_equal(p, np.stack([a * b for a, b in exs]))
    d = tmp_path / "samples"
    d.mkdir()
    for i, (a, b) in enumerate(exs):
        np.savez(d / f"{i:03d}.npz", a=a, b=b)
    out = fbjax.infer(fbjax.load(src, batch_size=None), d, step_size=3, out=tmp_path / "r.npz", progress=False)
    with np.load(out) as z:
        assert sorted(z.files) == ["__files__", "prod", "sum"]  # outputs + the example file names
        assert z["__files__"].tolist() == [f"{i:03d}.npz" for i in range(7)]
        np.testing.assert_array_equal(z["sum"], s)
        np.testing.assert_array_equal(z["prod"], p)
    with pytest.raises(InputError, match="2 input"):
        fbjax.infer(fbjax.load(src, batch_size=None), [exs[0][0]], progress=False)


def test_infer_streams_npy_from_npy_dir(tmp_path):
    src = conv_reshape_fc()
    xs = np.random.default_rng(5).standard_normal((9, 6, 6, 3)).astype(F32)
    d = tmp_path / "in"
    d.mkdir()
    for i, x in enumerate(xs):
        np.save(d / f"{i:02d}.npy", x)
    model_path = tmp_path / "m.tflite"
    model_path.write_bytes(src)
    out = fbjax.infer(fbjax.load(model_path), d, step_size=4, out=tmp_path / "y.npy", progress=False)
    assert_per_sample(np.load(out), src, xs, "streamed .npy")
    with pytest.raises(InputError, match="shape"):
        fbjax.infer(model_path, [np.zeros((6, 6, 4), F32)], progress=False)


def test_cli_infer(tmp_path, capsys):
    from fbjax.cli import main

    src = conv_reshape_fc()
    (tmp_path / "m.tflite").write_bytes(src)
    xs = np.random.default_rng(6).standard_normal((5, 6, 6, 3)).astype(F32)
    (tmp_path / "in").mkdir()
    for i, x in enumerate(xs):
        np.save(tmp_path / "in" / f"{i}.npy", x)
    rc = main(["infer", str(tmp_path / "m.tflite"), "--inputs", str(tmp_path / "in"), "--batch-size", "2",
               "--out", str(tmp_path / "o.npz"), "--no-progress"])
    assert rc == 0
    assert "examples/s" in capsys.readouterr().out
    with np.load(tmp_path / "o.npz") as z:
        assert_per_sample(z["out"], src, xs, "fbjax infer CLI")


def test_cli_export_stablehlo_stays_differentiable(tmp_path):
    import jax

    from fbjax.cli import main

    (tmp_path / "m.tflite").write_bytes(conv_reshape_fc())
    assert main(["export", str(tmp_path / "m.tflite"), "--to", "stablehlo", str(tmp_path / "m.jax"),
                 "--batch-size", "dynamic"]) == 0
    assert main(["export", str(tmp_path / "m.tflite"), "--to", "mlir", str(tmp_path / "m.mlir")]) == 0
    text = (tmp_path / "m.mlir").read_text()
    # the 3x3, 3-channel convolution: stablehlo.convolution, or on CPU the sum
    # over its 9 kernel taps of strided slices (KernelOptions.small_conv_taps)
    assert "stablehlo.convolution" in text or (jax.default_backend() == "cpu"
                                               and text.count("stablehlo.slice") >= 9)
    assert "stablehlo.dot_general" in text  # the FULLY_CONNECTED
    exp = jax.export.deserialize(bytearray((tmp_path / "m.jax").read_bytes()))
    params = dict(np.load(tmp_path / "m.params.npz"))
    model = fbjax.load(conv_reshape_fc(), batch_size=None)
    x = np.random.default_rng(7).standard_normal((3, 6, 6, 3)).astype(F32)
    assert_within(exp.call(params, x), model(x), per_sample_bound(conv_reshape_fc(), x), "exported vs fbjax")
    g1 = jax.grad(lambda p: exp.call(p, x).sum())(params)
    g2 = jax.grad(lambda p: model.apply(p, x).sum())(model.params)
    # the gradients sum the forward chain's terms again over 3 samples x 9 positions (and 5 outputs): each
    # within gamma_(64 + 27 + 5) of the gradient of the model on |x| and |params| (every ReLU open)
    abs_p = {k: np.abs(np.asarray(v)) for k, v in model.params.items()}
    g_mag = jax.grad(lambda p: model.apply(p, np.abs(x)).sum())(abs_p)
    for k in params:
        assert_within(g1[k], g2[k], 2 * gamma(CONV_FC_TERMS + 27 + 5) * np.asarray(g_mag[k], np.float64), f"grad {k}")


# --- 8 host devices and two processes (subprocesses) --------------------------------------

_EIGHT = textwrap.dedent("""
    import sys, numpy as np, jax, fbjax
    assert len(jax.devices()) == 8, jax.devices()
    model = fbjax.load(sys.argv[1], batch_size=None)
    xs = np.load(sys.argv[2])
    y8 = fbjax.infer(model, xs, step_size=16, progress=False)
    y1 = fbjax.infer(model, xs, step_size=16, devices=jax.devices()[:1], progress=False)
    np.save(sys.argv[3], y8)
    print("max|8 devices - 1 device|", float(np.abs(y8 - y1).max()))
""")

_WORKER = textwrap.dedent("""
    import sys, numpy as np, jax
    pid, port = int(sys.argv[1]), sys.argv[2]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid,
                               initialization_timeout=60)
    import fbjax
    assert jax.process_count() == 2 and len(jax.devices()) == 4, (jax.process_count(), jax.devices())
    xs = np.load(sys.argv[4])
    share = xs[:13] if pid == 0 else xs[13:]          # unequal shares: 13 and 4 examples
    y = fbjax.infer(sys.argv[3], share, step_size=4, progress=False)
    np.save(sys.argv[5].format(pid), y)
    jax.distributed.shutdown()
""")


def _env(devices: int) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    return env


def test_infer_on_8_forced_host_devices(tmp_path):
    src = conv_reshape_fc()
    (tmp_path / "m.tflite").write_bytes(src)
    xs = np.random.default_rng(8).standard_normal((21, 6, 6, 3)).astype(F32)
    np.save(tmp_path / "x.npy", xs)
    script = tmp_path / "eight.py"
    script.write_text(_EIGHT)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "m.tflite"), str(tmp_path / "x.npy"),
                        str(tmp_path / "y.npy")], env=_env(8), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_per_sample(np.load(tmp_path / "y.npy"), src, xs, "8 devices vs per-sample")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_infer_two_processes_on_localhost(tmp_path):
    src = conv_reshape_fc()
    (tmp_path / "m.tflite").write_bytes(src)
    xs = np.random.default_rng(9).standard_normal((17, 6, 6, 3)).astype(F32)
    np.save(tmp_path / "x.npy", xs)
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    port = str(_free_port())
    out = str(tmp_path / "y{}.npy")
    procs = [subprocess.Popen([sys.executable, str(script), str(i), port, str(tmp_path / "m.tflite"),
                               str(tmp_path / "x.npy"), out], env=_env(2),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    logs = []
    try:
        for p in procs:
            _, err = p.communicate(timeout=240)
            logs.append(err)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, p in enumerate(procs):
        assert p.returncode == 0, f"process {i} failed:\n{logs[i][-3000:] if i < len(logs) else ''}"
    want = one_by_one(src, list(xs))[0]
    y0, y1 = np.load(out.format(0)), np.load(out.format(1))
    assert y0.shape == (13, 5) and y1.shape == (4, 5)
    assert_within(np.concatenate([y0, y1]), want, per_sample_bound(src, xs), "two processes vs per-sample")


# --- argument checks, messages, progress, file names (fbjax infer papercuts) ------------

def _sample_dir(d: Path, xs, bad: dict = ()) -> Path:
    """One .npy per sample (s000.npy, ...); ``bad`` maps an index to a replacement array."""
    d.mkdir()
    for i, x in enumerate(xs):
        np.save(d / f"s{i:03d}.npy", dict(bad).get(i, x))
    return d


def test_cli_infer_refuses_nonpositive_batch_size_before_any_work(tmp_path, capsys):
    from fbjax.cli import main

    for bad in ("0", "-3", "x"):
        with pytest.raises(SystemExit) as e:
            main(["infer", str(tmp_path / "unused.tflite"), "--inputs", str(tmp_path), "--batch-size", bad,
                  "--out", str(tmp_path / "o.npz")])
        assert e.value.code == 2
        captured = capsys.readouterr()
        assert captured.out == ""  # no header printed first
        assert f"--batch-size: expected a positive int, got '{bad}'" in captured.err
    # the Python API checks first too: the model path is never opened
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InputError, match="step_size must be"):
            fbjax.infer(tmp_path / "missing.tflite", np.zeros((2, 6, 6, 3), F32), step_size=bad, progress=False)


def test_cli_infer_header_prints_the_effective_batch_size_on_2_devices(tmp_path):
    """--batch-size 3 on 2 devices runs batches of 4: the header says so
    (subprocess: the forced device count must not leak into this process)."""
    src = conv_reshape_fc()
    (tmp_path / "m.tflite").write_bytes(src)
    xs = np.random.default_rng(11).standard_normal((5, 6, 6, 3)).astype(F32)
    _sample_dir(tmp_path / "in", xs)
    r = subprocess.run([sys.executable, "-m", "fbjax.cli", "infer", str(tmp_path / "m.tflite"), "--inputs",
                        str(tmp_path / "in"), "--batch-size", "3", "--out", str(tmp_path / "o.npy"), "--no-progress"],
                       env=_env(2), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 device(s)" in r.stdout
    assert "step size 4 examples (3 rounded up to a multiple of 2 devices; 2 per device)" in r.stdout, r.stdout
    assert_per_sample(np.load(tmp_path / "o.npy"), src, xs, "2 devices, batch 4")


def test_infer_effective_step_size():
    from fbjax.batch_inference import effective_batch_size, effective_step_size

    assert [effective_step_size(b, 2) for b in (None, 1, 2, 3, 4)] == [16, 2, 2, 4, 4]
    assert effective_step_size(5, 1) == 5 and effective_step_size(9, 8) == 16
    with pytest.warns(DeprecationWarning, match="effective_step_size"):  # the old name, deprecated
        assert effective_batch_size(3, 2) == 4


def test_infer_missing_out_folder_is_checked_before_loading(tmp_path, capsys):
    from fbjax.cli import main

    d = _sample_dir(tmp_path / "in", np.zeros((2, 6, 6, 3), F32))
    # the model file does not exist either: the out folder is reported first, so nothing was loaded
    rc = main(["infer", str(tmp_path / "missing.tflite"), "--inputs", str(d), "--out",
               str(tmp_path / "nodir" / "p.npz")])
    captured = capsys.readouterr()
    assert rc == 1 and captured.out == ""
    assert captured.err.strip() == (f"fbjax infer: InputError: out: the folder {tmp_path / 'nodir'} does not "
                                    "exist (create it first)")
    with pytest.raises(InputError, match="nodir does not exist"):
        fbjax.infer(tmp_path / "missing.tflite", d, out=tmp_path / "nodir" / "p.npz", progress=False)
    with pytest.raises(InputError, match=r"out must end in \.npy or \.npz"):
        fbjax.infer(tmp_path / "missing.tflite", d, out=tmp_path / "p.txt", progress=False)
    assert sorted(os.listdir(tmp_path)) == ["in"]  # no temporary file left behind


def test_infer_wrong_shape_in_a_directory_names_the_file(tmp_path, capsys):
    from fbjax.cli import main

    (tmp_path / "m.tflite").write_bytes(conv_reshape_fc())
    xs = np.zeros((4, 6, 6, 3), F32)
    d = _sample_dir(tmp_path / "bad", xs, bad={2: np.zeros((6, 6, 4), F32)})
    with pytest.raises(InputError) as e:
        fbjax.infer(tmp_path / "m.tflite", d, step_size=2, progress=False)
    assert str(e.value).startswith(f"{d / 's002.npy'} (example 2): input 0 ('x') has shape (6, 6, 4)"), str(e.value)
    assert main(["infer", str(tmp_path / "m.tflite"), "--inputs", str(d), "--out", str(tmp_path / "o.npz"),
                 "--no-progress"]) == 1
    assert "s002.npy" in capsys.readouterr().err
    # in-memory examples have no file: the index names them
    with pytest.raises(InputError, match=r"^example 1: input 0 \('x'\) has shape"):
        fbjax.infer(tmp_path / "m.tflite", [xs[0], xs[0][..., :2]], progress=False)


class _RecordingBar:
    """Stand-in for tqdm: records the total and the updates."""
    made: list = []

    def __init__(self, total=None, **kw):
        self.total, self.n = total, 0
        _RecordingBar.made.append(self)

    def update(self, n):
        self.n += n

    def close(self):
        pass


def test_infer_progress_bar_knows_the_total(tmp_path, monkeypatch):
    """A directory's total is its number of sample files (it used to be
    ``len(path)``, the number of characters of the path, which tqdm drops
    once exceeded: a bare count with no percentage or ETA)."""
    import tqdm.auto

    monkeypatch.setattr(tqdm.auto, "tqdm", _RecordingBar)
    _RecordingBar.made = []
    model = fbjax.load(conv_reshape_fc(), batch_size=None)
    xs = np.zeros((13, 6, 6, 3), F32)
    d = _sample_dir(tmp_path / "a_long_directory_name", xs)
    fbjax.infer(model, d, step_size=4)
    fbjax.infer(model, str(d), step_size=4)
    fbjax.infer(model, xs, step_size=4)
    fbjax.infer(model, iter(list(xs)), step_size=4)  # a generator: length unknown
    assert [(b.total, b.n) for b in _RecordingBar.made] == [(13, 13), (13, 13), (13, 13), (None, 13)]


def test_infer_npz_holds_the_example_file_names_in_result_order(tmp_path):
    from fbjax.cli import build_parser
    from fbjax.batch_inference.sinks import FILE_NAMES_KEY, output_keys

    src = conv_reshape_fc()
    rng = np.random.default_rng(12)
    xs = rng.standard_normal((6, 6, 6, 3)).astype(F32)
    d = tmp_path / "in"
    d.mkdir()
    names = ["b.npy", "a.npy", "c10.npy", "c9.npy", "z.npy", "0.npy"]  # written out of order
    for n, x in zip(names, xs):
        np.save(d / n, x)
    out = fbjax.infer(fbjax.load(src, batch_size=None), d, step_size=4, out=tmp_path / "o.npz", progress=False)
    want = dict(zip(names, one_by_one(src, list(xs))[0]))
    bound = dict(zip(names, per_sample_bound(src, xs)))
    with np.load(out) as z:
        files = z[FILE_NAMES_KEY].tolist()
        assert files == sorted(names)
        for i, n in enumerate(files):
            assert_within(z["out"][i], want[n], bound[n], n)
    # an output literally named "__files__" is stored as output_<k>, never under the file-names key
    assert output_keys(["__files__", "y"]) == ["output_0", "y"]
    # --help documents the order and the key
    sub = build_parser().subcommand_parsers["infer"]
    text = " ".join(sub.format_help().split())
    assert "sorted file-name order" in text and "'__files__'" in text


def test_infer_empty_examples_match_the_nonempty_return_type():
    model = fbjax.load(conv_reshape_fc(), batch_size=None)
    got = fbjax.infer(model, [], progress=False)
    full = fbjax.infer(model, np.zeros((2, 6, 6, 3), F32), progress=False)
    assert isinstance(got, np.ndarray) and isinstance(full, np.ndarray)
    assert got.shape == (0, 5) == (0, *full.shape[1:]) and got.dtype == full.dtype
    two = fbjax.load(two_input_model(), batch_size=None)
    got2 = fbjax.infer(two, [], progress=False)
    assert isinstance(got2, list) and [(g.shape, g.dtype) for g in got2] == [((0, 3), F32)] * 2


@pytest.mark.skipif(not TFLITE_MODELS.is_dir(), reason="needs ../shared/models/tflite")
def test_infer_runs_cache_sized_chunks_of_the_prepared_program_on_cpu():
    """Issue 15 item 4: on one CPU device infer runs the prepared program of
    model(x) on chunks whose activations fit KernelOptions.chunk_bytes (one
    example for palm detection, 3.5 MB per example), padding the last batch:
    results within the shared-model bound of per-example calls."""
    from fbjax.batch_inference.stepping import chunk, plan

    path = TFLITE_MODELS / "mediapipe_face_detection_short_range.tflite"
    model = fbjax.load(path, batch_size=None)
    palm = fbjax.load(TFLITE_MODELS / "mediapipe_palm_detection_lite.tflite", batch_size=None)
    assert chunk(palm, 8) == 1 and chunk(palm, 64) == 1
    assert plan(palm, 8) == (1, 2)  # one example fills the cache: batch-1 steps, two streams timed
    k = chunk(model, 6)
    assert 1 <= k < 6 and 6 % k == 0  # 1.3 MB per example: more than one chunk per batch of 6
    assert plan(model, 6) == (k, 2)  # two examples fit: two streams of steps at once
    xs = np.random.default_rng(5).random((7, 128, 128, 3), dtype=F32)  # 6 + 1 padded
    got = fbjax.infer(model, xs, step_size=6, progress=False)
    single = fbjax.load(path)
    for i in range(7):
        for j, (g, w) in enumerate(zip(got, single(xs[i:i + 1]))):
            assert_close(np.asarray(g)[i:i + 1], np.asarray(w), 2 * MODEL_RTOL, f"example {i} output {j}")


def test_infer_reader_errors_reach_the_caller_and_the_reader_stops():
    import threading

    src = conv_reshape_fc()
    model = fbjax.load(src, batch_size=None)

    def examples():
        rng = np.random.default_rng(6)
        for i in range(9):
            if i == 5:
                raise ValueError("broken example source")
            yield rng.standard_normal((6, 6, 3)).astype(F32)

    with pytest.raises(ValueError, match="broken example source"):
        fbjax.infer(model, examples(), step_size=2, progress=False)
    assert not [t for t in threading.enumerate() if t.name == "fbjax-infer-reader"]


def test_infer_reads_npy_files_into_the_step_buffer_and_names_bad_files(tmp_path):
    """A directory of .npy files for a one-input model is read by header
    bytes + readinto (fbjax.batch_inference.sources.NpyFiles): one header parsed for many
    files, files in another layout (float64, Fortran order, format 2.0)
    read the general way, the same numbers as the same examples from an
    array (the same program on the same step buffers: identical results),
    and a file of another kind, shape or length rejected naming it."""
    from fbjax.batch_inference.sources import NpyFiles

    src = conv_reshape_fc()
    model = fbjax.load(src, batch_size=None)
    xs = np.random.default_rng(13).standard_normal((9, 6, 6, 3)).astype(F32)
    d = _sample_dir(tmp_path / "in", xs)
    np.save(d / "s003.npy", xs[3].astype(np.float64))  # float64: cast (same kind), as from an iterable
    np.save(d / "s004.npy", np.asfortranarray(xs[4]))  # Fortran order: the same values
    with open(d / "s005.npy", "wb") as f:  # header format 2.0 (4-byte header length)
        np.lib.format.write_array(f, xs[5], version=(2, 0))
    got = fbjax.infer(model, d, step_size=4, progress=False)
    np.testing.assert_array_equal(got, fbjax.infer(model, xs, step_size=4, progress=False))
    assert_per_sample(got, src, xs, "infer from a directory of .npy files")

    npy = NpyFiles((6, 6, 3), F32)
    dest = np.empty((6, 6, 3), F32)
    view = memoryview(dest.reshape(-1).view(np.uint8))
    for i in (0, 1, 2, 6):
        assert npy.read_into(str(d / f"s{i:03d}.npy"), view)
        np.testing.assert_array_equal(dest, xs[i])
    assert len(npy.headers) == 1  # parsed once, then compared as bytes
    assert npy.read_into(str(d / "s005.npy"), view) and len(npy.headers) == 2
    assert not npy.read_into(str(d / "s003.npy"), view)  # float64: left to the general path
    assert not npy.read_into(str(d / "s004.npy"), view)  # Fortran order: likewise

    bad = {"complex": (np.zeros((6, 6, 3), np.complex64), r"has dtype complex64, expected float32"),
           "shape": (np.zeros((6, 6, 2), F32), r"has shape \(6, 6, 2\), expected \(6, 6, 3\)")}
    for tag, (x, msg) in bad.items():
        b = _sample_dir(tmp_path / tag, xs, bad={6: x})
        with pytest.raises(InputError, match=rf"^{re.escape(str(b / 's006.npy'))} \(example 6\): input 0 \('x'\) {msg}"):
            fbjax.infer(model, b, step_size=4, progress=False)
    cut = _sample_dir(tmp_path / "cut", xs)
    raw = (cut / "s007.npy").read_bytes()
    (cut / "s007.npy").write_bytes(raw[:-10])  # the header promises 10 bytes more
    with pytest.raises(InputError, match=rf"^{re.escape(str(cut / 's007.npy'))}: holds .* truncated"):
        fbjax.infer(model, cut, step_size=4, progress=False)


def test_infer_int64_model_keeps_64_bits_in_the_worker_threads():
    """A model with int64 tensors runs under jax.enable_x64, a per-thread
    setting: steps run in worker threads (two streams on one CPU device)
    must set it there too, or int64 inputs above 2**31 lose their high bits.
    ADD of integers is exact: x + x == 2 * x."""
    from fbjax.batch_inference.stepping import plan

    b = TFLiteBuilder()
    x = b.add_input((1, 4), dtype=np.int64, name="x")
    y = b.add_tensor((1, 4), dtype=np.int64, name="y")
    b.add_op("ADD", [x, x], [y], options=dict(fused_activation_function="NONE"))
    b.add_output(y)
    model = fbjax.load(b.build(), batch_size=None)
    xs = (np.int64(2) ** 40 + np.arange(7 * 4, dtype=np.int64)).reshape(7, 4)
    assert plan(model, 2)[1] == 2  # a tiny model: two streams
    for _ in range(2):  # the first call runs its first step in this thread, the second all in workers
        got = fbjax.infer(model, xs, step_size=2, progress=False)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, 2 * xs)


def test_stream_chooser_keeps_the_faster_way_and_measures_again():
    """StreamChooser: probe one stream, then two, keep the faster (by the
    times given), then probe again; driven here by fake clock readings."""

    for t1, t2, keep in ((2.0, 1.0, 2), (1.0, 2.0, 1), (1.0, 0.95, 1)):  # two streams 5 % faster: not enough
        c = stepping.StreamChooser(2)
        clock, modes = 0.0, []
        per_step = {1: t1, 2: t2}
        for _ in range(2 * stepping.STREAM_PROBE_STEPS + stepping.STREAM_KEEP_STEPS + 1):
            if c.due():
                c.begin(clock)
            c.took()
            modes.append(c.mode)
            clock += per_step[c.mode]
        p = stepping.STREAM_PROBE_STEPS
        assert modes[:p] == [1] * p and modes[p:2 * p] == [2] * p
        assert modes[2 * p:-1] == [keep] * stepping.STREAM_KEEP_STEPS
        assert modes[-1] == 1  # measuring again


def test_stream_chooser_keeps_a_confirmed_choice_longer(monkeypatch):
    """Each probe round that confirms the way kept doubles how long it is
    kept (up to STREAM_KEEP_MAX_STEPS), so probing the slower way costs a
    shrinking share of the steps; a round with another winner starts again
    from STREAM_KEEP_STEPS. Driven by a fake clock."""
    keep = stepping.STREAM_KEEP_STEPS
    monkeypatch.setattr(stepping, "STREAM_KEEP_MAX_STEPS", 4 * keep)
    c = stepping.StreamChooser(2)
    clock, per_step = 0.0, {1: 1.0, 2: 2.0}  # one stream faster

    def next_keep():
        """Run steps until a kept phase starts; its (way, steps)."""
        nonlocal clock
        while True:
            kept = c.due() and (c.begin(clock) or c.left != stepping.STREAM_PROBE_STEPS)
            c.took()
            clock += per_step[c.mode]
            if kept:
                return c.phases[0]

    assert [next_keep() for _ in range(4)] == [(1, keep), (1, 2 * keep), (1, 4 * keep), (1, 4 * keep)]
    per_step = {1: 2.0, 2: 1.0}  # the load changed: two streams faster
    assert next_keep() == (2, keep)
    assert next_keep() == (2, 2 * keep)


def test_stream_chooser_runs_a_kept_way_across_calls_and_restarts_cut_probes():
    """Across infer calls (resume): a kept way counts its steps on, so the
    next probe comes after exactly STREAM_KEEP_STEPS kept steps however the
    calls cut them; a probe phase cut by a call's end starts again whole
    (its time would span the gap between the calls). Fake clock."""
    p, keep = stepping.STREAM_PROBE_STEPS, stepping.STREAM_KEEP_STEPS
    c = stepping.StreamChooser(2)
    clock, modes = 0.0, []

    def call(steps):
        nonlocal clock
        c.resume()
        for _ in range(steps):
            if c.due():
                c.begin(clock)
            c.took()
            modes.append(c.mode)
            clock += {1: 1.0, 2: 2.0}[c.mode]

    call(p - 1)  # the first probe cut short: not timed
    call(2 * p + 3)  # probed whole, both ways, then 3 steps kept
    assert modes[p - 1:] == [1] * p + [2] * p + [1] * 3
    for _ in range(3):
        call(keep // 4)
    call(keep - 3 - 3 * (keep // 4) + 1)  # the kept steps run out: the next step probes again
    assert modes[-(keep - 3 - 3 * (keep // 4) + 1):-1] == [1] * (keep - 3 - 3 * (keep // 4))
    assert c.phases == [(1, p), (2, p)] and c.left == p - 1


def test_stream_chooser_decides_on_calls_as_long_as_a_probe():
    """Calls of exactly STREAM_PROBE_STEPS steps (tflm_sine at step size 8 on
    64 examples): each probe ends with a call and is closed there
    (end_call), timed, so the chooser decides and keeps the faster way; it
    used to close them at the next call, untimed, and probe the slow way
    every other call (0.2x a loop). Fake clock."""
    p = stepping.STREAM_PROBE_STEPS
    c = stepping.StreamChooser(2)
    clock, modes = 0.0, []
    for _ in range(4 + stepping.STREAM_KEEP_STEPS // p):
        c.resume()
        clock += 100.0  # the gap between calls
        for _ in range(p):
            if c.due():
                c.begin(clock)
            c.took()
            modes.append(c.mode)
            clock += {1: 1.0, 2: 5.0}[c.mode]
        c.end_call(clock)
    assert modes[:2 * p] == [1] * p + [2] * p
    keep = stepping.STREAM_KEEP_STEPS
    assert modes[2 * p:2 * p + keep] == [1] * keep  # the faster kept
    assert modes[2 * p + keep:4 * p + keep] == [1] * p + [2] * p  # then probed again, both timed
    assert c.phases == [(1, 2 * keep)]  # and one stream kept twice as long


def test_infer_results_do_not_depend_on_the_streams_chosen(monkeypatch):
    """Whatever StreamChooser picks, each step is the same program on the
    same examples: identical results to one stream throughout (an identical
    program), within the per-sample bound of batch-1 calls."""

    made = []

    class Recording(stepping.StreamChooser):
        def __init__(self, streams):
            super().__init__(streams)
            made.append(self)

    monkeypatch.setattr(stepping, "StreamChooser", Recording)
    monkeypatch.setattr(stepping, "STREAM_PROBE_STEPS", 2)
    monkeypatch.setattr(stepping, "STREAM_KEEP_STEPS", 3)
    src = conv_reshape_fc()
    model = fbjax.load(src, batch_size=None)
    xs = np.random.default_rng(14).standard_normal((23, 6, 6, 3)).astype(F32)
    assert stepping.plan(model, 1) == (1, 2)
    got = fbjax.infer(model, xs, step_size=1, progress=False)
    assert {m for m, _ in made[-1].history} == {1, 2}  # both ways ran
    one = fbjax.load(src, batch_size=None, kernel_options=fbjax.KernelOptions(chunk_threads=1))  # one stream
    assert stepping.plan(one, 1) == (1, 1)
    np.testing.assert_array_equal(got, fbjax.infer(one, xs, step_size=1, progress=False))
    assert_per_sample(got, src, xs, "infer with streams chosen by timing")


def test_infer_calls_on_one_model_continue_the_stream_choice(monkeypatch):
    """A second infer call on the same model resumes its StreamChooser: a
    choice being kept goes on (no new probing at the call's start), and the
    results stay within the per-sample bound of batch-1 calls."""
    monkeypatch.setattr(stepping, "STREAM_PROBE_STEPS", 2)
    monkeypatch.setattr(stepping, "STREAM_KEEP_STEPS", 50)
    src = conv_reshape_fc()
    model = fbjax.load(src, batch_size=None)
    xs = np.random.default_rng(15).standard_normal((12, 6, 6, 3)).astype(F32)
    fbjax.infer(model, xs, step_size=1, progress=False)  # 1 compiling step, 2 + 2 probing, 7 kept
    ch = model.batch_cache.stream_choosers[2]
    best, left = ch.phases[0]
    assert [m for m, _ in ch.history] == [1, 2] and left == 50 and best in (1, 2)
    n = len(ch.history)
    got = fbjax.infer(model, xs, step_size=1, progress=False)
    assert model.batch_cache.stream_choosers[2] is ch
    assert {m for m, _ in ch.history[n:]} == {best}  # only the kept way ran: no probing
    assert_per_sample(got, src, xs, "infer resuming the stream choice")




class _Recorder:
    """What infer runs per step (``fbjax.batch_inference.stepping.own_call``), recording the
    input shapes of every call."""

    def __init__(self, call):
        self.call, self.shapes = call, []

    def __call__(self, params, *xs):
        self.shapes.append(tuple(np.shape(x) for x in xs))
        return self.call(params, *xs)


def _recording(monkeypatch, model) -> _Recorder:
    own = stepping.own_call
    rec = _Recorder(own(model))
    monkeypatch.setattr(stepping, "own_call", lambda m: rec if m is model else own(m))
    return rec


def _counting_loads(monkeypatch) -> list:
    """fbjax.load's keyword arguments of every call infer makes from now on."""
    import fbjax.batch_inference as bi

    loads = []
    real_load = bi.load
    monkeypatch.setattr(bi, "load", lambda *a, **k: loads.append(k) or real_load(*a, **k))
    return loads


def test_infer_runs_a_fixed_batch_model_as_its_own_calls(monkeypatch, tmp_path):
    """Issue 28 item 6: a model loaded the default way (the file's batch of
    1) whose example fills the cache (as the MediaPipe detectors' do: faked
    here by a cache budget of 1 byte) runs on one CPU device as its own
    batch-1 calls, the program of a loop of model(x): never loaded again
    (infer used to load it batch-polymorphic on every call, parsing, lowering
    and compiling it each time: 0.2-0.4x a loop on palm detection); results
    identical to the loop's (the same compiled program on the same
    examples)."""
    path = tmp_path / "m.tflite"
    path.write_bytes(conv_reshape_fc())
    xs = np.random.default_rng(16).standard_normal((9, 6, 6, 3)).astype(F32)
    model = fbjax.load(path, kernel_options={"chunk_bytes": 1})
    assert model.inputs[0].shape == (1, 6, 6, 3)
    loop = np.concatenate([np.asarray(model(x[None])) for x in xs])
    loads = _counting_loads(monkeypatch)
    rec = _recording(monkeypatch, model)
    for _ in range(2):
        np.testing.assert_array_equal(fbjax.infer(model, xs, step_size=4, progress=False), loop)
    assert rec.shapes == [((1, 6, 6, 3),)] * 18  # one call per example, none padded to the step size
    assert loads == [] and model.batch_cache.batch_polymorphic is None
    assert model.batch_cache.per_example_program is None


def _recording_per_example(monkeypatch, model) -> _Recorder:
    made = stepping.per_example_call
    rec = _Recorder(made(model))
    monkeypatch.setattr(stepping, "per_example_call", lambda m: rec if m is model else made(m))
    return rec


def test_infer_runs_a_small_batch1_model_from_bytes_per_example(monkeypatch):
    """Issue 28 item 6: a small batch-1 model loaded from bytes (no path to
    load it again batch-polymorphic) runs as its batch-1 program vmapped
    over steps of several examples (its batch-1 calls cost mostly host
    work: this is what made infer slower than a loop); results within the
    per-sample bound of batch-1 calls (a vmapped program may order sums
    differently), from arrays and from an iterable."""
    src = conv_reshape_fc()
    model = fbjax.load(src)
    xs = np.random.default_rng(22).standard_normal((9, 6, 6, 3)).astype(F32)
    assert stepping.plan(model, 4)[0] == 4
    rec = _recording_per_example(monkeypatch, model)
    loads = _counting_loads(monkeypatch)
    for got in (fbjax.infer(model, xs, step_size=4, progress=False), fbjax.infer(model, list(xs), step_size=4,
                                                                                 progress=False)):
        assert got.shape == (9, 5)
        assert_per_sample(got, src, xs, "batch-1 program vmapped over the examples")
    assert rec.shapes == [((4, 6, 6, 3),)] * 6  # 3 steps per call, the last padded
    assert loads == [] and isinstance(model.batch_cache.batch_polymorphic, InputError)


def test_infer_loads_a_small_fixed_batch_model_again_once(monkeypatch, tmp_path):
    """A batch-1 model whose examples' activations fit in cache several at a
    time (host work dominates its batch-1 calls): infer loads it again
    batch-polymorphic, once for every call, and runs steps of several
    examples; results within the per-sample bound of batch-1 calls."""
    src = conv_reshape_fc()
    path = tmp_path / "m.tflite"
    path.write_bytes(src)
    model = fbjax.load(path)
    loads = _counting_loads(monkeypatch)
    xs = np.random.default_rng(20).standard_normal((9, 6, 6, 3)).astype(F32)
    got = [fbjax.infer(model, xs, step_size=4, progress=False) for _ in range(2)]
    assert [k.get("batch_size", "?") for k in loads] == [None]
    assert model.batch_cache.batch_polymorphic.inputs[0].shape == (None, 6, 6, 3)
    for g in got:
        assert_per_sample(g, src, xs, "small model loaded again batch-polymorphic")


def test_infer_runs_a_fixed_batch_of_4_in_calls_of_4(monkeypatch, tmp_path):
    """fbjax.load(path, batch_size=4): infer runs calls of 4 examples, the
    last padded, results those of the model's own calls on the stacked
    examples (the same program), from arrays and from a directory."""
    src = conv_reshape_fc()
    model = fbjax.load(src, batch_size=4)
    xs = np.random.default_rng(17).standard_normal((9, 6, 6, 3)).astype(F32)
    padded = np.concatenate([xs, np.zeros((3, 6, 6, 3), F32)])
    calls = np.concatenate([np.asarray(model(padded[i:i + 4])) for i in range(0, 12, 4)])[:9]
    rec = _recording(monkeypatch, model)
    np.testing.assert_array_equal(fbjax.infer(model, xs, step_size=8, progress=False), calls)
    assert rec.shapes == [((4, 6, 6, 3),)] * 3
    d = tmp_path / "in"
    d.mkdir()
    for i, x in enumerate(xs):
        np.save(d / f"{i:02d}.npy", x)
    np.testing.assert_array_equal(fbjax.infer(model, d, step_size=8, progress=False), calls)
    assert_per_sample(calls, src, xs, "batch-4 calls")


def _vit_bound(ref) -> np.ndarray:
    """The ViT's outputs from two orders of its float32 sums (helpers.K_VIT)."""
    return 2 * gamma(K_VIT) * np.maximum(1.0, np.abs(np.asarray(ref, np.float64)))


def test_infer_runs_a_model_that_cannot_take_another_batch(monkeypatch):
    """litert-torch's ViT reduces over its batch dimension (a MEAN the batch
    rewrite cannot prove per example): fbjax.load(path, batch_size=None)
    refuses it, and infer, which loaded it so, did too. Loaded the default
    way it runs as its batch-1 program vmapped over steps of examples
    (each example sees the shapes of one call; 2x a loop of its calls,
    benchmarks/infer.py) with results within the bound of reordered sums
    (helpers.K_VIT) of the loop's; at a step of 1 (no several examples per
    call) its own calls, the loop's results."""
    path = ROOT / "tests" / "data" / "litert_torch" / "vit_f32.tflite"
    with pytest.raises(InputError, match="batch"):
        fbjax.load(path, batch_size=None)
    model = fbjax.load(path)
    xs = np.random.default_rng(18).standard_normal((5, 3, 32, 32)).astype(F32)
    loop = np.concatenate([np.asarray(model(x[None])) for x in xs])
    rec = _recording_per_example(monkeypatch, model)
    got = fbjax.infer(model, xs, step_size=2, progress=False)
    assert rec.shapes == [((2, 3, 32, 32),)] * 3
    assert_within(got, loop, _vit_bound(loop), "ViT vmapped over examples")
    np.testing.assert_array_equal(fbjax.infer(model, xs, step_size=1, progress=False), loop)
    assert len(rec.shapes) == 3  # the step of 1 ran the model's own calls


def test_cli_infer_runs_a_model_that_cannot_take_another_batch(tmp_path):
    """Issue 28 item 6: ``fbjax infer`` loads the model the default way and
    lets infer choose, as the Python API does: litert-torch's ViT, which
    ``batch_size=None`` refuses (a MEAN over the batch), runs from a
    directory (the CLI used to load it batch-polymorphic and refuse it);
    the results are the loop's within the bound of reordered sums
    (helpers.K_VIT), in file-name order."""
    from fbjax.cli import main

    path = ROOT / "tests" / "data" / "litert_torch" / "vit_f32.tflite"
    with pytest.raises(InputError, match="batch"):
        fbjax.load(path, batch_size=None)
    xs = np.random.default_rng(21).standard_normal((5, 3, 32, 32)).astype(F32)
    d = _sample_dir(tmp_path / "in", xs)
    out = tmp_path / "o.npz"
    assert main(["infer", str(path), "--input-dir", str(d), "--out", str(out), "--step-size", "2",
                 "--no-progress"]) == 0
    model = fbjax.load(path)
    loop = np.concatenate([np.asarray(model(x[None])) for x in xs])
    from fbjax.batch_inference.sinks import output_keys

    with np.load(out) as z:
        assert_within(z[output_keys([o.name for o in model.outputs])[0]], loop, _vit_bound(loop),
                      "fbjax infer on the ViT")
        assert list(z["__files__"]) == [f"s{i:03d}.npy" for i in range(5)]


_VIT_MESH = textwrap.dedent("""
    import sys, numpy as np, jax, fbjax
    assert len(jax.devices()) == 2, jax.devices()
    model = fbjax.load(sys.argv[1])  # batch 1; batch_size=None refuses it
    np.save(sys.argv[3], fbjax.infer(model, np.load(sys.argv[2]), step_size=4, progress=False))
""")


def test_infer_runs_a_model_that_cannot_take_another_batch_over_2_devices(tmp_path):
    """Over a device mesh (2 forced host devices; an accelerator likewise)
    steps are split along a batch: the ViT, whose graph cannot take one,
    runs as its batch-1 program vmapped over each device's examples (infer
    refused it before); results within the bound of reordered sums
    (helpers.K_VIT) of a loop of its calls, the last step padded."""
    path = ROOT / "tests" / "data" / "litert_torch" / "vit_f32.tflite"
    xs = np.random.default_rng(23).standard_normal((7, 3, 32, 32)).astype(F32)
    np.save(tmp_path / "x.npy", xs)
    script = tmp_path / "vit_mesh.py"
    script.write_text(_VIT_MESH)
    r = subprocess.run([sys.executable, str(script), str(path), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                       env=_env(2), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    model = fbjax.load(path)
    loop = np.concatenate([np.asarray(model(x[None])) for x in xs])
    got = np.load(tmp_path / "y.npy")
    assert got.shape == loop.shape
    assert_within(got, loop, _vit_bound(loop), "ViT vmapped over 2 devices")


def test_infer_loads_a_fixed_batch_model_again_once_per_model(monkeypatch, tmp_path):
    """Where a fixed batch model does not run as its own calls (several
    devices or an accelerator; faked here), infer loads it again
    batch-polymorphic once and keeps it on the model: a second call loads
    nothing. From bytes there is no path to load again: InputError."""
    src = conv_reshape_fc()
    from_bytes = fbjax.load(src)
    path = tmp_path / "m.tflite"
    path.write_bytes(src)
    model = fbjax.load(path)
    monkeypatch.setattr(stepping, "fixed_batch", lambda model: None)
    loads = _counting_loads(monkeypatch)
    xs = np.random.default_rng(19).standard_normal((5, 6, 6, 3)).astype(F32)
    with pytest.raises(InputError, match="batch_size=None"):
        fbjax.infer(from_bytes, xs, progress=False)
    got = [fbjax.infer(model, xs, step_size=2, progress=False) for _ in range(2)]
    assert [k.get("batch_size", "?") for k in loads] == [None]
    assert model.batch_cache.batch_polymorphic.inputs[0].shape == (None, 6, 6, 3)
    for g in got:
        assert_per_sample(g, src, xs, "batch-polymorphic model loaded again")


def test_infer_does_not_take_a_files_leading_2_for_a_batch(tmp_path):
    """A file's [2, 3] input need not be a batch of 2: infer does not split
    examples of shape (3,) into calls of 2 (their results would mix two
    examples wherever the graph mixes rows); it asks for the
    batch-polymorphic load, which refuses naming the leading dimension."""
    from fbjax.formats.tflite_builder import single_op_model

    path = tmp_path / "add.tflite"
    path.write_bytes(single_op_model("ADD", [(2, 3), (2, 3)]))
    model = fbjax.load(path)
    assert stepping.fixed_batch(model) is None
    with pytest.raises(InputError, match="leading batch dimension of 1"):
        fbjax.infer(model, [(np.ones(3, F32), np.ones(3, F32))], progress=False)
    assert stepping.fixed_batch(fbjax.load(conv_reshape_fc(), batch_size=3)) == 3
    # loaded for a batch job: the batch rewrite's refusal stands, as the file's (2, 3) is no batch of 1
    with pytest.raises(InputError, match="leading batch dimension of 1"):
        fbjax.batch_inference.load_for_infer(path)
    with pytest.raises(InputError, match="leave batch_size out"):
        fbjax.batch_inference.load_for_infer(path, batch_size=2)
