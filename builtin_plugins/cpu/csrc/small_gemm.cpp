// Small-M matmul for the CPU platform's decode steps: y[M, N] = x[M, K] W[N, K]^T (* scale[N]) (+ bias[N]).
// At one to a few rows a linear layer reads every weight once and does little arithmetic per byte, so its
// speed is the weight's bytes over the memory bandwidth: an int8 weight read straight from memory (with its
// per-output-channel float32 scale applied to each dot product) moves a quarter of float32's bytes and half
// of bfloat16's. Built at first use by builtin_plugins/cpu/native.py and called through ctypes (no torch
// headers; OpenMP resolves to the libgomp torch loaded).
//
// Weights: float32 (code 0), bfloat16 (1) or int8 (2), contiguous [N, K]; activations and outputs float32 (0)
// or bfloat16 (1), rows x_stride / y_stride elements apart. K must be a multiple of 8. Accumulation is float32.
// Each thread owns a slice of output channels; within it a block of NR weight rows is converted to float once
// per 8 columns and meets MR activation rows held in registers, so the weight crosses memory once per call.
#include <omp.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#ifndef KC_PREFETCH_TILES
#define KC_PREFETCH_TILES 2
#endif
#ifndef KC_ROWS_PER_PASS_BYTES  // activation rows kept in a core's L2 (512 KiB) while the weight streams past
#define KC_ROWS_PER_PASS_BYTES (256 * 1024)
#endif

namespace {

typedef float f32x8 __attribute__((vector_size(32)));
typedef int8_t i8x8 __attribute__((vector_size(8)));
typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));

inline f32x8 load8(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline f32x8 load8(const uint16_t* p) {  // bfloat16 -> float32 is a 16-bit shift
#ifdef __AVX2__
  // GCC splits the generic widening into 128-bit halves (five instructions); this is vpmovzxwd + vpslld.
  return (f32x8)_mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
#else
  u16x8 h;
  std::memcpy(&h, p, sizeof h);
  return (f32x8)(__builtin_convertvector(h, u32x8) << 16);
#endif
}
inline f32x8 load8(const int8_t* p) {
#ifdef __AVX2__
  // GCC scalarises the generic int8 -> float conversion; this is vpmovsxbd + vcvtdq2ps.
  return (f32x8)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  i8x8 q;
  std::memcpy(&q, p, sizeof q);
  return __builtin_convertvector(__builtin_convertvector(q, i32x8), f32x8);
#endif
}

inline float hsum(f32x8 v) {
  float s = 0.f;
  for (int i = 0; i < 8; ++i) s += v[i];
  return s;
}

inline float to_float(float x) { return x; }
inline float to_float(uint16_t x) {
  uint32_t bits = uint32_t(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline void store(float* dst, float x) { *dst = x; }
inline void store(uint16_t* dst, float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a (quiet) NaN
    *dst = uint16_t((bits >> 16) | 0x40);
    return;
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even, as torch does
  *dst = uint16_t(bits >> 16);
}

struct Args {
  const float* x;  // [M, K] float32, contiguous
  int64_t K;
  const float* scale;  // [N] or null
  const void* bias;    // [N] in the output dtype, or null
  void* y;
  int64_t y_stride;
};

// MR activation rows x NR weight rows, KU-way unrolled over K (independent accumulators hide FMA latency).
template <typename W, typename Y, int MR, int NR, int KU>
void tile(const Args& a, const W* w, int64_t m0, int64_t n0) {
  f32x8 acc[KU][MR][NR] = {};
  const int64_t K = a.K;
  const float* x = a.x + m0 * K;
  const W* wr = w + n0 * K;
  // A tile's rows are short streams (K elements each) that the hardware prefetcher barely ramps up on; the
  // weight is read in order overall, so fetch the same columns of the tiles ahead while this one computes.
  constexpr int64_t kLine = 64 / sizeof(W);
  const int64_t ahead = KC_PREFETCH_TILES * NR * K;
  int64_t k = 0;
  for (; k + 8 * KU <= K; k += 8 * KU) {
    if (k % kLine < 8 * KU) {
      for (int r = 0; r < NR; ++r) __builtin_prefetch(wr + r * K + k + ahead, 0, 0);
    }
    for (int u = 0; u < KU; ++u) {
      f32x8 wv[NR];
      for (int r = 0; r < NR; ++r) wv[r] = load8(wr + r * K + k + 8 * u);
      for (int m = 0; m < MR; ++m) {
        f32x8 xv = load8(x + m * K + k + 8 * u);
        for (int r = 0; r < NR; ++r) acc[u][m][r] += wv[r] * xv;
      }
    }
  }
  for (; k < K; k += 8) {
    f32x8 wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = load8(wr + r * K + k);
    for (int m = 0; m < MR; ++m) {
      f32x8 xv = load8(x + m * K + k);
      for (int r = 0; r < NR; ++r) acc[0][m][r] += wv[r] * xv;
    }
  }
  Y* y = static_cast<Y*>(a.y);
  const Y* bias = static_cast<const Y*>(a.bias);
  for (int m = 0; m < MR; ++m) {
    for (int r = 0; r < NR; ++r) {
      f32x8 sum = acc[0][m][r];
      for (int u = 1; u < KU; ++u) sum += acc[u][m][r];
      float v = hsum(sum);
      const int64_t n = n0 + r;
      if (a.scale) v *= a.scale[n];
      if (bias) v += to_float(bias[n]);
      store(y + (m0 + m) * a.y_stride + n, v);
    }
  }
}

// The last `left` (< R + 1) activation rows in one tile of that height (one row: two-way K unrolling).
template <typename W, typename Y, int R, int NR>
void remainder(const Args& a, const W* w, int64_t left, int64_t m0, int64_t n0) {
  if constexpr (R >= 1) {
    if (left == R) {
      tile<W, Y, R, NR, R == 1 ? 2 : 1>(a, w, m0, n0);
      return;
    }
    remainder<W, Y, R - 1, NR>(a, w, left, m0, n0);
  }
}

// All M activation rows against weight rows n0..n0+NR, MR rows at a time.
template <typename W, typename Y, int MR, int NR>
void rows(const Args& a, const W* w, int64_t M, int64_t n0) {
  int64_t m0 = 0;
  for (; m0 + MR <= M; m0 += MR) tile<W, Y, MR, NR, 1>(a, w, m0, n0);
  remainder<W, Y, MR - 1, NR>(a, w, M - m0, m0, n0);
}

template <typename W, typename Y>
void run(const Args& a, const W* w, int64_t M, int64_t N, int num_threads) {
  if (M == 1 && sizeof(W) < 4) {
    // One row of bfloat16/int8 at a time, four accumulators: a single sequential stream per thread, which
    // measured 1.4x the bandwidth of four interleaved rows for these weights (float32 is the other way round).
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t n = 0; n < N; ++n) tile<W, Y, 1, 1, 4>(a, w, 0, n);
    return;
  }
  if (M > 4 && sizeof(W) < 4) {
    // Batches of rows over bfloat16/int8 weights are compute bound: 6 activation rows x 2 weight rows is 12
    // accumulators, which fit the 16 AVX2 registers with the weights and one activation (4 x 4 spilled).
    // Every pair of weight rows meets every activation row, so the rows are taken in passes small enough to
    // stay in L2 (at 384 rows, 1.14x the speed of one pass over Llama-125M's linears); the weight is read
    // once per pass.
    constexpr int MR = 6, NR2 = 2;
    const int64_t per_pass = std::max<int64_t>(MR, KC_ROWS_PER_PASS_BYTES / (4 * a.K) / MR * MR);
    const int64_t blocks = N / NR2;
    for (int64_t m0 = 0; m0 < M; m0 += per_pass) {
      const int64_t rows_here = std::min(per_pass, M - m0);
      Args part = a;
      part.x = a.x + m0 * a.K;
      part.y = static_cast<Y*>(a.y) + m0 * a.y_stride;
#pragma omp parallel for num_threads(num_threads) schedule(static)
      for (int64_t b = 0; b < blocks; ++b) rows<W, Y, MR, NR2>(part, w, rows_here, b * NR2);
      for (int64_t n = blocks * NR2; n < N; ++n) rows<W, Y, MR, 1>(part, w, rows_here, n);
    }
    return;
  }
  constexpr int NR = 4;
  const int64_t blocks = N / NR;
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) rows<W, Y, 4, NR>(a, w, M, b * NR);
  for (int64_t n = blocks * NR; n < N; ++n) rows<W, Y, 4, 1>(a, w, M, n);
}

template <typename X>
std::vector<float> to_float_rows(const X* x, int64_t x_stride, int64_t M, int64_t K) {
  std::vector<float> out(M * K);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) out[m * K + k] = to_float(x[m * x_stride + k]);
  return out;
}

template <typename Y>
int dispatch_weight(int w_code, const Args& a, const void* w, int64_t M, int64_t N, int num_threads) {
  switch (w_code) {
    case 0: run<float, Y>(a, static_cast<const float*>(w), M, N, num_threads); return 0;
    case 1: run<uint16_t, Y>(a, static_cast<const uint16_t*>(w), M, N, num_threads); return 0;
    case 2: run<int8_t, Y>(a, static_cast<const int8_t*>(w), M, N, num_threads); return 0;
    default: return -1;
  }
}

}  // namespace

extern "C" int kc_small_gemm(int w_code, int x_code, const void* x, int64_t x_stride, const void* w,
                             const float* scale, const void* bias, void* y, int64_t y_stride, int64_t M, int64_t N,
                             int64_t K, int num_threads) {
  if (K % 8 != 0 || M <= 0 || N <= 0 || x_stride < K || y_stride < N) return -1;
  std::vector<float> xf;
  const float* xp;
  if (x_code == 0 && x_stride == K) {
    xp = static_cast<const float*>(x);
  } else if (x_code == 0) {
    xf = to_float_rows(static_cast<const float*>(x), x_stride, M, K);
    xp = xf.data();
  } else if (x_code == 1) {
    xf = to_float_rows(static_cast<const uint16_t*>(x), x_stride, M, K);
    xp = xf.data();
  } else {
    return -1;
  }
  Args a{xp, K, scale, bias, y, y_stride};
  num_threads = std::max(1, num_threads);
  return x_code == 0 ? dispatch_weight<float>(w_code, a, w, M, N, num_threads)
                     : dispatch_weight<uint16_t>(w_code, a, w, M, N, num_threads);
}
