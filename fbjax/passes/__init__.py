"""IR rewrites :func:`fbjax.load` runs between reading a file and lowering it.

Each pass rewrites a :class:`~fbjax.ir.ModelIR` in place and learns what it
needs about each op from the lowering registry it is handed (the op facts
declared at registration), never by importing the lowering:

* :mod:`fbjax.passes.quantization`: the ``quantized="exact"`` / ``"float"``
  rewrite of quantized TFLite models (:func:`~fbjax.passes.quantization.rewrite_quantized`);
* :mod:`fbjax.passes.shapes`: the batch rewrite
  (:func:`~fbjax.passes.shapes.set_batch_size`,
  :func:`~fbjax.passes.shapes.check_batch_size`), graph inputs bound to
  constants (:func:`~fbjax.passes.shapes.bind_inputs`, ``constant_inputs``)
  and the static-bound valid-count outputs
  (:func:`~fbjax.passes.shapes.add_valid_counts`, ``static_bounds``);
* :mod:`fbjax.passes.reading`: what a file means per op, applied right after
  reading (region graphs' arities checked, output dtypes an RTen file leaves
  open filled), by :func:`fbjax.load` and the numpy reference alike
  (:func:`~fbjax.passes.reading.read`, the one read step; the lowering
  takes only the IR it completed).

The sequence :func:`fbjax.load` and ``fbjax inspect`` run (read and
complete, rewrites, then lowering) is :mod:`fbjax.loading`: it hands the
lowering registry to the passes, so it sits above the lowering, outside this
package, which is one layer below it (``tests/test_layering.py``).
"""
