"""Data pipelines: Apache Beam's RunInference with :class:`fbjax.beam.FbjaxModelHandler`
(DirectRunner) and the Ray Data recipe ``examples/ray_data.py`` (a local Ray cluster)
return exactly ``fbjax.infer``'s results.

Bit equality is the right check here: the handler and the Ray actors run each batch
through ``fbjax.infer`` at the same ``step_size`` as the reference call, so every example
goes through the same compiled program at the same batch shape (on one CPU device: calls
of ``k`` examples, ``k`` fixed by ``step_size`` and the model; the last call of a batch
padded with zeros, which each example's row never reads: the models here have no op that
mixes examples). How Beam or Ray cut the data into batches changes which examples share a
call, not the program or its shapes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fbjax
from fbjax.errors import InputError
from fbjax.formats.tflite_builder import single_op_model

from conftest import assert_within, gamma
from helpers import K_VIT, ray_with_example

ROOT = Path(__file__).resolve().parents[1]
STEP = 8


def _image(i: int) -> np.ndarray:
    """Example ``i``: a float32 (256, 256, 3) image in [0, 1] for fbjax's default model."""
    return np.random.default_rng(i).random((256, 256, 3), dtype=np.float32)


@pytest.fixture(scope="module")
def dense_path(tmp_path_factory) -> str:
    """A FULLY_CONNECTED model, input (1, 16) -> output (1, 8): small activations,
    so fbjax.infer runs steps of 8 examples as one call of 8 (padding the last)."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    p = tmp_path_factory.mktemp("models") / "dense.tflite"
    p.write_bytes(single_op_model("FULLY_CONNECTED", [(1, 16), w, b], output_shapes=[(1, 8)]))
    return str(p)


def _dense_bound(x: np.ndarray) -> np.ndarray:
    """How far the dense model's output may move when an example sits in another row of a
    step (XLA:CPU's GEMM need not round every row position alike on every CPU): the bound
    of a reordered float32 sum of 16 products and the bias, 2 gamma_17 (|x| |w|^T + |b|),
    with the fixture's own w and b (``dense_path``)."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    return 2 * gamma(17) * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T + np.abs(b))


def _run_beam(handler, elements, out_dir: Path, key_of, make=None) -> None:
    """Run ``elements`` (mapped by ``make`` inside the pipeline, if given) through
    RunInference(handler) on the DirectRunner; ``key_of`` maps each output to ``(key,
    PredictionResult)``, whose inference goes to ``out_dir/<key>.npy`` (the pipeline's
    functions are pickled, so results leave it through files)."""
    import apache_beam as beam
    from apache_beam.ml.inference.base import RunInference
    from apache_beam.options.pipeline_options import PipelineOptions

    def save(item):
        key, result = key_of(item)
        np.save(out_dir / f"{key}.npy", result.inference)

    with beam.Pipeline(runner="DirectRunner", options=PipelineOptions([])) as p:
        pc = p | beam.Create(elements)
        if make is not None:
            pc = pc | beam.Map(make)
        pc | RunInference(handler) | beam.Map(save)


def test_beam_keyed_run_inference_equals_infer(tmp_path):
    """KeyedModelHandler around FbjaxModelHandler: (key, example) in, (key,
    PredictionResult) out; 21 examples (not a multiple of the step) of the bundled
    MediaPipe model, each result bit-equal to fbjax.infer's on all 21."""
    from apache_beam.ml.inference.base import KeyedModelHandler

    from fbjax.beam import FbjaxModelHandler

    n = 21
    x = np.stack([_image(i) for i in range(n)])
    ref = fbjax.infer(fbjax.data.DEFAULT_MODEL, x, step_size=STEP, progress=False)
    handler = KeyedModelHandler(FbjaxModelHandler(fbjax.data.DEFAULT_MODEL, step_size=STEP))

    def key_of(kv):
        key, result = kv
        assert result.model_id == fbjax.data.DEFAULT_MODEL
        assert np.array_equal(result.example, _image(key))
        return kv

    # the images are made inside the pipeline from their keys: Beam's Create is slow with
    # large arrays (it pickles them into the pipeline, ~2 s per image here)
    _run_beam(handler, list(range(n)), tmp_path, key_of, make=lambda i: (i, _image(i)))
    assert sorted(int(f.stem) for f in tmp_path.glob("*.npy")) == list(range(n))
    for i in range(n):
        y = np.load(tmp_path / f"{i}.npy")
        assert y.shape == ref.shape[1:] and y.dtype == ref.dtype
        assert np.array_equal(y, ref[i]), f"example {i}: max |diff| {np.abs(y - ref[i]).max()}"


def test_beam_batches_smaller_than_a_step_give_infers_results(tmp_path, dense_path):
    """Beam batches of 1-3 examples with step_size 8 (the dense model runs a step as one
    call of 8): each batch is padded to the step, so every call is the program
    fbjax.infer runs on the whole dataset; an example may sit in another row of the
    step, so the results agree within the bound of reordered sums (:func:`_dense_bound`;
    bit equality held on some CPUs, not on all). Unkeyed elements: the example's first
    value is its index."""
    from fbjax.beam import FbjaxModelHandler

    n = 13
    x = np.random.default_rng(5).standard_normal((n, 16)).astype(np.float32)
    x[:, 0] = np.arange(n)
    ref = fbjax.infer(dense_path, x, step_size=STEP, progress=False)
    handler = FbjaxModelHandler(dense_path, step_size=STEP, min_batch_size=1, max_batch_size=3)
    assert handler.batch_elements_kwargs() == {"min_batch_size": 1, "max_batch_size": 3}
    _run_beam(handler, list(x), tmp_path, lambda r: (int(r.example[0]), r))
    assert sorted(int(f.stem) for f in tmp_path.glob("*.npy")) == list(range(n))
    bound = _dense_bound(x)
    for i in range(n):
        got = np.load(tmp_path / f"{i}.npy").astype(np.float64)
        assert np.all(np.abs(got - ref[i]) <= bound[i]), f"example {i}"


def test_beam_runs_a_model_that_cannot_take_another_batch(tmp_path):
    """litert-torch's ViT refuses batch_size=None (a MEAN over the batch): the handler
    loads it at the file's batch of 1 (fbjax.batch_inference.load_for_infer), which
    fbjax.infer runs as its batch-1 program vmapped over steps of examples; Beam batches
    of 1-3 examples with step_size 4 give fbjax.infer's results on the whole dataset (the
    same program at the same step shape, padded; an example may sit in another row of the
    step, and a vmapped program's rows need not round alike on every CPU, so within the
    bound of reordered sums, helpers.K_VIT); the handler refused it before."""
    from fbjax.beam import FbjaxModelHandler

    path = str(ROOT / "tests" / "data" / "litert_torch" / "vit_f32.tflite")
    with pytest.raises(InputError, match="reduces over the batch dimension"):
        fbjax.load(path, batch_size=None)
    n = 7
    x = np.random.default_rng(6).standard_normal((n, 3, 32, 32)).astype(np.float32)
    x[:, 0, 0, 0] = np.arange(n)
    ref = fbjax.infer(fbjax.load(path), x, step_size=4, progress=False)
    handler = FbjaxModelHandler(path, step_size=4, min_batch_size=1, max_batch_size=3)
    assert handler.load_model().inputs[0].shape == (1, 3, 32, 32)
    _run_beam(handler, list(x), tmp_path, lambda r: (int(r.example[0, 0, 0]), r))
    assert sorted(int(f.stem) for f in tmp_path.glob("*.npy")) == list(range(n))
    bound = 2 * gamma(K_VIT) * np.maximum(1.0, np.abs(ref.astype(np.float64)))
    assert_within(np.stack([np.load(tmp_path / f"{i}.npy") for i in range(n)]), ref, bound, "ViT through Beam")


def test_beam_handler_direct_calls(dense_path):
    """run_inference outside a pipeline: one PredictionResult per example, in order;
    pre-batched (N, ...) arrays as with_no_batching() passes them; byte count;
    multi-output models give a tuple per example."""
    from fbjax.beam import FbjaxModelHandler

    h = FbjaxModelHandler(dense_path)
    m = h.load_model()
    assert m.inputs[0].shape == (None, 16)  # loaded batch-polymorphic
    x = np.random.default_rng(1).standard_normal((5, 16)).astype(np.float32)
    ref = fbjax.infer(dense_path, x, step_size=STEP, progress=False)
    for batch in (list(x), x):
        res = list(h.run_inference(batch, m))
        assert len(res) == 5
        for i, r in enumerate(res):
            assert np.array_equal(r.example, x[i]) and np.array_equal(r.inference, ref[i])
            assert r.model_id == dense_path
    assert h.get_num_bytes(list(x)) == x.nbytes
    with pytest.raises(InputError, match=r"shape \(15,\)"):
        list(h.run_inference([x[0, :15]], m))
    with pytest.raises(ValueError, match="inference_args"):
        h.run_inference(list(x), m, {"foo": 1})


@pytest.mark.parametrize("which", ["dense", "default"])
def test_beam_handler_from_several_threads(which, dense_path):
    """A Beam worker process shares its model between its threads (Dataflow runs several
    per process): batches run concurrently from 4 threads give fbjax.infer's results (the
    dense model: within the bound of reordered sums, an example may sit in another row of a
    step, :func:`_dense_bound`; the segmentation model, one example per call: its bits)."""
    from concurrent.futures import ThreadPoolExecutor

    from fbjax.beam import FbjaxModelHandler

    path = dense_path if which == "dense" else fbjax.data.DEFAULT_MODEL
    h = FbjaxModelHandler(path)
    m = h.load_model()
    x = np.random.default_rng(2).random((20, *m.inputs[0].shape[1:]), dtype=np.float32)
    ref = fbjax.infer(path, x, step_size=STEP, progress=False)
    batches = [list(x[i:i + 5]) for i in range(0, len(x), 5)] * 2
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda b: h.run_inference(b, m), batches))
    ys = np.stack([r.inference for res in outs for r in res])
    want = np.concatenate([ref, ref])
    if which == "dense":
        assert np.all(np.abs(ys.astype(np.float64) - want) <= _dense_bound(np.concatenate([x, x])))
    else:
        assert np.array_equal(ys, want)


def test_beam_handler_multi_output(tmp_path):
    """A two-output model (SPLIT of a (1, 6) input in two (1, 3)): inference is a tuple
    in Model.outputs order, each equal to fbjax.infer's."""
    from fbjax.beam import FbjaxModelHandler

    p = tmp_path / "split.tflite"
    p.write_bytes(single_op_model("SPLIT", [np.asarray(1, np.int32), (1, 6)], options={"num_splits": 2},
                                  output_shapes=[(1, 3), (1, 3)]))
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    h = FbjaxModelHandler(p)
    res = list(h.run_inference(list(x), h.load_model()))
    ref = fbjax.infer(str(p), x, step_size=STEP, progress=False)
    for i, r in enumerate(res):
        assert isinstance(r.inference, tuple) and len(r.inference) == 2
        assert np.array_equal(r.inference[0], ref[0][i]) and np.array_equal(r.inference[1], ref[1][i])
        assert np.array_equal(r.inference[0], x[i, :3])  # SPLIT: the halves, exactly


def test_beam_handler_options():
    from fbjax.beam import DEFAULT_STEP_SIZE, FbjaxModelHandler

    h = FbjaxModelHandler(fbjax.data.DEFAULT_MODEL)
    assert h.step_size == DEFAULT_STEP_SIZE
    assert h.batch_elements_kwargs() == {"min_batch_size": DEFAULT_STEP_SIZE, "max_batch_size": 4 * DEFAULT_STEP_SIZE}
    assert FbjaxModelHandler("m.tflite", step_size=16).batch_elements_kwargs() == {"min_batch_size": 16,
                                                                                   "max_batch_size": 64}
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InputError, match="step_size"):
            FbjaxModelHandler("m.tflite", step_size=bad)
    with pytest.raises(InputError, match="min_batch_size 9 > max_batch_size 4"):
        FbjaxModelHandler("m.tflite", min_batch_size=9, max_batch_size=4)
    with pytest.raises(InputError, match="step_size"):
        FbjaxModelHandler("m.tflite", load_options={"batch_size": 4})
    e = FbjaxModelHandler("m.tflite", env_vars={"FBJAX_TEST_BEAM_ENV": "1"})
    e.set_environment_vars()  # what RunInference does before load_model
    assert os.environ.pop("FBJAX_TEST_BEAM_ENV") == "1"
    h.update_model_path("other.tflite")
    with pytest.raises(FileNotFoundError):
        h.load_model()


def test_beam_handler_reads_a_model_through_beam_filesystems():
    """A model path with a scheme (gs://, s3://...) is read with Beam's FileSystems on the
    worker: here a file system registered for the scheme ``fbjaxtest`` serving the bundled
    model's bytes; the handler's results equal those of the local file."""
    import io

    from apache_beam.io.filesystem import FileSystem

    from fbjax.beam import FbjaxModelHandler

    data = Path(fbjax.data.DEFAULT_MODEL).read_bytes()
    opened = []

    def _unused(*a, **k):
        raise NotImplementedError

    def _open(self, path, mime_type="application/octet-stream", compression_type=None):
        opened.append(path)
        return io.BytesIO(data)

    # Beam finds file systems among FileSystem's subclasses, by scheme() (the scheme is this
    # test's own, so the class left registered in the process serves no other path)
    fs = type("FbjaxTestFileSystem", (FileSystem,), {
        **{name: _unused for name in FileSystem.__abstractmethods__},
        "scheme": classmethod(lambda cls: "fbjaxtest"), "open": _open})
    h = FbjaxModelHandler("fbjaxtest://models/selfie.tflite")
    m = h.load_model()
    x = np.stack([_image(i) for i in range(2)])
    res = list(h.run_inference(list(x), m))
    assert fs in FileSystem.get_all_subclasses()  # (also keeps the class alive until here)
    assert opened == ["fbjaxtest://models/selfie.tflite"]
    ref = fbjax.infer(fbjax.data.DEFAULT_MODEL, x, step_size=STEP, progress=False)
    assert all(np.array_equal(r.inference, ref[i]) for i, r in enumerate(res))
    assert res[0].model_id == "fbjaxtest://models/selfie.tflite"


def test_import_fbjax_imports_neither_beam_nor_ray():
    code = "import sys, fbjax; bad = [m for m in ('apache_beam', 'ray') if m in sys.modules]; assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# --- Ray Data -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_example():
    """examples/ray_data.py imported, on a local Ray cluster (2 CPUs), shut down after."""
    with ray_with_example("ray_data.py", num_cpus=2) as mod:
        yield mod


# Ray Data reads its own deprecated context fields when a job starts (ray/data/context.py)
@pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")
def test_ray_data_equals_infer(ray_example, capfd):
    """The recipe's job (one actor: the other CPU reads, batches of 12 rows, step 8) on 24 images: the rows
    come back (in some order) with outputs bit-equal to fbjax.infer's, and Ray logs no error-level line about
    the actors' constructor arguments (ray-project/ray#57733: the recipe's actors do not restart)."""
    n = 24
    ds = ray_example.build(n, fbjax.data.DEFAULT_MODEL, step_size=STEP, batch_size=12, actors=1)
    out = fbjax.load(fbjax.data.DEFAULT_MODEL).outputs[0].name
    ids, ys = ray_example.collect(ds, out)
    assert "constructor arguments in the object store" not in capfd.readouterr().err
    assert ids.tolist() == list(range(n))
    ref = fbjax.infer(fbjax.data.DEFAULT_MODEL, ray_example.example_images(ids), step_size=STEP, progress=False)
    assert ys.shape == ref.shape and ys.dtype == ref.dtype
    bad = [i for i in range(n) if not np.array_equal(ys[i], ref[i])]
    assert not bad, f"examples {bad} differ from fbjax.infer (max |diff| {np.abs(ys - ref).max()})"
