// The per-layer pointwise ops of a decoder layer for the CPU platform: RMSNorm (with the fused residual add),
// the rotary embedding (rotate-half style, in place) and SwiGLU's silu(gate) * up. At decode sizes each is a
// few thousand elements, and torch spends more time dispatching its five or six ops per call than computing:
// one pass here replaces them. Built and called as kc_common.h describes.
//
// Tensors are float32 (kc::F32) or bfloat16 (kc::BF16), rows `stride` elements apart, columns contiguous.
// bfloat16 results are rounded where torch rounds them (each op's intermediate bfloat16 tensors), so the
// results equal the torch references' up to float32 summation order.
#include <cmath>
#include <cstdint>

#include "kc_common.h"
#include "packed_call.h"

namespace {

// Element i of a float32 or bfloat16 row. A bfloat16 row's x is already a bfloat16 value (round_to's), which
// kc::store's rounding leaves as it is (a NaN made quiet).
template <typename T>
inline float load(const T* p, int64_t i) { return kc::to_float(p[i]); }
template <typename T>
inline void store(T* p, int64_t i, float x) { kc::store(p + i, x); }

inline float round_to(float x, const float*) { return x; }
inline float round_to(float x, const uint16_t*) {  // float -> bfloat16 -> float, nearest even (as torch)
  const uint32_t bits = kc::bit_cast<uint32_t>(x);
  return (bits & 0x7fffffffu) > 0x7f800000u ? x : kc::to_float(kc::to_bf16(x));  // a NaN as it is
}

// Parallel over rows only when there is enough work to pay for waking the threads.
inline int threads_for(int64_t rows, int64_t cols, int num_threads) {
  return rows * cols >= (int64_t(1) << 16) ? kc_threads(num_threads) : 1;
}

template <typename T>
void rms_norm(T* x, int64_t x_stride, T* residual, int64_t r_stride, const T* w, T* out, int64_t o_stride,
              int64_t rows, int64_t hidden, float eps, int num_threads) {
#pragma omp parallel for num_threads(threads_for(rows, hidden, num_threads)) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = x + r * x_stride;
    if (residual) {  // residual += x, in the tensor dtype; the sum is what gets normalised
      T* res = residual + r * r_stride;
      for (int64_t i = 0; i < hidden; ++i) store(res, i, round_to(load(res, i) + load(src, i), res));
      src = res;
    }
    float sum = 0.f;
    for (int64_t i = 0; i < hidden; ++i) {
      const float v = load(src, i);
      sum += v * v;
    }
    const float inv = 1.f / std::sqrt(sum / float(hidden) + eps);
    T* dst = out + r * o_stride;
    for (int64_t i = 0; i < hidden; ++i) store(dst, i, round_to(load(w, i) * round_to(load(src, i) * inv, dst), dst));
  }
}

// x: [T, heads, head_size] rows x_stride apart (q and k adjacent in the qkv output: one call for both);
// cache: [max_position, rotary_dim] holding cos then sin halves. In the torch reference each product is a
// tensor of the promoted dtype: bfloat16 only when both x and the cache are.
template <typename T, typename C>
void rotary(const int64_t* positions, T* x, int64_t x_stride, int64_t tokens, int64_t heads, int64_t head_size,
            int64_t rotary_dim, const C* cache, int num_threads) {
  constexpr bool kRoundProducts = sizeof(T) == 2 && sizeof(C) == 2;
  auto product = [](float v, const T* like) { return kRoundProducts ? round_to(v, like) : v; };
  const int64_t half = rotary_dim / 2;
#pragma omp parallel for num_threads(threads_for(tokens, heads * head_size, num_threads)) schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    const C* cos = cache + positions[t] * rotary_dim;
    const C* sin = cos + half;
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + t * x_stride + h * head_size;
      for (int64_t i = 0; i < half; ++i) {
        const float c = load(cos, i), s = load(sin, i);
        const float x1 = load(v, i), x2 = load(v, i + half);
        store(v, i, round_to(product(x1 * c, v) - product(x2 * s, v), v));
        store(v, i + half, round_to(product(x2 * c, v) + product(x1 * s, v), v));
      }
    }
  }
}

template <typename T>
void silu_and_mul(const T* x, int64_t x_stride, T* out, int64_t o_stride, int64_t rows, int64_t d,
                  int num_threads) {
#pragma omp parallel for num_threads(threads_for(rows, d, num_threads)) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = x + r * x_stride;
    const T* up = gate + d;
    T* dst = out + r * o_stride;
    for (int64_t i = 0; i < d; ++i) {
      const float g = load(gate, i);
      store(dst, i, round_to(round_to(g / (1.f + std::exp(-g)), dst) * load(up, i), dst));
    }
  }
}

}  // namespace

extern "C" {

int kc_rms_norm(int dtype, void* x, int64_t x_stride, void* residual, int64_t r_stride, const void* w, void* out,
                int64_t o_stride, int64_t rows, int64_t hidden, float eps, int num_threads) {
  if (rows < 0 || hidden <= 0) return kc::BAD_ARGS;
  return kc::with_dtype(dtype, [&](auto type) {
    using T = decltype(type);
    rms_norm(static_cast<T*>(x), x_stride, static_cast<T*>(residual), r_stride, static_cast<const T*>(w),
             static_cast<T*>(out), o_stride, rows, hidden, eps, num_threads);
  });
}

int kc_rotary(int dtype, int cache_dtype, const int64_t* positions, void* x, int64_t x_stride, int64_t tokens,
              int64_t heads, int64_t head_size, int64_t rotary_dim, const void* cache, int64_t cache_rows,
              int num_threads) {
  if (tokens < 0 || rotary_dim <= 0 || rotary_dim % 2 || rotary_dim > head_size) return kc::BAD_ARGS;
  for (int64_t t = 0; t < tokens; ++t) {  // checked before anything is written: the call fails whole
    if (positions[t] < 0 || positions[t] >= cache_rows) return kc::BAD_ARGS;
  }
  return kc::with_dtype(dtype, [&](auto type) {
    return kc::with_dtype(cache_dtype, [&](auto cache_type) {
      rotary(positions, static_cast<decltype(type)*>(x), x_stride, tokens, heads, head_size, rotary_dim,
             static_cast<const decltype(cache_type)*>(cache), num_threads);
    });
  });
}

int kc_silu_and_mul(int dtype, const void* x, int64_t x_stride, void* out, int64_t o_stride, int64_t rows,
                    int64_t d, int num_threads) {
  if (rows < 0 || d <= 0) return kc::BAD_ARGS;
  return kc::with_dtype(dtype, [&](auto type) {
    using T = decltype(type);
    silu_and_mul(static_cast<const T*>(x), x_stride, static_cast<T*>(out), o_stride, rows, d, num_threads);
  });
}

}  // extern "C"

KC_PACKED(kc_rms_norm)
KC_PACKED(kc_rotary)
KC_PACKED(kc_silu_and_mul)

// A decode step's recorded launches in order, each a *_packed entry (of any of these libraries) with its
// words at words + offsets[i]; stops at the first nonzero status. Returns how many calls succeeded (n when
// all did) and the failing call's status in *status.
extern "C" int64_t kc_run_packed(int64_t n, const int64_t* fns, const int64_t* words, const int64_t* offsets,
                                 int* status) {
  using Packed = int (*)(const int64_t*);
  for (int64_t i = 0; i < n; ++i) {
    const int result = reinterpret_cast<Packed>(static_cast<intptr_t>(fns[i]))(words + offsets[i]);
    if (result != kc::OK) {
      *status = result;
      return i;
    }
  }
  return n;
}
