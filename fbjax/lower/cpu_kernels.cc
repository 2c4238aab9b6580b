// fbjax's CPU kernels for integer matrix products, called through XLA's FFI
// (fbjax/lower/cpu_kernels.py builds this file with the machine's C++
// compiler and registers the handlers; see its docstring).
//
// XLA:CPU (jaxlib 0.10) has no integer GEMM/GEMV: an s8 x s8 -> s32
// dot_general is rewritten into an s32 dot whose operands are first
// written out widened to int32 (4x the weight bytes), which bounds the
// decode step of a quantized LLM at a fraction of the memory bandwidth.
// These kernels read each int8 (or packed int4) weight once, widen it in
// registers and multiply-accumulate in int32: integer sums, so the result
// is the same in any order, and equal to the XLA lowering's bit for bit.
//
//   fbjax_int8_matmul:        x int16 [R, I], w int8 [O, I]
//                             -> y int32 [R, O], y[r, o] = sum_i x[r, i] * w[o, i]
//   fbjax_block_matmul:       x int16 [R, K, B], w [O, K, B] (int8, or int4
//                             packed two per byte as XLA stores it: element 2j
//                             in the low nibble of byte j)
//                             -> acc int32 [K, R, O] = sum_c x[r, k, c] * w[o, k, c]
//                                ksum int32 [K, O]   = sum_c w[o, k, c]
//   fbjax_block_fc:          the same x and w, scale float32 [O, K] -> out float32 [R, O], kfsum float32 [O]:
//                             TFLite's blockwise FULLY_CONNECTED sums over the blocks (see BlockFc)
//   fbjax_block_fc_f32:      x float32 [R, K * B], the same w and scale -> out float32 [R, O]: the whole
//                             blockwise FULLY_CONNECTED but its bias (input rows quantized here, as
//                             AsymmetricQuantizeFloats; see BlockFcF32). With AVX-512 VNNI and packed int4
//                             weights (B % 32 == 0) the sums take vpdpbusd on the nibbles (Int4Tile).
//
// Exactness: |x| <= 32767 and |w| <= 128, so each pair of products summed by
// _mm256_madd_epi16 fits int32; the callers keep |sum| < 2**31 (fbjax's hybrid
// kernels pass |x| <= 255, I < 2**16).

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#if defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define FBJAX_AVX512 1
#if defined(__AVX512VNNI__)
#define FBJAX_VNNI 1
#endif
#endif

#include "xla/ffi/api/ffi.h"
#include "cpu_parallel.h"

namespace ffi = xla::ffi;

namespace {

using fbjax_cpu::ParallelChunks;

#if defined(__AVX2__)
inline int32_t HSum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}
#endif

// y[r] = sum_i x[r * xs + i] * w[i] for r < ROWS, n values.
template <int ROWS>
inline void DotN(const int16_t* x, int64_t xs, const int8_t* w, int64_t n, int32_t* y) {
  int64_t i = 0;
  int32_t acc[ROWS] = {};
#if defined(__AVX2__)
  __m256i a[ROWS];
  for (int r = 0; r < ROWS; ++r) a[r] = _mm256_setzero_si256();
  for (; i + 16 <= n; i += 16) {
    const __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
    for (int r = 0; r < ROWS; ++r)
      a[r] = _mm256_add_epi32(
          a[r], _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + r * xs + i)), wv));
  }
  for (int r = 0; r < ROWS; ++r) acc[r] = HSum(a[r]);
#endif
  for (; i < n; ++i)
    for (int r = 0; r < ROWS; ++r) acc[r] += int32_t(x[r * xs + i]) * int32_t(w[i]);
  for (int r = 0; r < ROWS; ++r) y[r] = acc[r];
}

// DotN for rows <= 4 rows chosen at run time.
inline void Dot4(const int16_t* x, int64_t xs, int rows, const int8_t* w, int64_t n, int32_t* y) {
  switch (rows) {
    case 1: return DotN<1>(x, xs, w, n, y);
    case 2: return DotN<2>(x, xs, w, n, y);
    case 3: return DotN<3>(x, xs, w, n, y);
    default: return DotN<4>(x, xs, w, n, y);
  }
}

// Register-blocked tile for many rows (prefill): y[r * ys + o] = sum_i x[r * xs + i] * w[o * ws + i]
// for r < RR, o < OO, weights already widened to int16.
template <int RR, int OO>
inline void Tile(const int16_t* x, int64_t xs, const int16_t* w, int64_t ws, int64_t n, int32_t* y, int64_t ys) {
  int64_t i = 0;
  int32_t acc[RR][OO] = {};
#if defined(__AVX2__)
  __m256i a[RR][OO];
  for (int r = 0; r < RR; ++r)
    for (int o = 0; o < OO; ++o) a[r][o] = _mm256_setzero_si256();
  for (; i + 16 <= n; i += 16) {
    __m256i wv[OO];
    for (int o = 0; o < OO; ++o) wv[o] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + o * ws + i));
    for (int r = 0; r < RR; ++r) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + r * xs + i));
      for (int o = 0; o < OO; ++o) a[r][o] = _mm256_add_epi32(a[r][o], _mm256_madd_epi16(xv, wv[o]));
    }
  }
  for (int r = 0; r < RR; ++r)
    for (int o = 0; o < OO; ++o) acc[r][o] = HSum(a[r][o]);
#endif
  for (; i < n; ++i)
    for (int r = 0; r < RR; ++r)
      for (int o = 0; o < OO; ++o) acc[r][o] += int32_t(x[r * xs + i]) * int32_t(w[o * ws + i]);
  for (int r = 0; r < RR; ++r)
    for (int o = 0; o < OO; ++o) y[r * ys + o] = acc[r][o];
}

template <int RR>
inline void TileO(int oo, const int16_t* x, int64_t xs, const int16_t* w, int64_t ws, int64_t n, int32_t* y,
                  int64_t ys) {
  switch (oo) {
    case 1: return Tile<RR, 1>(x, xs, w, ws, n, y, ys);
    case 2: return Tile<RR, 2>(x, xs, w, ws, n, y, ys);
    default: return Tile<RR, 3>(x, xs, w, ws, n, y, ys);
  }
}

// y[r, o] for o in [o0, o1), all R rows, from int16 weight rows w16 (row o at w16 + (o - o0) * n).
inline void Gemm(const int16_t* X, int64_t R, const int16_t* w16, int64_t o0, int64_t o1, int64_t n, int32_t* Y,
                 int64_t O) {
  for (int64_t o = o0; o < o1; o += 3) {
    const int oo = static_cast<int>(std::min<int64_t>(3, o1 - o));
    const int16_t* w = w16 + (o - o0) * n;
    for (int64_t r = 0; r < R; r += 4) {
      const int rr = static_cast<int>(std::min<int64_t>(4, R - r));
      const int16_t* x = X + r * n;
      int32_t* y = Y + r * O + o;
      switch (rr) {
        case 1: TileO<1>(oo, x, n, w, n, n, y, O); break;
        case 2: TileO<2>(oo, x, n, w, n, n, y, O); break;
        case 3: TileO<3>(oo, x, n, w, n, n, y, O); break;
        default: TileO<4>(oo, x, n, w, n, n, y, O); break;
      }
    }
  }
}

// One block of B int4 values, packed (element 2j low nibble of byte j), widened to int8 in out[B].
inline void UnpackS4(const uint8_t* p, int64_t b, int8_t* out) {
  int64_t j = 0;
#if defined(__AVX2__)
  const __m128i lo_mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  for (; j + 32 <= b; j += 32) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j / 2));
    const __m128i lo = _mm_and_si128(v, lo_mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), lo_mask);
    // sign-extend 4 bits: (v ^ 8) - 8
    const __m128i e0 = _mm_sub_epi8(_mm_xor_si128(_mm_unpacklo_epi8(lo, hi), eight), eight);
    const __m128i e1 = _mm_sub_epi8(_mm_xor_si128(_mm_unpackhi_epi8(lo, hi), eight), eight);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j), e0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j + 16), e1);
  }
#endif
  for (; j < b; ++j) {
    const int v = (p[j / 2] >> (4 * (j & 1))) & 0x0F;
    out[j] = static_cast<int8_t>((v ^ 8) - 8);
  }
}

constexpr int64_t kChunkBytes = 64 * 1024;  // weight bytes per claimed chunk
// One input row (a decode step): the intra-op threads only for matrices of at least this many weight bytes
// (the LM head). In a real decode program the pool's threads sleep between the kernels (other XLA ops run in
// between), and waking one cost more than it saved: SmolLM2-135M-shaped decode, load ~3, tok/s medians of 3,
// two runs each: int4 57.7 / 57.6 with threads on every matrix, 70.7 / 72.4 with none, 68.4 / 72.5 with
// threads from 4 MB; int8 51.9 / 51.3, 70.4 / 67.7, 73.6 / 72.0. (A jit of back-to-back kernel calls, whose
// pool threads stay awake, said the opposite: 7.0 ms a token's int4 products threaded, 9.9 ms not.)
constexpr int64_t kParallelMinBytes = 4 << 20;
// The int4 tiles (fbjax_block_fc_f32) are bound by their arithmetic (unpacking, a float32 step per 32-value
// block), not by memory: one input row takes the pool's threads from 64 KB of packed weights on. SmolLM2-135M
// int4 decode step at batch 1, alternating runs on a noisy machine: medians 6.72 / 6.81 / 11.52 ms against
// 8.55 / 8.86 / 8.59 ms with the 4 MB threshold of the int8 kernels (which stream at the memory's rate).
constexpr int64_t kInt4ParallelMinBytes = 64 << 10;
constexpr int64_t kTileChunkBytes = 16 * 1024;  // the same for the int4 tiles of fbjax_block_fc_f32
// How far ahead of its loads the int4 tile loop prefetches weights (and scales), into L2 (_MM_HINT_T1): one
// decode token's products with distinct weights, one thread (load ~5.5): 6.4-6.5 ms at 16 KB, 6.5-6.6 at 32 KB,
// 6.7-7.0 at 8 KB, 7.0-7.3 at 64 KB; into L1 (_MM_HINT_T0) 9.1-9.5 ms at 16 KB; without prefetch 10.1 ms.
#ifndef FBJAX_PF
#define FBJAX_PF 16384
#endif
constexpr int64_t kPrefetchBytes = FBJAX_PF;

ffi::Error Int8Matmul(ffi::ThreadPool pool, ffi::Buffer<ffi::S16> x, ffi::Buffer<ffi::S8> w,
                      ffi::ResultBuffer<ffi::S32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1])
    return ffi::Error::InvalidArgument("fbjax_int8_matmul: x [R, I] and w [O, I] expected");
  const int64_t R = xd[0], I = xd[1], O = wd[0];
  const int16_t* X = x.typed_data();
  const int8_t* W = w.typed_data();
  int32_t* Y = y->typed_data();
  const int64_t per = std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(I, 1));
  const int64_t chunks = (O + per - 1) / per;
  if (R > 16) {  // many rows: widen a chunk of weight rows to int16 once, then register-blocked tiles
    const int64_t gper = std::max<int64_t>(3, (kChunkBytes / 4) / std::max<int64_t>(I, 1) / 3 * 3);
    const int64_t gchunks = (O + gper - 1) / gper;
    ParallelChunks(pool, gchunks, [=](int64_t c) {
      const int64_t o0 = c * gper, o1 = std::min(O, (c + 1) * gper);
      std::unique_ptr<int16_t[]> w16(new int16_t[(o1 - o0) * I]);
      for (int64_t k = 0; k < (o1 - o0) * I; ++k) w16[k] = W[o0 * I + k];
      Gemm(X, R, w16.get(), o0, o1, I, Y, O);
    });
    return ffi::Error::Success();
  }
  auto body = [=](int64_t c) {
    int32_t tmp[4];
    for (int64_t o = c * per; o < std::min(O, (c + 1) * per); ++o) {
      const int8_t* wr = W + o * I;
      for (int64_t r = 0; r < R; r += 4) {
        const int rows = static_cast<int>(std::min<int64_t>(4, R - r));
        Dot4(X + r * I, I, rows, wr, I, tmp);
        for (int k = 0; k < rows; ++k) Y[(r + k) * O + o] = tmp[k];
      }
    }
  };
  if (R == 1 && O * I < kParallelMinBytes) {
    for (int64_t c = 0; c < chunks; ++c) body(c);
  } else {
    ParallelChunks(pool, chunks, body);
  }
  return ffi::Error::Success();
}

template <bool kPacked>
ffi::Error BlockMatmul(ffi::ThreadPool pool, const int16_t* X, const void* Wv, int64_t R, int64_t K, int64_t B,
                       int64_t O, int32_t* acc, int32_t* ksum) {
  const int64_t row_bytes = kPacked ? K * B / 2 : K * B;
  const int64_t per = std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(row_bytes, 1));
  const int64_t chunks = (O + per - 1) / per;
  ParallelChunks(pool, chunks, [=](int64_t c) {
    int8_t buf[1024];
    int32_t tmp[4];
    for (int64_t o = c * per; o < std::min(O, (c + 1) * per); ++o) {
      for (int64_t k = 0; k < K; ++k) {
        const int8_t* wb;
        if (kPacked) {
          UnpackS4(static_cast<const uint8_t*>(Wv) + (o * K + k) * B / 2, B, buf);
          wb = buf;
        } else {
          wb = static_cast<const int8_t*>(Wv) + (o * K + k) * B;
        }
        int32_t s = 0;
        for (int64_t j = 0; j < B; ++j) s += wb[j];
        ksum[k * O + o] = s;
        for (int64_t r = 0; r < R; r += 4) {
          const int rows = static_cast<int>(std::min<int64_t>(4, R - r));
          Dot4(X + (r * K + k) * B, K * B, rows, wb, B, tmp);
          for (int q = 0; q < rows; ++q) acc[(k * R + r + q) * O + o] = tmp[q];
        }
      }
    }
  });
  return ffi::Error::Success();
}

ffi::Error BlockMatmulAny(ffi::ThreadPool pool, ffi::Buffer<ffi::S16> x, ffi::AnyBuffer w,
                          ffi::ResultBuffer<ffi::S32> acc, ffi::ResultBuffer<ffi::S32> ksum) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 3 || wd.size() != 3 || xd[1] != wd[1] || xd[2] != wd[2])
    return ffi::Error::InvalidArgument("fbjax_block_matmul: x [R, K, B] and w [O, K, B] expected");
  const bool packed = w.element_type() == ffi::S4;
  if (!packed && w.element_type() != ffi::S8)
    return ffi::Error::InvalidArgument("fbjax_block_matmul: w must be int8 or int4");
  if (xd[2] > 1024 || (packed && xd[2] % 2))
    return ffi::Error::InvalidArgument("fbjax_block_matmul: block size must be <= 1024 (even for int4)");
  auto run = packed ? BlockMatmul<true> : BlockMatmul<false>;
  return run(pool, x.typed_data(), w.untyped_data(), xd[0], xd[1], xd[2], wd[0], acc->typed_data(),
             ksum->typed_data());
}

#if defined(__AVX2__)
// The four int32 sums of the 8 lanes of v0..v3.
inline __m128i Sum4(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// sum_c x[c] * w[c] over one block of b values (b % 16 == 0), as 8 int32 lanes.
inline __m256i BlockLanes(const int16_t* x, const int16_t* w, int64_t b) {
  __m256i a = _mm256_setzero_si256();
  for (int64_t c = 0; c < b; c += 16)
    a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + c)),
                                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c))));
  return a;
}
#endif

// sums[k] = sum_c x[k * b + c] * w[k * b + c] for the K blocks of one row.
inline void BlockDots(const int16_t* x, const int16_t* w, int64_t K, int64_t b, int32_t* sums) {
  int64_t k = 0;
#if defined(__AVX2__)
  if (b % 16 == 0) {
    for (; k + 4 <= K; k += 4) {
      const __m128i s4 = Sum4(BlockLanes(x + k * b, w + k * b, b), BlockLanes(x + (k + 1) * b, w + (k + 1) * b, b),
                              BlockLanes(x + (k + 2) * b, w + (k + 2) * b, b),
                              BlockLanes(x + (k + 3) * b, w + (k + 3) * b, b));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(sums + k), s4);
    }
  }
#endif
  for (; k < K; ++k) {
    int32_t s = 0;
    for (int64_t c = 0; c < b; ++c) s += int32_t(x[k * b + c]) * int32_t(w[k * b + c]);
    sums[k] = s;
  }
}

// out[j] = w[j] widened to int16 for j < n; returns sum_j w[j].
inline int32_t WidenSum(const int8_t* w, int64_t n, int16_t* out) {
  int64_t j = 0;
  int32_t s = 0;
#if defined(__AVX2__)
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc = _mm256_setzero_si256();
  for (; j + 16 <= n; j += 16) {
    const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + j)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), v);
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(v, ones));
  }
  s = HSum(acc);
#endif
  for (; j < n; ++j) {
    out[j] = w[j];
    s += w[j];
  }
  return s;
}

#if defined(__AVX2__)
// 32 weights from p (int4: 16 bytes, element 2j in the low nibble of byte j; int8: 32 bytes) as int16.
template <bool kPacked>
inline void Load32(const uint8_t* p, __m256i& w0, __m256i& w1) {
  if (kPacked) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i m = _mm_set1_epi8(0x0F), e = _mm_set1_epi8(8);
    const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    w0 = _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_xor_si128(_mm_unpacklo_epi8(lo, hi), e), e));
    w1 = _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_xor_si128(_mm_unpackhi_epi8(lo, hi), e), e));
  } else {
    w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
  }
}

// One weight row of K blocks of B values (B % 32 == 0) against one input row x [K * B]:
// ks[k] = sum of block k's weights, sums[k] = sum_c x[k * B + c] * w[k * B + c]. Weights stay in registers.
template <bool kPacked>
void RowSums1(const uint8_t* wrow, const int16_t* x, int64_t K, int64_t B, int32_t* ks, int32_t* sums) {
  const __m256i ones = _mm256_set1_epi16(1);
  auto lanes = [&](int64_t k, __m256i& kl, __m256i& dl) {
    kl = _mm256_setzero_si256();
    dl = _mm256_setzero_si256();
    for (int64_t c = 0; c < B; c += 32) {
      const int64_t e = k * B + c;
      __m256i w0, w1;
      Load32<kPacked>(wrow + (kPacked ? e / 2 : e), w0, w1);
      kl = _mm256_add_epi32(kl, _mm256_add_epi32(_mm256_madd_epi16(w0, ones), _mm256_madd_epi16(w1, ones)));
      const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + e));
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + e + 16));
      dl = _mm256_add_epi32(dl, _mm256_add_epi32(_mm256_madd_epi16(x0, w0), _mm256_madd_epi16(x1, w1)));
    }
  };
  int64_t k = 0;
  for (; k + 4 <= K; k += 4) {
    __m256i kl[4], dl[4];
    for (int b = 0; b < 4; ++b) lanes(k + b, kl[b], dl[b]);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(ks + k), Sum4(kl[0], kl[1], kl[2], kl[3]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(sums + k), Sum4(dl[0], dl[1], dl[2], dl[3]));
  }
  for (; k < K; ++k) {
    __m256i kl, dl;
    lanes(k, kl, dl);
    ks[k] = HSum(kl);
    sums[k] = HSum(dl);
  }
}
#endif

// TFLite's EvalBlockwise4Bit accumulation (fully_connected.cc), per output o over the blocks in order:
// out[r, o] += float(sum_c x[r, k, c] * w[o, k, c]) * scale[o, k];  kfsum[o] += scale[o, k] * float(ksum);
// each product and sum rounded to float32 on its own (built with -ffp-contract=off: no FMA). Each weight
// row is unpacked and widened to int16 once, then used for every input row.
void BlockFcSums(ffi::ThreadPool& pool, const int16_t* X, const uint8_t* W, bool packed, const float* S, int64_t R,
                 int64_t K, int64_t B, int64_t O, float* Y, float* KF);

ffi::Error BlockFc(ffi::ThreadPool pool, ffi::Buffer<ffi::S16> x, ffi::AnyBuffer w, ffi::Buffer<ffi::F32> scale,
                   ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> kfsum) {
  const auto xd = x.dimensions(), wd = w.dimensions(), sd = scale.dimensions();
  if (xd.size() != 3 || wd.size() != 3 || xd[1] != wd[1] || xd[2] != wd[2] || sd.size() != 2 || sd[0] != wd[0] ||
      sd[1] != wd[1])
    return ffi::Error::InvalidArgument("fbjax_block_fc: x [R, K, B], w [O, K, B], scale [O, K] expected");
  const bool packed = w.element_type() == ffi::S4;
  if (!packed && w.element_type() != ffi::S8) return ffi::Error::InvalidArgument("fbjax_block_fc: w int8 or int4");
  const int64_t R = xd[0], K = xd[1], B = xd[2], O = wd[0];
  if (B > 1024 || (packed && B % 2)) return ffi::Error::InvalidArgument("fbjax_block_fc: block size <= 1024");
  BlockFcSums(pool, x.typed_data(), static_cast<const uint8_t*>(w.untyped_data()), packed, scale.typed_data(), R, K,
              B, O, out->typed_data(), kfsum->typed_data());
  return ffi::Error::Success();
}

void BlockFcSums(ffi::ThreadPool& pool, const int16_t* X, const uint8_t* W, bool packed, const float* S, int64_t R,
                 int64_t K, int64_t B, int64_t O, float* Y, float* KF) {
  const int64_t row_bytes = packed ? K * B / 2 : K * B;
  const int64_t per = std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(row_bytes, 1));
  const int64_t chunks = (O + per - 1) / per;
  ParallelChunks(pool, chunks, [=](int64_t c) {
    std::unique_ptr<int16_t[]> w16(new int16_t[K * B]);
    std::unique_ptr<int32_t[]> ks(new int32_t[K]), sums(new int32_t[K]);
    int8_t buf[1024];
    for (int64_t o = c * per; o < std::min(O, (c + 1) * per); ++o) {
      const float* so = S + o * K;
#if defined(__AVX2__)
      if (R == 1 && B % 32 == 0) {  // decode: one input row, weights unpacked in registers
        (packed ? RowSums1<true> : RowSums1<false>)(W + o * row_bytes, X, K, B, ks.get(), sums.get());
        float kf = 0.0f, y = 0.0f;
        for (int64_t k = 0; k < K; ++k) {
          const float t = so[k] * static_cast<float>(ks[k]);
          kf = kf + t;
          const float p = static_cast<float>(sums[k]) * so[k];
          y = y + p;
        }
        KF[o] = kf;
        Y[o] = y;
        continue;
      }
#endif
      for (int64_t k = 0; k < K; ++k) {
        const int8_t* wb;
        if (packed) {
          UnpackS4(W + (o * K + k) * B / 2, B, buf);
          wb = buf;
        } else {
          wb = reinterpret_cast<const int8_t*>(W) + (o * K + k) * B;
        }
        ks[k] = WidenSum(wb, B, w16.get() + k * B);
      }
      float kf = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const float t = so[k] * static_cast<float>(ks[k]);
        kf = kf + t;
      }
      KF[o] = kf;
      for (int64_t r = 0; r < R; ++r) {
        BlockDots(X + r * K * B, w16.get(), K, B, sums.get());
        float y = 0.0f;
        for (int64_t k = 0; k < K; ++k) {
          const float p = static_cast<float>(sums[k]) * so[k];
          y = y + p;
        }
        Y[r * O + o] = y;
      }
    }
  });
}


// ---------------------------------------------------------------------------------------------------------
// fbjax_block_fc_f32: the whole blockwise FULLY_CONNECTED (without bias) from the float input.

// float32 -> int32 as XLA converts (NaN -> 0, saturating): the callers only pass values already clamped.
inline int32_t ToI32(double v) {
  if (!(v == v)) return 0;
  if (v <= -2147483648.0) return INT32_MIN;
  if (v >= 2147483647.0) return INT32_MAX;
  return static_cast<int32_t>(v);
}

// AsymmetricQuantizeFloats of one row x [n] as fbjax.lower.tflite_int.hybrid.asymmetric_quantize computes it
// (its docstring; TFLite's tensor_utils): rmin = min(0, min x), rmax = max(0, max x) (NaN propagates), the
// scale and zero point in double, s = float32(scale), inv = float32(1 / double(s)),
// q = clamp(zp + clamp(round_half_away(x * inv), -256, 256), -128, 127) (float32 product); an all-zero range
// gives s = 1, zp = 0, q = 0.
void AsymQuantizeRow(const float* x, int64_t n, int8_t* q, float* s_out, int32_t* zp_out) {
  float mn = 0.0f, mx = 0.0f;  // min(0, min x), max(0, max x)
  bool nan = false;
  int64_t i = 0;
#if defined(FBJAX_AVX512)
  __m512 vmn = _mm512_setzero_ps(), vmx = _mm512_setzero_ps();
  __mmask16 un = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    un |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    vmn = _mm512_min_ps(vmn, v);
    vmx = _mm512_max_ps(vmx, v);
  }
  nan = un != 0;
  mn = _mm512_reduce_min_ps(vmn);
  mx = _mm512_reduce_max_ps(vmx);
#endif
  for (; i < n; ++i) {
    const float v = x[i];
    if (v != v) nan = true;
    mn = v < mn ? v : mn;
    mx = v > mx ? v : mx;
  }
  if (nan) mn = mx = std::numeric_limits<float>::quiet_NaN();
  if (mn == mx) {  // all zero (NaN != NaN: not here)
    std::fill(q, q + n, int8_t(0));
    *s_out = 1.0f;
    *zp_out = 0;
    return;
  }
  const float diff = mx - mn;  // float32 subtraction, as TFLite
  const double scale = static_cast<double>(diff) / 255.0;
  const double a = static_cast<double>(mn) / scale, b = static_cast<double>(mx) / scale;
  const double zp_d = (128.0 + std::fabs(a) < 127.0 + std::fabs(b)) ? -128.0 - a : 127.0 - b;
  const double zp_f = zp_d <= -128.0 ? -128.0 : (zp_d >= 127.0 ? 127.0 : std::round(zp_d));
  const int32_t zp = ToI32(zp_f);
  const float s = static_cast<float>(scale);
  const float inv = static_cast<float>(1.0 / static_cast<double>(s));
  *s_out = s;
  *zp_out = zp;
  i = 0;
#if defined(FBJAX_AVX512)
  {
    const __m512 vinv = _mm512_set1_ps(inv), half = _mm512_set1_ps(0.5f), lo = _mm512_set1_ps(-256.0f),
                 hi = _mm512_set1_ps(256.0f);
    const __m512i vzp = _mm512_set1_epi32(zp), qlo = _mm512_set1_epi32(-128), qhi = _mm512_set1_epi32(127);
    const __m512i sign = _mm512_set1_epi32(static_cast<int32_t>(0x80000000u));
    for (; i + 16 <= n; i += 16) {
      const __m512 p = _mm512_mul_ps(_mm512_loadu_ps(x + i), vinv);
      // round half away from zero, exactly: t = trunc(p); t += sign(p) where |p - t| >= 0.5
      const __m512 t = _mm512_roundscale_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m512 d = _mm512_abs_ps(_mm512_sub_ps(p, t));
      const __mmask16 up = _mm512_cmp_ps_mask(d, half, _CMP_GE_OQ);
      const __m512 one = _mm512_castsi512_ps(
          _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(p), sign), _mm512_castps_si512(_mm512_set1_ps(1.0f))));
      __m512 r = _mm512_mask_add_ps(t, up, t, one);
      const __mmask16 ok = _mm512_cmp_ps_mask(r, r, _CMP_ORD_Q);  // NaN -> 0, as XLA's convert
      r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
      __m512i qi = _mm512_maskz_cvttps_epi32(ok, r);
      qi = _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(qi, vzp), qlo), qhi);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(qi));
    }
  }
#endif
  for (; i < n; ++i) {
    const float p = x[i] * inv;
    float r = std::round(p);
    r = r < -256.0f ? -256.0f : (r > 256.0f ? 256.0f : r);
    const int32_t v = ToI32(r) + zp;
    q[i] = static_cast<int8_t>(v < -128 ? -128 : (v > 127 ? 127 : v));
  }
}


#if defined(FBJAX_VNNI)
// Per 128-bit lane: the sums of the four int32 of that lane in r0, r1, r2, r3 -> [s(r0), s(r1), s(r2), s(r3)].
inline __m512i Reduce4(__m512i r0, __m512i r1, __m512i r2, __m512i r3) {
  const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(r0, r1), _mm512_unpackhi_epi32(r0, r1));
  const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(r2, r3), _mm512_unpackhi_epi32(r2, r3));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
}

// 4x4 transpose of 128-bit lanes: v[b] lane g = z[g] lane b.
inline void Transpose4(const __m512i z[4], __m512i v[4]) {
  const __m512i a = _mm512_shuffle_i32x4(z[0], z[1], 0x44), b = _mm512_shuffle_i32x4(z[0], z[1], 0xEE);
  const __m512i c = _mm512_shuffle_i32x4(z[2], z[3], 0x44), d = _mm512_shuffle_i32x4(z[2], z[3], 0xEE);
  v[0] = _mm512_shuffle_i32x4(a, c, 0x88);
  v[1] = _mm512_shuffle_i32x4(a, c, 0xDD);
  v[2] = _mm512_shuffle_i32x4(b, d, 0x88);
  v[3] = _mm512_shuffle_i32x4(b, d, 0xDD);
}

// The layout Int4Tiles1 reads one quantized row q [NU * 32] in: xe[u * 16 + j] = q[32u + 2j],
// xo[u * 16 + j] = q[32u + 2j + 1], xs8[k] = 8 * sum of block k's B values.
void SplitUnits(const int8_t* q, int64_t NU, int64_t K, int64_t B, int8_t* xe, int8_t* xo, int32_t* xs8) {
  int64_t u = 0;
  std::unique_ptr<int32_t[]> us(new int32_t[NU]);
#if defined(__AVX512VBMI__)
  const __m512i idx = _mm512_set_epi8(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25,
                                      23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, 62, 60, 58, 56, 54, 52, 50, 48, 46,
                                      44, 42, 40, 38, 36, 34, 32, 30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4,
                                      2, 0);
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  for (; u + 2 <= NU; u += 2) {  // 64 values: evens to the low half, odds to the high half
    const __m512i v = _mm512_loadu_si512(q + u * 32);
    const __m512i p = _mm512_permutexvar_epi8(idx, v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xe + u * 16), _mm512_castsi512_si256(p));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xo + u * 16), _mm512_extracti64x4_epi64(p, 1));
    // unit sums: sum(q + 128) per 8 bytes (vpsadbw), then per 32
    const __m512i sad = _mm512_sad_epu8(_mm512_xor_si512(v, bias), _mm512_setzero_si512());
    alignas(64) int64_t t[8];
    _mm512_store_si512(t, sad);
    us[u] = static_cast<int32_t>(t[0] + t[1] + t[2] + t[3]) - 128 * 32;
    us[u + 1] = static_cast<int32_t>(t[4] + t[5] + t[6] + t[7]) - 128 * 32;
  }
#endif
  for (; u < NU; ++u) {
    int32_t t = 0;
    for (int64_t j = 0; j < 16; ++j) {
      xe[u * 16 + j] = q[u * 32 + 2 * j];
      xo[u * 16 + j] = q[u * 32 + 2 * j + 1];
      t += q[u * 32 + 2 * j] + q[u * 32 + 2 * j + 1];
    }
    us[u] = t;
  }
  const int64_t ub = B / 32;
  for (int64_t k = 0; k < K; ++k) {
    int32_t t = 0;
    for (int64_t j = 0; j < ub; ++j) t += us[k * ub + j];
    xs8[k] = 8 * t;
  }
}

// Input rows r0 .. r0 + NR - 1, packed int4 weights, B % 32 == 0, output rows of tile t (16 of them, o0 = 16 t;
// rows >= O repeat row O - 1 and are not stored). Each input row's quantized values are given split per
// 32-value unit u (SplitUnits): xe[u * 16 + j] = q[32u + 2j] and xo[u * 16 + j] = q[32u + 2j + 1] (matching
// the low and high nibbles of the unit's 16 weight bytes), zero-padded to a multiple of 4 units (xstride bytes
// from one row to the next), and xs8[k] = 8 * sum of block k's q (K per row). With u = nibble ^ 8 in [0, 15]
// (w = u - 8): sum_c q * w = sum(u_lo * xe) + sum(u_hi * xo) - 8 * sum_c q (vpdpbusd: u8 x s8, exact int32),
// sum_c w = sum(u_lo + u_hi) - 8 B. The per-block float32 sums then run over the 16 rows of the tile at once,
// each lane in TFLite's order over the blocks, and the output stage y = (out - f32(zp) * kfsum) * s.
template <int NR>
void Int4Tile(const uint8_t* W, const float* S, int64_t K, int64_t B, int64_t O, const int8_t* xe, const int8_t* xo,
              int64_t xstride, const int32_t* xs8, const float* s, const int32_t* zp, int64_t t, float* Y) {
  const int64_t NU = K * B / 32, UB = B / 32, row_bytes = NU * 16;
  const __m512i m88 = _mm512_set1_epi8(static_cast<char>(0x88)), m0f = _mm512_set1_epi8(0x0F);
  const __m512i ones = _mm512_set1_epi8(1);
  const __m512i ks8 = _mm512_set1_epi32(static_cast<int32_t>(8 * B));
  const int64_t o0 = t * 16;
  const int valid = static_cast<int>(std::min<int64_t>(16, O - o0));
  const uint8_t* rows[16];
  int32_t sidx_[16];
  for (int r = 0; r < 16; ++r) {
    const int64_t o = o0 + std::min(r, valid - 1);
    rows[r] = W + o * row_bytes;
    sidx_[r] = static_cast<int32_t>((o - o0) * K);
  }
  const __m512i sidx = _mm512_loadu_si512(sidx_);
  const float* so = S + o0 * K;
  for (int64_t b = 0; b < 16 * K * 4; b += 64)  // the scales of the tile kPrefetchBytes / 16 rows ahead
    _mm_prefetch(reinterpret_cast<const char*>(so) + kPrefetchBytes / row_bytes * K * 4 + b, _MM_HINT_T1);
  __m512 y[NR], kf = _mm512_setzero_ps();
  __m512i isum[NR], iks = _mm512_setzero_si512();
  for (int i = 0; i < NR; ++i) {
    y[i] = _mm512_setzero_ps();
    isum[i] = _mm512_setzero_si512();
  }
  int64_t k = 0, in_block = 0;
  for (int64_t u0 = 0; u0 < NU; u0 += 4) {
    const int nu = static_cast<int>(std::min<int64_t>(4, NU - u0));
    const __mmask64 lm = nu == 4 ? ~__mmask64(0) : ((__mmask64(1) << (16 * nu)) - 1);
    __m512i ve[NR], vo[NR];
    for (int i = 0; i < NR; ++i) {
      ve[i] = _mm512_loadu_si512(xe + i * xstride + u0 * 16);
      vo[i] = _mm512_loadu_si512(xo + i * xstride + u0 * 16);
    }
    __m512i zd[NR][4], zk[4];
    for (int g = 0; g < 4; ++g) {
      __m512i lo[4], hi[4], kk[4];
      for (int j = 0; j < 4; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(rows[4 * g + j] + u0 * 16 + kPrefetchBytes), _MM_HINT_T1);
        const __m512i v = _mm512_xor_si512(_mm512_maskz_loadu_epi8(lm, rows[4 * g + j] + u0 * 16), m88);
        lo[j] = _mm512_and_si512(v, m0f);
        hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m0f);
        kk[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_add_epi8(lo[j], hi[j]), ones);
      }
      zk[g] = Reduce4(kk[0], kk[1], kk[2], kk[3]);
      for (int i = 0; i < NR; ++i) {
        __m512i d[4];
        for (int j = 0; j < 4; ++j)
          d[j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[j], ve[i]), hi[j], vo[i]);
        zd[i][g] = Reduce4(d[0], d[1], d[2], d[3]);
      }
    }
    __m512i vd[NR][4], vk[4];
    Transpose4(zk, vk);
    for (int i = 0; i < NR; ++i) Transpose4(zd[i], vd[i]);
    for (int b = 0; b < nu; ++b) {  // unit u0 + b of the 16 rows, in order
      iks = _mm512_add_epi32(iks, vk[b]);
      for (int i = 0; i < NR; ++i) isum[i] = _mm512_add_epi32(isum[i], vd[i][b]);
      if (++in_block == UB) {  // block k complete: TFLite's float32 step, per lane
        const __m512 sc = _mm512_i32gather_ps(sidx, so + k, 4);
        const __m512 fk = _mm512_cvtepi32_ps(_mm512_sub_epi32(iks, ks8));
        kf = _mm512_add_ps(kf, _mm512_mul_ps(sc, fk));
        iks = _mm512_setzero_si512();
        for (int i = 0; i < NR; ++i) {
          const __m512 fd = _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[i], _mm512_set1_epi32(xs8[i * K + k])));
          y[i] = _mm512_add_ps(y[i], _mm512_mul_ps(fd, sc));
          isum[i] = _mm512_setzero_si512();
        }
        in_block = 0;
        ++k;
      }
    }
  }
  for (int i = 0; i < NR; ++i) {
    const __m512 out = _mm512_mul_ps(_mm512_sub_ps(y[i], _mm512_mul_ps(_mm512_set1_ps(static_cast<float>(zp[i])), kf)),
                                     _mm512_set1_ps(s[i]));
    _mm512_mask_storeu_ps(Y + i * O + o0, static_cast<__mmask16>((1u << valid) - 1), out);
  }
}

// Int4Tile for the R input rows (from r = 0, in groups of up to kRowGroup) and tiles t0 .. t1 - 1.
void Int4Tiles(const uint8_t* W, const float* S, int64_t K, int64_t B, int64_t O, int64_t R, const int8_t* xe,
               const int8_t* xo, int64_t xstride, const int32_t* xs8, const float* s, const int32_t* zp, int64_t t0,
               int64_t t1, float* Y) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t r = 0; r < R; r += 4) {
      const int64_t n = std::min<int64_t>(4, R - r);
      const int8_t *e = xe + r * xstride, *od = xo + r * xstride;
      const int32_t* x8 = xs8 + r * K;
      float* y = Y + r * O;
      switch (n) {
        case 1: Int4Tile<1>(W, S, K, B, O, e, od, xstride, x8, s + r, zp + r, t, y); break;
        case 2: Int4Tile<2>(W, S, K, B, O, e, od, xstride, x8, s + r, zp + r, t, y); break;
        case 3: Int4Tile<3>(W, S, K, B, O, e, od, xstride, x8, s + r, zp + r, t, y); break;
        default: Int4Tile<4>(W, S, K, B, O, e, od, xstride, x8, s + r, zp + r, t, y); break;
      }
    }
}
#endif

// x float32 [R, I], w [O, K, B] (int8, or int4 packed), scale float32 [O, K] -> out float32 [R, O]: each input
// row quantized asymmetrically (AsymQuantizeRow), the blockwise sums in TFLite's order, then
// out = (sum - f32(zp) * kfsum) * s. The same float operations as fbjax.lower.tflite_int.hybrid._fc_blockwise
// (without bias) in the same order: the same bits.
ffi::Error BlockFcF32(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer w, ffi::Buffer<ffi::F32> scale,
                      ffi::ResultBuffer<ffi::F32> out) {
  const auto xd = x.dimensions(), wd = w.dimensions(), sd = scale.dimensions();
  if (xd.size() != 2 || wd.size() != 3 || xd[1] != wd[1] * wd[2] || sd.size() != 2 || sd[0] != wd[0] ||
      sd[1] != wd[1])
    return ffi::Error::InvalidArgument("fbjax_block_fc_f32: x [R, K * B], w [O, K, B], scale [O, K] expected");
  const bool packed = w.element_type() == ffi::S4;
  if (!packed && w.element_type() != ffi::S8)
    return ffi::Error::InvalidArgument("fbjax_block_fc_f32: w int8 or int4");
  const int64_t R = xd[0], I = xd[1], K = wd[1], B = wd[2], O = wd[0];
  if (B > 1024 || (packed && B % 2)) return ffi::Error::InvalidArgument("fbjax_block_fc_f32: block size <= 1024");
  const float* X = x.typed_data();
  const uint8_t* W = static_cast<const uint8_t*>(w.untyped_data());
  const float* S = scale.typed_data();
  float* Y = out->typed_data();
  std::unique_ptr<int8_t[]> q(new int8_t[std::max<int64_t>(R * I, 1)]);
  std::unique_ptr<float[]> s(new float[std::max<int64_t>(R, 1)]);
  std::unique_ptr<int32_t[]> zp(new int32_t[std::max<int64_t>(R, 1)]);
  for (int64_t r = 0; r < R; ++r) AsymQuantizeRow(X + r * I, I, q.get() + r * I, s.get() + r, zp.get() + r);
  if (R == 0 || O == 0) return ffi::Error::Success();
#if defined(FBJAX_VNNI)
  if (packed && B % 32 == 0) {
    const int64_t NU = I / 32, xstride = (NU + 3) / 4 * 4 * 16;
    std::unique_ptr<int8_t[]> xe(new int8_t[R * xstride]()), xo(new int8_t[R * xstride]());
    std::unique_ptr<int32_t[]> xs8(new int32_t[R * K]);
    for (int64_t r = 0; r < R; ++r)
      SplitUnits(q.get() + r * I, NU, K, B, xe.get() + r * xstride, xo.get() + r * xstride, xs8.get() + r * K);
    const int64_t tiles = (O + 15) / 16;
    const int64_t tile_bytes = 16 * NU * 16 * std::min<int64_t>(R, 4);  // work ~ weight bytes x row group
    const int64_t per = std::max<int64_t>(1, kTileChunkBytes / tile_bytes);
    const int64_t chunks = (tiles + per - 1) / per;
    const int8_t *pe = xe.get(), *po = xo.get();
    const int32_t* px = xs8.get();
    const float* ps = s.get();
    const int32_t* pz = zp.get();
    auto run = [=](int64_t c) {
      Int4Tiles(W, S, K, B, O, R, pe, po, xstride, px, ps, pz, c * per, std::min(tiles, (c + 1) * per), Y);
    };
    if (R == 1 && O * NU * 16 < kInt4ParallelMinBytes) {
      for (int64_t c = 0; c < chunks; ++c) run(c);
    } else {
      ParallelChunks(pool, chunks, run);
    }
    return ffi::Error::Success();
  }
#endif
  std::unique_ptr<int16_t[]> x16(new int16_t[R * I]);
  for (int64_t k = 0; k < R * I; ++k) x16[k] = q[k];
  std::unique_ptr<float[]> kf(new float[O]);
  BlockFcSums(pool, x16.get(), W, packed, S, R, K, B, O, Y, kf.get());
  for (int64_t r = 0; r < R; ++r) {
    const float zf = static_cast<float>(zp[r]), sr = s[r];
    for (int64_t o = 0; o < O; ++o) {
      const float t = zf * kf[o];
      const float d = Y[r * O + o] - t;
      Y[r * O + o] = d * sr;
    }
  }
  return ffi::Error::Success();
}

// How far ahead of its loads the symmetric int8 kernel prefetches weights (the rows are contiguous, read in
// order; a prefetch past the end is a hint, it does not fault). One thread, one input row, 30 stacked
// [1536, 576] blocks (26.5 MB): 30.4 GB/s without, 28.5 at 1 KB, 34.2 at 4 KB, 36.7 at 16 KB; the
// [49152, 576] LM head: 18.5, 24.1, 32.5, 36.4 GB/s (this machine, idle).
constexpr int64_t kSymPrefetch = 16 * 1024;

// Symmetric int8 x int8 products: x int8 [R, I] (|x| <= 127: rows quantized symmetrically, zero point 0),
// w int8 [O, I] -> y int32 [R, O], y[r, o] = sum_i x[r, i] * w[o, i]. With AVX-512 VNNI: vpdpbusd takes
// unsigned bytes times signed bytes, so the weights go in as w + 128 (w ^ 0x80) and 128 * sum_i x[r, i]
// is subtracted after: the same integers. Each weight row is loaded once per group of 4 input rows (from
// L1 after the first), 64 products per instruction.
ffi::Error Int8MatmulSym(ffi::ThreadPool pool, ffi::Buffer<ffi::S8> x, ffi::Buffer<ffi::S8> w,
                         ffi::ResultBuffer<ffi::S32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1])
    return ffi::Error::InvalidArgument("fbjax_int8_matmul_sym: x [R, I] and w [O, I] expected");
  const int64_t R = xd[0], I = xd[1], O = wd[0];
  const int8_t* X = x.typed_data();
  const int8_t* W = w.typed_data();
  int32_t* Y = y->typed_data();
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && !defined(FBJAX_NO_VNNI)
  const int64_t iv = I / 64 * 64;  // the part summed 64 at a time
  std::unique_ptr<int32_t[]> xsum(new int32_t[R > 0 ? R : 1]);
  for (int64_t r = 0; r < R; ++r) {
    int32_t s = 0;
    for (int64_t i = 0; i < iv; ++i) s += X[r * I + i];
    xsum[r] = 128 * s;
  }
  const int32_t* XS = xsum.get();
  const int64_t per = std::max<int64_t>(1, (kChunkBytes / 4) / std::max<int64_t>(I, 1));
  const int64_t chunks = (O + per - 1) / per;
  const auto body = [=](int64_t c) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int64_t o = c * per; o < std::min(O, (c + 1) * per); ++o) {
      const int8_t* wr = W + o * I;
      int64_t r0 = 0;
      for (; r0 + 8 <= R; r0 += 8) {  // 8 rows: each weight vector loaded once for all of them
        __m512i a[8];
        for (int k = 0; k < 8; ++k) a[k] = _mm512_setzero_si512();
        const int8_t* x0 = X + r0 * I;
        for (int64_t i = 0; i < iv; i += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(wr + i + kSymPrefetch), _MM_HINT_T0);
          const __m512i wv = _mm512_xor_si512(_mm512_loadu_si512(wr + i), flip);
#pragma GCC unroll 8
          for (int k = 0; k < 8; ++k) a[k] = _mm512_dpbusd_epi32(a[k], wv, _mm512_loadu_si512(x0 + k * I + i));
        }
        for (int k = 0; k < 8; ++k) {
          int32_t v = _mm512_reduce_add_epi32(a[k]) - XS[r0 + k];
          for (int64_t i = iv; i < I; ++i) v += int32_t(x0[k * I + i]) * int32_t(wr[i]);
          Y[(r0 + k) * O + o] = v;
        }
      }
      for (; r0 < R; r0 += 4) {
        const int rows = static_cast<int>(std::min<int64_t>(4, R - r0));
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
        const int8_t* x0 = X + r0 * I;
        for (int64_t i = 0; i < iv; i += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(wr + i + kSymPrefetch), _MM_HINT_T0);
          const __m512i wv = _mm512_xor_si512(_mm512_loadu_si512(wr + i), flip);
          a0 = _mm512_dpbusd_epi32(a0, wv, _mm512_loadu_si512(x0 + i));
          if (rows > 1) a1 = _mm512_dpbusd_epi32(a1, wv, _mm512_loadu_si512(x0 + I + i));
          if (rows > 2) a2 = _mm512_dpbusd_epi32(a2, wv, _mm512_loadu_si512(x0 + 2 * I + i));
          if (rows > 3) a3 = _mm512_dpbusd_epi32(a3, wv, _mm512_loadu_si512(x0 + 3 * I + i));
        }
        const __m512i acc[4] = {a0, a1, a2, a3};
        for (int k = 0; k < rows; ++k) {
          int32_t v = _mm512_reduce_add_epi32(acc[k]) - XS[r0 + k];
          for (int64_t i = iv; i < I; ++i) v += int32_t(x0[k * I + i]) * int32_t(wr[i]);
          Y[(r0 + k) * O + o] = v;
        }
      }
    }
  };
  if (R == 1 && O * I < (4 << 20)) {  // one row, a small matrix: the calling thread alone
    for (int64_t c = 0; c < chunks; ++c) body(c);
  } else {
    ParallelChunks(pool, chunks, body);
  }
  return ffi::Error::Success();
#else
  // no VNNI: the rows widened to int16 and fbjax_int8_matmul's kernels (AVX2 where the CPU has it)
  std::unique_ptr<int16_t[]> x16(new int16_t[R * I > 0 ? R * I : 1]);
  for (int64_t k = 0; k < R * I; ++k) x16[k] = X[k];
  int64_t dims[2] = {R, I};
  XLA_FFI_Buffer xb;
  xb.struct_size = XLA_FFI_Buffer_STRUCT_SIZE;
  xb.extension_start = nullptr;
  xb.dtype = static_cast<XLA_FFI_DataType>(ffi::S16);
  xb.data = x16.get();
  xb.rank = 2;
  xb.dims = dims;
  return Int8Matmul(pool, ffi::Buffer<ffi::S16>(&xb), w, y);
#endif
}

// One block of a layer scan's stacked weights w [L, ...] (fbjax/lower/layer_slice.py), read in place:
// a buffer of rank - 1 at block `layer`, handed to the kernels above.
struct LayerView {
  XLA_FFI_Buffer buf;
  int64_t dims[8];
};

ffi::Error MakeLayerView(ffi::AnyBuffer w, ffi::Buffer<ffi::S32> layer, LayerView* v) {
  const auto d = w.dimensions();
  if (d.size() < 2 || d.size() > 9 || layer.element_count() != 1)
    return ffi::Error::InvalidArgument("fbjax: stacked weights [L, ...] and a scalar block index expected");
  const int32_t k = *layer.typed_data();
  if (k < 0 || k >= d[0]) return ffi::Error::InvalidArgument("fbjax: block index out of range");
  int64_t n = 1;
  for (size_t i = 1; i < d.size(); ++i) {
    v->dims[i - 1] = d[i];
    n *= d[i];
  }
  const int64_t bits = w.element_type() == ffi::S4 ? 4 : 8 * static_cast<int64_t>(ffi::ByteWidth(w.element_type()));
  if ((n * bits) % 8) return ffi::Error::InvalidArgument("fbjax: a block must fill whole bytes");
  v->buf.struct_size = XLA_FFI_Buffer_STRUCT_SIZE;
  v->buf.extension_start = nullptr;
  v->buf.dtype = static_cast<XLA_FFI_DataType>(w.element_type());
  v->buf.data = static_cast<uint8_t*>(w.untyped_data()) + k * (n * bits / 8);
  v->buf.rank = static_cast<int64_t>(d.size()) - 1;
  v->buf.dims = v->dims;
  return ffi::Error::Success();
}

ffi::Error Int8MatmulAt(ffi::ThreadPool pool, ffi::Buffer<ffi::S16> x, ffi::AnyBuffer w, ffi::Buffer<ffi::S32> layer,
                        ffi::ResultBuffer<ffi::S32> y) {
  LayerView v;
  ffi::Error e = MakeLayerView(w, layer, &v);
  if (e.failure()) return e;
  if (w.element_type() != ffi::S8) return ffi::Error::InvalidArgument("fbjax_int8_matmul_at: w must be int8");
  return Int8Matmul(pool, x, ffi::Buffer<ffi::S8>(&v.buf), y);
}

ffi::Error Int8MatmulSymAt(ffi::ThreadPool pool, ffi::Buffer<ffi::S8> x, ffi::AnyBuffer w, ffi::Buffer<ffi::S32> layer,
                           ffi::ResultBuffer<ffi::S32> y) {
  LayerView v;
  ffi::Error e = MakeLayerView(w, layer, &v);
  if (e.failure()) return e;
  if (w.element_type() != ffi::S8) return ffi::Error::InvalidArgument("fbjax_int8_matmul_sym_at: w must be int8");
  return Int8MatmulSym(pool, x, ffi::Buffer<ffi::S8>(&v.buf), y);
}

ffi::Error BlockMatmulAt(ffi::ThreadPool pool, ffi::Buffer<ffi::S16> x, ffi::AnyBuffer w, ffi::Buffer<ffi::S32> layer,
                         ffi::ResultBuffer<ffi::S32> acc, ffi::ResultBuffer<ffi::S32> ksum) {
  LayerView v;
  ffi::Error e = MakeLayerView(w, layer, &v);
  if (e.failure()) return e;
  return BlockMatmulAny(pool, x, ffi::AnyBuffer(&v.buf), acc, ksum);
}

ffi::Error BlockFcAt(ffi::ThreadPool pool, ffi::Buffer<ffi::S16> x, ffi::AnyBuffer w, ffi::Buffer<ffi::F32> scale,
                     ffi::Buffer<ffi::S32> layer, ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> kfsum) {
  LayerView v;
  ffi::Error e = MakeLayerView(w, layer, &v);
  if (e.failure()) return e;
  return BlockFc(pool, x, ffi::AnyBuffer(&v.buf), scale, out, kfsum);
}

// The scales are the block's own [O, K], or stacked [L, O, K] like the weights and read at the same block.
ffi::Error BlockFcF32At(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer w, ffi::AnyBuffer scale,
                        ffi::Buffer<ffi::S32> layer, ffi::ResultBuffer<ffi::F32> out) {
  LayerView v, sv;
  ffi::Error e = MakeLayerView(w, layer, &v);
  if (e.failure()) return e;
  if (scale.element_type() != ffi::F32) return ffi::Error::InvalidArgument("fbjax_block_fc_f32_at: scale float32");
  if (scale.dimensions().size() == 3) {
    e = MakeLayerView(scale, layer, &sv);
    if (e.failure()) return e;
  } else {  // the block's own: the same buffer, as a view
    const auto d = scale.dimensions();
    if (d.size() > 8) return ffi::Error::InvalidArgument("fbjax_block_fc_f32_at: scale [O, K] or [L, O, K]");
    for (size_t i = 0; i < d.size(); ++i) sv.dims[i] = d[i];
    sv.buf.struct_size = XLA_FFI_Buffer_STRUCT_SIZE;
    sv.buf.extension_start = nullptr;
    sv.buf.dtype = static_cast<XLA_FFI_DataType>(ffi::F32);
    sv.buf.data = scale.untyped_data();
    sv.buf.rank = static_cast<int64_t>(d.size());
    sv.buf.dims = sv.dims;
  }
  return BlockFcF32(pool, x, ffi::AnyBuffer(&v.buf), ffi::Buffer<ffi::F32>(&sv.buf), out);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(fbjax_int8_matmul_at, Int8MatmulAt,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S16>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(fbjax_int8_matmul_sym, Int8MatmulSym,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(fbjax_int8_matmul_sym_at, Int8MatmulSymAt,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(fbjax_block_matmul_at, BlockMatmulAt,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S16>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(fbjax_block_fc_at, BlockFcAt,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S16>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(fbjax_int8_matmul, Int8Matmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S16>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(fbjax_block_matmul, BlockMatmulAny,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S16>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(fbjax_block_fc, BlockFc,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S16>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(fbjax_block_fc_f32, BlockFcF32,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(fbjax_block_fc_f32_at, BlockFcF32At,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
