// fbjax's CPU kernel for the attention composite (odml.scaled_dot_product_attention), called
// through XLA's FFI; fbjax/lower/cpu_kernels.py compiles it with cpu_kernels.cc into one library.
//
// XLA:CPU runs jax.nn.dot_product_attention's two dot_generals on K and V transposed to
// [B, K, H, S] / [B, K, S, H] first: copies of the whole caches on every decode step, which grow
// with the batch and the cache length (~19 ms of a 53 ms batch-8 step of a 30-layer model). This
// kernel reads the caches where they lie, [.., S, K, H], once per query head group.
//
//   fbjax_attention: q float32 [B, T, N, H]; k float32 [R, Lk, B0, S, K, H], v [R, Lv, B0, S, K, H],
//                    R * B0 == B (a layer scan's stacked caches, and vmapped rows, read in place:
//                    batch row b = r * B0 + b0 reads k[r, layer[0], b0] and v[r, layer[1], b0]); mask float32 [Bm, Nm, T, S] (Bm divides
//                    B, batch row b reads mask row b / (B / Bm); Nm 1 or N) or an empty array (no
//                    mask); layer int32 [2], the blocks of k and v; attributes scale, cap (0: no soft cap).
//                    -> out float32 [B, T, N, H]. Query head n reads key/value head n / (N / K).
//
// The float32 computation, in this order, for each batch row b, query position t, head n (kv head
// j = n / (N / K)):
//   x[s]   = sum_h q[h] * k[s, h]: eight partial sums (lane l: h = l, l + 8, ... in increasing h,
//            each product rounded, then added), combined as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) +
//            (l6 + l7)); the last H % 8 products (when H is not a multiple of 8) added after, in order.
//   x[s]   = x[s] * scale;  with a cap: x[s] = cap * tanh(x[s] / cap) (C's tanhf);  x[s] = x[s] + mask.
//   m      = max_s x[s];  e[s] = exp(x[s] - m) (a polynomial exp within 2 ulp; 0 below ln(FLT_MIN),
//            i.e. where the term is < 2^-126 of the row's largest, 1);
//   sum    = eight partial sums of e over s (lane l: s = l, l + 8, ...), combined as above, then the
//            last S % 8 terms in order;
//   out[h] = (sum over s in increasing order of e[s] * v[s, h]) / sum.
// No fused multiply-adds (the library is built with -ffp-contract=off).
//
// Masked keys are not read: a key whose mask value is <= -2^125 (litert-torch's masks hold
// float32's lowest, -3.4e38, or -inf) gets the weight e = 0 whatever its key and value hold, as
// the computation above gives for any logit of magnitude below 2^124, provided the row's largest
// computed x is above -2^123 (checked: a row where it is not, or whose every key is masked, is
// computed over every key). Terms e[s] * v[s, h] with e[s] == 0 are not added (v not read). So a
// decode step reads only the cache positions written so far.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"
#include "cpu_parallel.h"

namespace ffi = xla::ffi;

namespace {

using fbjax_cpu::ParallelChunks;

constexpr float kMaskedAt = -4.2535296e37f;  // -2^125: keys with mask <= this are not read
// How many keys ahead the weighted sum of the values prefetches their rows (decode step, 8 rows x 30 layers
// of a SmolLM2-135M cache at position 100: see the commit adding it)
constexpr int64_t kPvAhead = 8;
constexpr int64_t kInlineWork = int64_t{1} << 20;  // B * T * N * S * H below this: no pool threads
constexpr float kRowFloor = -1.0633824e37f;  // -2^123: a row's largest computed logit must exceed it
constexpr float kExpLow = -87.33654f;        // ln(FLT_MIN): exp below it is taken as 0

// The order of the dot product written in the header, one key.
inline float DotScalar(const float* q, const float* k, int64_t H) {
  const int64_t H8 = H / 8 * 8;
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t c = 0; c < H8; c += 8)
    for (int j = 0; j < 8; ++j) {
      const float p = q[c + j] * k[c + j];
      l[j] = l[j] + p;
    }
  float s = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
  for (int64_t h = H8; h < H; ++h) {
    const float p = q[h] * k[h];
    s = s + p;
  }
  return s;
}

inline float ExpScalar(float x) {
  if (std::isnan(x)) return x;
  if (x < kExpLow) return 0.0f;
  return std::exp(x);
}

#if defined(__AVX2__)
// The four sums of the 8 lanes of a0..a3, each ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
inline __m128 Sum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

inline float HSum(__m256 a) { return _mm_cvtss_f32(Sum4(a, a, a, a)); }

// exp of 8 floats: x = n ln2 + r (Cody-Waite), exp(r) by a degree-6 polynomial (Cephes expf), times
// 2^n; 0 below ln(FLT_MIN), +inf above ln(FLT_MAX), NaN kept.
inline __m256 Exp8(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(kExpLow);
  __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  __m256 fx = _mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  __m256 r = _mm256_sub_ps(xc, _mm256_mul_ps(fx, _mm256_set1_ps(0.693359375f)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(fx, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(y, r2), r), _mm256_set1_ps(1.0f));
  // 2^n: n in [-126, 128]; n = 128 (x near ln(FLT_MAX)) as 2^127 * 2
  const __m256i n = _mm256_cvtps_epi32(fx);
  const __m256i n1 = _mm256_min_epi32(n, _mm256_set1_epi32(127));
  const __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
  const __m256 p2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(n, n1), _mm256_set1_epi32(127)), 23));
  y = _mm256_mul_ps(_mm256_mul_ps(y, p1), p2);
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(std::numeric_limits<float>::infinity()), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// x[i][kk] = q_i . k_kk for RR query rows q[i] and 4 keys (k + kk * ks), H % 8 == 0.
template <int RR>
inline void DotTile(const float* const* q, const float* k, int64_t ks, int64_t H, float* x, int64_t xs) {
  for (int j = 0; j < 4; ++j)  // the keys two tiles ahead (a prefetch past the cache's end is only a hint)
    for (int64_t c = 0; c < H; c += 16)
      _mm_prefetch(reinterpret_cast<const char*>(k + (8 + j) * ks + c), _MM_HINT_T0);
  __m256 a[RR][4];
  for (int i = 0; i < RR; ++i)
    for (int j = 0; j < 4; ++j) a[i][j] = _mm256_setzero_ps();
  for (int64_t c = 0; c < H; c += 8) {
    __m256 qv[RR];
    for (int i = 0; i < RR; ++i) qv[i] = _mm256_loadu_ps(q[i] + c);
    for (int j = 0; j < 4; ++j) {
      const __m256 kv = _mm256_loadu_ps(k + j * ks + c);
      for (int i = 0; i < RR; ++i) a[i][j] = _mm256_add_ps(a[i][j], _mm256_mul_ps(qv[i], kv));
    }
  }
  for (int i = 0; i < RR; ++i) _mm_storeu_ps(x + i * xs, Sum4(a[i][0], a[i][1], a[i][2], a[i][3]));
}

// acc rows: out[i][h] += e[i][s] * v[s][h] for s in [s0, s1), RR rows, 8 * NC values of h from h0: each
// value row's 8 * NC floats read once per key (NC = 8 with H = 64: the whole row, one pass over the keys).
template <int RR, int NC>
inline void PvTile(const float* e, int64_t es, const float* v, int64_t vs, int64_t s0, int64_t s1, float* out,
                   int64_t os, int64_t h0) {
  __m256 a[RR][NC];
  for (int i = 0; i < RR; ++i)
    for (int c = 0; c < NC; ++c) a[i][c] = _mm256_loadu_ps(out + i * os + h0 + 8 * c);
  for (int64_t s = s0; s < s1; ++s) {
    bool any = false;
    for (int i = 0; i < RR; ++i) any |= e[i * es + s] != 0.0f;
    if (!any) continue;  // (a masked key: not read)
    const float* vr = v + s * vs + h0;
    // the value rows are K * H floats apart: fetch the row kPvAhead keys ahead
    for (int c = 0; c < NC; c += 2)
      _mm_prefetch(reinterpret_cast<const char*>(vr + kPvAhead * vs + 8 * c), _MM_HINT_T0);
    __m256 w[RR];
    for (int i = 0; i < RR; ++i) w[i] = _mm256_broadcast_ss(e + i * es + s);
    for (int c = 0; c < NC; ++c) {
      const __m256 vc = _mm256_loadu_ps(vr + 8 * c);
      for (int i = 0; i < RR; ++i) a[i][c] = _mm256_add_ps(a[i][c], _mm256_mul_ps(w[i], vc));
    }
  }
  for (int i = 0; i < RR; ++i)
    for (int c = 0; c < NC; ++c) _mm256_storeu_ps(out + i * os + h0 + 8 * c, a[i][c]);
}
#endif

struct Problem {
  const float *Q, *Kc, *Vc, *M;  // Kc, Vc: block `layer` of row r = 0, b0 = 0
  int64_t B, T, N, H, S, K, G, B0, Bm, Nm;
  int64_t k_row, v_row;  // floats between consecutive r (L * B0 * S * K * H)
  int64_t kv_batch;  // floats between consecutive b0 (S * K * H)
  float scale, cap;
};

constexpr int64_t kKeyBlock = 4;  // keys per skip decision / dot tile


// out rows [i, i + rr) (rr <= 4): PvTile over keys [a, c): with H == 64 and rr <= 3 (a decode step of
// grouped-query attention) the whole value row per key, else every 16 values of h.
inline void PvRows(int rr, const float* e, int64_t S, const float* v, int64_t vs, int64_t a, int64_t c, float* out,
                   int64_t H) {
#if defined(__AVX2__)
  if (H == 64 && rr <= 3) {
    switch (rr) {
      case 1: PvTile<1, 8>(e, S, v, vs, a, c, out, H, 0); break;
      case 2: PvTile<2, 8>(e, S, v, vs, a, c, out, H, 0); break;
      default: PvTile<3, 8>(e, S, v, vs, a, c, out, H, 0); break;
    }
    return;
  }
  if (H % 16 == 0) {
    for (int64_t h0 = 0; h0 < H; h0 += 16) switch (rr) {
        case 1: PvTile<1, 2>(e, S, v, vs, a, c, out, H, h0); break;
        case 2: PvTile<2, 2>(e, S, v, vs, a, c, out, H, h0); break;
        case 3: PvTile<3, 2>(e, S, v, vs, a, c, out, H, h0); break;
        default: PvTile<4, 2>(e, S, v, vs, a, c, out, H, h0); break;
      }
    return;
  }
#endif
  for (int i = 0; i < rr; ++i) {
    const float* ei = e + i * S;
    float* oi = out + i * H;
    for (int64_t s = a; s < c; ++s) {
      const float w = ei[s];
      if (w == 0.0f) continue;  // (a masked key: not read)
      const float* vr = v + s * vs;
      for (int64_t h = 0; h < H; ++h) {
        const float pv = w * vr[h];
        oi[h] = oi[h] + pv;
      }
    }
  }
}

// One work item: batch row b, kv head j, query positions [t0, t1) (rows i = (t - t0) * G + g).
// x: scratch [rows, S] (logits, then weights); acc: [rows, H] numerators, then [rows] sums.
void Item(const Problem& p, int64_t b, int64_t j, int64_t t0, int64_t t1, float* x, float* acc) {
  const int64_t H = p.H, S = p.S, G = p.G;
  const int64_t rows = (t1 - t0) * G;
  const int64_t r = b / p.B0, b0 = b % p.B0;
  const float* kb = p.Kc + r * p.k_row + b0 * p.kv_batch + j * H;  // key s at kb + s * K * H
  const float* vb = p.Vc + r * p.v_row + b0 * p.kv_batch + j * H;
  const int64_t ks = p.K * H;
  std::unique_ptr<const float*[]> qr(new const float*[rows]), mr(new const float*[rows]);
  std::unique_ptr<int64_t[]> lo(new int64_t[rows]), hi(new int64_t[rows]);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t t = t0 + i / G, n = j * G + i % G;
    qr[i] = p.Q + ((b * p.T + t) * p.N + n) * H;
    mr[i] = p.M == nullptr ? nullptr
                           : p.M + (((b / (p.B / p.Bm)) * p.Nm + (p.Nm == 1 ? 0 : n)) * p.T + t) * S;
  }
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // x[i][s] for rows [i0, i0 + nr) (nr <= 3); with `all` false a block of keys that every one of these
  // rows masks is skipped (x = -inf), and a masked key's x is -inf; [lo, hi): the keys computed
  auto logits = [&](int64_t i0, int64_t nr, bool all) {
    for (int64_t i = i0; i < i0 + nr; ++i) lo[i] = S, hi[i] = 0;
    for (int64_t s0 = 0; s0 < S; s0 += kKeyBlock) {
      const int64_t kn = std::min(kKeyBlock, S - s0);
      bool skip = !all && mr[i0] != nullptr;
      for (int64_t i = i0; i < i0 + nr && skip; ++i)
        for (int64_t s = s0; s < s0 + kn; ++s)
          if (!(mr[i][s] <= kMaskedAt)) { skip = false; break; }
      if (skip) {
        for (int64_t i = i0; i < i0 + nr; ++i)
          for (int64_t s = s0; s < s0 + kn; ++s) x[i * S + s] = neg_inf;
        continue;
      }
#if defined(__AVX2__)
      if (H % 8 == 0 && kn == kKeyBlock) {
        int64_t i = i0;
        for (; i + 3 <= i0 + nr; i += 3) DotTile<3>(&qr[i], kb + s0 * ks, ks, H, x + i * S + s0, S);
        for (; i < i0 + nr; ++i) DotTile<1>(&qr[i], kb + s0 * ks, ks, H, x + i * S + s0, S);
      } else
#endif
      {
        for (int64_t i = i0; i < i0 + nr; ++i)
          for (int64_t s = s0; s < s0 + kn; ++s) x[i * S + s] = DotScalar(qr[i], kb + s * ks, H);
      }
      for (int64_t i = i0; i < i0 + nr; ++i) {
        float* xi = x + i * S;
        const float* mi = mr[i];
        lo[i] = std::min(lo[i], s0);
        hi[i] = s0 + kn;
        for (int64_t s = s0; s < s0 + kn; ++s) {
          float y = xi[s] * p.scale;
          if (p.cap != 0.0f) {
            const float d = y / p.cap;
            y = p.cap * std::tanh(d);
          }
          if (mi != nullptr) y = (!all && mi[s] <= kMaskedAt) ? neg_inf : y + mi[s];
          xi[s] = y;
        }
      }
    }
  };
  for (int64_t i0 = 0; i0 < rows; i0 += 3) logits(i0, std::min<int64_t>(3, rows - i0), false);
  const int64_t S8 = S / 8 * 8;
  for (int64_t i = 0; i < rows; ++i) {
    float* xi = x + i * S;
    // the row's largest logit, and whether one is NaN, over the computed keys (the others are -inf)
    auto scan = [&](float& m, bool& nan) {
      m = neg_inf;
      nan = false;
      int64_t s = lo[i];
#if defined(__AVX2__)
      __m256 mv = _mm256_set1_ps(neg_inf), un = _mm256_setzero_ps();
      for (; s + 8 <= hi[i]; s += 8) {
        const __m256 v = _mm256_loadu_ps(xi + s);
        mv = _mm256_max_ps(mv, v);
        un = _mm256_or_ps(un, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      }
      float mb[8];
      _mm256_storeu_ps(mb, mv);
      for (int q = 0; q < 8; ++q) m = std::max(m, mb[q]);
      nan = _mm256_movemask_ps(un) != 0;
#endif
      for (; s < hi[i]; ++s) {
        m = std::max(m, xi[s]);
        nan = nan || std::isnan(xi[s]);
      }
    };
    float m;
    bool nan;
    scan(m, nan);
    if (!nan && !(m > kRowFloor) && mr[i] != nullptr) {
      logits(i, 1, true);  // every key masked, or no computed logit above the floor: every key
      scan(m, nan);
    }
    if (nan) m = std::numeric_limits<float>::quiet_NaN();
    // e[s] = exp(x[s] - m) in place and their sum, over whole groups of 8 keys covering [lo, hi): the
    // keys outside [lo, hi) have e = 0, which leaves every partial sum as it is
    const int64_t a = lo[i] / 8 * 8, c = std::min(S8, (hi[i] + 7) / 8 * 8);
    float sum;
#if defined(__AVX2__)
    {
      __m256 sl = _mm256_setzero_ps();
      const __m256 mv = _mm256_set1_ps(m);
      for (int64_t s = a; s < c; s += 8) {
        const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(xi + s), mv));
        _mm256_storeu_ps(xi + s, e);
        sl = _mm256_add_ps(sl, e);
      }
      sum = HSum(sl);
    }
#else
    {
      float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t s = a; s < c; s += 8)
        for (int q = 0; q < 8; ++q) {
          xi[s + q] = ExpScalar(xi[s + q] - m);
          l[q] = l[q] + xi[s + q];
        }
      sum = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    }
#endif
    for (int64_t s = std::max(S8, lo[i]); s < hi[i]; ++s) {
      xi[s] = ExpScalar(xi[s] - m);
      sum = sum + xi[s];
    }
    std::memset(acc + i * H, 0, sizeof(float) * H);
    acc[rows * H + i] = sum;
  }
  // out[i][h] = sum_s e[i][s] * v[s][h], s increasing over the computed keys, 4 rows at a time
  for (int64_t i = 0; i < rows; i += 4) {
    const int rr = static_cast<int>(std::min<int64_t>(4, rows - i));
    int64_t a = S, c = 0;
    for (int q = 0; q < rr; ++q) a = std::min(a, lo[i + q]), c = std::max(c, hi[i + q]);
    if (a >= c) continue;
    for (int q = 0; q < rr; ++q) {  // a row's keys outside its own [lo, hi) hold -inf logits: weight 0
      float* xq = x + (i + q) * S;
      for (int64_t s = a; s < std::min(c, lo[i + q]); ++s) xq[s] = 0.0f;
      for (int64_t s = std::max(a, hi[i + q]); s < c; ++s) xq[s] = 0.0f;
    }
    PvRows(rr, x + i * S, S, vb, ks, a, c, acc + i * H, H);
  }
}

ffi::Error Attention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                     ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::F32> mask, ffi::Buffer<ffi::S32> layer, float scale,
                     float cap, ffi::ResultBuffer<ffi::F32> out) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), md = mask.dimensions();
  if (qd.size() != 4 || kd.size() != 6 || vd.size() != 6)
    return ffi::Error::InvalidArgument("fbjax_attention: q [B, T, N, H], k and v [R, L, B0, S, K, H] expected");
  for (int d = 0; d < 6; ++d)
    if (d != 1 && kd[d] != vd[d]) return ffi::Error::InvalidArgument("fbjax_attention: k and v shapes differ");
  Problem p;
  p.B = qd[0], p.T = qd[1], p.N = qd[2], p.H = qd[3];
  const int64_t R = kd[0], Lk = kd[1], Lv = vd[1];
  p.B0 = kd[2], p.S = kd[3], p.K = kd[4];
  if (kd[5] != p.H || R * p.B0 != p.B || p.K == 0 || p.N % p.K)
    return ffi::Error::InvalidArgument("fbjax_attention: k's [R, L, B0, S, K, H] does not match q's [B, T, N, H]");
  if (layer.element_count() != 2) return ffi::Error::InvalidArgument("fbjax_attention: layer [2] expected");
  const int32_t lk = layer.typed_data()[0], lv = layer.typed_data()[1];
  if (lk < 0 || lk >= Lk || lv < 0 || lv >= Lv)
    return ffi::Error::InvalidArgument("fbjax_attention: layer index out of range");
  p.G = p.N / p.K;
  p.M = nullptr;
  p.Bm = p.Nm = 1;
  if (mask.element_count() > 0) {
    if (md.size() != 4 || md[2] != p.T || md[3] != p.S || md[0] == 0 || p.B % md[0] || (md[1] != 1 && md[1] != p.N))
      return ffi::Error::InvalidArgument("fbjax_attention: mask [Bm, 1 or N, T, S] expected, Bm dividing B");
    p.M = mask.typed_data();
    p.Bm = md[0];
    p.Nm = md[1];
  }
  p.kv_batch = p.S * p.K * p.H;
  p.k_row = Lk * p.B0 * p.kv_batch;
  p.v_row = Lv * p.B0 * p.kv_batch;
  p.Kc = k.typed_data() + static_cast<int64_t>(lk) * p.B0 * p.kv_batch;
  p.Vc = v.typed_data() + static_cast<int64_t>(lv) * p.B0 * p.kv_batch;
  p.Q = q.typed_data();
  p.scale = scale;
  p.cap = cap;
  float* O = out->typed_data();
  if (p.B == 0 || p.T == 0 || p.N == 0 || p.H == 0) return ffi::Error::Success();
  if (p.S == 0) {
    std::fill(O, O + p.B * p.T * p.N * p.H, std::numeric_limits<float>::quiet_NaN());
    return ffi::Error::Success();
  }
  // work items: (b, kv head, chunk of positions); chunks of ~48 query rows
  const int64_t tc = std::max<int64_t>(1, 48 / p.G);
  const int64_t tchunks = (p.T + tc - 1) / tc;
  const int64_t items = p.B * p.K * tchunks;
  const Problem pc = p;
  const auto item = [pc, tc, tchunks, O](int64_t it) {
    const int64_t tk = it % tchunks, j = (it / tchunks) % pc.K, b = it / (tchunks * pc.K);
    const int64_t t0 = tk * tc, t1 = std::min(pc.T, t0 + tc);
    const int64_t rows = (t1 - t0) * pc.G;
    std::unique_ptr<float[]> x(new float[rows * pc.S]), acc(new float[rows * pc.H + rows]);
    Item(pc, b, j, t0, t1, x.get(), acc.get());
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t t = t0 + i / pc.G, n = j * pc.G + i % pc.G;
      float* o = O + ((b * pc.T + t) * pc.N + n) * pc.H;
      const float sum = acc[rows * pc.H + i];
      for (int64_t h = 0; h < pc.H; ++h) o[h] = acc[i * pc.H + h] / sum;
    }
  };
  // A small problem (a decode step of a few rows) runs on the calling thread: waking a pool thread cost
  // more than the work (SmolLM2-135M int8 decode, batch 1, 30 layers at position 100: 1.31 ms a step in
  // this kernel with the pool, see fbjax/lower/cpu_kernels.py). Each item writes its own outputs: the same
  // bits either way.
  if (p.B * p.T * p.N * p.S * p.H < kInlineWork) {
    for (int64_t it = 0; it < items; ++it) item(it);
  } else {
    ParallelChunks(pool, items, item);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(fbjax_attention, Attention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Attr<float>("scale")
                                  .Attr<float>("cap")
                                  .Ret<ffi::Buffer<ffi::F32>>());
