"""The one-op ``STABLEHLO_*`` TFLite models (a helper module, not a test
module: ``tests/test_tflite_stablehlo.py`` checks each against the numpy twin
and LiteRT, ``tests/test_parity.py`` uses them as the generated cases of the
``"stablehlo"`` op set).

:data:`CASES` maps a case name to ``(op, inputs, outputs, options, bodies)``
(:func:`fbjax.formats.tflite_builder.stablehlo_op_model`'s arguments; an :class:`In` is a
model input holding its value, a numpy array a constant); :func:`build`
writes the model and returns it with its input values. The inputs come from
one seeded generator, drawn in table order.
"""

from __future__ import annotations

import numpy as np

from fbjax.formats.tflite_builder import stablehlo_op_model

F32, I32, B = np.float32, np.int32, np.bool_
RNG = np.random.RandomState(7)


class In:
    """A model input holding ``value``."""

    def __init__(self, value):
        self.value = np.asarray(value)


def _cmp_body(direction, ctype="STABLEHLO_COMPARISON_TYPE_FLOAT_TOTAL_ORDER", dtype=F32):
    def fn(b):
        lhs, rhs = b.add_input((), dtype), b.add_input((), dtype)
        o = b.add_tensor((), B)
        b.add_op("STABLEHLO_COMPARE", [lhs, rhs], [o], options=dict(
            comparison_direction=f"STABLEHLO_COMPARISON_DIRECTION_{direction}", compare_type=ctype))
        b.add_output(o)
    return fn


def _while_cond(b):
    i, _ = b.add_input((), I32), b.add_input((3,), F32)
    five = b.add_tensor((), I32, data=np.array(5, I32))
    o = b.add_tensor((), B)
    b.add_op("STABLEHLO_COMPARE", [i, five], [o], options=dict(
        comparison_direction="STABLEHLO_COMPARISON_DIRECTION_LT", compare_type="STABLEHLO_COMPARISON_TYPE_SIGNED"))
    b.add_output(o)


def _while_body(b):
    i, x = b.add_input((), I32), b.add_input((3,), F32)
    one = b.add_tensor((), I32, data=np.array(1, I32))
    k = b.add_tensor((3,), F32, data=np.full(3, 1.5, F32))
    i2, x2 = b.add_tensor((), I32), b.add_tensor((3,), F32)
    b.add_op("STABLEHLO_ADD", [i, one], [i2])
    b.add_op("STABLEHLO_MULTIPLY", [x, k], [x2])
    b.add_output(i2)
    b.add_output(x2)


def _unary_graph(op, shape=(3,)):
    def fn(b):
        x = b.add_input(shape, F32)
        o = b.add_tensor(shape, F32)
        b.add_op(op, [x, x], [o]) if op in ("STABLEHLO_ADD", "STABLEHLO_MULTIPLY") else b.add_op(op, [x], [o])
        b.add_output(o)
    return fn


def _binary_graph(op, shape=(2, 3)):
    def fn(b):
        x, y = b.add_input(shape, F32), b.add_input(shape, F32)
        o = b.add_tensor(shape, F32)
        b.add_op(op, [x, y], [o])
        b.add_output(o)
    return fn


def _flex(obj) -> bytes:
    from flatbuffers import flexbuffers

    return bytes(flexbuffers.Dumps(obj))


def _f(*shape, lo=-3.0, hi=3.0):
    return RNG.uniform(lo, hi, shape).astype(F32)


_UNARY = {
    "STABLEHLO_LOGISTIC": _f(4, 5), "STABLEHLO_ABS": _f(4, 5), "STABLEHLO_COSINE": _f(4, 5),
    "STABLEHLO_EXPONENTIAL": _f(4, 5), "STABLEHLO_FLOOR": _f(4, 5), "STABLEHLO_LOG": _f(4, 5, lo=0.01),
    "STABLEHLO_NEGATE": _f(4, 5), "STABLEHLO_RSQRT": _f(4, 5, lo=0.01), "STABLEHLO_TANH": _f(4, 5),
    "STABLEHLO_CBRT": _f(4, 5),
}
_BINARY = {
    "STABLEHLO_ADD": (_f(4, 5), _f(4, 5)), "STABLEHLO_SUBTRACT": (_f(4, 5), _f(4, 5)),
    "STABLEHLO_MULTIPLY": (_f(4, 5), _f(4, 5)), "STABLEHLO_DIVIDE": (_f(4, 5), _f(4, 5, lo=0.5)),
    "STABLEHLO_MAXIMUM": (_f(4, 5), _f(4, 5)), "STABLEHLO_MINIMUM": (_f(4, 5), _f(4, 5)),
    "STABLEHLO_POWER": (_f(4, 5, lo=0.1), _f(4, 5)), "STABLEHLO_REMAINDER": (_f(4, 5), _f(4, 5, lo=0.5)),
}

_IDX = np.array([[0], [2], [2], [5], [9]], I32)  # scatter rows: 2 twice, 9 out of bounds (skipped)

#: name -> (op, inputs, outputs, options, bodies)
CASES = {}
for _op, _x in _UNARY.items():
    CASES[_op] = (_op, [In(_x)], [((4, 5), F32)], None, None)
for _op, (_a, _b) in _BINARY.items():
    CASES[_op] = (_op, [In(_a), In(_b)], [((4, 5), F32)], None, None)
CASES.update({
    "STABLEHLO_AND": ("STABLEHLO_AND", [In(RNG.randint(-99, 99, (4, 5)).astype(I32)),
                                        In(RNG.randint(-99, 99, (4, 5)).astype(I32))], [((4, 5), I32)], None, None),
    "STABLEHLO_OR": ("STABLEHLO_OR", [In(RNG.rand(4, 5) > 0.5), In(RNG.rand(4, 5) > 0.5)], [((4, 5), B)], None, None),
    "STABLEHLO_SHIFT_LEFT": ("STABLEHLO_SHIFT_LEFT", [In(RNG.randint(-99, 99, (2, 16)).astype(I32)),
                                                      In(np.tile(np.arange(0, 32, 2, dtype=I32), (2, 1)))],
                             [((2, 16), I32)], None, None),
    "STABLEHLO_SHIFT_LEFT-out-of-range": ("STABLEHLO_SHIFT_LEFT",
                                          [In(RNG.randint(-99, 99, (2, 6)).astype(I32)),
                                           In(np.array([[-1, 32, 33, 40, -40, 31]] * 2, I32))],
                                          [((2, 6), I32)], None, None),
    "STABLEHLO_CLAMP": ("STABLEHLO_CLAMP", [np.array(-1.0, F32), In(_f(4, 5)), np.array(1.5, F32)],
                        [((4, 5), F32)], None, None),
    "STABLEHLO_SELECT": ("STABLEHLO_SELECT", [In(RNG.rand(4, 5) > 0.5), In(_f(4, 5)), In(_f(4, 5))],
                         [((4, 5), F32)], None, None),
    "STABLEHLO_COMPARE": ("STABLEHLO_COMPARE", [In(np.array([np.nan, -0.0, 1.0, -np.inf, 2.0], F32)),
                                                In(np.array([1.0, 0.0, np.nan, -1.0, 2.0], F32))], [((5,), B)],
                          dict(comparison_direction="STABLEHLO_COMPARISON_DIRECTION_LT",
                               compare_type="STABLEHLO_COMPARISON_TYPE_FLOAT_TOTAL_ORDER"), None),
    "STABLEHLO_CONVERT": ("STABLEHLO_CONVERT", [In(_f(4, 5) * 10)], [((4, 5), I32)], None, None),
    "STABLEHLO_RESHAPE": ("STABLEHLO_RESHAPE", [In(_f(4, 5))], [((2, 10), F32)], None, None),
    "STABLEHLO_CONCATENATE": ("STABLEHLO_CONCATENATE", [In(_f(2, 3)), In(_f(2, 4))], [((2, 7), F32)],
                              dict(dimension=1), None),
    "STABLEHLO_BROADCAST_IN_DIM": ("STABLEHLO_BROADCAST_IN_DIM", [In(_f(5))], [((4, 5), F32)],
                                   dict(broadcast_dimensions=[1]), None),
    "STABLEHLO_SLICE": ("STABLEHLO_SLICE", [In(_f(6, 7))], [((2, 3), F32)],
                        dict(start_indices=[1, 0], limit_indices=[5, 7], strides=[2, 3]), None),
    "STABLEHLO_IOTA": ("STABLEHLO_IOTA", [], [((3, 4), I32)], dict(iota_dimension=1), None),
    "STABLEHLO_TRANSPOSE": ("STABLEHLO_TRANSPOSE", [In(_f(2, 3, 4))], [((4, 2, 3), F32)],
                            dict(permutation=[2, 0, 1]), None),
    "STABLEHLO_PAD": ("STABLEHLO_PAD", [In(_f(2, 3)), np.array(0.5, F32)], [((6, 5), F32)],
                      dict(edge_padding_low=[1, -1], edge_padding_high=[2, 1], interior_padding=[1, 1]), None),
    "STABLEHLO_DYNAMIC_SLICE": ("STABLEHLO_DYNAMIC_SLICE", [In(_f(5, 6)), In(np.array(4, I32)), In(np.array(-2, I32))],
                                [((3, 2), F32)], dict(slice_sizes=[3, 2]), None),
    "STABLEHLO_DYNAMIC_UPDATE_SLICE": ("STABLEHLO_DYNAMIC_UPDATE_SLICE",
                                       [In(_f(5, 6)), In(_f(2, 3)), In(np.array(1, I32)), In(np.array(9, I32))],
                                       [((5, 6), F32)], None, None),
    "STABLEHLO_DOT_GENERAL": ("STABLEHLO_DOT_GENERAL", [In(_f(2, 3, 4)), In(_f(2, 4, 5))], [((2, 3, 5), F32)],
                              dict(lhs_batching_dimensions=[0], rhs_batching_dimensions=[0],
                                   lhs_contracting_dimensions=[2], rhs_contracting_dimensions=[1]), None),
    "STABLEHLO_CONVOLUTION": ("STABLEHLO_CONVOLUTION", [In(_f(1, 6, 6, 2)), _f(3, 3, 2, 4)], [((1, 3, 3, 4), F32)],
                              dict(window_strides=[2, 2], padding=[1, 1, 1, 1], lhs_dilation=[1, 1],
                                   rhs_dilation=[1, 1], input_batch_dimension=0, input_feature_dimension=3,
                                   input_spatial_dimensions=[1, 2], kernel_input_feature_dimension=2,
                                   kernel_output_feature_dimension=3, kernel_spatial_dimensions=[0, 1],
                                   output_batch_dimension=0, output_feature_dimension=3,
                                   output_spatial_dimensions=[1, 2], feature_group_count=1, batch_group_count=1),
                              None),
    "STABLEHLO_GATHER": ("STABLEHLO_GATHER", [In(_f(7, 4)), In(np.array([[6], [0], [2], [8]], I32))],
                         [((4, 4), F32)], dict(offset_dims=[1], collapsed_slice_dims=[0], start_index_map=[0],
                                               index_vector_dim=1, slice_sizes=[1, 4]), None),
    "STABLEHLO_SCATTER": ("STABLEHLO_SCATTER", [In(_f(8, 3)), _IDX, In(_f(5, 3))], [((8, 3), F32)],
                          dict(update_window_dims=[1], inserted_window_dims=[0], scatter_dims_to_operand_dims=[0],
                               index_vector_dim=1), {"update_computation_subgraph_index": "STABLEHLO_ADD"}),
    "STABLEHLO_SCATTER-replace": ("STABLEHLO_SCATTER", [In(_f(8, 3)), np.array([[1], [6]], I32), In(_f(2, 3))],
                                  [((8, 3), F32)],
                                  dict(update_window_dims=[1], inserted_window_dims=[0],
                                       scatter_dims_to_operand_dims=[0], index_vector_dim=1, unique_indices=True),
                                  {"update_computation_subgraph_index": "RETURN_RHS"}),
    "STABLEHLO_REDUCE": ("STABLEHLO_REDUCE", [In(_f(3, 4, 5)), np.array(0.0, F32)], [((3, 5), F32)],
                         dict(dimensions=[1]), {"body_subgraph_index": "STABLEHLO_ADD"}),
    "STABLEHLO_REDUCE_WINDOW": ("STABLEHLO_REDUCE_WINDOW", [In(_f(1, 6, 6, 2)), np.array(-np.inf, F32)],
                                [((1, 3, 3, 2), F32)],
                                dict(window_dimensions=[1, 3, 3, 1], window_strides=[1, 2, 2, 1],
                                     base_dilations=[1, 1, 1, 1], window_dilations=[1, 1, 1, 1],
                                     padding=[0, 0, 1, 1, 1, 1, 0, 0]),
                                {"body_subgraph_index": "STABLEHLO_MAXIMUM"}),
    "STABLEHLO_SORT": ("STABLEHLO_SORT", [In(np.array([[3, np.nan, -0.0, 0.0, -1, 3, 7]], F32))], [((1, 7), F32)],
                       dict(dimension=1, is_stable=True), {"comparator_subgraph_index": _cmp_body("LT")}),
    "STABLEHLO_SORT-descending": ("STABLEHLO_SORT", [In(_f(3, 9))], [((3, 9), F32)],
                                  dict(dimension=1, is_stable=True), {"comparator_subgraph_index": _cmp_body("GT")}),
    "STABLEHLO_WHILE": ("STABLEHLO_WHILE", [In(np.array(0, I32)), In(_f(3))], [((), I32), ((3,), F32)], None,
                        {"cond_subgraph_index": _while_cond, "body_subgraph_index": _while_body}),
    "STABLEHLO_CASE": ("STABLEHLO_CASE", [In(np.array(1, I32)), In(_f(3))], [((3,), F32)], None,
                       {"branch_subgraph_indices": [_unary_graph("STABLEHLO_ADD"), _unary_graph("STABLEHLO_MULTIPLY")]}),
    "STABLEHLO_CASE-out-of-range": ("STABLEHLO_CASE", [In(np.array(7, I32)), In(_f(3))], [((3,), F32)], None,
                                    {"branch_subgraph_indices": [_unary_graph("STABLEHLO_ADD"),
                                                                 _unary_graph("STABLEHLO_MULTIPLY")]}),
    "STABLEHLO_COMPOSITE": ("STABLEHLO_COMPOSITE", [In(_f(2, 3)), In(_f(2, 3))], [((2, 3), F32)],
                            dict(name="test.add", version=1, composite_attributes=list(_flex({"alpha": 1}))),
                            {"decomposition_subgraph_index": _binary_graph("STABLEHLO_ADD")}),
    "STABLEHLO_CUSTOM_CALL": ("STABLEHLO_CUSTOM_CALL", [In(_f(2, 3))], [((2, 3), F32)],
                              dict(call_target_name="fbjax_test.double", backend_config="x"), None),
    "STABLEHLO_RNG_BIT_GENERATOR": ("STABLEHLO_RNG_BIT_GENERATOR", [In(np.array([7, 42], np.uint64))],
                                    [((2,), np.uint64), ((3, 4), np.uint32)], dict(algorithm="PHILOX"), None),
})


def build(name):
    """``(model bytes, input values)`` of case ``name``."""
    op, inputs, outputs, options, bodies = CASES[name]
    specs = [(x.value.shape, x.value.dtype) if isinstance(x, In) else x for x in inputs]
    values = [x.value for x in inputs if isinstance(x, In)]
    return stablehlo_op_model(op, specs, outputs, options=options, bodies=bodies), values

