"""Float lowerings used only by quantized models, for TFLite builtins that
the float op set (``"tflite"``) does not lower: op set ``"tflite.qfloat"``.

:func:`fbjax.quantization.prepare` routes a float node here only when
``("tflite", op)`` has no lowering, so the float op set always wins once it
has the op. The set is empty at present: every op it used to hold (SOFTMAX,
NEG, RSQRT, SQUARED_DIFFERENCE, GELU, LEAKY_RELU, TRANSPOSE, BATCH_MATMUL,
GATHER, SUM, PADV2, RESIZE_NEAREST_NEIGHBOR, TRANSPOSE_CONV) now has a
``"tflite"`` lowering with a numpy twin in :mod:`fbjax.reference.tflite`, so
these copies were never reached and were removed rather than kept as
untested duplicates. Add an op here (with a twin in
:mod:`fbjax.reference.tflite_int`) only for a float op that quantized models
need and the float op set cannot take.
"""

from __future__ import annotations

OP_SET = "tflite.qfloat"
