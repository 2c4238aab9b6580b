"""Write docs/tflite_coverage.md from fbjax's registries (run by `nox -s coverage_table`).

Every TFLite ``BuiltinOperator`` code gets one row: whether
:data:`fbjax.lower.LOWERINGS` has a lowering, whether
:data:`fbjax.reference.REFERENCE` has a numpy twin, whether a converter-made
fixture exercises it (the ``op`` field of the test manifests under
``tests/data/tflite_builtins``), or why it is excluded. Nothing in the table
is typed by hand except the exclusion reasons below.

    python scripts/coverage_table.py [--check]

``--check`` exits 1 when the committed table is out of date.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "docs" / "tflite_coverage.md"
MANIFESTS = [ROOT / "tests" / "data" / "tflite_builtins" / "manifest.json"]
QUANT_OPS_DIR = ROOT / "tests" / "data" / "quant" / "ops"

#: Issue 3's scope: codes below 162 plus these.
EXTRA_IN_SCOPE = {203: "DILATE", 205: "REDUCE_WINDOW"}

#: Custom codes issue 3 asks for (rows appear even while not implemented).
MEDIAPIPE_TODO = ["TFLite_Detection_PostProcess", "MaxPoolingWithArgmax2D", "MaxUnpooling2D",
                  "Landmarks2TransformMatrix", "TransformLandmarks", "TransformTensorBilinear"]

RANDOM_OPS = {"RANDOM_STANDARD_NORMAL", "RANDOM_UNIFORM", "MULTINOMIAL"}

#: In-range codes that are not numeric-tensor operators, with the reason.
EXCLUDED = {
    "SKIP_GRAM": "operates on strings",
    "HASHTABLE": "string hash table resource",
    "HASHTABLE_FIND": "string hash table resource",
    "HASHTABLE_IMPORT": "string hash table resource",
    "HASHTABLE_SIZE": "string hash table resource",
    "CUSTOM": "not an operator: marks custom ops, which are listed by custom code below",
    "DELEGATE": "not an operator: placeholder for delegate kernels, never in a model file",
    "PLACEHOLDER_FOR_GREATER_OP_CODES": "not an operator: marks the switch to deprecated_builtin_code",
    "CONCAT_EMBEDDINGS": "no TFLite kernel exists for this code (the runtime cannot run it either)",
}



#: Ops whose output is quantized by definition: lowered only in "tflite.int".
QUANTIZED_OUTPUT_OPS = {"QUANTIZE"}

def builtin_codes() -> dict[int, str]:
    from fbjax.formats._generated import tflite_generated as T

    return {v: k for k, v in vars(T.BuiltinOperator).items() if not k.startswith("_") and isinstance(v, int)}


def tested_ops() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for m in MANIFESTS:
        if m.exists():
            for case, spec in json.loads(m.read_text()).items():
                # the op under test first, then every other op of the compared model
                out.setdefault(spec["op"], []).insert(0, case)
                for op in spec.get("ops", []):
                    if op != spec["op"] and case not in out.setdefault(op, []):
                        out[op].append(case)
    # Ops that exist only on the quantized path are tested by the per-op
    # quantized fixtures (tests/test_tflite_quant.py compares each with LiteRT).
    from fbjax.formats import read_model

    for path in sorted(QUANT_OPS_DIR.glob("*.tflite")):
        names = {n.op_name for n in read_model(str(path)).main_graph.nodes}
        for op in sorted(names & QUANTIZED_OUTPUT_OPS):
            out.setdefault(op, []).append(f"quant/{path.stem}")
    return out


#: Custom ops that LiteRT has no kernel for, tested against the numpy reference and
#: transcriptions of the published formulas (tests/test_tflite_mediapipe_ops.py): the
#: ``COVERED_CUSTOM_OPS`` tuple of the tests' helper module.
NO_LITERT_TESTS = ROOT / "tests" / "helpers.py"
#: the test module that checks them (what the table names)
NO_LITERT_TEST_MODULE = "tests/test_tflite_mediapipe_ops.py"


def tested_without_litert() -> set[str]:
    import ast

    if not NO_LITERT_TESTS.exists():
        return set()
    for node in ast.parse(NO_LITERT_TESTS.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "COVERED_CUSTOM_OPS" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def build_table() -> str:
    import fbjax.lower  # noqa: F401  registers the lowerings
    import fbjax.reference  # noqa: F401  registers the reference twins
    from fbjax.lower.registry import LOWERINGS
    from fbjax.reference.registry import REFERENCE

    codes = builtin_codes()
    tested = tested_ops()
    rows, n_scope, n_low, n_ref, n_test, n_excl = [], 0, 0, 0, 0, 0
    done = 0
    for code in sorted(codes):
        name = codes[code]
        in_range = code < 162 or code in EXTRA_IN_SCOPE
        # QUANTIZE always produces a quantized tensor, so fbjax.load routes it to
        # the integer op set (exact mode) or to fake quantization (float mode).
        via_int = name in QUANTIZED_OUTPUT_OPS and ("tflite.int", name) in LOWERINGS
        low = ("tflite", name) in LOWERINGS or via_int
        ref = ("tflite", name) in REFERENCE
        tst = name in tested
        if name in EXCLUDED:
            status = f"excluded: {EXCLUDED[name]}"
            n_excl += 1
        elif in_range:
            n_scope += 1
            n_low += low
            n_ref += ref
            n_test += tst
            done += low and ref and tst
            status = "in scope"
            if not low:
                status += " — NOT LOWERED"
                if ("tflite.int", name) in LOWERINGS:
                    status += " on the float path (quantized path only: op set `tflite.int`)"
            elif via_int:
                status += "; lowered in op set `tflite.int` (its output is always quantized)"
            elif name in RANDOM_OPS:
                status += "; tested statistically (PRNG key differs from LiteRT's Philox stream)"
        else:
            status = "outside issue 3 (StableHLO / later codes)"
        mark = lambda b: "yes" if b else "—"  # noqa: E731
        cases = ", ".join(f"`{c}`" for c in tested.get(name, [])[:3])
        rows.append(f"| {code} | `{name}` | {mark(low)} | {mark(ref)} | {mark(tst)} {cases} | {status} |")

    custom_low = sorted(n for s, n in (o.key for o in LOWERINGS) if s == "tflite.custom")
    no_litert = tested_without_litert()

    def custom_tested(n):
        if n in tested:
            return "yes " + ", ".join(f"`{c}`" for c in tested[n][:3])
        if n in no_litert:
            return (f"yes `{NO_LITERT_TEST_MODULE}` (no LiteRT kernel: "
                    "numpy reference and formula transcriptions)")
        own = ROOT / "tests" / f"test_tflite_{n.lower()}.py"  # an op with a test module of its own
        if own.exists():
            return f"yes `{own.relative_to(ROOT).as_posix()}` (no LiteRT kernel: its oracle is named there)"
        return "—"

    custom_rows = [f"| `{n}` | yes | {'yes' if ('tflite.custom', n) in REFERENCE else '—'} | {custom_tested(n)} |"
                   for n in custom_low]
    custom_rows += [f"| `{n}` | — | — | — (not implemented) |" for n in MEDIAPIPE_TODO if n not in custom_low]
    head = [
        "# TFLite operator coverage",
        "",
        "Generated by `nox -s coverage_table` (`scripts/coverage_table.py`) from fbjax's lowering and",
        "reference registries and the converter-made test fixtures; do not edit by hand.",
        "",
        f"In scope (issue 3: builtin codes below 162, plus DILATE and REDUCE_WINDOW, minus exclusions): "
        f"**{n_scope}**. Lowered: **{n_low}**. With a numpy reference: **{n_ref}**. "
        f"Tested against LiteRT with a fixture: **{n_test}**. "
        f"Lowered, referenced and tested: **{done}**. Excluded: **{n_excl}**.",
        "",
        "*Tested* means a fixture in `tests/data/tflite_builtins/manifest.json` whose main graph contains",
        "the op -- written by TensorFlow's converter, or by `fbjax.formats.tflite_builder` for ops the converter never",
        "emits (`made_by` in the manifest) -- is compared with LiteRT (numpy for CALL, which LiteRT",
        "cannot run) by",
        "`tests/test_tflite_builtins.py` / `tests/test_tflite_control.py`; ops tested only by",
        "hand-built models in other test files are not counted here, except QUANTIZE, whose output",
        "is always quantized: it is tested by the converter-made per-op fixtures in",
        "`tests/data/quant/ops/` (`tests/test_tflite_quant.py`, bit-exact against LiteRT).",
        "",
        "| code | op | lowered | reference | tested (fixtures) | status |",
        "|---:|---|:-:|:-:|---|---|",
    ]
    tail = ["", "## Custom ops (`tflite.custom`)", "",
            "Issue 3 also names the custom codes below; users add others with `fbjax.register_custom_op`.", "",
            "| custom code | lowered | reference | tested (fixtures) |", "|---|:-:|:-:|---|"]
    return "\n".join(head + rows + tail + custom_rows) + "\n"


def main(argv) -> int:
    text = build_table()
    if "--check" in argv:
        cur = OUT.read_text() if OUT.exists() else ""
        if cur != text:
            print(f"{OUT} is out of date; run `nox -s coverage_table`")
            return 1
        return 0
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {os.path.relpath(OUT, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
