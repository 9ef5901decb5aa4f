// Paged decode attention for the CPU platform: one query token per sequence, keys and values read once,
// straight from the paged cache (no gathered copy). Built at first use by builtin_plugins/cpu/native.py
// and called through ctypes, so it needs no torch headers; OpenMP resolves to the libgomp torch loaded.
//
// Layouts (contiguous): q/out [num_seqs, num_heads, head_size], the query heads of one KV head adjacent
// (GQA); key cache [num_blocks, num_kv_heads, head_size, block_size] (transposed within a block, so a query
// meets a whole block of keys in one vector step), value cache [num_blocks, num_kv_heads, block_size,
// head_size]; block_tables [num_seqs, max_blocks] and seq_lens [num_seqs] int64. Accumulation is float32
// for both float32 and bfloat16 inputs.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

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

struct Shape {
  int64_t num_heads, num_kv_heads, head_size, block_size, max_blocks;
  float scale;
};

typedef float f32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

inline f32x16 load16(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline f32x16 load16(const uint16_t* p) {  // bfloat16 -> float32 is a 16-bit shift
  u16x16 h;
  std::memcpy(&h, p, sizeof h);
  return (f32x16)(__builtin_convertvector(h, u32x16) << 16);
}

inline void softmax_numerators(float* scores, int64_t stride, int64_t group, int64_t seq_len, float* inv_sum) {
  for (int64_t g = 0; g < group; ++g) {
    float* sg = scores + g * stride;
    float max_score = sg[0];
    for (int64_t t = 1; t < seq_len; ++t) max_score = std::max(max_score, sg[t]);
    float sum = 0.f;
    for (int64_t t = 0; t < seq_len; ++t) {
      sg[t] = std::exp(sg[t] - max_score);
      sum += sg[t];
    }
    inv_sum[g] = 1.f / sum;
  }
}

// One (sequence, kv head) for head size 16 * NV and block size 16 * NB: its `group` query heads against
// seq_len cached positions, with GCC vector types (AVX-512 / AVX2 / NEON as the machine has). Keys are stored
// transposed ([hs, bs] per block and head), so a query meets a whole block of keys in one vector FMA per d;
// values are [bs, hs] rows. Every accumulator is a register.
template <typename T, int NV, int NB>
void decode_one_vec(const T* q, const T* k_cache, const T* v_cache, const int64_t* block_table, int64_t seq_len,
                    T* out, const Shape& s, float* scores, float* qf) {
  constexpr int64_t hs = 16 * NV, bs = 16 * NB;
  const int64_t group = s.num_heads / s.num_kv_heads;
  const int64_t block_stride = s.num_kv_heads * hs * bs;  // one block holds every kv head's slab
  const int64_t stride = (seq_len + bs - 1) / bs * bs;  // a score row per query head, whole blocks
  for (int64_t i = 0; i < group * hs; ++i) qf[i] = to_float(q[i]) * s.scale;

  // Pass 1: scores[g, t] = q_g . k_t; four partial sums over d hide the FMA latency.
  for (int64_t t0 = 0, b = 0; t0 < seq_len; t0 += bs, ++b) {
    const T* kt = k_cache + block_table[b] * block_stride;
    if (t0 + bs < seq_len) {  // the next block's slab: a 4 KiB chunk the hardware prefetcher cannot foresee
      const char* next = reinterpret_cast<const char*>(k_cache + block_table[b + 1] * block_stride);
      for (int64_t off = 0; off < int64_t(hs * bs * sizeof(T)); off += 64) __builtin_prefetch(next + off);
    }
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = qf + g * hs;
      f32x16 part[4][NB] = {};
      for (int64_t d = 0; d < hs; d += 4)
        for (int j = 0; j < 4; ++j)
          for (int c = 0; c < NB; ++c) part[j][c] += qg[d + j] * load16(kt + (d + j) * bs + c * 16);
      for (int c = 0; c < NB; ++c) {  // the last block's tail lanes are never read back
        const f32x16 sum = (part[0][c] + part[1][c]) + (part[2][c] + part[3][c]);
        std::memcpy(scores + g * stride + t0 + c * 16, &sum, sizeof sum);
      }
    }
  }
  float inv_sum[64];
  softmax_numerators(scores, stride, group, seq_len, inv_sum);

  // Pass 2: out[g] = sum_t p[g, t] v_t / sum; one query head at a time so its accumulator stays in registers
  // (the sequence's values for this head are re-read from L2, not memory).
  for (int64_t g = 0; g < group; ++g) {
    const float* pg = scores + g * stride;
    f32x16 acc[NV] = {};
    for (int64_t t0 = 0, b = 0; t0 < seq_len; t0 += bs, ++b) {
      const T* vb = v_cache + block_table[b] * block_stride;
      const int64_t n = std::min(bs, seq_len - t0);
      if (g == 0 && t0 + bs < seq_len) {
        const char* next = reinterpret_cast<const char*>(v_cache + block_table[b + 1] * block_stride);
        for (int64_t off = 0; off < int64_t(hs * bs * sizeof(T)); off += 64) __builtin_prefetch(next + off);
      }
      for (int64_t i = 0; i < n; ++i) {
        const float p = pg[t0 + i];
        for (int c = 0; c < NV; ++c) acc[c] += p * load16(vb + i * hs + c * 16);
      }
    }
    float result[hs];
    for (int c = 0; c < NV; ++c) {
      const f32x16 scaled = acc[c] * inv_sum[g];
      std::memcpy(result + c * 16, &scaled, sizeof scaled);
    }
    for (int64_t d = 0; d < hs; ++d) store(out + g * hs + d, result[d]);
  }
}

// Any head and block size, plain loops (the vector path covers the common shapes).
template <typename T>
void decode_one_generic(const T* q, const T* k_cache, const T* v_cache, const int64_t* block_table,
                        int64_t seq_len, T* out, const Shape& s, float* scores, float* qf) {
  const int64_t hs = s.head_size, bs = s.block_size;
  const int64_t group = s.num_heads / s.num_kv_heads;
  const int64_t block_stride = s.num_kv_heads * hs * bs;
  for (int64_t i = 0; i < group * hs; ++i) qf[i] = to_float(q[i]) * s.scale;
  for (int64_t t0 = 0, b = 0; t0 < seq_len; t0 += bs, ++b) {
    const T* kt = k_cache + block_table[b] * block_stride;
    const int64_t n = std::min(bs, seq_len - t0);
    for (int64_t g = 0; g < group; ++g)
      for (int64_t i = 0; i < n; ++i) {
        float dot = 0.f;
        for (int64_t d = 0; d < hs; ++d) dot += qf[g * hs + d] * to_float(kt[d * bs + i]);
        scores[g * seq_len + t0 + i] = dot;
      }
  }
  float inv_sum[64];
  softmax_numerators(scores, seq_len, group, seq_len, inv_sum);
  for (int64_t g = 0; g < group; ++g) {
    float* acc = qf + g * hs;  // q is no longer needed: its buffer holds the output row
    std::fill(acc, acc + hs, 0.f);
    for (int64_t t0 = 0, b = 0; t0 < seq_len; t0 += bs, ++b) {
      const T* vb = v_cache + block_table[b] * block_stride;
      const int64_t n = std::min(bs, seq_len - t0);
      for (int64_t i = 0; i < n; ++i) {
        const float p = scores[g * seq_len + t0 + i];
        for (int64_t d = 0; d < hs; ++d) acc[d] += p * to_float(vb[i * hs + d]);
      }
    }
    for (int64_t d = 0; d < hs; ++d) store(out + g * hs + d, acc[d] * inv_sum[g]);
  }
}

using DecodeOne = void (*)(const void*, const void*, const void*, const int64_t*, int64_t, void*, const Shape&,
                           float*, float*);

template <typename T, int NV, int NB>
void vec_entry(const void* q, const void* k, const void* v, const int64_t* bt, int64_t len, void* out,
               const Shape& s, float* scores, float* qf) {
  decode_one_vec<T, NV, NB>(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), bt, len,
                            static_cast<T*>(out), s, scores, qf);
}

template <typename T>
void generic_entry(const void* q, const void* k, const void* v, const int64_t* bt, int64_t len, void* out,
                   const Shape& s, float* scores, float* qf) {
  decode_one_generic<T>(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), bt, len,
                        static_cast<T*>(out), s, scores, qf);
}

template <typename T, int NV>
DecodeOne pick_block(int64_t block_size) {
  if (block_size == 16) return vec_entry<T, NV, 1>;
  if (block_size == 32) return vec_entry<T, NV, 2>;
  return generic_entry<T>;
}

template <typename T>
DecodeOne pick(const Shape& s) {
  switch (s.head_size) {
    case 64: return pick_block<T, 4>(s.block_size);
    case 80: return pick_block<T, 5>(s.block_size);
    case 96: return pick_block<T, 6>(s.block_size);
    case 128: return pick_block<T, 8>(s.block_size);
    default: return generic_entry<T>;
  }
}

void decode_all(DecodeOne decode_one, int64_t element_size, const char* q, const char* k_cache,
                const char* v_cache, const int64_t* block_tables, const int64_t* seq_lens, char* out,
                int64_t num_seqs, int64_t max_seq_len, const Shape& s, int num_threads) {
  const int64_t group = s.num_heads / s.num_kv_heads;
  const int64_t num_items = num_seqs * s.num_kv_heads;
  const int64_t head_stride = s.head_size * s.block_size * element_size;  // one kv head's slab of a block
  const int64_t padded_len = (std::max<int64_t>(max_seq_len, 1) + s.block_size - 1) / s.block_size * s.block_size;
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<float> scores(group * padded_len), qf(group * s.head_size);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < num_items; ++item) {
      const int64_t seq = item / s.num_kv_heads, kv_head = item % s.num_kv_heads;
      const int64_t seq_len = seq_lens[seq];
      const int64_t head_offset = (seq * s.num_heads + kv_head * group) * s.head_size * element_size;
      if (seq_len <= 0) {  // nothing to attend to: zeros, as an empty softmax-weighted sum
        std::memset(out + head_offset, 0, group * s.head_size * element_size);
        continue;
      }
      decode_one(q + head_offset, k_cache + kv_head * head_stride, v_cache + kv_head * head_stride,
                 block_tables + seq * s.max_blocks, seq_len, out + head_offset, s, scores.data(), qf.data());
    }
  }
}

}  // namespace

// dtype: 0 = float32, 1 = bfloat16. Returns 0, or -1 for arguments the kernel does not handle.
extern "C" int kc_paged_decode(int dtype, const void* q, const void* k_cache, const void* v_cache,
                               const int64_t* block_tables, const int64_t* seq_lens, void* out, int64_t num_seqs,
                               int64_t num_heads, int64_t num_kv_heads, int64_t head_size, int64_t block_size,
                               int64_t max_blocks, int64_t max_seq_len, float scale, int num_threads) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || num_heads / num_kv_heads > 64) return -1;
  if (block_size <= 0 || head_size <= 0 || dtype < 0 || dtype > 1) return -1;
  const Shape s{num_heads, num_kv_heads, head_size, block_size, max_blocks, scale};
  const DecodeOne decode_one = dtype == 0 ? pick<float>(s) : pick<uint16_t>(s);
  decode_all(decode_one, dtype == 0 ? 4 : 2, static_cast<const char*>(q), static_cast<const char*>(k_cache),
             static_cast<const char*>(v_cache), block_tables, seq_lens, static_cast<char*>(out), num_seqs,
             max_seq_len, s, num_threads);
  return 0;
}
