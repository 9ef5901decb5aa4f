// Small-M matmul for the CPU platform's decode steps: y[M, N] = x[M, K] W[N, K]^T (* scale[N]) (+ bias[N]).
// At one to a few rows a linear layer reads every weight once and does little arithmetic per byte, so its
// speed is the weight's bytes over the memory bandwidth: an int8 weight read straight from memory (with its
// per-output-channel float32 scale applied to each dot product) moves a quarter of float32's bytes and half
// of bfloat16's. Built and called as kc_common.h describes.
//
// Weights: float32 (code 0), bfloat16 (1) or int8 (2), contiguous [N, K]; activations and outputs float32 (0)
// or bfloat16 (1), rows x_stride / y_stride elements apart. K must be a multiple of 8. Accumulation is float32.
// Each thread owns a slice of output channels; within it a block of NR weight rows is loaded once per vector
// of columns and meets MR activation rows held in registers, so the weight crosses memory once per call.
//
// Two ways to multiply (the "lanes" below): float32 FMAs at the machine's vector width (8 floats on AVX2, 16
// on AVX-512), every weight widened to float32; and, where the CPU has AVX512-BF16 and the activations are
// bfloat16, pair dot products (vdpbf16ps: 32 multiply-adds per instruction, twice the FMA's) over bfloat16 or
// int8 weights (int8 -> bfloat16 is exact). Both accumulate float32 products of the same rounded inputs.
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kc_common.h"
#include "packed_call.h"

#ifndef KC_PREFETCH_LOCALITY  // 0: prefetchnta
#define KC_PREFETCH_LOCALITY 0
#endif
#ifndef KC_FAR_PREFETCH_ROWS
#define KC_FAR_PREFETCH_ROWS 32
#endif
#ifndef KC_PREFETCH_TILES
#define KC_PREFETCH_TILES 2
#endif
#ifndef KC_ROWS_PER_PASS_BYTES  // activation rows kept in a core's L2 (512 KiB and up) while the weight streams past
#define KC_ROWS_PER_PASS_BYTES (256 * 1024)
#endif

namespace {

using kc::fvec;
using kc::loadv;  // float32 and bfloat16; int8 below
using kc::store;
using kc::to_float;
using kc::VW;

#ifdef __AVX512F__
constexpr int REGS = 32;  // vector registers
#else
constexpr int REGS = 16;
#endif
typedef int8_t i8vec __attribute__((vector_size(VW)));
typedef int32_t i32vec __attribute__((vector_size(VW * 4)));

inline fvec loadv(const int8_t* p) {
#if defined(__AVX512F__)
  return (fvec)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(__AVX2__)
  // GCC scalarises the generic int8 -> float conversion; this is vpmovsxbd + vcvtdq2ps.
  return (fvec)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  i8vec q;
  std::memcpy(&q, p, sizeof q);
  return __builtin_convertvector(__builtin_convertvector(q, i32vec), fvec);
#endif
}
template <typename T>
inline fvec loadv(const T* p, int64_t n) {  // the first n (< VW) elements, zeros after
  T part[VW] = {};
  std::memcpy(part, p, n * sizeof(T));
  return loadv(part);
}

// Float lanes: weights of type W widened to float32, activations float32, one FMA per VW products.
template <typename W>
struct FloatLanes {
  using Weight = W;
  using X = float;
  using Acc = fvec;
  static constexpr int kStep = VW;  // columns per vector
  static Acc load_w(const W* p) { return loadv(p); }
  static Acc load_w(const W* p, int64_t n) { return loadv(p, n); }
  static Acc load_x(const float* p) { return loadv(p); }
  static Acc load_x(const float* p, int64_t n) { return loadv(p, n); }
  static Acc madd(Acc acc, Acc x, Acc w) { return acc + x * w; }
  static float sum(Acc v) {
    float s = 0.f;
    for (int i = 0; i < VW; ++i) s += v[i];
    return s;
  }
};

#ifdef __AVX512BF16__
// Pair lanes: bfloat16 activations and bfloat16 (or int8, converted exactly) weights, 32 columns per vector,
// vdpbf16ps adding the products of each adjacent pair into a float32 lane.
inline __m512bh pairs(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
inline __m512bh pairs(const uint16_t* p, int64_t n) { return (__m512bh)_mm512_maskz_loadu_epi16((1u << n) - 1, p); }
inline __m512bh pairs_of(__m256i q) {
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)));
  return _mm512_cvtne2ps_pbh(hi, lo);  // lo fills the low half
}
inline __m512bh pairs(const int8_t* p) { return pairs_of(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512bh pairs(const int8_t* p, int64_t n) { return pairs_of(_mm256_maskz_loadu_epi8((1u << n) - 1, p)); }

template <typename W>
struct PairLanes {
  using Weight = W;
  using X = uint16_t;
  using Acc = __m512;
  static constexpr int kStep = 32;
  static __m512bh load_w(const W* p) { return pairs(p); }
  static __m512bh load_w(const W* p, int64_t n) { return pairs(p, n); }
  static __m512bh load_x(const uint16_t* p) { return pairs(p); }
  static __m512bh load_x(const uint16_t* p, int64_t n) { return pairs(p, n); }
  static Acc madd(Acc acc, __m512bh x, __m512bh w) { return _mm512_dpbf16_ps(acc, x, w); }
  static float sum(Acc v) { return _mm512_reduce_add_ps(v); }
};
#endif

struct Args {
  const void* x;  // [M, K] rows x_stride elements apart, in the lanes' activation type
  int64_t x_stride, K;
  const float* scale;  // [N] or null
  const void* bias;    // [N] in the output dtype, or null
  void* y;
  int64_t y_stride;
  bool far_prefetch;   // options bit 1
  bool single_stream;  // options bit 2
};

// MR activation rows x NR weight rows, KU-way unrolled over K (independent accumulators hide latency).
// wr: the first of the tile's NR weight rows (K apart); n0: its output column.
template <typename L, typename Y, int MR, int NR, int KU>
void tile(const Args& a, const typename L::Weight* wr, int64_t m0, int64_t n0) {
  using W = typename L::Weight;
  using Acc = typename L::Acc;
  constexpr int S = L::kStep;
  Acc acc[KU][MR][NR];
  for (int u = 0; u < KU; ++u)
    for (int m = 0; m < MR; ++m)
      for (int r = 0; r < NR; ++r) acc[u][m][r] = Acc{};
  const int64_t K = a.K, xs = a.x_stride;
  const typename L::X* x = static_cast<const typename L::X*>(a.x) + m0 * xs;
  // A tile's rows are short streams (K elements each) that the hardware prefetcher barely ramps up on; the
  // weight is read in order overall, so fetch the same columns of the tiles ahead while this one computes.
  constexpr int64_t kLine = 64 / sizeof(W);
  // Near: the tiles just ahead, non-temporal. Far: KC_FAR_PREFETCH_ROWS weight rows ahead into L2 (prefetcht1);
  // on some CPUs the near distance is shorter than memory's latency (one-row tiles: 1.8x the int8 speed far).
  const int64_t ahead = a.far_prefetch ? std::max<int64_t>(KC_FAR_PREFETCH_ROWS, KC_PREFETCH_TILES * NR) * K
                                       : KC_PREFETCH_TILES * NR * K;
  int64_t k = 0;
  for (; k + S * KU <= K; k += S * KU) {
    if (k % kLine < S * KU) {
      if (a.far_prefetch) {
        for (int r = 0; r < NR; ++r) __builtin_prefetch(wr + r * K + k + ahead, 0, 2);
      } else {
        for (int r = 0; r < NR; ++r) __builtin_prefetch(wr + r * K + k + ahead, 0, KC_PREFETCH_LOCALITY);
      }
    }
    for (int u = 0; u < KU; ++u) {
      decltype(L::load_w(wr)) wv[NR];
      for (int r = 0; r < NR; ++r) wv[r] = L::load_w(wr + r * K + k + S * u);
      for (int m = 0; m < MR; ++m) {
        const auto xv = L::load_x(x + m * xs + k + S * u);
        for (int r = 0; r < NR; ++r) acc[u][m][r] = L::madd(acc[u][m][r], xv, wv[r]);
      }
    }
  }
  for (; k < K; k += S) {
    const int64_t n = std::min<int64_t>(S, K - k);
    decltype(L::load_w(wr)) wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = n == S ? L::load_w(wr + r * K + k) : L::load_w(wr + r * K + k, n);
    for (int m = 0; m < MR; ++m) {
      const auto xv = n == S ? L::load_x(x + m * xs + k) : L::load_x(x + m * xs + k, n);
      for (int r = 0; r < NR; ++r) acc[0][m][r] = L::madd(acc[0][m][r], xv, wv[r]);
    }
  }
  Y* y = static_cast<Y*>(a.y);
  const Y* bias = static_cast<const Y*>(a.bias);
  for (int m = 0; m < MR; ++m) {
    for (int r = 0; r < NR; ++r) {
      float v = 0.f;
      for (int u = 0; u < KU; ++u) v += L::sum(acc[u][m][r]);
      const int64_t n = n0 + r;
      if (a.scale) v *= a.scale[n];
      if (bias) v += to_float(bias[n]);
      store(y + (m0 + m) * a.y_stride + n, v);
    }
  }
}

// The last `left` (< R + 1) activation rows in one tile of that height (one row: two-way K unrolling).
template <typename L, typename Y, int R, int NR>
void remainder(const Args& a, const typename L::Weight* wr, int64_t left, int64_t m0, int64_t n0) {
  if constexpr (R >= 1) {
    if (left == R) {
      tile<L, Y, R, NR, R == 1 ? 2 : 1>(a, wr, m0, n0);
      return;
    }
    remainder<L, Y, R - 1, NR>(a, wr, left, m0, n0);
  }
}

// All M activation rows against weight rows n0..n0+NR, MR rows at a time.
template <typename L, typename Y, int MR, int NR>
void rows(const Args& a, const typename L::Weight* w, int64_t M, int64_t n0) {
  const typename L::Weight* wr = w + n0 * a.K;
  int64_t m0 = 0;
  for (; m0 + MR <= M; m0 += MR) tile<L, Y, MR, NR, 1>(a, wr, m0, n0);
  remainder<L, Y, MR - 1, NR>(a, wr, M - m0, m0, n0);
}

// Batch tiles: MR x NR accumulators plus NR weight vectors and one activation fit the register file (6 x 2 on
// AVX2's 16, 6 x 4 on AVX-512's 32).
constexpr int kBatchRows = 6, kBatchCols = REGS == 32 ? 4 : 2;

template <typename L, typename Y>
void run(const Args& a, const typename L::Weight* w, int64_t M, int64_t N, int num_threads) {
  using W = typename L::Weight;
  if (M == 1 && (sizeof(W) < 4 || a.single_stream)) {
    // One weight row at a time, four accumulators: a single sequential stream per thread. For bfloat16/int8
    // it measured 1.4x the bandwidth of four interleaved rows; for float32 it depends on the CPU (slower on
    // an AVX2 machine, 1.09x faster on a Zen 5 EPYC), so there it is option bit 2, which the tuning times.
    kc_parallel_steal(N, kc_threads(num_threads), [&](int64_t n) { tile<L, Y, 1, 1, 4>(a, w + n * a.K, 0, n); });
    return;
  }
  if (M > 4 && sizeof(W) < 4) {
    // Batches of rows over bfloat16/int8 weights are compute bound. Every block of weight rows meets every
    // activation row, so the rows are taken in passes small enough to stay in L2 (at 384 rows, 1.14x the
    // speed of one pass over Llama-125M's linears on AVX2); the weight is read once per pass.
    constexpr int MR = kBatchRows, NR = kBatchCols;
    const int64_t row_bytes = a.K * sizeof(typename L::X);
    const int64_t per_pass = std::max<int64_t>(MR, KC_ROWS_PER_PASS_BYTES / row_bytes / MR * MR);
    const int64_t blocks = N / NR;
    for (int64_t m0 = 0; m0 < M; m0 += per_pass) {
      const int64_t rows_here = std::min(per_pass, M - m0);
      Args part = a;
      part.x = static_cast<const typename L::X*>(a.x) + m0 * a.x_stride;
      part.y = static_cast<Y*>(a.y) + m0 * a.y_stride;
#pragma omp parallel for num_threads(kc_threads(num_threads)) schedule(static)
      for (int64_t b = 0; b < blocks; ++b) rows<L, Y, MR, NR>(part, w, rows_here, b * NR);
      for (int64_t n = blocks * NR; n < N; ++n) rows<L, Y, MR, 1>(part, w, rows_here, n);
    }
    return;
  }
  constexpr int NR = 4;
  const int64_t blocks = N / NR;
  kc_parallel_steal(blocks, kc_threads(num_threads), [&](int64_t b) { rows<L, Y, 4, NR>(a, w, M, b * NR); });
  for (int64_t n = blocks * NR; n < N; ++n) rows<L, Y, 4, 1>(a, w, M, n);
}

template <typename X>
std::vector<float> to_float_rows(const X* x, int64_t x_stride, int64_t M, int64_t K) {
  std::vector<float> out(M * K);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) out[m * K + k] = to_float(x[m * x_stride + k]);
  return out;
}

template <typename Y>
int float_lanes(int w_code, const Args& a, const void* w, int64_t M, int64_t N, int num_threads) {
  switch (w_code) {
    case 0: run<FloatLanes<float>, Y>(a, static_cast<const float*>(w), M, N, num_threads); return kc::OK;
    case 1: run<FloatLanes<uint16_t>, Y>(a, static_cast<const uint16_t*>(w), M, N, num_threads); return kc::OK;
    case 2: run<FloatLanes<int8_t>, Y>(a, static_cast<const int8_t*>(w), M, N, num_threads); return kc::OK;
    default: return kc::BAD_ARGS;
  }
}

}  // namespace

// Bit 0: bfloat16 activations over bfloat16/int8 weights use pair dot products (the Python side routes
// bfloat16 batches by it).
extern "C" int kc_small_gemm_features() {
#ifdef __AVX512BF16__
  return 1;
#else
  return 0;
#endif
}

// options bit 0: float lanes even where pair dot products apply (bfloat16 activations widened to float32 once;
// at one row over int8 weights float lanes need fewer instructions per weight). Bit 1: the far prefetch
// (see tile). Bit 2: float32 weights at one row walked one row at a time (see run). The caller times the
// combinations on its CPU.
extern "C" int kc_small_gemm(int w_code, int x_code, const void* x, int64_t x_stride, const void* w,
                             const float* scale, const void* bias, void* y, int64_t y_stride, int64_t M, int64_t N,
                             int64_t K, int num_threads, int options) {
  if (K % 8 != 0 || M <= 0 || N <= 0 || x_stride < K || y_stride < N || w_code < 0 || w_code > 2)
    return kc::BAD_ARGS;
  num_threads = kc_threads(num_threads);
  Args a{x, x_stride, K, scale, bias, y, y_stride, (options & 2) != 0, (options & 4) != 0};
#ifdef __AVX512BF16__
  if (x_code == kc::BF16 && w_code == 1 && !(options & 1)) {
    run<PairLanes<uint16_t>, uint16_t>(a, static_cast<const uint16_t*>(w), M, N, num_threads);
    return kc::OK;
  }
  if (x_code == kc::BF16 && w_code == 2 && !(options & 1)) {
    run<PairLanes<int8_t>, uint16_t>(a, static_cast<const int8_t*>(w), M, N, num_threads);
    return kc::OK;
  }
#endif
  std::vector<float> xf;  // float lanes read float32 rows, K apart
  if (x_code == kc::F32 && x_stride != K) {
    xf = to_float_rows(static_cast<const float*>(x), x_stride, M, K);
  } else if (x_code == kc::BF16) {
    xf = to_float_rows(static_cast<const uint16_t*>(x), x_stride, M, K);
  } else if (x_code != kc::F32) {
    return kc::BAD_ARGS;
  }
  if (!xf.empty()) {
    a.x = xf.data();
    a.x_stride = K;
  }
  return kc::with_dtype(x_code,
                        [&](auto type) { return float_lanes<decltype(type)>(w_code, a, w, M, N, num_threads); });
}

KC_PACKED(kc_small_gemm)
