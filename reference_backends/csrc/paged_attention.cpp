// Paged attention on the CPU for the `compiled` backend (reference_backends/compiled.py).
//
// Plain C++ (no torch headers, so it builds in seconds with any g++/clang++) loaded
// through ctypes. One work item is a (query tile, key split) of one sequence for a group
// of KV heads: each head's query heads (its GQA group) share every K/V row it loads, keys
// are read in place from the pages through the block table and the cache's own strides,
// and the softmax is online (running max and sum in fp32) over blocks of keys, so no key
// outside a row's visible range is ever read: NaN garbage past a sequence's end never
// reaches an output. The next block is prefetched a few lines at a time between compute
// chunks. Items whose keys were split write unnormalised partials that a second pass
// merges (flash-decoding). OpenMP shares torch's runtime (libgomp.so.1).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#ifndef PAGED_ATTENTION_PREFETCH_LOCALITY
#define PAGED_ATTENTION_PREFETCH_LOCALITY 2
#endif

namespace {

enum DType : int64_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

// Mirrors the ctypes Structure in compiled.py: every field 8 bytes, in this order.
struct Params {
  int64_t dtype;
  int64_t num_heads, num_kv_heads, head_dim, page_size;
  const void* q;
  int64_t q_s0, q_s1, q_s2;
  const void* k;
  int64_t k_s0, k_s1, k_s2, k_s3;
  const void* v;
  int64_t v_s0, v_s1, v_s2, v_s3;
  void* out;  // contiguous [T, H, value_dim] in dtype
  const int32_t* block_table;  // flat local page ids; a tile's row starts at its bt_off
  const int32_t* tiles;  // [num_tiles, 8], see Tile
  int64_t num_tiles;
  const int32_t* merges;  // [num_merges, 4]: first partial, splits, q_token, q_count
  int64_t num_merges;
  float* partials;  // [slots, max_rows * (value_dim + 2)] workspace
  int64_t max_rows;  // most query rows (tokens x GQA group) of a tile, per KV head
  int64_t heads_per_item;  // KV heads one work item runs
  int64_t causal;
  int64_t num_threads;
  double scale;
  int64_t value_dim;  // entries of a value row and an output row (MLA: < head_dim)
};

// Fields of one tile row; the kernel runs it once per KV head.
enum Tile { kQToken, kQCount, kQPos, kBtOff, kKBegin, kKEnd, kPart, kTileFields = 8 };

#ifndef PAGED_ATTENTION_BLOCK
#define PAGED_ATTENTION_BLOCK 32
#endif
constexpr int64_t kBlock = PAGED_ATTENTION_BLOCK;  // keys per online-softmax block
#ifndef PAGED_ATTENTION_CHUNK
#define PAGED_ATTENTION_CHUNK 4
#endif
constexpr int64_t kChunk = PAGED_ATTENTION_CHUNK;  // keys computed between prefetch rounds
#ifndef PAGED_ATTENTION_PREFETCH
#define PAGED_ATTENTION_PREFETCH 1
#endif
constexpr bool kPrefetch = PAGED_ATTENTION_PREFETCH != 0;  // off: to measure what it buys

inline void prefetch_line(const void* p) {
#if defined(__GNUC__)
  __builtin_prefetch(p, 0, PAGED_ATTENTION_PREFETCH_LOCALITY);
#else
  (void)p;
#endif
}
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {  // round to nearest even, NaN kept NaN
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// IEEE half <-> float in software (as c10's Half.h), for compilers without F16C.
inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t w = uint32_t(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float exp_scale = bits_to_float(0x7800000u);  // 2^-112
  const float normalized = bits_to_float((two_w >> 4) + (0xE0u << 23)) * exp_scale;
  const float denormalized = bits_to_float((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t result =
      sign | (two_w < (1u << 27) ? float_to_bits(denormalized) : float_to_bits(normalized));
  return bits_to_float(result);
#endif
}

inline uint16_t float_to_half(float f) {
#if defined(__F16C__)
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
  const float scale_to_inf = bits_to_float(0x77800000u);  // 2^112
  const float scale_to_zero = bits_to_float(0x08800000u);  // 2^-110
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = float_to_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = bits_to_float((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = float_to_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return uint16_t((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
#endif
}

// One row of `n` elements at `stride` (elements) as fp32 in `dst`.
inline void load_row(const void* src, int64_t stride, int64_t n, int64_t dtype, float* dst) {
  if (dtype == kF32) {
    const float* s = static_cast<const float*>(src);
    if (stride == 1) {
      std::memcpy(dst, s, size_t(n) * sizeof(float));
    } else {
      for (int64_t i = 0; i < n; ++i) dst[i] = s[i * stride];
    }
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src);
  if (dtype == kBF16) {
    if (stride == 1) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dst[i] = bits_to_float(uint32_t(s[i]) << 16);
    } else {
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i * stride]);
    }
    return;
  }
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  if (stride == 1) {
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
  }
#endif
  for (; i < n; ++i) dst[i] = half_to_float(s[i * stride]);
}

inline void store_row(const float* src, int64_t n, float factor, int64_t dtype, void* dst) {
  if (dtype == kF32) {
    float* d = static_cast<float*>(dst);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) d[i] = src[i] * factor;
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(dst);
  if (dtype == kBF16) {
    for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(src[i] * factor);
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = float_to_half(src[i] * factor);
  }
}

// exp(x) for x <= 0 (a logit minus its running max), vectorisable: Cephes' expf
// polynomial on x - n ln2 times 2^n. Returns exactly 0 below -87 (and for -inf),
// so masked keys get zero weight. Relative error ~2 ulp.
inline float exp_nonpositive(float x) {
  const bool underflow = x < -87.0f;
  x = std::max(x, -87.0f);
  x = std::min(x, 0.0f);
  const float fx = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - fx * 0.693359375f;
  r = r + fx * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t n = int32_t(fx);
  const float pow2n = bits_to_float(uint32_t(n + 127) << 23);
  return underflow ? 0.0f : y * pow2n;
}

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

#if defined(__AVX2__) && defined(__FMA__)
#define PAGED_ATTENTION_AVX2 1

inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 shuf = _mm_movehdup_ps(lo);
  __m128 sums = _mm_add_ps(lo, shuf);
  shuf = _mm_movehl_ps(shuf, sums);
  return _mm_cvtss_f32(_mm_add_ss(sums, shuf));
}

// S[r][t] = Q[r] . K[t] for NR query rows and NT keys: NR x NT independent FMA chains,
// each K chunk loaded once for all NR rows.
template <int NR, int NT>
inline void logits_kernel(const float* Q, int64_t D, const float* const* k, float* S) {
  __m256 acc[NR][NT];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 8 <= D; d += 8) {
    __m256 kv[NT];
    for (int t = 0; t < NT; ++t) kv[t] = _mm256_loadu_ps(k[t] + d);
    for (int r = 0; r < NR; ++r) {
      const __m256 qv = _mm256_loadu_ps(Q + r * D + d);
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_fmadd_ps(qv, kv[t], acc[r][t]);
    }
  }
  float sums[NR][NT];
  if constexpr (NR * NT == 8) {  // eight horizontal sums at once: 7 shuffles + adds, not 40
    __m256* a = &acc[0][0];
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    const __m256 total = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                                       _mm256_permute2f128_ps(u0, u1, 0x31));
    _mm256_storeu_ps(&sums[0][0], total);
  } else {
    for (int r = 0; r < NR; ++r)
      for (int t = 0; t < NT; ++t) sums[r][t] = hsum(acc[r][t]);
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) {
      float s = sums[r][t];
      for (int64_t e = d; e < D; ++e) s += Q[r * D + e] * k[t][e];
      S[r * kBlock + t] = s;
    }
  }
}

// acc[r] += sum_t S[r][t] V[t] for NR rows: the accumulator stays in registers over
// the whole block, each V chunk loaded once for all NR rows.
template <int NR>
inline void values_kernel(const float* S, int64_t D, const float* const* v, int64_t nb,
                          float* acc) {
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) {
    __m256 a[NR][2];
    for (int r = 0; r < NR; ++r) {
      a[r][0] = _mm256_loadu_ps(acc + r * D + d);
      a[r][1] = _mm256_loadu_ps(acc + r * D + d + 8);
    }
    for (int64_t t = 0; t < nb; ++t) {
      const __m256 v0 = _mm256_loadu_ps(v[t] + d);
      const __m256 v1 = _mm256_loadu_ps(v[t] + d + 8);
      for (int r = 0; r < NR; ++r) {
        const __m256 p = _mm256_broadcast_ss(S + r * kBlock + t);
        a[r][0] = _mm256_fmadd_ps(p, v0, a[r][0]);
        a[r][1] = _mm256_fmadd_ps(p, v1, a[r][1]);
      }
    }
    for (int r = 0; r < NR; ++r) {
      _mm256_storeu_ps(acc + r * D + d, a[r][0]);
      _mm256_storeu_ps(acc + r * D + d + 8, a[r][1]);
    }
  }
  for (; d + 8 <= D; d += 8) {
    __m256 a[NR];
    for (int r = 0; r < NR; ++r) a[r] = _mm256_loadu_ps(acc + r * D + d);
    for (int64_t t = 0; t < nb; ++t) {
      const __m256 v0 = _mm256_loadu_ps(v[t] + d);
      for (int r = 0; r < NR; ++r) {
        a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(S + r * kBlock + t), v0, a[r]);
      }
    }
    for (int r = 0; r < NR; ++r) _mm256_storeu_ps(acc + r * D + d, a[r]);
  }
  for (; d < D; ++d) {
    for (int r = 0; r < NR; ++r) {
      float a = acc[r * D + d];
      for (int64_t t = 0; t < nb; ++t) a += S[r * kBlock + t] * v[t][d];
      acc[r * D + d] = a;
    }
  }
}

template <int NR>
inline void logits_rows(const float* Q, int64_t D, const float* const* k, int64_t nb, float* S) {
  int64_t t = 0;
  for (; t + 2 <= nb; t += 2) logits_kernel<NR, 2>(Q, D, k + t, S + t);
  if (t < nb) logits_kernel<NR, 1>(Q, D, k + t, S + t);
}
#endif

// S[r][t] = Q[r] . K[t] for every row and key of a block.
inline void block_logits(const float* Q, int64_t R, int64_t D, const float* const* k, int64_t nb,
                         float* S) {
#ifdef PAGED_ATTENTION_AVX2
  int64_t r = 0;
  for (; r + 4 <= R; r += 4) logits_rows<4>(Q + r * D, D, k, nb, S + r * kBlock);
  switch (R - r) {
    case 3: logits_rows<3>(Q + r * D, D, k, nb, S + r * kBlock); break;
    case 2: logits_rows<2>(Q + r * D, D, k, nb, S + r * kBlock); break;
    case 1: logits_rows<1>(Q + r * D, D, k, nb, S + r * kBlock); break;
    default: break;
  }
#else
  for (int64_t t = 0; t < nb; ++t)
    for (int64_t r = 0; r < R; ++r) S[r * kBlock + t] = dot(Q + r * D, k[t], D);
#endif
}

// acc[r] += sum_t S[r][t] V[t] for every row of a block.
inline void block_values(const float* S, int64_t R, int64_t D, const float* const* v, int64_t nb,
                         float* acc) {
#ifdef PAGED_ATTENTION_AVX2
  int64_t r = 0;
  for (; r + 4 <= R; r += 4) values_kernel<4>(S + r * kBlock, D, v, nb, acc + r * D);
  switch (R - r) {
    case 3: values_kernel<3>(S + r * kBlock, D, v, nb, acc + r * D); break;
    case 2: values_kernel<2>(S + r * kBlock, D, v, nb, acc + r * D); break;
    case 1: values_kernel<1>(S + r * kBlock, D, v, nb, acc + r * D); break;
    default: break;
  }
#else
  for (int64_t t = 0; t < nb; ++t)
    for (int64_t r = 0; r < R; ++r) {
      const float p = S[r * kBlock + t];
      if (p != 0.0f) axpy(p, v[t], acc + r * D, D);
    }
#endif
}

// -- The wide-rows path: many query rows per KV head (prefill, extend, speculative steps) --
//
// With R >= kLanes query rows against one key block, the work is a small matrix product
// and everything is laid out with the rows innermost: Q^T [D][Rp], the logits and then
// the probabilities S^T [key][Rp], the accumulator A^T [D][Rp], m and l [Rp] (Rp: R
// rounded up to whole vectors, the extra rows zero and masked). Every key and value
// element is then one broadcast against a vector of rows held in registers, read once
// per block for all R rows, with no horizontal sums; the online softmax runs along
// vectors of rows. The vector width is the widest the build's ISA has (16 floats with
// AVX-512, 8 with AVX2, 4 otherwise), so one source serves each CPU it is built on.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr int kLogitKeys = 4, kLogitVecs = 4;  // 16 accumulators + 4 row vectors (of 32)
constexpr int kValueDims = 4, kValueVecs = 4;
#elif defined(__AVX2__)
constexpr int kLanes = 8;
constexpr int kLogitKeys = 2, kLogitVecs = 4;  // 8 accumulators + 4 row vectors (of 16)
constexpr int kValueDims = 2, kValueVecs = 4;
#else
constexpr int kLanes = 4;
constexpr int kLogitKeys = 2, kLogitVecs = 2;
constexpr int kValueDims = 2, kValueVecs = 2;
#endif
typedef float vfloat __attribute__((vector_size(kLanes * sizeof(float))));
typedef float vfloat_u __attribute__((vector_size(kLanes * sizeof(float)), aligned(4)));
typedef int32_t vint __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline vfloat vload(const float* p) { return *reinterpret_cast<const vfloat_u*>(p); }
inline void vstore(float* p, vfloat v) { *reinterpret_cast<vfloat_u*>(p) = v; }
inline vfloat splat(float x) { return x - vfloat{}; }  // one broadcast (x - 0 folds; 0 + x not)

// S^T[t][r] = K[t] . Q^T[:, r] for NT keys and NV row vectors starting at row r0.
template <int NT, int NV>
inline void logits_t_kernel(const float* Qt, int64_t Rp, int64_t D, const float* const* k,
                            float* St, int64_t r0) {
  vfloat acc[NT][NV];
  for (int t = 0; t < NT; ++t)
    for (int i = 0; i < NV; ++i) acc[t][i] = splat(0.0f);
  for (int64_t d = 0; d < D; ++d) {
    vfloat q[NV];
    for (int i = 0; i < NV; ++i) q[i] = vload(Qt + d * Rp + r0 + i * kLanes);
    for (int t = 0; t < NT; ++t) {
      const vfloat b = splat(k[t][d]);
      for (int i = 0; i < NV; ++i) acc[t][i] += b * q[i];
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int i = 0; i < NV; ++i) vstore(St + t * Rp + r0 + i * kLanes, acc[t][i]);
}

template <int NT>
inline void logits_t_rows(const float* Qt, int64_t Rp, int64_t D, const float* const* k,
                          float* St) {
  const int64_t vecs = Rp / kLanes;
  int64_t v = 0;
  for (; v + kLogitVecs <= vecs; v += kLogitVecs)
    logits_t_kernel<NT, kLogitVecs>(Qt, Rp, D, k, St, v * kLanes);
  for (; v < vecs; ++v) logits_t_kernel<NT, 1>(Qt, Rp, D, k, St, v * kLanes);
}

// S^T for every key of a block.
inline void block_logits_t(const float* Qt, int64_t Rp, int64_t D, const float* const* k,
                           int64_t nb, float* St) {
  int64_t t = 0;
  for (; t + kLogitKeys <= nb; t += kLogitKeys)
    logits_t_rows<kLogitKeys>(Qt, Rp, D, k + t, St + t * Rp);
  for (; t < nb; ++t) logits_t_rows<1>(Qt, Rp, D, k + t, St + t * Rp);
}

// A^T[d][r] += sum_t V[t][d] P^T[t][r] for ND dims from d0 and NV row vectors from r0.
template <int ND, int NV>
inline void values_t_kernel(const float* Pt, int64_t Rp, const float* const* v, int64_t nb,
                            float* At, int64_t d0, int64_t r0) {
  vfloat acc[ND][NV];
  for (int e = 0; e < ND; ++e)
    for (int i = 0; i < NV; ++i) acc[e][i] = vload(At + (d0 + e) * Rp + r0 + i * kLanes);
  for (int64_t t = 0; t < nb; ++t) {
    vfloat p[NV];
    for (int i = 0; i < NV; ++i) p[i] = vload(Pt + t * Rp + r0 + i * kLanes);
    for (int e = 0; e < ND; ++e) {
      const vfloat b = splat(v[t][d0 + e]);
      for (int i = 0; i < NV; ++i) acc[e][i] += b * p[i];
    }
  }
  for (int e = 0; e < ND; ++e)
    for (int i = 0; i < NV; ++i) vstore(At + (d0 + e) * Rp + r0 + i * kLanes, acc[e][i]);
}

template <int ND>
inline void values_t_dims(const float* Pt, int64_t Rp, const float* const* v, int64_t nb,
                          float* At, int64_t d0) {
  const int64_t vecs = Rp / kLanes;
  int64_t i = 0;
  for (; i + kValueVecs <= vecs; i += kValueVecs)
    values_t_kernel<ND, kValueVecs>(Pt, Rp, v, nb, At, d0, i * kLanes);
  for (; i < vecs; ++i) values_t_kernel<ND, 1>(Pt, Rp, v, nb, At, d0, i * kLanes);
}

// A^T += V^T P^T for dims [d_begin, d_end) and every key of a block.
inline void block_values_t(const float* Pt, int64_t Rp, int64_t d_begin, int64_t d_end,
                           const float* const* v, int64_t nb, float* At) {
  int64_t d = d_begin;
  for (; d + kValueDims <= d_end; d += kValueDims)
    values_t_dims<kValueDims>(Pt, Rp, v, nb, At, d);
  for (; d < d_end; ++d) values_t_dims<1>(Pt, Rp, v, nb, At, d);
}

// exp(x) for x <= 0 along a vector: exp_nonpositive's polynomial, lane by lane.
inline vfloat vexp_nonpositive(vfloat x) {
  const vint underflow = x < -87.0f;
  x = x < -87.0f ? splat(-87.0f) : x;
  x = x > 0.0f ? splat(0.0f) : x;
  const vfloat y0 = x * 1.44269504088896341f + 0.5f;
  vfloat fx = __builtin_convertvector(__builtin_convertvector(y0, vint), vfloat);
  fx = fx > y0 ? fx - 1.0f : fx;  // truncation toward zero, made a floor
  vfloat r = x - fx * 0.693359375f;
  r = r + fx * 2.12194440e-4f;
  vfloat p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const vfloat y = p * r * r + r + 1.0f;
  const vint pow2n = (__builtin_convertvector(fx, vint) + 127) << 23;
  const vfloat e = y * (vfloat)pow2n;  // a cast between vectors of one size keeps the bits
  return (vfloat)((vint)e & ~underflow);
}

// The online softmax of one block along vectors of rows: S^T becomes P^T in place, each
// row's m and l move to the block, and A^T is rescaled to the new maxima. A key at or
// past a row's limit gets weight 0; a row with no visible key so far stays untouched.
inline void softmax_t(float* St, int64_t Rp, int64_t D, int64_t nb, int64_t t0,
                      const int64_t* limit, float* m, float* l, float* At, float* alpha) {
  const vfloat neg_inf = splat(kNegInf);
  for (int64_t r = 0; r < Rp; r += kLanes) {
    vfloat visible;
    for (int i = 0; i < kLanes; ++i) visible[i] = float(limit[r + i] - t0);
    vfloat block_max = neg_inf;
    for (int64_t t = 0; t < nb; ++t) {
      vfloat s = vload(St + t * Rp + r);
      s = splat(float(t)) < visible ? s : neg_inf;
      vstore(St + t * Rp + r, s);
      block_max = s > block_max ? s : block_max;
    }
    const vfloat m_old = vload(m + r);
    const vfloat m_new = block_max > m_old ? block_max : m_old;
    const vfloat kept = m_old == neg_inf ? splat(0.0f) : vexp_nonpositive(m_old - m_new);
    const vfloat a = (m_new == neg_inf) | (m_old == m_new) ? splat(1.0f) : kept;
    // a row that has seen no key yet: every weight exactly 0 (and no -inf - -inf)
    const vfloat shift = m_new == neg_inf ? splat(std::numeric_limits<float>::max()) : m_new;
    vfloat sum = splat(0.0f);
    for (int64_t t = 0; t < nb; ++t) {
      const vfloat p = vexp_nonpositive(vload(St + t * Rp + r) - shift);
      vstore(St + t * Rp + r, p);
      sum += p;
    }
    vstore(l + r, vload(l + r) * a + sum);
    vstore(m + r, m_new);
    vstore(alpha + r, a);
  }
  for (int64_t d = 0; d < D; ++d) {
    float* row = At + d * Rp;
    for (int64_t r = 0; r < Rp; r += kLanes) vstore(row + r, vload(row + r) * vload(alpha + r));
  }
}

// p[t] = exp(s[t] - m) in place for t < n; returns the sum of the p.
inline float exp_block(float* s, int64_t n, float m) {
  int64_t t = 0;
  float sum = 0.0f;
#ifdef PAGED_ATTENTION_AVX2
  const __m256 lo = _mm256_set1_ps(-87.0f), zero = _mm256_setzero_ps();
  const __m256 max = _mm256_set1_ps(m);
  __m256 total = zero;
  for (; t + 8 <= n; t += 8) {
    __m256 x = _mm256_sub_ps(_mm256_loadu_ps(s + t), max);
    const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), zero);
    const __m256 fx = _mm256_floor_ps(
        _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y =
        _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i n2 = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    const __m256 e = _mm256_andnot_ps(underflow, _mm256_mul_ps(y, _mm256_castsi256_ps(n2)));
    _mm256_storeu_ps(s + t, e);
    total = _mm256_add_ps(total, e);
  }
  sum = hsum(total);
#endif
  for (; t < n; ++t) {
    s[t] = exp_nonpositive(s[t] - m);
    sum += s[t];
  }
  return sum;
}

// The cache lines of a list of spans, prefetched a quota at a time in list order.
class PrefetchCursor {
 public:
  void reset() {
    spans_.clear();
    index_ = 0;
    next_ = 0;
    lines_ = 0;
  }
  void add(const char* p, int64_t bytes) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(63);
    const uintptr_t end = reinterpret_cast<uintptr_t>(p) + uintptr_t(bytes);
    spans_.push_back({first, end});
    lines_ += int64_t((end - first + 63) / 64);
  }
  int64_t lines() const { return lines_; }
  void issue(int64_t count) {
    while (count > 0 && index_ < spans_.size()) {
      const Span& span = spans_[index_];
      uintptr_t line = next_ ? next_ : span.first;
      for (; count > 0 && line < span.end; --count, line += 64) {
        prefetch_line(reinterpret_cast<const void*>(line));
      }
      if (line < span.end) {
        next_ = line;
      } else {
        next_ = 0;
        ++index_;
      }
    }
  }

 private:
  struct Span {
    uintptr_t first, end;
  };
  std::vector<Span> spans_;
  size_t index_ = 0;
  uintptr_t next_ = 0;  // next line of spans_[index_]; 0 = its first
  int64_t lines_ = 0;
};

// Per-thread buffers, sized once per call.
struct Scratch {
  PrefetchCursor cursor;
  std::vector<float> q, acc, m, l, scores, kbuf, vbuf;
  std::vector<float> qt, at, mt, lt, st, alpha;  // the wide-rows path's (rows innermost)
  std::vector<const float*> krow, vrow;
  std::vector<int64_t> limit, limit_t, kofs, vofs, next_kofs, next_vofs;

  static int64_t padded(int64_t rows) { return (rows + kLanes - 1) / kLanes * kLanes; }
  // 1 when a tile of `rows` query rows takes the wide path (else its buffers stay empty:
  // a short decode call must not pay for zeroing them)
  static int64_t wide(int64_t rows) { return rows >= kLanes ? 1 : 0; }

  Scratch(int64_t rows, int64_t heads, int64_t d, int64_t dv)
      : q(size_t(heads * rows * d)),
        acc(size_t(heads * rows * dv)),
        m(size_t(heads * rows)),
        l(size_t(heads * rows)),
        scores(size_t(rows * kBlock)),
        kbuf(size_t(kBlock * d)),
        vbuf(size_t(kBlock * dv)),
        qt(size_t(wide(rows) * heads * d * padded(rows))),
        at(size_t(wide(rows) * heads * dv * padded(rows))),
        mt(size_t(wide(rows) * heads * padded(rows))),
        lt(size_t(wide(rows) * heads * padded(rows))),
        st(size_t(wide(rows) * kBlock * padded(rows))),
        alpha(size_t(wide(rows) * 2 * padded(rows))),
        krow(size_t(kBlock)),
        vrow(size_t(kBlock)),
        limit(size_t(rows)),
        limit_t(size_t(padded(rows))),
        kofs(size_t(kBlock)),
        vofs(size_t(kBlock)),
        next_kofs(size_t(kBlock)),
        next_vofs(size_t(kBlock)) {}
};

// Element offsets (page and in-page slot, no head) of keys [t0, t0 + n) in K and V.
inline void token_offsets(const Params& P, const int32_t* pages, int64_t t0, int64_t n,
                          int64_t* kofs, int64_t* vofs) {
  int64_t page_index = t0 / P.page_size, offset = t0 % P.page_size;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t page = pages[page_index];
    kofs[t] = page * P.k_s0 + offset * P.k_s1;
    vofs[t] = page * P.v_s0 + offset * P.v_s1;
    if (++offset == P.page_size) {
      offset = 0;
      ++page_index;
    }
  }
}

// The attention of one tile for KV heads [h0, h1): every query row of the tile (query
// tokens x GQA group) of each head against keys [k_begin, limit), block by block. The
// heads of a block run back to back, so the block's token rows (all heads, contiguous
// in an NHD cache) are streamed once; the next block's rows are prefetched meanwhile.
void attend_tile(const Params& P, const int32_t* tile, int64_t h0, int64_t h1, Scratch& sc) {
  const int64_t D = P.head_dim, DV = P.value_dim;
  const int64_t G = P.num_heads / P.num_kv_heads;
  const int64_t H = P.num_heads;
  const int64_t q_token = tile[kQToken], q_count = tile[kQCount], q_pos = tile[kQPos];
  const int64_t k_begin = tile[kKBegin], k_end = tile[kKEnd], part = tile[kPart];
  const int32_t* pages = P.block_table + tile[kBtOff];
  const int64_t R = q_count * G;
  const int64_t esize = P.dtype == kF32 ? 4 : 2;
  const char* qbase = static_cast<const char*>(P.q);
  const char* kbase = static_cast<const char*>(P.k);
  const char* vbase = static_cast<const char*>(P.v);
  const float scale = float(P.scale);
  const bool k_direct = P.dtype == kF32 && P.k_s3 == 1;
  const bool v_direct = P.dtype == kF32 && P.v_s3 == 1;
  const bool prefetch = kPrefetch && P.k_s3 == 1 && P.v_s3 == 1;

  float* S = sc.scores.data();
  PrefetchCursor& cursor = sc.cursor;
  int64_t k_stop = k_begin;
  for (int64_t j = 0; j < q_count; ++j) {
    const int64_t visible = P.causal ? std::min(k_end, q_pos + j + 1) : k_end;
    for (int64_t g = 0; g < G; ++g) sc.limit[size_t(j * G + g)] = visible;
    k_stop = std::max(k_stop, visible);
  }
  for (int64_t h = h0; h < h1; ++h) {
    for (int64_t r = 0; r < R; ++r) {
      const int64_t hr = (h - h0) * R + r;
      const int64_t head = h * G + r % G;
      float* qr = sc.q.data() + hr * D;
      load_row(qbase + ((q_token + r / G) * P.q_s0 + head * P.q_s1) * esize, P.q_s2, D, P.dtype,
               qr);
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) qr[d] *= scale;
      sc.m[size_t(hr)] = kNegInf;
      sc.l[size_t(hr)] = 0.0f;
    }
  }
  std::fill(sc.acc.begin(), sc.acc.begin() + (h1 - h0) * R * DV, 0.0f);
  const bool wide = Scratch::wide(R) != 0;  // enough rows for vectors of rows (softmax_t)
  const int64_t Rp = Scratch::padded(R);
  if (wide) {
    for (int64_t h = 0; h < h1 - h0; ++h) {
      float* qt = sc.qt.data() + h * D * Rp;
      for (int64_t r = 0; r < Rp; ++r) {
        const float* qr = sc.q.data() + (h * R + r) * D;
        for (int64_t d = 0; d < D; ++d) qt[d * Rp + r] = r < R ? qr[d] : 0.0f;
      }
    }
    std::fill(sc.at.begin(), sc.at.begin() + (h1 - h0) * DV * Rp, 0.0f);
    std::fill(sc.mt.begin(), sc.mt.begin() + (h1 - h0) * Rp, kNegInf);
    std::fill(sc.lt.begin(), sc.lt.begin() + (h1 - h0) * Rp, 0.0f);
    for (int64_t r = 0; r < Rp; ++r) sc.limit_t[size_t(r)] = r < R ? sc.limit[size_t(r)] : 0;
  }

  int64_t* kofs = sc.kofs.data();
  int64_t* vofs = sc.vofs.data();
  int64_t* next_kofs = sc.next_kofs.data();
  int64_t* next_vofs = sc.next_vofs.data();
  if (k_begin < k_stop) {
    token_offsets(P, pages, k_begin, std::min(kBlock, k_stop - k_begin), next_kofs, next_vofs);
  }
  for (int64_t t0 = k_begin; t0 < k_stop; t0 += kBlock) {
    const int64_t nb = std::min(kBlock, k_stop - t0);
    std::swap(kofs, next_kofs);
    std::swap(vofs, next_vofs);
    const int64_t next_nb = std::min(kBlock, k_stop - t0 - nb);
    if (next_nb > 0) token_offsets(P, pages, t0 + nb, next_nb, next_kofs, next_vofs);
    // Prefetch the next block while computing this one, in address order (each token's
    // rows of all the item's heads are contiguous in an NHD cache) and a few lines at a
    // time between compute chunks: the hardware prefetchers stop at 4 KiB pages, one
    // head's rows sit a whole token row apart, and a burst of prefetches stalls the core
    // once the miss buffers are full.
    cursor.reset();
    if (prefetch && next_nb > 0) {
      for (int64_t t = 0; t < next_nb; ++t) {
        for (int kv = 0; kv < 2; ++kv) {
          const char* base = kv ? vbase + next_vofs[t] * esize : kbase + next_kofs[t] * esize;
          const int64_t s2 = kv ? P.v_s2 : P.k_s2, width = kv ? DV : D;
          if (s2 == width) {
            cursor.add(base + h0 * width * esize, (h1 - h0) * width * esize);
          } else {
            for (int64_t x = h0; x < h1; ++x) cursor.add(base + x * s2 * esize, width * esize);
          }
        }
      }
    }
    const int64_t chunks = (h1 - h0) * 2 * ((nb + kChunk - 1) / kChunk);
    const int64_t quota = (cursor.lines() + chunks - 1) / chunks;
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t hrow = (h - h0) * R;
      float* Q = sc.q.data() + hrow * D;
      float* acc = sc.acc.data() + hrow * DV;
      float* m = sc.m.data() + hrow;
      float* l = sc.l.data() + hrow;
      for (int64_t t = 0; t < nb; ++t) {
        const int64_t ko = kofs[t] + h * P.k_s2, vo = vofs[t] + h * P.v_s2;
        if (k_direct) {
          sc.krow[size_t(t)] = reinterpret_cast<const float*>(kbase) + ko;
        } else {
          float* dst = sc.kbuf.data() + t * D;
          load_row(kbase + ko * esize, P.k_s3, D, P.dtype, dst);
          sc.krow[size_t(t)] = dst;
        }
        if (v_direct) {
          sc.vrow[size_t(t)] = reinterpret_cast<const float*>(vbase) + vo;
        } else {
          float* dst = sc.vbuf.data() + t * DV;
          load_row(vbase + vo * esize, P.v_s3, DV, P.dtype, dst);
          sc.vrow[size_t(t)] = dst;
        }
      }
      if (wide) {
        const int64_t hw = h - h0;
        float* Qt = sc.qt.data() + hw * D * Rp;
        float* At = sc.at.data() + hw * DV * Rp;
        float* St = sc.st.data();
        for (int64_t c = 0; c < nb; c += kChunk) {
          block_logits_t(Qt, Rp, D, sc.krow.data() + c, std::min(kChunk, nb - c), St + c * Rp);
          cursor.issue(quota);
        }
        softmax_t(St, Rp, DV, nb, t0, sc.limit_t.data(), sc.mt.data() + hw * Rp,
                  sc.lt.data() + hw * Rp, At, sc.alpha.data());
        const int64_t dims = std::max<int64_t>(kValueDims, (DV + kChunk - 1) / kChunk);
        for (int64_t d = 0; d < DV; d += dims) {  // P.V in slices of dims, prefetching between
          block_values_t(St, Rp, d, std::min(DV, d + dims), sc.vrow.data(), nb, At);
          cursor.issue(quota);
        }
        continue;
      }
      // Logits: each key row is loaded once and used by every query row of the head;
      // keys past a row's causal limit (still inside the sequence) are masked after.
      for (int64_t c = 0; c < nb; c += kChunk) {
        block_logits(Q, R, D, sc.krow.data() + c, std::min(kChunk, nb - c), S + c);
        cursor.issue(quota);
      }
      // Online softmax: rescale each row's running sum and accumulator to the new max.
      for (int64_t r = 0; r < R; ++r) {
        float* s = S + r * kBlock;
        const int64_t valid = std::min(nb, sc.limit[size_t(r)] - t0);
        if (valid <= 0) {
          std::fill(s, s + nb, 0.0f);
          continue;
        }
        float block_max = kNegInf;
        for (int64_t t = 0; t < valid; ++t) block_max = std::max(block_max, s[t]);
        for (int64_t t = valid; t < nb; ++t) s[t] = kNegInf;
        const float m_old = m[r];
        const float m_new = std::max(m_old, block_max);
        const float sum = exp_block(s, nb, m_new);
        if (m_old != m_new) {
          const float alpha = m_old == kNegInf ? 0.0f : exp_nonpositive(m_old - m_new);
          float* ar = acc + r * DV;
#pragma omp simd
          for (int64_t d = 0; d < DV; ++d) ar[d] *= alpha;
          l[r] *= alpha;
        }
        l[r] += sum;
        m[r] = m_new;
      }
      // P.V: each value row is loaded once and used by every query row of the head.
      for (int64_t c = 0; c < nb; c += kChunk) {
        block_values(S + c, R, DV, sc.vrow.data() + c, std::min(kChunk, nb - c), acc);
        cursor.issue(quota);
      }
    }
  }

  if (wide) {  // A^T, m and l back to rows, as the narrow path leaves them
    for (int64_t h = 0; h < h1 - h0; ++h) {
      const float* At = sc.at.data() + h * DV * Rp;
      for (int64_t r = 0; r < R; ++r) {
        float* ar = sc.acc.data() + (h * R + r) * DV;
        for (int64_t d = 0; d < DV; ++d) ar[d] = At[d * Rp + r];
        sc.m[size_t(h * R + r)] = sc.mt[size_t(h * Rp + r)];
        sc.l[size_t(h * R + r)] = sc.lt[size_t(h * Rp + r)];
      }
    }
  }
  for (int64_t h = h0; h < h1; ++h) {
    const int64_t hrow = (h - h0) * R;
    const float* acc = sc.acc.data() + hrow * DV;
    if (part < 0) {  // the whole key range: normalise straight into the output
      char* obase = static_cast<char*>(P.out);
      for (int64_t r = 0; r < R; ++r) {
        const float l = sc.l[size_t(hrow + r)];
        const int64_t index = ((q_token + r / G) * H + h * G + r % G) * DV;
        store_row(acc + r * DV, DV, l > 0.0f ? 1.0f / l : 0.0f, P.dtype, obase + index * esize);
      }
      continue;
    }
    float* slot = P.partials + (part + h) * P.max_rows * (DV + 2);
    std::memcpy(slot, acc, size_t(R * DV) * sizeof(float));
    std::memcpy(slot + R * DV, sc.m.data() + hrow, size_t(R) * sizeof(float));
    std::memcpy(slot + R * DV + R, sc.l.data() + hrow, size_t(R) * sizeof(float));
  }
}

// Combine the partials of one split tile for one KV head into the output.
void merge_tile(const Params& P, const int32_t* merge, int64_t kvh, std::vector<float>& row) {
  const int64_t D = P.value_dim;
  const int64_t G = P.num_heads / P.num_kv_heads;
  const int64_t KV = P.num_kv_heads;
  const int64_t first = merge[0], splits = merge[1], q_token = merge[2], q_count = merge[3];
  const int64_t R = q_count * G;
  const int64_t stride = P.max_rows * (D + 2);
  const int64_t esize = P.dtype == kF32 ? 4 : 2;
  char* obase = static_cast<char*>(P.out);
  for (int64_t r = 0; r < R; ++r) {
    float m_max = kNegInf;
    for (int64_t s = 0; s < splits; ++s) {
      const float* slot = P.partials + (first + s * KV + kvh) * stride;
      m_max = std::max(m_max, slot[R * D + r]);
    }
    std::fill(row.begin(), row.end(), 0.0f);
    float total = 0.0f;
    if (m_max != kNegInf) {
      for (int64_t s = 0; s < splits; ++s) {
        const float* slot = P.partials + (first + s * KV + kvh) * stride;
        const float m = slot[R * D + r];
        if (m == kNegInf) continue;
        const float w = std::exp(m - m_max);
        total += w * slot[R * D + R + r];
        axpy(w, slot + r * D, row.data(), D);
      }
    }
    const int64_t j = r / G, g = r % G;
    const int64_t index = ((q_token + j) * P.num_heads + kvh * G + g) * D;
    store_row(row.data(), D, total > 0.0f ? 1.0f / total : 0.0f, P.dtype, obase + index * esize);
  }
}

}  // namespace

extern "C" {

// Bumped whenever Params or the tile layout changes; compiled.py checks it.
int64_t paged_attention_abi_version() { return 3; }

int64_t paged_attention_openmp() {
#ifdef _OPENMP
  return 1;
#else
  return 0;
#endif
}

void paged_attention_forward(const Params* params) {
  const Params& P = *params;
  const int64_t KV = P.num_kv_heads;
  const int64_t per_item = std::max<int64_t>(1, std::min(P.heads_per_item, KV));
  const int64_t groups = (KV + per_item - 1) / per_item;
  const int64_t work = P.num_tiles * groups;
  const int64_t merges = P.num_merges * KV;
#pragma omp parallel num_threads(int(std::max<int64_t>(1, P.num_threads)))
  {
    Scratch scratch(P.max_rows, per_item, P.head_dim, P.value_dim);
    // Consecutive items are the head groups of one tile: the threads stream the same pages.
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < work; ++i) {
      const int64_t h0 = (i % groups) * per_item;
      attend_tile(P, P.tiles + (i / groups) * kTileFields, h0, std::min(KV, h0 + per_item),
                  scratch);
    }
    if (merges > 0) {
      std::vector<float> row(size_t(P.value_dim));
#pragma omp for schedule(static)
      for (int64_t i = 0; i < merges; ++i) {
        merge_tile(P, P.merges + (i / KV) * 4, i % KV, row);
      }
    }
  }
}

}  // extern "C"
