"""Flatbuffer verifier: checks a file's structure before anything unpacks it.

The flatc Python bindings (and their object API, ``XT.InitFromObj``) trust
every offset and vector length they read: a corrupted vector length of 2**31
makes them loop for hours or allocate without bound, and a garbage offset
raises ``IndexError``/``struct.error`` deep inside. :func:`verify` walks the
whole flatbuffer from its root, driven by a compact description of the schema
(``fbjax/formats/_generated/<name>_schema_desc.py``, generated from
``schemas/<name>.fbs`` by ``nox -s schemas``: ``tools/schema_desc.py``), and checks what the C++
``flatbuffers::Verifier`` checks, plus a little more:

* the root offset, each table's vtable (offset, size, alignment) and each
  present field (inside the table's inline size, aligned);
* every referenced table, vector, string and union value lies inside the
  buffer; offsets are non-zero; vector ``length * element size`` fits;
  strings are zero-terminated;
* ``(required)`` fields are present;
* enum fields (and vectors of enums) hold values the schema defines; union
  type fields name a known member, and a union with a type has a value;
* nesting depth and the number of tables/strings visited are bounded
  (:class:`Limits`); shared sub-tables are counted once per visit (that is
  what the object API costs), and a file may not need more visits than it
  has room for 4-byte offsets, so an object graph built to unpack
  exponentially is refused here instead of hanging the object API.

Every failure raises :class:`~fbjax.errors.ModelFormatError` naming where in
the file it is, e.g. ``flatbuffer: vector at offset 0x1234
(Model.subgraphs[0].tensors) has length 4294967295, past the end of the
3164-byte file``.

The module also holds format-neutral semantic helpers the frontends share
(:func:`check_shape`, :func:`check_call_graph`, :func:`check_byte_range`,
:func:`read_rten_header`, :func:`check_flexbuffer` for TFLite custom
options). The ``.fbs`` parser that produces the schema descriptions is a
tool of the repository (``tools/schema_desc.py``, run by ``nox -s schemas``).

Entry points for the frontends: ``verify(raw, "tflite")``,
``verify(raw, "rten", start=model_offset, size=model_length)``,
``verify(raw, "stablehlo", label=path)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import struct
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np

from ..errors import ModelFormatError

#: Exceptions from deep inside parsing that every flatbuffer reader (TFLite,
#: RTen, stablehlo.flatbuf; :func:`corrupt_file_errors`) turns into
#: ModelFormatError as a last resort: :func:`verify` should leave none to
#: catch. The fuzz tests set :data:`STRICT` to see them raw.
FALLBACK_ERRORS = (IndexError, struct.error, ValueError, TypeError, OverflowError, UnicodeDecodeError,
                   AttributeError, KeyError, MemoryError, RecursionError)
#: True: the readers let :data:`FALLBACK_ERRORS` through unchanged (one switch for every reader)
STRICT = False


@contextlib.contextmanager
def corrupt_file_errors(label: str, what: str, prefix_errors: bool = True) -> Iterator[None]:
    """The one error policy of the readers' parsing, as a ``with`` block: a
    :class:`~fbjax.errors.ModelFormatError` raised inside gets ``label`` (the
    file's path, or ``<bytes>``) in front of its message (unless
    ``prefix_errors`` is False: a reader whose messages name the file
    already); one of :data:`FALLBACK_ERRORS` (unless :data:`STRICT`) becomes
    a ModelFormatError ``"<label>: corrupt or truncated <what> (<type>: <message>)"``.

    Raises:
        ModelFormatError: as described.
    """
    try:
        yield
    except ModelFormatError as e:
        if not prefix_errors:
            raise
        raise ModelFormatError(f"{label}: {e}") from None
    except (() if STRICT else FALLBACK_ERRORS) as e:
        raise ModelFormatError(f"{label}: corrupt or truncated {what} ({type(e).__name__}: {e})") from None

__all__ = [
    "Limits", "limits", "get_limits", "verify", "check_shape", "check_call_graph",
    "check_byte_range", "read_rten_header", "check_flexbuffer", "SCHEMAS",
]


# --- limits ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Limits:
    """Bounds the verifier and the frontends enforce on untrusted files.

    Attributes:
        max_depth: deepest nesting of tables (RTen If/Loop bodies nest graphs).
        max_tables: tables + strings visited while walking the flatbuffer
            (C++ flatbuffers uses 1,000,000 too); bounds the object API's work.
        max_elements: elements of one tensor (its shape's product).
        max_rank: dimensions of one tensor.
        max_flex_elements: values decoded from one flexbuffer (custom options).
        max_sparse_elements: elements of one sparse constant once densified
            at load (the only load-time allocation whose size the file states
            rather than stores: a few bytes of metadata can claim billions).
    """

    max_depth: int = 64
    max_tables: int = 1_000_000
    max_elements: int = 2**31 - 1
    max_rank: int = 32
    max_flex_elements: int = 1_000_000
    max_sparse_elements: int = 1 << 24


_LIMITS = [Limits()]


def get_limits() -> Limits:
    """The limits in force (see :func:`limits`)."""
    return _LIMITS[-1]


@contextlib.contextmanager
def limits(**changes) -> Iterator[Limits]:
    """Temporarily change the limits: ``with limits(max_elements=2**24): ...``."""
    new = dataclasses.replace(get_limits(), **changes)
    _LIMITS.append(new)
    try:
        yield new
    finally:
        _LIMITS.remove(new)


# --- schema descriptions --------------------------------------------------

# scalar type name -> (struct format, size)
_SCALARS = {
    "bool": ("B", 1), "byte": ("b", 1), "ubyte": ("B", 1), "int8": ("b", 1), "uint8": ("B", 1),
    "short": ("h", 2), "ushort": ("H", 2), "int16": ("h", 2), "uint16": ("H", 2),
    "int": ("i", 4), "uint": ("I", 4), "int32": ("i", 4), "uint32": ("I", 4),
    "long": ("q", 8), "ulong": ("Q", 8), "int64": ("q", 8), "uint64": ("Q", 8),
    "float": ("f", 4), "double": ("d", 8), "float32": ("f", 4), "float64": ("d", 8),
}
_NP = {"b": "<i1", "B": "<u1", "h": "<i2", "H": "<u2", "i": "<i4", "I": "<u4", "q": "<i8", "Q": "<u8"}

#: schema name -> generated description module
SCHEMAS = {
    "tflite": "tflite_schema_desc",
    "rten": "rten_schema_desc",
    "stablehlo": "stablehlo_schema_desc",
    "gpu_cl_seed": "gpu_cl_seed_schema_desc",
    "gpu_cl_tf25": "gpu_cl_tf25_schema_desc",
    "gpu_cl_tf27": "gpu_cl_tf27_schema_desc",
    "gpu_cl_litert": "gpu_cl_litert_schema_desc",
    "tflite_metadata": "tflite_metadata_schema_desc",
    "litertlm_header": "litertlm_header_schema_desc",
}

# field kinds of the compiled plan
_K_SCALAR, _K_ENUM, _K_STRUCT, _K_STRING, _K_TABLE, _K_UNION = range(6)
_K_VSCALAR, _K_VENUM, _K_VSTRUCT, _K_VSTRING, _K_VTABLE = range(6, 11)


@dataclasses.dataclass
class _Field:
    name: str
    voffset: int  # offset of the field's slot in the vtable
    kind: int
    size: int  # inline size in the table
    align: int
    elem: int = 0  # vector element size
    fmt: str = ""  # struct format of a scalar / enum / vector element
    arg: Any = None  # table name, union members, enum value set
    required: bool = False
    type_voffset: int = 0  # union: slot of the _type field


class _Schema:
    """A schema description compiled into per-table verification plans."""

    def __init__(self, name: str, desc: Mapping):
        self.name = name
        self.root = desc["ROOT"]
        self.file_identifier = desc.get("FILE_IDENTIFIER")
        self.enums = {k: (fmt, frozenset(vals), bool(flags)) for k, (fmt, vals, flags) in desc["ENUMS"].items()}
        self.unions = {k: dict(v) for k, v in desc["UNIONS"].items()}
        self.structs = {k: (size, align) for k, (size, align, _f) in desc["STRUCTS"].items()}
        self._table_names = frozenset(desc["TABLES"])
        self.tables = {t: self._plan(t, fields) for t, fields in desc["TABLES"].items()}

    def _plan(self, table: str, fields) -> list:
        plan = []
        for name, slot, typ, flags in fields:
            if "deprecated" in flags:
                continue
            vo = 4 + 2 * slot
            req = "required" in flags
            f = None
            if typ.startswith("["):
                el = typ[1:-1]
                if el in _SCALARS:
                    fmt, sz = _SCALARS[el]
                    f = _Field(name, vo, _K_VSCALAR, 4, 4, sz, fmt)
                elif el in self.enums:
                    fmt, vals, bits = self.enums[el]
                    f = _Field(name, vo, _K_VENUM, 4, 4, struct.calcsize(fmt), fmt, (el, vals, bits))
                elif el == "string":
                    f = _Field(name, vo, _K_VSTRING, 4, 4, 4)
                elif el in self.structs:
                    f = _Field(name, vo, _K_VSTRUCT, 4, 4, self.structs[el][0])
                elif el in self._table_names:
                    f = _Field(name, vo, _K_VTABLE, 4, 4, 4, arg=el)
            elif typ in _SCALARS:
                fmt, sz = _SCALARS[typ]
                f = _Field(name, vo, _K_SCALAR, sz, sz, fmt=fmt)
            elif typ in self.enums:
                fmt, vals, bits = self.enums[typ]
                sz = struct.calcsize(fmt)
                f = _Field(name, vo, _K_ENUM, sz, sz, fmt=fmt, arg=(typ, vals, bits))
            elif typ == "string":
                f = _Field(name, vo, _K_STRING, 4, 4)
            elif typ in self.structs:
                size, align = self.structs[typ]
                f = _Field(name, vo, _K_STRUCT, size, align)
            elif typ in self.unions:
                # the union's _type field (slot - 1) is checked as an enum
                members = self.unions[typ]
                plan.append(_Field(name + "_type", vo - 2, _K_ENUM, 1, 1, fmt="B",
                                   arg=(typ, frozenset([0, *members]), False)))
                f = _Field(name, vo, _K_UNION, 4, 4, arg=(typ, members), required=req, type_voffset=vo - 2)
            elif typ in self._table_names:
                f = _Field(name, vo, _K_TABLE, 4, 4, arg=typ)
            if f is None:
                raise ValueError(f"schema {self.name}: {table}.{name} has unknown type {typ!r}")
            f.required = req
            plan.append(f)
        return plan


_COMPILED: dict[str, _Schema] = {}


def schema(name: str) -> _Schema:
    """The compiled description of schema ``name`` (``"tflite"``, ``"rten"``, ``"stablehlo"``)."""
    s = _COMPILED.get(name)
    if s is None:
        if name not in SCHEMAS:
            raise ValueError(f"unknown flatbuffer schema {name!r}; known: {', '.join(sorted(SCHEMAS))}")
        mod = importlib.import_module(f"._generated.{SCHEMAS[name]}", __package__)
        s = _COMPILED[name] = _Schema(name, vars(mod))
    return s


# --- the verifier ---------------------------------------------------------

_u8 = struct.Struct("<B").unpack_from
_u16 = struct.Struct("<H").unpack_from
_u32 = struct.Struct("<I").unpack_from
_i32 = struct.Struct("<i").unpack_from
_FMT = {c: struct.Struct("<" + c).unpack_from for c in "bBhHiIqQfd"}


class _Verifier:
    def __init__(self, buf, start: int, end: int, sch: _Schema, lim: Limits, unchecked_enums=frozenset()):
        self.buf = buf
        self.unchecked_enums = unchecked_enums
        self.start = start
        self.end = end
        self.size = end - start
        self.s = sch
        self.lim = lim
        self.count = 0
        self.path: list = []
        self.label = ""
        # Each table or string is reached through its own 4-byte offset unless
        # sub-tables are shared; the object API unpacks shared ones once per
        # reference, so more visits than offsets fit in the file means a DAG
        # built to blow up unpacking.
        self.max_visits = min(lim.max_tables, self.size // 4 + 16)

    # -- errors
    def where(self) -> str:
        out = self.s.root
        for p in self.path:
            out += f"[{p}]" if isinstance(p, int) else "." + p
        return out

    def fail(self, msg: str):
        raise ModelFormatError(f"{self.label}flatbuffer: {msg}")

    def cut(self, needed: int) -> str:
        """What a reference to byte ``needed`` (relative) past the end says: a
        file cut off before it (within the format's 2 GiB reach)."""
        if needed > 1 << 31:
            return ""
        return (f": the file looks truncated (it has {self.size:,} bytes; its offsets need at least {needed:,}: "
                "an interrupted download or copy?)")

    def rel(self, pos: int) -> str:
        return f"0x{pos - self.start:x}"

    def past_end(self, what: str, pos: int, n: int):
        self.fail(f"{what} at offset {self.rel(pos)} ({self.where()}) needs bytes up to "
                  f"{pos - self.start + n}, past the end of the {self.size}-byte file{self.cut(pos - self.start + n)}")

    # -- primitives
    def offset(self, pos: int) -> int:
        """Follow the uoffset stored at ``pos`` (already range-checked)."""
        o = _u32(self.buf, pos)[0]
        if o == 0:
            self.fail(f"offset at {self.rel(pos)} ({self.where()}) is zero")
        tgt = pos + o
        if tgt + 4 > self.end:
            self.fail(f"offset at {self.rel(pos)} ({self.where()}) points to {self.rel(tgt)}, "
                      f"past the end of the {self.size}-byte file{self.cut(tgt + 4 - self.start)}")
        return tgt

    def vector(self, pos: int, elem: int) -> tuple[int, int]:
        """(length, position of element 0) of the vector referenced at ``pos``."""
        v = self.offset(pos)
        if (v - self.start) & 3:
            self.fail(f"vector at offset {self.rel(v)} ({self.where()}) is misaligned")
        n = _u32(self.buf, v)[0]
        if v + 4 + n * elem > self.end:
            self.fail(f"vector at offset {self.rel(v)} ({self.where()}) has length {n}, "
                      f"past the end of the {self.size}-byte file{self.cut(v + 4 + n * elem - self.start)}")
        return n, v + 4

    def string(self, pos: int):
        self.count += 1
        if self.count > self.max_visits:
            self.too_many()
        v = self.offset(pos)
        if (v - self.start) & 3:
            self.fail(f"string at offset {self.rel(v)} ({self.where()}) is misaligned")
        n = _u32(self.buf, v)[0]
        if v + 4 + n + 1 > self.end:
            self.fail(f"string at offset {self.rel(v)} ({self.where()}) has length {n}, "
                      f"past the end of the {self.size}-byte file{self.cut(v + 5 + n - self.start)}")
        if self.buf[v + 4 + n] != 0:
            self.fail(f"string at offset {self.rel(v)} ({self.where()}) is not zero-terminated")

    def too_many(self):
        if self.max_visits < self.lim.max_tables:
            self.fail(f"more than {self.max_visits} tables and strings to unpack (at {self.where()}), more than "
                      f"the {self.size}-byte file has offsets for: sub-tables are shared to blow up unpacking")
        self.fail(f"more than {self.lim.max_tables} tables and strings to unpack (at {self.where()}); "
                  "the file is corrupt or shares sub-tables to blow up unpacking "
                  "(fbjax.formats.verify.limits(max_tables=...) raises the limit)")

    def bad_enum(self, f: _Field, value, typename: str, pos: int):
        self.fail(f"{self.where()} at offset {self.rel(pos)} has unknown {typename} value {value}")

    # -- tables
    def table(self, pos: int, tname: str, depth: int):
        self.count += 1
        if self.count > self.max_visits:
            self.too_many()
        if depth > self.lim.max_depth:
            self.fail(f"tables nest deeper than {self.lim.max_depth} levels at {self.where()}")
        buf, start, end = self.buf, self.start, self.end
        if pos < start or pos + 4 > end:
            self.past_end(f"table {tname}", pos, 4)
        if (pos - start) & 3:
            self.fail(f"table {tname} at offset {self.rel(pos)} ({self.where()}) is misaligned")
        vt = pos - _i32(buf, pos)[0]
        if vt < start or vt + 4 > end:
            self.fail(f"table {tname} at offset {self.rel(pos)} ({self.where()}) has its vtable at "
                      f"{vt - start:#x}, outside the {self.size}-byte file")
        if (vt - start) & 1:
            self.fail(f"vtable of {tname} at offset {self.rel(vt)} ({self.where()}) is misaligned")
        vsize, tsize = _u16(buf, vt)[0], _u16(buf, vt + 2)[0]
        if vsize < 4 or vsize & 1 or vt + vsize > end:
            self.fail(f"vtable of {tname} at offset {self.rel(vt)} ({self.where()}) has invalid size {vsize}")
        if tsize < 4 or pos + tsize > end:
            self.fail(f"table {tname} at offset {self.rel(pos)} ({self.where()}) has inline size {tsize}, "
                      f"past the end of the {self.size}-byte file" if tsize >= 4 else
                      f"table {tname} at offset {self.rel(pos)} ({self.where()}) has inline size {tsize} (< 4)")
        path = self.path
        for f in self.s.tables[tname]:
            fo = _u16(buf, vt + f.voffset)[0] if f.voffset < vsize else 0
            if fo == 0:
                if f.required:
                    path.append(f.name)
                    self.fail(f"required field {self.where()} is missing")
                if f.kind == _K_UNION and f.type_voffset < vsize:
                    to = _u16(buf, vt + f.type_voffset)[0]
                    utype = _u8(buf, pos + to)[0] if to else 0
                    if utype:
                        path.append(f.name)
                        self.fail(f"union {self.where()} has type {f.arg[1][utype]} but no value")
                continue
            path.append(f.name)
            if fo + f.size > tsize:
                self.fail(f"field {self.where()} at table offset {fo} lies outside the table's "
                          f"{tsize}-byte inline part")
            fp = pos + fo
            if (fp - start) & (f.align - 1):
                self.fail(f"field {self.where()} at offset {self.rel(fp)} is misaligned")
            k = f.kind
            if k == _K_ENUM and (tname, f.name) not in self.unchecked_enums:
                val = _FMT[f.fmt](buf, fp)[0]
                ename, vals, bits = f.arg
                if not (val in vals or (bits and val & ~_bitmask(vals) == 0)):
                    self.bad_enum(f, val, ename, fp)
            elif k == _K_TABLE:
                self.table(self.offset(fp), f.arg, depth + 1)
            elif k == _K_STRING:
                self.string(fp)
            elif k == _K_VSCALAR or k == _K_VSTRUCT:
                self.vector(fp, f.elem)
            elif k == _K_VTABLE:
                n, p0 = self.vector(fp, 4)
                for i in range(n):
                    path.append(i)
                    self.table(self.offset(p0 + 4 * i), f.arg, depth + 1)
                    path.pop()
            elif k == _K_UNION:
                utype = _u8(buf, pos + _u16(buf, vt + f.type_voffset)[0])[0] if f.type_voffset < vsize and \
                    _u16(buf, vt + f.type_voffset)[0] else 0
                if utype:
                    uname, members = f.arg
                    member = members.get(utype)
                    if member is None:  # the _type field was checked first; defensive
                        self.bad_enum(f, utype, uname, fp)
                    path[-1] = f"{f.name}<{member}>"
                    self.table(self.offset(fp), member, depth + 1)
            elif k == _K_VSTRING:
                n, p0 = self.vector(fp, 4)
                for i in range(n):
                    path.append(i)
                    self.string(p0 + 4 * i)
                    path.pop()
            elif k == _K_VENUM:
                n, p0 = self.vector(fp, f.elem)
                if n:
                    arr = np.frombuffer(buf, _NP[f.fmt], count=n, offset=p0)
                    ename, vals, bits = f.arg
                    if bits:
                        bad = arr[(arr.astype(np.int64) & ~_bitmask(vals)) != 0]
                    else:
                        bad = arr[~np.isin(arr, np.fromiter(vals, np.int64, len(vals)))]
                    if bad.size:
                        self.fail(f"{self.where()} (vector at {self.rel(p0 - 4)}) has unknown {ename} "
                                  f"value {int(bad[0])}")
            # _K_SCALAR, _K_STRUCT: inline, bounds checked above
            path.pop()


def _bitmask(vals) -> int:
    m = 0
    for v in vals:
        m |= int(v)
    return m


def verify(buf, schema_name: str = "tflite", *, start: int = 0, size: Optional[int] = None,
           limits: Optional[Limits] = None, label: Optional[str] = None,
           unchecked_enums: Iterable[tuple[str, str]] = ()) -> int:
    """Check that ``buf[start:start+size]`` is a well-formed flatbuffer of ``schema_name``.

    Call it before ``GetRootAs``/``InitFromObj``: after it passes, every
    offset and vector the generated bindings follow is inside the buffer and
    unpacking does bounded work.

    Args:
        buf: the bytes (``bytes``, ``memoryview``, ``mmap``...).
        schema_name: ``"tflite"``, ``"rten"`` or ``"stablehlo"``.
        start: where the flatbuffer begins in ``buf`` (RTen v2 embeds it
            after a header); offsets in messages are relative to it.
        size: its length (default: to the end of ``buf``).
        limits: override the :func:`get_limits` in force.
        label: prefix for messages (the file's path), e.g. ``"model.rten: "``.
        unchecked_enums: ``(table, field)`` pairs whose enum values are not
            checked (a writer known to fill them with garbage: TF 2.5's GPU
            delegate writes ``Texture2DDescriptor.normalized_type`` from
            uninitialised memory).

    Returns:
        the number of tables and strings visited.

    Raises:
        ModelFormatError: naming the offending location.
    """
    sch = schema(schema_name)
    lim = limits or get_limits()
    pre = f"{label}: " if label else ""
    total = len(buf)
    if size is None:
        size = total - start
    if start < 0 or size < 0 or start + size > total:
        raise ModelFormatError(f"{pre}flatbuffer: region {start}..{start + size} is outside the {total}-byte file")
    end = start + size
    if size < 8:
        raise ModelFormatError(f"{pre}flatbuffer: {size} bytes is too short for a {schema_name} flatbuffer")
    v = _Verifier(buf, start, end, sch, lim, frozenset(unchecked_enums))
    v.label = pre
    root = v.offset(start)
    v.table(root, sch.root, 0)
    return v.count


# --- semantic helpers shared by the frontends -----------------------------

def check_shape(shape: Sequence, where: str, *, allow_unknown: bool = True,
                limits: Optional[Limits] = None) -> int:
    """Check a tensor shape; return its element count (unknown dims count as 1).

    Raises:
        ModelFormatError: negative dims, rank or element count over the limits.
    """
    lim = limits or get_limits()
    if len(shape) > lim.max_rank:
        raise ModelFormatError(f"{where}: rank {len(shape)} exceeds the limit of {lim.max_rank}")
    n = 1
    for d in shape:
        if d is None:
            if not allow_unknown:
                raise ModelFormatError(f"{where}: shape {list(shape)} has an unknown dimension")
            continue
        d = int(d)
        if d < 0:
            raise ModelFormatError(f"{where}: negative dimension in shape {list(shape)}")
        n *= d
    if n > lim.max_elements:
        raise ModelFormatError(
            f"{where}: shape {list(shape)} has {n} elements, over the limit of {lim.max_elements} "
            "(fbjax.formats.verify.limits(max_elements=...) raises it)"
        )
    return n


def check_byte_range(offset: int, nbytes: int, file_size: int, where: str) -> None:
    """``offset .. offset + nbytes`` must lie inside a ``file_size``-byte file."""
    if offset < 0 or nbytes < 0 or offset + nbytes > file_size:
        raise ModelFormatError(
            f"{where}: bytes {offset}..{offset + nbytes} lie outside the {file_size}-byte file"
        )


def check_call_graph(n_graphs: int, calls: Iterable[tuple[int, int, str]], *, entry: int = 0) -> None:
    """Check subgraph references: every callee in range, no cycles.

    Args:
        n_graphs: number of subgraphs.
        calls: ``(caller, callee, location)`` triples, ``location`` naming the
            operator field (``"subgraph 0, operator 3 (WHILE): body_subgraph_index"``).

    Raises:
        ModelFormatError: a callee out of range, or a subgraph that
            (directly or indirectly) calls itself.
    """
    edges: dict[int, list] = {}
    for caller, callee, loc in calls:
        callee = int(callee)
        if not 0 <= callee < n_graphs:
            raise ModelFormatError(f"{loc} refers to subgraph {callee}, but the model has {n_graphs} subgraphs")
        edges.setdefault(caller, []).append((callee, loc))
    state = [0] * n_graphs  # 0 new, 1 on stack, 2 done
    for root in range(n_graphs):
        if state[root]:
            continue
        stack = [(root, iter(edges.get(root, ())))]
        state[root] = 1
        trail = [root]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                trail.pop()
                continue
            callee, loc = nxt
            if state[callee] == 1:
                cyc = trail[trail.index(callee):] + [callee]
                raise ModelFormatError(
                    f"{loc} calls subgraph {callee}, which is already on the call stack "
                    f"(cycle {' -> '.join(map(str, cyc))}); recursive subgraphs are not allowed"
                )
            if state[callee] == 0:
                state[callee] = 1
                trail.append(callee)
                stack.append((callee, iter(edges.get(callee, ()))))


RTEN_MAGIC = b"RTEN"
_RTEN_HEADER = struct.Struct("<4sIQQQ")


def read_rten_header(buf, label: str = "<bytes>") -> tuple[int, int, int, int]:
    """Parse and check an RTen file header.

    Returns:
        ``(version, model_offset, model_length, tensor_data_offset)``; for v1
        files (no ``RTEN`` magic) ``(1, 0, len(buf), 0)``.

    Raises:
        ModelFormatError: a v2 header whose offsets do not fit the file.
    """
    total = len(buf)
    if total < 4 or bytes(buf[:4]) != RTEN_MAGIC:
        return 1, 0, total, 0
    if total < _RTEN_HEADER.size:
        raise ModelFormatError(f"{label}: RTen header needs {_RTEN_HEADER.size} bytes, the file has {total}")
    _, version, moff, mlen, doff = _RTEN_HEADER.unpack_from(buf, 0)
    if version != 2:
        raise ModelFormatError(f"{label}: RTen header version {version} is not supported (expected 2)")
    if moff < _RTEN_HEADER.size or moff + mlen > total:
        raise ModelFormatError(
            f"{label}: RTen header: model at bytes {moff}..{moff + mlen} lies outside the {total}-byte file"
        )
    if doff > total:
        raise ModelFormatError(
            f"{label}: RTen header: tensor data offset {doff} is past the end of the {total}-byte file"
        )
    return version, moff, mlen, doff


# --- flexbuffers (TFLite custom options) ----------------------------------

def check_flexbuffer(raw: bytes, where: str = "custom options", limits: Optional[Limits] = None) -> None:
    """Bound the work of decoding a flexbuffer before ``flexbuffers.Loads``.

    Walks the value graph checking that every offset and vector stays inside
    ``raw``, nesting stays under ``max_depth`` and the total number of
    decoded values stays under ``max_flex_elements`` (shared vectors count
    once per reference: that is what decoding costs).

    Raises:
        ModelFormatError: the bytes are not a well-formed flexbuffer.
    """
    lim = limits or get_limits()
    n = len(raw)
    if n < 3:
        raise ModelFormatError(f"{where}: {n} bytes is too short for a flexbuffer")
    root_width = raw[-1]
    if root_width not in (1, 2, 4, 8) or n < root_width + 2:
        raise ModelFormatError(f"{where}: invalid flexbuffer root width {root_width}")
    packed = raw[-2]
    budget = [lim.max_flex_elements]

    def uint(pos, width):
        if pos < 0 or pos + width > n:
            raise ModelFormatError(f"{where}: flexbuffer read at {pos} past the end of its {n} bytes")
        return int.from_bytes(raw[pos:pos + width], "little")

    def walk(pos, parent_width, packed_type, depth, expect_size=None):
        # pos: where the value (or offset to it) sits, with parent's width
        budget[0] -= 1
        if budget[0] < 0:
            raise ModelFormatError(f"{where}: flexbuffer holds more than {lim.max_flex_elements} values")
        if depth > lim.max_depth:
            raise ModelFormatError(f"{where}: flexbuffer nests deeper than {lim.max_depth} levels")
        t = packed_type >> 2
        bw = 1 << (packed_type & 3)
        if t <= 3 or t == 26:  # NULL, INT, UINT, FLOAT, BOOL: inline
            return
        off = uint(pos, parent_width)
        tgt = pos - off
        if tgt < 0 or tgt > n:
            raise ModelFormatError(f"{where}: flexbuffer offset at {pos} points outside its {n} bytes")
        if t in (5, 25):  # STRING, BLOB: size prefix
            size = uint(tgt - bw, bw)
            if tgt + size > n:
                raise ModelFormatError(f"{where}: flexbuffer string at {tgt} runs past the end")
            return
        if t == 4:  # KEY: zero terminated
            if tgt >= n or raw.find(b"\0", tgt) < 0:
                raise ModelFormatError(f"{where}: flexbuffer key at {tgt} is not terminated")
            return
        if t in (6, 7, 8):  # INDIRECT_INT/UINT/FLOAT
            uint(tgt, bw)
            return
        if t in (9, 10):  # MAP, VECTOR: size prefix, values, then one type byte each
            size = uint(tgt - bw, bw)
            budget[0] -= size
            if budget[0] < 0:
                raise ModelFormatError(f"{where}: flexbuffer holds more than {lim.max_flex_elements} values")
            if tgt + size * bw + size > n:
                raise ModelFormatError(f"{where}: flexbuffer vector at {tgt} has {size} elements, past the end")
            if t == 9:  # the keys: a typed vector of KEY offsets
                kpos = tgt - 3 * bw
                kbw = uint(tgt - 2 * bw, bw)
                if kbw not in (1, 2, 4, 8):
                    raise ModelFormatError(f"{where}: flexbuffer map at {tgt} has key width {kbw}")
                walk(kpos, bw, (14 << 2) | (kbw.bit_length() - 1), depth + 1, size)
            for i in range(size):
                walk(tgt + i * bw, bw, raw[tgt + size * bw + i], depth + 1)
            return
        if 11 <= t <= 24 or t == 36:  # typed vectors (sized) and fixed-size vectors of scalars
            size = (t - 16) // 3 + 2 if 16 <= t <= 24 else uint(tgt - bw, bw)
            if expect_size is not None and size != expect_size:
                raise ModelFormatError(f"{where}: flexbuffer map has {expect_size} values but {size} keys")
            budget[0] -= size
            if budget[0] < 0:
                raise ModelFormatError(f"{where}: flexbuffer holds more than {lim.max_flex_elements} values")
            if tgt + size * bw > n:
                raise ModelFormatError(f"{where}: flexbuffer vector at {tgt} has {size} elements, past the end")
            if t in (14, 15):  # vectors of keys / strings: follow each
                for i in range(size):
                    walk(tgt + i * bw, bw, ((4 if t == 14 else 5) << 2) | (packed_type & 3 if t == 15 else 0),
                         depth + 1)
            return
        raise ModelFormatError(f"{where}: unknown flexbuffer type {t}")

    walk(n - 2 - root_width, root_width, packed, 0)
