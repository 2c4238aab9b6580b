"""Mutation fuzzer for fbjax's model readers (TFLite, RTen, StableHLO, GPU-delegate ``.bin``, bundles).

Each case takes a seed model (:mod:`fuzz_corpus`), applies 1-4 mutations
(bit flips, byte/u16/u32/u64 overwrites with boundary values, truncation,
insertion/deletion, offset corruption, swapped or duplicated tables and
blocks, splices from another seed) and loads the result the way a user
does, with ``fbjax.load`` (``--load full``, the default: the reader, the
passes, the lowering, the load-time abstract trace and the constants
computed ahead of the first call), or with ``fbjax.loading.read`` (reader +
read step) + ``fbjax.lower.build.build`` only (``--load parse``: faster, but blind to
what happens after the lowering is built). Allowed outcomes: a successful
load, ``ModelFormatError``, ``UnsupportedOperatorError`` or ``InputError``
(a model fbjax cannot bind at its file's shapes). Anything else is a crash;
a case taking more than ``--case-timeout`` seconds (default 10; bundles
:data:`TIMEOUT_SCALE` times that: 60 s) is a hang.

LLM bundles (``bundle``: the whole file mutated; ``bundle_model``: only the
model section, packed back into its container by
:func:`fuzz_corpus.repack`) that load are then asked for 2 tokens
(``generate("hi", max_new_tokens=2)``, which traces, compiles and runs the
prefill and decode signatures): an error there must be fbjax's own too
(counted under the same outcomes, its message class prefixed ``generate:``).
The report names the slowest case of each format (``slowest``: case
number, seed model, outcome, seconds) for ``--repro``.

Watchdogs: each case runs under ``signal.setitimer`` (a Python-level hang is
interrupted and reported), and the cases run in worker subprocesses that the
parent kills when they overrun (a hang inside C code, or a segfault, is
reported with the input that caused it, not a blocked run).

Usage::

    python tests/fuzz/fuzz_harness.py --seconds 60              # all formats
    python tests/fuzz/fuzz_harness.py --seconds 3600 --strict --json out.json
    python tests/fuzz/fuzz_harness.py --repro tflite:1234 --seed 0

``--strict`` makes the TFLite reader re-raise instead of wrapping the stray
exceptions its last-resort handler catches, so those show up as crashes.
Cases are deterministic in (``--seed``, format, case number).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

#: ``bundle``: the containers fbjax.load opens (LiteRT-LM .litertlm, MediaPipe LLM and vision .task),
#: loaded with the format detected (a vision bundle's members are each loaded too)
#: ``bundle_model``: an LLM bundle whose model section alone is mutated (:func:`fuzz_corpus.repack`)
FORMATS = ("tflite", "rten", "stablehlo", "gpu_cl", "bundle", "bundle_model")
CASE_TIMEOUT = 10.0
#: case timeout multiples per format: an LLM bundle that loads is also compiled and run (2 tokens): the int8
#: bundle's load and generate take ~8 s on an idle 2-core machine, 15-30 s at a load average of 10
TIMEOUT_SCALE = {"bundle": 6.0, "bundle_model": 6.0}
#: the prompt and token count of the generation after an LLM bundle's load
GENERATE_PROMPT, GENERATE_TOKENS = "hi", 2


def format_timeout(fmt: str, case_timeout: float) -> float:
    """The case timeout of ``fmt``: ``case_timeout`` times its :data:`TIMEOUT_SCALE`."""
    return case_timeout * TIMEOUT_SCALE.get(fmt, 1.0)

INTERESTING32 = [0, 1, 2, 3, 4, 8, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x10000,
                 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF]
INTERESTING16 = [0, 1, 2, 4, 6, 8, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFE, 0xFFFF]


# --- mutators --------------------------------------------------------------------

def _offset_slots(data: bytes) -> list[int]:
    """4-aligned positions whose u32 looks like a forward flatbuffer offset."""
    n = len(data)
    out = []
    for pos in range(0, n - 3, 4):
        v = int.from_bytes(data[pos:pos + 4], "little")
        if 4 <= v < n - pos and v % 4 == 0:
            out.append(pos)
    return out


class Mutator:
    def __init__(self, seeds):
        self.seeds = seeds
        self._slots = {}

    def slots(self, idx: int) -> list[int]:
        if idx not in self._slots:
            self._slots[idx] = _offset_slots(self.seeds[idx][2])
        return self._slots[idx]

    def mutate(self, rng: random.Random, idx: int) -> tuple[bytes, list[str]]:
        b = bytearray(self.seeds[idx][2])
        names = []
        for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4))):
            if len(b) < 8:
                break
            fn = rng.choice(self.MUTATIONS)
            names.append(fn.__name__[2:])
            fn(self, rng, b, idx)
        return bytes(b), names

    # each m_* mutates b in place
    def m_bitflip(self, rng, b, idx):
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)

    def m_byte(self, rng, b, idx):
        b[rng.randrange(len(b))] = rng.choice((0, 1, 0x7F, 0x80, 0xFE, 0xFF, rng.randrange(256)))

    def m_u16(self, rng, b, idx):
        i = rng.randrange(0, len(b) - 1) & ~1
        cur = int.from_bytes(b[i:i + 2], "little")
        v = rng.choice(INTERESTING16 + [(cur + rng.choice((-4, -2, 2, 4))) & 0xFFFF, rng.randrange(1 << 16)])
        b[i:i + 2] = v.to_bytes(2, "little")

    def m_u32(self, rng, b, idx):
        i = rng.randrange(0, len(b) - 3) & ~3
        cur = int.from_bytes(b[i:i + 4], "little")
        v = rng.choice(INTERESTING32 + [len(b), len(b) - i, len(b) - i - 4, (cur + rng.randint(-16, 16)) & 0xFFFFFFFF,
                                        rng.randrange(1 << 32), cur * 2 & 0xFFFFFFFF])
        b[i:i + 4] = v.to_bytes(4, "little")

    def m_u64(self, rng, b, idx):
        if len(b) < 16:
            return
        i = rng.randrange(0, len(b) - 7) & ~7
        v = rng.choice((0, 1, 2, len(b), len(b) + 1, 1 << 31, 1 << 32, 1 << 63, (1 << 64) - 1, rng.randrange(1 << 64)))
        b[i:i + 8] = v.to_bytes(8, "little")

    def m_truncate(self, rng, b, idx):
        del b[rng.randrange(1, len(b)):]

    def m_insert(self, rng, b, idx):
        i = rng.randrange(len(b))
        n = rng.choice((1, 2, 4, 8, 16))
        b[i:i] = bytes(rng.randrange(256) for _ in range(n)) if rng.random() < 0.5 else bytes(n)

    def m_delete(self, rng, b, idx):
        i = rng.randrange(len(b))
        del b[i:i + rng.choice((1, 2, 4, 8, 16, 64))]

    def m_offset(self, rng, b, idx):
        """Corrupt a (likely) flatbuffer offset: nudge it, aim it elsewhere or past the end."""
        slots = [s for s in self.slots(idx) if s + 4 <= len(b)]
        if not slots:
            return self.m_u32(rng, b, idx)
        i = rng.choice(slots)
        cur = int.from_bytes(b[i:i + 4], "little")
        v = rng.choice((cur + rng.choice((-8, -4, -2, -1, 1, 2, 4, 8)), rng.randrange(max(1, len(b) - i)),
                        len(b) - i, len(b) - i - 2, 0, 0x7FFFFFFF, 0xFFFFFFFF, cur + (1 << 31)))
        b[i:i + 4] = (v & 0xFFFFFFFF).to_bytes(4, "little")

    def m_table_swap(self, rng, b, idx):
        """Swap the targets of two offsets (swapped tables/vectors), or aim one
        at the other's target (a duplicated, shared table)."""
        slots = [s for s in self.slots(idx) if s + 4 <= len(b)]
        if len(slots) < 2:
            return self.m_u32(rng, b, idx)
        i, j = rng.sample(slots, 2)
        ti = i + int.from_bytes(b[i:i + 4], "little")
        tj = j + int.from_bytes(b[j:j + 4], "little")
        dup = rng.random() < 0.4
        if tj - i > 0:
            b[i:i + 4] = ((tj - i) & 0xFFFFFFFF).to_bytes(4, "little")
        if not dup and ti - j > 0:
            b[j:j + 4] = ((ti - j) & 0xFFFFFFFF).to_bytes(4, "little")

    def m_block_swap(self, rng, b, idx):
        n = rng.choice((4, 8, 16, 32, 64))
        if len(b) < 2 * n + 8:
            return
        i = rng.randrange(0, len(b) - n) & ~3
        j = rng.randrange(0, len(b) - n) & ~3
        bi, bj = bytes(b[i:i + n]), bytes(b[j:j + n])
        b[i:i + n], b[j:j + n] = bj, bi

    def m_block_dup(self, rng, b, idx):
        n = rng.choice((4, 8, 16, 32, 64, 256))
        if len(b) < n + 8:
            return
        i = rng.randrange(0, len(b) - n) & ~3
        j = rng.randrange(0, len(b) - n) & ~3
        b[j:j + n] = bytes(b[i:i + n])

    def m_splice(self, rng, b, idx):
        fmt = self.seeds[idx][1]
        others = [s[2] for s in self.seeds if s[1] == fmt]
        o = rng.choice(others)
        n = rng.choice((8, 16, 64, 256))
        if len(o) < n or len(b) < n:
            return
        i = rng.randrange(0, len(o) - n + 1) & ~3
        j = rng.randrange(0, len(b) - n + 1) & ~3
        b[j:j + n] = o[i:i + n]

    MUTATIONS = [m_bitflip, m_bitflip, m_byte, m_u16, m_u16, m_u32, m_u32, m_u32, m_u64, m_truncate,
                 m_insert, m_delete, m_offset, m_offset, m_offset, m_table_swap, m_table_swap,
                 m_block_swap, m_block_dup, m_splice]


# --- running cases ------------------------------------------------------------

class Hang(BaseException):
    """Raised by the per-case alarm."""


def _alarm(signum, frame):
    raise Hang()


_MSG_CLASS = re.compile(r"0x[0-9a-f]+|\d+|'[^']*'|\"[^\"]*\"")


def message_class(msg: str) -> str:
    """An error message with numbers, names and the file label removed."""
    msg = msg.split(": ", 1)[1] if msg.startswith("<bytes>: ") else msg
    return _MSG_CLASS.sub("#", msg)[:110]


#: what a case runs: ``full`` is ``fbjax.load``; ``parse`` the reader and ``build`` only
LOAD_MODES = ("full", "parse")


class Runner:
    def __init__(self, strict: bool, case_timeout: float = CASE_TIMEOUT, load_mode: str = "full"):
        import fbjax
        import fbjax.lower  # noqa: F401  (registers the lowerings)
        from fbjax.errors import InputError, ModelFormatError, UnsupportedOperatorError
        from fbjax.formats import verify
        from fbjax.loading import read
        from fbjax.lower.build import build

        self.read, self.build, self.fbjax_load = read, build, fbjax.load
        self.MFE, self.UOE, self.IE = ModelFormatError, UnsupportedOperatorError, InputError
        verify.STRICT = strict  # every reader's last-resort error conversion
        self.case_timeout = case_timeout
        self.load_mode = load_mode
        # the product's default limits (fbjax.formats.verify.Limits, fbjax.ir.MAX_VALUE_BYTES) apply
        signal.signal(signal.SIGALRM, _alarm)
        self.load = self._load

    def close(self):
        try:
            os.remove(os.path.join(tempfile.gettempdir(), f"fbjax-fuzz-{os.getpid()}.bin"))
        except OSError:
            pass

    def _load(self, data, fmt):
        if self.load_mode == "full" or fmt in ("bundle", "bundle_model"):
            m = self.fbjax_load(data, format=None if fmt in ("bundle", "bundle_model") else fmt)
            for name in getattr(m, "names", ()):  # a vision .task: every member, as bundle[name] loads it
                m[name]
            if hasattr(m, "generate"):  # an LLM bundle: run what load prepared (prefill, decode)
                self.stage = "generate"
                m.generate(GENERATE_PROMPT, max_new_tokens=GENERATE_TOKENS)
            return getattr(m, "ir", None)  # (an LLM bundle's model: m.model.ir, not rewritten in place)
        ir = self.read(data, fmt)  # the read step (completed IR), as fbjax.load runs it
        self.build(ir)
        return ir

    @staticmethod
    def rewrite_in_place(ir, path: str, data: bytes, n: int) -> None:
        """Rewrite the file a model was loaded from in place -- truncated to
        a prefix, emptied, or overwritten by other bytes of the same length,
        as a hot-reloading service or a tool writing the next version to the
        same path does -- then read everything the loaded IR holds (every
        constant, the bytes ``Model.save`` rewrites). A reader that kept a
        mapping of the file dies here with SIGBUS (issue 15 item 5)."""
        kind = n % 3
        with open(path, "r+b") as f:
            if kind == 0:
                f.truncate(len(data) // 3)
            elif kind == 1:
                f.truncate(0)
            else:
                f.write(bytes(len(data)))
        total = 0
        for g in ir.graphs:
            for v in g.values:
                d = getattr(v, "data", None)
                if isinstance(d, np.ndarray) and d.size:
                    total += int(np.frombuffer(np.ascontiguousarray(d).tobytes(), np.uint8).sum())
        if ir.buffer is not None:
            total += int(np.frombuffer(bytes(ir.buffer), np.uint8).sum())

    def run(self, fmt: str, data: bytes, detect: bool, via_file: bool = False, n: int = 0) -> tuple[str, str, float]:
        """(outcome, detail, seconds): outcome is ok/unsupported/format/fallback/hang/crash.

        ``via_file``: load from a temporary file instead of bytes; after a
        successful load the file is rewritten in place and the IR read again
        (:meth:`rewrite_in_place`).
        """
        t0 = time.perf_counter()
        if via_file:
            path = os.path.join(tempfile.gettempdir(), f"fbjax-fuzz-{os.getpid()}.bin")
            with open(path, "wb") as f:
                f.write(data)
            raw, data = data, path
        signal.setitimer(signal.ITIMER_REAL, self.case_timeout)
        self.stage = "load"
        try:
            ir = self.load(data, None if detect else fmt)
            if via_file and ir is not None:
                self.rewrite_in_place(ir, data, raw, n)
            out, detail = "ok", ""
        except Hang:
            out, detail = "hang", f"interrupted after {self.case_timeout} s"
        except self.UOE:
            out, detail = "unsupported", ""
        except self.IE as e:  # a model that cannot run at its own file's shapes
            out, detail = "input", message_class(str(e))
        except self.MFE as e:
            msg = str(e)
            out = "fallback" if "corrupt or truncated" in msg else "format"
            detail = message_class(msg)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - classifying every other exception is the point
            import traceback

            tb = traceback.extract_tb(e.__traceback__)
            last = next((f for f in reversed(tb) if "fbjax" in f.filename), tb[-1] if tb else None)
            where = f"{Path(last.filename).name}:{last.lineno}" if last else "?"
            out, detail = "crash", f"{type(e).__name__} at {where}: {str(e)[:120]}"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if self.stage != "load" and out not in ("ok", "hang"):
            detail = f"{self.stage}: {detail}"
        dt = time.perf_counter() - t0
        if dt > self.case_timeout and out != "hang":
            out, detail = "hang", f"took {dt:.1f} s"
        return out, detail, dt


def case_rng(seed: int, fmt: str, n: int) -> random.Random:
    return random.Random(f"{seed}:{fmt}:{n}")


def via_file(n: int) -> bool:
    """Every 20th case loads from a file (then rewritten in place) instead of bytes."""
    return n % 20 == 7


def make_case(mut: Mutator, seed: int, fmt: str, n: int):
    """(seed index, mutated bytes, mutation names, detect?) for case ``n`` of ``fmt``."""
    rng = case_rng(seed, fmt, n)
    idxs = [i for i, s in enumerate(mut.seeds) if s[1] == fmt]
    weights = [1.0 / (1 + len(mut.seeds[i][2]) / 200000) for i in idxs]  # large seeds a little less often
    idx = rng.choices(idxs, weights)[0]
    data, names = mut.mutate(rng, idx)
    if fmt == "bundle_model":  # the mutated model section, back in its bundle
        from fuzz_corpus import repack

        data = repack(mut.seeds[idx][0], data)
    return idx, data, names, rng.random() < 0.1


def _busy(*args):
    while True:
        pass


def _inject(kind: str, runner: "Runner"):
    """Watchdog self-test (``FBJAX_FUZZ_INJECT=hang:N,block:M,abort:K``)."""
    if kind == "hang":  # a Python-level hang inside the case: the alarm interrupts it
        runner.load = _busy
    elif kind == "block":  # stuck where the alarm cannot reach: the parent must kill it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(3600)
    elif kind == "abort":
        os.abort()


def worker(fmt: str, seed: int, start: int, seconds: float, max_cases: int, strict: bool,
           progress: str, case_timeout: float, out_path: str | None = None, until: float = 0.0,
           load_mode: str = "full") -> dict:
    """Run cases ``start, start+1, ...`` of ``fmt`` for ``seconds``; write the
    case number to ``progress`` before each case (for the parent's post-mortem)."""
    from fuzz_corpus import seeds

    mut = Mutator(seeds())
    runner = Runner(strict, case_timeout, load_mode)
    # self-test of the watchdogs: FBJAX_FUZZ_INJECT=hang:N,block:M,abort:K
    inject = {int(at): kind for kind, _, at in
              (x.partition(":") for x in os.environ.get("FBJAX_FUZZ_INJECT", "").split(",") if x)}
    counts = collections.Counter()
    classes = collections.Counter()
    fallbacks = collections.Counter()
    crashes = []
    max_dt = 0.0
    slowest = None
    n = start
    # ``until`` counts start-up against the budget; still fuzz at least 2 s
    t_end = time.monotonic() + max(2.0, min(seconds, until - time.time() if until else seconds))
    t_snap = 0.0

    def result():
        return {"format": fmt, "start": start, "next": n, "counts": dict(counts), "max_case_s": max_dt,
                "slowest": slowest,
                "crashes": crashes, "classes": dict(classes.most_common(40)), "fallbacks": dict(fallbacks)}

    with open(progress, "w") as prog:
        while time.monotonic() < t_end and n - start < max_cases:
            if out_path and time.monotonic() - t_snap > 1.0:  # survives the parent killing us
                _write_json(out_path, result())
                t_snap = time.monotonic()
            prog.seek(0)
            prog.write(f"{n:012d}\n")
            prog.flush()
            idx, data, names, detect = make_case(mut, seed, fmt, n)
            if n in inject:
                _inject(inject[n], runner)
            out, detail, dt = runner.run(fmt, data, detect, via_file(n), n)
            runner.load = runner._load
            counts[out] += 1
            if dt > max_dt:
                max_dt = dt
                slowest = {"case": n, "seed": mut.seeds[idx][0], "mutations": names, "outcome": out,
                           "detail": detail, "seconds": round(dt, 3)}
            if out == "format":
                classes[detail] += 1
            elif out == "fallback":
                fallbacks[detail] += 1
            if out in ("crash", "hang") and len(crashes) < 50:
                crashes.append({"case": n, "seed": mut.seeds[idx][0], "mutations": names, "detail": detail})
            n += 1
    runner.close()
    return result()


def _write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _watch(cmd, progress: str, budget: float, case_timeout: float):
    """Run a worker; kill it when one case has run for ``case_timeout + 2`` s
    (the progress file is rewritten before every case) or it overruns."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True)
        t0 = time.monotonic()
        rc = None
        while rc is None:
            try:
                rc = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            try:
                stale = time.time() - os.stat(progress).st_mtime > case_timeout + 2
            except OSError:  # still importing
                stale = now - t0 > 180
            if stale or now - t0 > budget + case_timeout + 120:
                proc.kill()
                proc.wait()
                rc = "timeout"
        err.seek(0)
        return rc, err.read()


def fuzz(seconds: float, formats=FORMATS, seed: int = 0, strict: bool = False, chunk: float = 300.0,
         case_timeout: float = CASE_TIMEOUT, crash_dir: str | None = None, log=None,
         max_cases: int = 1 << 62, load_mode: str = "full", format_cases: dict | None = None) -> dict:
    """Fuzz each format for ``seconds / len(formats)`` in worker subprocesses,
    or until ``max_cases`` cases of it have run (``format_cases[fmt]`` where
    given), whichever comes first; each format's case timeout is
    :func:`format_timeout`.
    A worker that dies (an abort, a segfault) or hangs in C code counts its
    case in progress as a crash or hang and a new worker goes on after it.
    Workers use a compilation cache of their own (a temporary
    ``FBJAX_CACHE_DIR``, unless one is set), not the user's.

    Returns:
        ``{format: {"cases", "counts", "max_case_s", "slowest", "crashes", "classes", "seconds"}}``.
    """
    from fuzz_corpus import seeds

    if not os.environ.get("FBJAX_CACHE_DIR"):
        os.environ["FBJAX_CACHE_DIR"] = tempfile.mkdtemp(prefix="fbjax-fuzz-cache-")

    available = {s[1] for s in seeds()}
    formats = [f for f in formats if f in available]
    per = seconds / max(len(formats), 1)
    report = {}
    for fmt in formats:
        agg = {"cases": 0, "counts": collections.Counter(), "max_case_s": 0.0, "slowest": None, "crashes": [],
               "classes": collections.Counter(), "fallbacks": collections.Counter(), "seconds": 0.0}
        n = 0
        t_fmt = time.monotonic()
        fmt_cases = (format_cases or {}).get(fmt, max_cases)
        fmt_timeout = format_timeout(fmt, case_timeout)
        agg["case_timeout"] = fmt_timeout
        while time.monotonic() - t_fmt < per - 1 and n < fmt_cases:
            budget = min(chunk, per - (time.monotonic() - t_fmt))
            with tempfile.TemporaryDirectory() as td:
                prog, out = os.path.join(td, "progress"), os.path.join(td, "result.json")
                cmd = [sys.executable, __file__, "--worker", fmt, "--seed", str(seed), "--start", str(n),
                       "--seconds", str(budget), "--until", str(time.time() + budget), "--progress", prog,
                       "--out", out, "--max-cases", str(fmt_cases - n),
                       "--case-timeout", str(fmt_timeout), "--load", load_mode] + (["--strict"] if strict else [])
                rc, err = _watch(cmd, prog, budget, fmt_timeout)
                res = json.load(open(out)) if os.path.exists(out) else None
                if res is not None:  # the final result, or the last snapshot of a worker that died
                    agg["counts"].update(res["counts"])
                    agg["classes"].update(res["classes"])
                    agg["fallbacks"].update(res["fallbacks"])
                    agg["crashes"] += res["crashes"]
                    if res["max_case_s"] >= agg["max_case_s"]:
                        agg["max_case_s"], agg["slowest"] = res["max_case_s"], res.get("slowest")
                if rc == 0 and res is not None:
                    agg["cases"] += res["next"] - n
                    n = res["next"]
                elif not os.path.exists(prog) and rc != "timeout":
                    # died before its first case (e.g. an import broken mid-edit): not a finding
                    agg.setdefault("startup_failures", []).append(err[-300:])
                    if log:
                        log(f"{fmt}: worker failed to start (rc {rc}): {err.strip().splitlines()[-1:]}")
                    if len(agg["startup_failures"]) >= 5:
                        break
                    time.sleep(5)
                else:  # the worker died or hung in C code: blame the case in progress
                    bad = int(open(prog).read().strip() or n) if os.path.exists(prog) else n
                    kind = "hang" if rc == "timeout" else "crash"
                    detail = f"worker {'timed out' if rc == 'timeout' else f'exited {rc}'}: {err[-300:]}"
                    agg["counts"][kind] += 1
                    agg["crashes"].append({"case": bad, "detail": detail})
                    agg["cases"] += bad - n + 1
                    if crash_dir:
                        from fuzz_corpus import seeds as _s

                        _, data, _, _ = make_case(Mutator(_s()), seed, fmt, bad)
                        os.makedirs(crash_dir, exist_ok=True)
                        Path(crash_dir, f"{fmt}-{seed}-{bad}.bin").write_bytes(data)
                    n = bad + 1
            if log:
                log(f"{fmt}: {agg['cases']} cases, {dict(agg['counts'])}")
        agg["seconds"] = round(time.monotonic() - t_fmt, 1)
        agg["counts"] = dict(agg["counts"])
        agg["classes"] = dict(agg["classes"].most_common(25))
        agg["fallbacks"] = dict(agg["fallbacks"].most_common(25))
        report[fmt] = agg
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="total fuzzing time (split across formats)")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strict", action="store_true", help="TFLite reader re-raises stray exceptions")
    ap.add_argument("--chunk", type=float, default=300.0, help="seconds per worker process")
    ap.add_argument("--case-timeout", type=float, default=CASE_TIMEOUT,
                    help="seconds per case (bundle formats: TIMEOUT_SCALE times this)")
    ap.add_argument("--load", choices=LOAD_MODES, default="full",
                    help="full: fbjax.load (default); parse: the reader and build only (faster, sees less)")
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--crash-dir", help="save inputs that crashed/hung a worker here")
    ap.add_argument("--repro", help="FORMAT:CASE: run one case in-process and print the outcome")
    # worker mode (internal)
    ap.add_argument("--worker")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--max-cases", type=int, default=1 << 62,
                    help="stop each format after this many cases (a run bounded by work, not by time)")
    ap.add_argument("--format-cases", default="",
                    help="FORMAT=N,...: another case count for these formats (e.g. bundle_model=12)")
    ap.add_argument("--until", type=float, default=0.0, help="wall-clock end (time.time()), startup included")
    ap.add_argument("--progress")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if a.worker:
        res = worker(a.worker, a.seed, a.start, a.seconds, a.max_cases, a.strict, a.progress, a.case_timeout,
                     a.out, a.until, a.load)
        _write_json(a.out, res)
        return 0
    if a.repro:
        from fuzz_corpus import seeds

        fmt, n = a.repro.split(":")
        idx, data, names, detect = make_case(Mutator(seeds()), a.seed, fmt, int(n))
        print(f"seed model {seeds()[idx][0]}, mutations {names}, detect={detect}, {len(data)} bytes")
        if a.crash_dir:
            os.makedirs(a.crash_dir, exist_ok=True)
            Path(a.crash_dir, f"{fmt}-{a.seed}-{n}.bin").write_bytes(data)
        out, detail, dt = Runner(a.strict, format_timeout(fmt, a.case_timeout), a.load).run(fmt, data, detect)
        print(f"{out} in {dt:.2f} s: {detail}")
        return 1 if out in ("crash", "hang") else 0
    t0 = time.monotonic()
    report = fuzz(a.seconds, a.formats.split(","), a.seed, a.strict, a.chunk, a.case_timeout, a.crash_dir,
                  max_cases=a.max_cases, load_mode=a.load,
                  format_cases={f: int(k) for f, _, k in (x.partition("=") for x in a.format_cases.split(",") if x)},
                  log=lambda s: print(f"[{time.monotonic() - t0:7.0f}s] {s}", file=sys.stderr, flush=True))
    total = sum(r["cases"] for r in report.values())
    bad = sum(r["counts"].get("crash", 0) + r["counts"].get("hang", 0) for r in report.values())
    slow = max(((f, r["slowest"]) for f, r in report.items() if r.get("slowest")),
               key=lambda fr: fr[1]["seconds"], default=None)
    summary = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv), "total_cases": total,
               "load": a.load, "slowest": slow and dict(slow[1], format=slow[0]),
               "crashes_and_hangs": bad, "strict": a.strict, "seed": a.seed, "formats": report}
    text = json.dumps(summary, indent=1)
    if a.json:
        Path(a.json).write_text(text)
    print(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
