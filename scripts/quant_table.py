"""Print the per-model figures of the quantized TFLite fixtures (issue 4).

For every whole-model fixture with integer activations (tests/data/quant
and tests/data/quant_aeq, plus their uncommitted extra/ folders when
present): "exact" is the fraction of output elements equal to LiteRT's
builtin kernels (BUILTIN_WITHOUT_DEFAULT_DELEGATES), "float" the fraction of
the float (fake-quantized) mode's outputs within one output quantization
step of the dequantized oracle (the issue's figure) and "float =" the fraction
equal to it; seeds 0-2, the same helpers the tests use.

    PYTHONPATH=. python scripts/quant_table.py
"""

import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
warnings.filterwarnings("ignore")

import test_tflite_quant as T  # noqa: E402


def main() -> None:
    paths = [p for p in T.MODELS + T.EXTRA if T._setting(T._stem(p)) in ("int8", "uint8", "int16x8")]
    paths += [p for p in T.AEQ + T.AEQ_EXTRA if any(r in p.stem for r in ("a8w8", "a16w8"))]
    print("| model | exact | float (within one step) | float = |")
    print("|---|---|---|---|")
    for p in paths:
        st = T._stem(p)
        if st in T.ORACLE_FAILS:
            print(f"| {st} | no oracle: {T.ORACLE_FAILS[st]} | | |")
            continue
        cells = []
        for fn in (T.exact_fraction, T.float_within_one_step, lambda q: T.float_within_one_step(q, steps=0)):
            try:
                cells.append(f"{fn(p) * 100:.2f}%")
            except Exception as e:  # noqa: BLE001 - report, keep going
                cells.append(f"error: {type(e).__name__}: {str(e)[:80]}")
        print(f"| {st} | {cells[0]} | {cells[1]} | {cells[2]} |", flush=True)


if __name__ == "__main__":
    main()
