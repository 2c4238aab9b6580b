"""TFLite GPU delegate (OpenCL) serialized models (``.bin``): bytes -> :class:`~fbjax.ir.ModelIR`.

The delegate writes ``tflite.gpu.cl.data.InferenceContext`` flatbuffers to skip
graph compilation on the next start: its whole compiled graph, one ``CLNode``
per OpenCL kernel, with the kernel's source, launch sizes, tensor descriptors
and every weight repacked into GPU layouts. There is no file identifier and the
schema changed between TensorFlow releases; :func:`detect_generation` verifies
the root table against each schema fbjax has (``schemas/gpu_cl_*.fbs``):

* ``"seed"`` (TF master late 2020, ``schemas/gpu_cl_seed.fbs``): ``DataType``
  FLOAT32 = 1, FLOAT16 = 2; ``Arguments`` carry ``shared_int4s`` /
  ``shared_float4s`` / ``shared_half4s``; graph inputs/outputs are named by
  ``input_ids`` / ``output_ids`` only;
* ``"tf2.5"`` (TensorFlow 2.5.0, ``schemas/gpu_cl_tf25.fbs``): FLOAT16 = 1,
  FLOAT32 = 2; ``const_tensors``; ``input_refs`` / ``output_refs`` (the TFLite
  tensor indices the graph's inputs and outputs stand for);
* ``"tf2.7"`` (TensorFlow 2.7, ``schemas/gpu_cl_tf27.fbs``): the 2.5 layout
  with ``driver_version`` and the compiled ``binary_programs`` (``BinaryProgram``:
  a kernel fingerprint and the driver's program binary) in the root table's first
  two slots, and ``CLNode.fingerprint`` naming each node's program;
* ``"litert"`` (LiteRT today, ``schemas/gpu_cl_litert.fbs``): the graph moves
  to ``InferenceContext.gpu_model`` (``GpuModel`` / ``GpuNode``) beside
  ``driver_version`` and compiled ``binary_programs``; ``Arguments`` lose the
  Texture2D and TensorLinear objects (those weights are TensorDescriptor
  objects); precision lives in each operation's definition.

fbjax reads the graph and the weights; compiled programs are device code for
the driver that built them: ``fbjax inspect`` counts them, ``Model.save`` keeps
their bytes as they are.

Modules by job: :mod:`.generations` (the container: schema generations,
detection, where each generation keeps what), :mod:`.nodes` (the stored nodes:
names, arguments, weight objects), :mod:`.tensors` (the graph's tensor
descriptors, inputs and outputs), :mod:`.weights` (weight layouts and their
index maps), :mod:`.kernels` (the op table: one entry per GPU operation type),
:mod:`.reader` (building the IR) and :mod:`.describe` (``fbjax inspect``).

Op types exist only in node names (``"convolution_2d 12 linked : relu 13"``):
each node becomes one IR node of op set ``"gpu_cl"`` for its own op plus one per
linked (fused element-wise) op, read as its entry in :data:`.kernels.KERNELS`
says. Every weight object is decoded back to TFLite layouts (OHWI convolution
filters, ``[1, H, W, C]`` depthwise filters, ``[O, I]`` fully connected
weights, ``[C]`` biases, ``[1, 1, C]`` PReLU slopes) through an index map into
the object's data (:func:`weight_index`), so :mod:`fbjax.formats.gpu_cl_writer`
can put tuned values back in the same places. Activations are ``[B, H, W, C]``.
"""

from .describe import describe, find_node
from .generations import GENERATIONS, PRECISIONS, STORAGE, Generation, detect_generation, probe
from .kernels import KERNELS, OP_SET, Kernel
from .nodes import GpuNode, GpuObject, parse_nodes
from .reader import read
from .weights import WeightRef, weight_index

__all__ = ["read", "probe", "detect_generation", "describe", "find_node", "weight_index", "parse_nodes",
           "GENERATIONS", "Generation", "PRECISIONS", "STORAGE", "KERNELS", "OP_SET", "Kernel",
           "GpuNode", "GpuObject", "WeightRef"]
