"""Print the composite figures (issue 26, item 4): fused against decomposed.

For every fixture with litert-torch composites (tests/data/llm/*.tflite,
tests/data/composites/*.tflite): the largest ``|a - b| / max(1, |b|)``
between ``fbjax.load(..., composites="fused")`` and ``"decomposed"`` over
every output of every signature, and, for the composites fixtures, each mode
against the recorded PyTorch, LiteRT builtin-kernel and XNNPACK outputs.
Then llama_f32's CPU call times in both modes, side by side in one run
(best of 7 rounds of 100 calls; on a shared machine only the ratio means
anything, and little below 1.2x).

    PYTHONPATH=. python scripts/composites_table.py
"""

import time
import warnings
from pathlib import Path

import jax
import numpy as np

import fbjax

warnings.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parent.parent / "tests" / "data"


def err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b))))


def io(npz: Path, key: str, tag: str = "in") -> dict:
    z = np.load(npz)
    return {k.split("/")[-1]: z[k] for k in z.files if k.startswith(f"{key}/{tag}/")}


def main() -> None:
    for path in sorted((ROOT / "llm").glob("*.tflite")):
        ms = {m: fbjax.load(path, composites=m) for m in ("fused", "decomposed")}
        for key in ms["fused"].ir.signatures:
            ins = io(path.with_suffix(".npz"), key)
            f, d = ms["fused"].signature(key)(**ins), ms["decomposed"].signature(key)(**ins)
            print(f"{path.stem:12s} {key:10s} fused vs decomposed {max(err(f[k], d[k]) for k in d):.2e}")
    for name in ("mqa", "gqa_softcap"):
        path = ROOT / "composites" / f"{name}.tflite"
        for mode in ("litert", "fused", "decomposed"):
            m = fbjax.load(path, composites=mode)
            for key in m.ir.signatures:
                got = m.signature(key)(**io(path.with_suffix(".npz"), key))
                vs = " ".join(f"vs {t} {max(err(got[k], io(path.with_suffix('.npz'), key, t)[k]) for k in got):.2e}"
                              for t in ("torch", "builtin", "xnnpack"))
                print(f"{name:12s} {mode:10s} {key:9s} {vs}")
    path = ROOT / "composites" / "group_norm.tflite"
    z = np.load(path.with_suffix(".npz"))
    for mode in ("litert", "fused", "decomposed"):
        got = fbjax.load(path, composites=mode)(z["in"])
        print(f"group_norm   {mode:10s} " + " ".join(f"vs {t} {err(got, z[t]):.2e}" for t in ("torch", "builtin", "xnnpack")))
    path = ROOT / "llm" / "llama_f32.tflite"
    for key in ("prefill_16", "decode"):
        ins = io(path.with_suffix(".npz"), key)
        runs = {m: fbjax.load(path, composites=m).signature(key) for m in ("fused", "decomposed")}
        for r in runs.values():
            jax.block_until_ready(r(**ins))
        t = {m: [] for m in runs}
        for _ in range(7):
            for m, r in runs.items():
                t0 = time.perf_counter()
                for _ in range(100):
                    out = r(**ins)
                jax.block_until_ready(out)
                t[m].append((time.perf_counter() - t0) / 100)
        best = {m: min(v) for m, v in t.items()}
        print(f"llama_f32 {key}: fused {best['fused'] * 1e3:.3f} ms, decomposed {best['decomposed'] * 1e3:.3f} ms, "
              f"decomposed/fused {best['decomposed'] / best['fused']:.2f}")


if __name__ == "__main__":
    main()
