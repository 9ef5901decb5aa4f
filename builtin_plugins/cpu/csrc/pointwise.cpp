// The per-layer pointwise ops of a decoder layer for the CPU platform: RMSNorm (with the fused residual add),
// the rotary embedding (rotate-half style, in place) and SwiGLU's silu(gate) * up. At decode sizes each is a
// few thousand elements, and torch spends more time dispatching its five or six ops per call than computing:
// one pass here replaces them. Built at first use by builtin_plugins/cpu/native.py, called through ctypes.
//
// Tensors are float32 (dtype code 0) or bfloat16 (1), rows `stride` elements apart, columns contiguous.
// bfloat16 results are rounded where torch rounds them (each op's intermediate bfloat16 tensors), so the
// results equal the torch references' up to float32 summation order.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "packed_call.h"

namespace {

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const uint16_t* p, int64_t i) {
  uint32_t bits = uint32_t(p[i]) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float round_to(float x, const float*) { return x; }
inline float round_to(float x, const uint16_t*) {  // float -> bfloat16 -> float, nearest even (as torch)
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return x;
  bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline void store(float* p, int64_t i, float x) { p[i] = x; }
inline void store(uint16_t* p, int64_t i, float x) {  // x is already a bfloat16 value
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) bits |= 0x00400000u;  // a quiet NaN
  p[i] = uint16_t(bits >> 16);
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
  if (rows < 0 || hidden <= 0) return -1;
  if (dtype == 0) {
    rms_norm(static_cast<float*>(x), x_stride, static_cast<float*>(residual), r_stride,
             static_cast<const float*>(w), static_cast<float*>(out), o_stride, rows, hidden, eps, num_threads);
  } else if (dtype == 1) {
    rms_norm(static_cast<uint16_t*>(x), x_stride, static_cast<uint16_t*>(residual), r_stride,
             static_cast<const uint16_t*>(w), static_cast<uint16_t*>(out), o_stride, rows, hidden, eps,
             num_threads);
  } else {
    return -1;
  }
  return 0;
}

int kc_rotary(int dtype, int cache_dtype, const int64_t* positions, void* x, int64_t x_stride, int64_t tokens,
              int64_t heads, int64_t head_size, int64_t rotary_dim, const void* cache, int64_t cache_rows,
              int num_threads) {
  if (tokens < 0 || rotary_dim <= 0 || rotary_dim % 2 || rotary_dim > head_size) return -1;
  for (int64_t t = 0; t < tokens; ++t) {  // checked before anything is written: the call fails whole
    if (positions[t] < 0 || positions[t] >= cache_rows) return -1;
  }
  const int key = dtype * 2 + cache_dtype;
  switch (key) {
    case 0: rotary(positions, static_cast<float*>(x), x_stride, tokens, heads, head_size, rotary_dim,
                   static_cast<const float*>(cache), num_threads); return 0;
    case 1: rotary(positions, static_cast<float*>(x), x_stride, tokens, heads, head_size, rotary_dim,
                   static_cast<const uint16_t*>(cache), num_threads); return 0;
    case 2: rotary(positions, static_cast<uint16_t*>(x), x_stride, tokens, heads, head_size, rotary_dim,
                   static_cast<const float*>(cache), num_threads); return 0;
    case 3: rotary(positions, static_cast<uint16_t*>(x), x_stride, tokens, heads, head_size, rotary_dim,
                   static_cast<const uint16_t*>(cache), num_threads); return 0;
    default: return -1;
  }
}

int kc_silu_and_mul(int dtype, const void* x, int64_t x_stride, void* out, int64_t o_stride, int64_t rows,
                    int64_t d, int num_threads) {
  if (rows < 0 || d <= 0) return -1;
  if (dtype == 0) {
    silu_and_mul(static_cast<const float*>(x), x_stride, static_cast<float*>(out), o_stride, rows, d, num_threads);
  } else if (dtype == 1) {
    silu_and_mul(static_cast<const uint16_t*>(x), x_stride, static_cast<uint16_t*>(out), o_stride, rows, d,
                 num_threads);
  } else {
    return -1;
  }
  return 0;
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
    if (result != 0) {
      *status = result;
      return i;
    }
  }
  return n;
}
