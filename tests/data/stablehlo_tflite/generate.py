"""Regenerate the STABLEHLO_* TFLite fixtures of tests/test_tflite_stablehlo.py.

Each TensorFlow function below is converted with
``converter.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_STABLEHLO_OPS]``
(TFLite builtins STABLEHLO_*, region bodies as appended subgraphs), and
TensorFlow's own outputs on seeded random inputs are stored next to it:
``<name>.tflite`` and ``<name>.npz`` (``input_<i>`` and ``expected_<i>``).
``manifest.json`` lists the fixtures, the STABLEHLO_* ops each contains, and
functions the converter refused, with its message.

Needs TensorFlow (not a test dependency):

    python3 -m venv /work/venv-tf6 && /work/venv-tf6/bin/pip install tensorflow-cpu
    /work/venv-tf6/bin/python tests/data/stablehlo_tflite/generate.py
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
RNG = np.random.RandomState(20261129)


def _w(*shape):
    return tf.constant(RNG.randn(*shape).astype(np.float32))


def spec(*shape, dtype=tf.float32):
    return tf.TensorSpec(shape, dtype)


def build():
    """name -> (tf.function with an input signature, example inputs)."""
    cases = {}

    def add(name, sig, inputs):
        def deco(fn):
            cases[name] = (tf.function(fn, input_signature=sig), inputs)
            return fn
        return deco

    x_img = RNG.randn(1, 9, 9, 3).astype(np.float32)
    w_conv = _w(3, 3, 3, 5)
    b_conv = _w(5)

    @add("conv2d_relu", [spec(1, 9, 9, 3)], [x_img])
    def conv2d_relu(x):
        return tf.nn.relu(tf.nn.conv2d(x, w_conv, strides=2, padding="SAME") + b_conv)

    w_dw = _w(3, 3, 3, 2)

    @add("depthwise_conv2d", [spec(1, 9, 9, 3)], [x_img])
    def depthwise_conv2d(x):
        return tf.nn.depthwise_conv2d(x, w_dw, strides=[1, 1, 1, 1], padding="VALID")

    @add("max_pool", [spec(1, 9, 9, 3)], [x_img])
    def max_pool(x):
        return tf.nn.max_pool2d(x, ksize=3, strides=2, padding="SAME")

    @add("avg_pool", [spec(1, 9, 9, 3)], [x_img])
    def avg_pool(x):
        return tf.nn.avg_pool2d(x, ksize=2, strides=2, padding="VALID")

    w_mm = _w(6, 4)

    @add("matmul", [spec(3, 6)], [RNG.randn(3, 6).astype(np.float32)])
    def matmul(x):
        return tf.matmul(x, w_mm)

    @add("batch_matmul", [spec(2, 3, 4), spec(2, 4, 5)],
         [RNG.randn(2, 3, 4).astype(np.float32), RNG.randn(2, 4, 5).astype(np.float32)])
    def batch_matmul(a, b):
        return tf.matmul(a, b)

    @add("sort", [spec(4, 10)], [RNG.randn(4, 10).astype(np.float32)])
    def sort(x):
        return tf.sort(x, axis=-1, direction="DESCENDING")

    # tf.sort / tf.argsort convert to a custom call mhlo.topk; XLA's own sort
    # (tf2xla's key_value_sort) converts to STABLEHLO_SORT with a comparator.
    @add("key_value_sort", [spec(3, 7), tf.TensorSpec([3, 7], tf.int32)],
         [RNG.randn(3, 7).astype(np.float32), RNG.permutation(21).reshape(3, 7).astype(np.int32)])
    def key_value_sort(k, v):
        from tensorflow.compiler.tf2xla.python import xla

        return xla.key_value_sort(k, v)

    @add("argsort", [spec(12)], [RNG.permutation(12).astype(np.float32)])
    def argsort(x):
        return tf.argsort(x, stable=True)

    @add("reductions", [spec(3, 5, 7)], [RNG.randn(3, 5, 7).astype(np.float32)])
    def reductions(x):
        return (tf.reduce_sum(x, axis=1), tf.reduce_max(x, axis=[0, 2]), tf.reduce_mean(x, axis=-1),
                tf.reduce_min(x), tf.reduce_prod(x[:, :2, :2], axis=0))

    @add("argmax", [spec(4, 9)], [RNG.randn(4, 9).astype(np.float32)])
    def argmax(x):
        return tf.argmax(x, axis=1, output_type=tf.int32)

    # TF 2.21's converter writes the values a while region captures from
    # outside (constants, and loop-invariant state it hoists) as tensor 0 of
    # the cond/body subgraphs, a wrong tensor: the model it writes is invalid
    # (listed under "defective" in the manifest; the test expects failure).
    @add("while_loop", [spec(4), spec(4), tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32),
                        tf.TensorSpec([], tf.int32)],
         [RNG.randn(4).astype(np.float32), np.full(4, 1.5, np.float32), np.array(0, np.int32),
          np.array(1, np.int32), np.array(5, np.int32)])
    def while_loop(x, scale, i0, step, n):
        _, _, y, _, _ = tf.while_loop(lambda i, s, y, sc, n: i < n,
                                      lambda i, s, y, sc, n: (i + s, s, y * sc + sc, sc, n),
                                      (i0, step, x, scale, n))
        return y

    @add("scatter_update", [spec(8, 3), spec(2, 3)],
         [RNG.randn(8, 3).astype(np.float32), RNG.randn(2, 3).astype(np.float32)])
    def scatter_update(x, u):
        return tf.tensor_scatter_nd_update(x, tf.constant([[1], [6]]), u)

    @add("scatter_add", [spec(6), spec(4)], [RNG.randn(6).astype(np.float32), RNG.randn(4).astype(np.float32)])
    def scatter_add(x, u):
        return tf.tensor_scatter_nd_add(x, tf.constant([[0], [3], [3], [5]]), u)

    @add("gather", [spec(7, 4)], [RNG.randn(7, 4).astype(np.float32)])
    def gather(x):
        return tf.gather(x, tf.constant([6, 0, 2, 2]), axis=0)

    @add("cumsum", [spec(3, 6)], [RNG.randn(3, 6).astype(np.float32)])
    def cumsum(x):
        return tf.cumsum(x, axis=1)

    @add("pad_transpose", [spec(2, 3, 4)], [RNG.randn(2, 3, 4).astype(np.float32)])
    def pad_transpose(x):
        return tf.transpose(tf.pad(x, [[0, 1], [2, 0], [1, 1]], constant_values=0.5), [2, 0, 1])

    @add("elementwise", [spec(5, 6)], [RNG.uniform(0.1, 3.0, (5, 6)).astype(np.float32)])
    def elementwise(x):
        return (tf.exp(x) - tf.math.log(x), tf.math.rsqrt(x), tf.tanh(x) * tf.cos(x), tf.floor(x * 2.0),
                tf.pow(x, 1.5), tf.math.floormod(x, 0.7), tf.where(x > 1.0, x, -x))

    @add("switch_case", [tf.TensorSpec([], tf.int32), spec(3)], [np.array(1, np.int32), RNG.randn(3).astype(np.float32)])
    def switch_case(i, x):
        return tf.switch_case(i, [lambda: x * 2.0, lambda: x + 10.0, lambda: -x])

    @add("cond", [spec(3)], [RNG.randn(3).astype(np.float32)])
    def cond(x):
        return tf.cond(tf.reduce_sum(x) > 0.0, lambda: x * 2.0, lambda: x - 1.0)

    return cases


#: fixtures the converter writes wrongly: name -> what is wrong.
DEFECTIVE = {
    "while_loop": "the converter writes values captured by the while regions (the loop-invariant scale, step "
                  "and bound) as tensor 0 of the cond/body subgraphs, so the model multiplies by the loop "
                  "counter instead of the scale",
}


def stablehlo_ops(data: bytes) -> list:
    """Names of the STABLEHLO_* (and other) builtins a model uses."""
    from tensorflow.lite.python import schema_py_generated as S

    m = S.ModelT.InitFromObj(S.Model.GetRootAs(data, 0))
    names = {v: k for k, v in vars(S.BuiltinOperator).items() if not k.startswith("_")}
    return sorted({names.get(max(int(oc.builtinCode), int(oc.deprecatedBuiltinCode)), str(oc.builtinCode))
                   for oc in m.operatorCodes or []})


def main(argv) -> int:
    only = set(argv[1:])
    manifest = {"tensorflow": tf.__version__, "fixtures": {}, "refused": {}}
    path = os.path.join(HERE, "manifest.json")
    if only and os.path.exists(path):  # regenerating some: keep the others' entries
        with open(path) as f:
            manifest.update({k: v for k, v in json.load(f).items() if k in ("fixtures", "refused")})
        for name in only:
            manifest["fixtures"].pop(name, None)
            manifest["refused"].pop(name, None)
    for name, (fn, inputs) in build().items():
        if only and name not in only:
            continue
        conv = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()], fn)
        conv.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_STABLEHLO_OPS]
        try:
            data = conv.convert()
        except Exception as e:  # noqa: BLE001 - recorded in the manifest
            manifest["refused"][name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            print(f"{name}: refused: {manifest['refused'][name]}")
            continue
        outs = fn(*[tf.constant(x) for x in inputs])
        outs = outs if isinstance(outs, (tuple, list)) else [outs]
        arrays = {f"input_{i}": np.asarray(x) for i, x in enumerate(inputs)}
        arrays.update({f"expected_{i}": np.asarray(o) for i, o in enumerate(outs)})
        with open(os.path.join(HERE, f"{name}.tflite"), "wb") as f:
            f.write(data)
        np.savez(os.path.join(HERE, f"{name}.npz"), **arrays)
        ops = stablehlo_ops(data)
        manifest["fixtures"][name] = {"ops": ops, "bytes": len(data)}
        print(f"{name}: {len(data)} bytes, {ops}")
    manifest["defective"] = {k: v for k, v in DEFECTIVE.items() if k in manifest["fixtures"]}
    with open(os.path.join(HERE, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
