"""The ``.fbs`` parser that generates the schema descriptions the flatbuffer
verifier (:mod:`fbjax.formats.verify`) walks files with
(``fbjax/formats/_generated/<name>_schema_desc.py``). A tool of the
repository, run by ``nox -s schemas``::

    python tools/schema_desc.py schemas/tflite.fbs fbjax/formats/_generated/tflite_schema_desc.py

The package only reads the generated modules; tests check that they equal
a fresh parse (``tests/test_robustness.py``).
"""

from __future__ import annotations

import argparse
import pprint
import re
import struct
import sys

from fbjax.formats.verify import _SCALARS  # the scalar sizes the verifier uses

__all__ = ["parse_fbs", "render_description", "main"]

_TOKEN = re.compile(r'\s+|//[^\n]*|/\*.*?\*/|"(?:[^"\\]|\\.)*"|[A-Za-z_][\w.]*|-?[\d.][\w.+-]*|.', re.S)


def _tokens(text: str) -> list[str]:
    return [t for t in _TOKEN.findall(text) if t.strip() and not t.startswith(("//", "/*"))]


def parse_fbs(text: str) -> dict:
    """Parse a flatbuffers schema into the description :func:`verify` uses.

    Handles what TFLite/RTen/StableHLO schemas use: ``namespace``,
    ``include``, ``attribute``, ``file_identifier``/``file_extension``,
    ``enum``, ``union``, ``table``, ``struct`` (with fixed arrays),
    ``root_type``, field defaults and attributes (``id``, ``deprecated``,
    ``required``, ``bit_flags``).

    Returns:
        ``{"ROOT", "FILE_IDENTIFIER", "ENUMS", "UNIONS", "STRUCTS", "TABLES"}``.
    """
    toks = _tokens(text)
    i = 0
    enums: dict = {}
    unions: dict = {}
    structs_raw: dict = {}
    tables: dict = {}
    out: dict = {"ROOT": None, "FILE_IDENTIFIER": None}

    def expect(tok):
        nonlocal i
        if toks[i] != tok:
            raise ValueError(f"fbs parse error: expected {tok!r}, got {toks[i]!r} (token {i})")
        i += 1

    def attrs():
        nonlocal i
        found = {}
        if i < len(toks) and toks[i] == "(":
            i += 1
            while toks[i] != ")":
                key = toks[i].strip('"')
                i += 1
                val = None
                if toks[i] == ":":
                    val = toks[i + 1].strip('"')
                    i += 2
                found[key] = val
                if toks[i] == ",":
                    i += 1
            i += 1
        return found

    def typ():
        nonlocal i
        if toks[i] == "[":
            inner = toks[i + 1]
            i += 2
            if toks[i] == ":":  # fixed array in a struct
                n = int(toks[i + 1])
                i += 2
                expect("]")
                return ("array", inner, n)
            expect("]")
            return f"[{_base(inner)}]"
        t = toks[i]
        i += 1
        return _base(t)

    while i < len(toks):
        t = toks[i]
        if t in ("namespace", "include", "attribute", "file_extension"):
            while toks[i] != ";":
                i += 1
            i += 1
        elif t == "file_identifier":
            out["FILE_IDENTIFIER"] = toks[i + 1].strip('"')
            i += 3
        elif t == "root_type":
            out["ROOT"] = _base(toks[i + 1])
            i += 3
        elif t == "enum":
            name = toks[i + 1]
            i += 2
            expect(":")
            under = toks[i]
            i += 1
            a = attrs()
            expect("{")
            vals, nxt = [], 0
            bits = "bit_flags" in a
            while toks[i] != "}":
                i += 1  # member name
                if toks[i] == "=":
                    nxt = int(toks[i + 1], 0)
                    i += 2
                attrs()
                vals.append((1 << nxt) if bits else nxt)
                nxt += 1
                if toks[i] == ",":
                    i += 1
            i += 1
            enums[name] = (_SCALARS[under][0], tuple(sorted(vals)), bits)
        elif t == "union":
            name = toks[i + 1]
            i += 2
            attrs()
            expect("{")
            members, nxt = {}, 1
            while toks[i] != "}":
                member = toks[i]
                i += 1
                if toks[i] == ":":
                    member = toks[i + 1]
                    i += 2
                if toks[i] == "=":
                    nxt = int(toks[i + 1], 0)
                    i += 2
                members[nxt] = _base(member)
                nxt += 1
                if toks[i] == ",":
                    i += 1
            i += 1
            unions[name] = members
        elif t in ("table", "struct"):
            name = toks[i + 1]
            i += 2
            a_decl = attrs()
            expect("{")
            fields = []
            while toks[i] != "}":
                fname = toks[i]
                i += 1
                expect(":")
                ftype = typ()
                if toks[i] == "=":
                    i += 2
                a = attrs()
                expect(";")
                fields.append((fname, ftype, a))
            i += 1
            if t == "table":
                tables[name] = fields
            else:
                structs_raw[name] = (fields, a_decl)
        elif t == ";":
            i += 1
        else:
            raise ValueError(f"fbs parse error: unexpected {t!r} (token {i})")

    # structs: size and alignment
    structs: dict = {}

    def struct_layout(sname):
        if sname in structs:
            return structs[sname][:2]
        fields, a_decl = structs_raw[sname]
        off, align = 0, 1
        for fname, ftype, _ in fields:
            n = 1
            if isinstance(ftype, tuple):
                _, ftype, n = ftype
            if ftype in _SCALARS:
                sz = al = _SCALARS[ftype][1]
            elif ftype in enums:
                sz = al = struct.calcsize(enums[ftype][0])
            else:
                sz, al = struct_layout(ftype)
            off = (off + al - 1) // al * al + sz * n
            align = max(align, al)
        if "force_align" in a_decl:
            align = max(align, int(a_decl["force_align"]))
        size = (off + align - 1) // align * align
        structs[sname] = (size, align, tuple(f[0] for f in fields))
        return size, align

    for s in structs_raw:
        struct_layout(s)

    out_tables = {}
    for tname, fields in tables.items():
        explicit = any("id" in a for _, _, a in fields)
        slot = 0
        entries = []
        for fname, ftype, a in fields:
            is_union = isinstance(ftype, str) and ftype in unions
            if explicit:
                if "id" not in a:
                    raise ValueError(f"{tname}.{fname}: all fields need an id once one has")
                s = int(a["id"])
            else:
                s = slot + 1 if is_union else slot
                slot += 2 if is_union else 1
            flags = tuple(sorted(k for k in ("deprecated", "required") if k in a))
            entries.append((fname, s, ftype, flags))
        out_tables[tname] = tuple(entries)
    out["ENUMS"] = enums
    out["UNIONS"] = unions
    out["STRUCTS"] = structs
    out["TABLES"] = out_tables
    if out["ROOT"] is None:
        raise ValueError("fbs has no root_type")
    return out


def _base(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def render_description(desc: dict, source: str) -> str:
    """Python source of a schema description module."""
    lines = [
        f'"""Schema description of {source} for fbjax.formats.verify.',
        "",
        "Generated by `nox -s schemas` (python tools/schema_desc.py). Do not edit.",
        "TABLES: table -> ((field, vtable slot, type, flags), ...); a union field's",
        "_type lives in the slot before it. ENUMS: name -> (struct format, values, bit_flags).",
        '"""',
        "",
    ]
    for key in ("ROOT", "FILE_IDENTIFIER", "ENUMS", "UNIONS", "STRUCTS", "TABLES"):
        lines.append(f"{key} = {pprint.pformat(desc[key], width=110, compact=True)}")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    """``python tools/schema_desc.py SCHEMA.fbs OUT.py``: write the description module."""
    p = argparse.ArgumentParser(prog="python tools/schema_desc.py",
                                description="Write the schema description fbjax's flatbuffer verifier reads.")
    p.add_argument("fbs", help="the flatbuffers schema (schemas/NAME.fbs)")
    p.add_argument("out", help="the Python module to write (fbjax/formats/_generated/NAME_schema_desc.py)")
    args = p.parse_args(argv)
    with open(args.fbs) as f:
        desc = parse_fbs(f.read())
    with open(args.out, "w") as f:
        f.write(render_description(desc, args.fbs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
