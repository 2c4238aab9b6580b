"""Hand-built ``.rten`` graphs for tests (a helper module, shared by
``tests/test_rten_format.py`` and ``tests/test_zero_size_constants.py``),
written with the generated flatbuffer bindings, not fbjax's reader."""

from __future__ import annotations

from fbjax.formats._generated import rten_generated as R


def value_node(name, shape, dtype=R.DataType.Float):
    """A value node ``name`` of ``shape`` (ints, or names for symbolic dims)."""
    node = R.NodeT()
    node.name = name
    node.dataType = R.NodeKind.ValueNode
    v = R.ValueNodeT()
    dims = []
    for d in shape:
        dim = R.DimT()
        if isinstance(d, str):
            dim.name = d
        else:
            dim.value = d
        dims.append(dim)
    v.shape = dims
    v.dtype = dtype
    node.data = v
    return node


def const_node(name, arr):
    """A float32 constant node ``name`` holding ``arr``."""
    node = R.NodeT()
    node.name = name
    node.dataType = R.NodeKind.ConstantNode
    c = R.ConstantNodeT()
    c.shape = list(arr.shape)
    c.dtype = R.ConstantDataType.Float32
    c.dataType = R.ConstantData.FloatData
    fd = R.FloatDataT()
    fd.data = arr.reshape(-1).tolist()
    c.data = fd
    node.data = c
    return node


def op_node(op_type, inputs, outputs, attrs_type=R.OperatorAttrs.NONE, attrs=None):
    """An operator node of ``op_type`` reading and writing node indices."""
    node = R.NodeT()
    node.dataType = R.NodeKind.OperatorNode
    op = R.OperatorNodeT()
    op.type = op_type
    op.attrsType = attrs_type
    op.attrs = attrs
    op.inputs = inputs
    op.outputs = outputs
    node.data = op
    return node


def rten_file(nodes, inputs, outputs):
    """The ``.rten`` bytes of a graph of ``nodes`` with these input/output node indices."""
    import flatbuffers

    g = R.GraphT()
    g.nodes, g.inputs, g.outputs = nodes, inputs, outputs
    m = R.ModelT()
    m.schemaVersion = 1
    m.graph = g
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b))
    return bytes(b.Output())
