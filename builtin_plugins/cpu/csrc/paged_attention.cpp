// Paged decode attention for the CPU platform: one query token per sequence, keys and values read once,
// straight from the paged cache (no gathered copy). Built at first use by builtin_plugins/cpu/native.py
// and called through ctypes, so it needs no torch headers; OpenMP resolves to the libgomp torch loaded.
//
// Layouts (contiguous): q/out [num_seqs, num_heads, head_size], the query heads of one KV head adjacent
// (GQA); k/v cache [num_blocks, block_size, num_kv_heads, head_size]; block_tables [num_seqs, max_blocks]
// and seq_lens [num_seqs] int64. Accumulation is float32 for both float32 and bfloat16 inputs.
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

// One (sequence, kv head): its `group` query heads against seq_len cached positions.
// HS > 0 fixes the head size at compile time so the inner loops vectorise fully.
template <typename T, int HS>
void decode_one(const T* q, const T* k_cache, const T* v_cache, const int64_t* block_table, int64_t seq_len,
                T* out, const Shape& s, float* scores, float* acc, float* qf) {
  const int64_t hs = HS > 0 ? HS : s.head_size;
  const int64_t group = s.num_heads / s.num_kv_heads;
  const int64_t row_stride = s.num_kv_heads * hs;  // between positions of one block
  const int64_t block_stride = s.block_size * row_stride;
  for (int64_t i = 0; i < group * hs; ++i) qf[i] = to_float(q[i]) * s.scale;

  // Pass 1: scores[g, t] = q_g . k_t
  for (int64_t t0 = 0, b = 0; t0 < seq_len; t0 += s.block_size, ++b) {
    const T* kb = k_cache + block_table[b] * block_stride;
    const int64_t n = std::min(s.block_size, seq_len - t0);
    for (int64_t i = 0; i < n; ++i) {
      const T* kr = kb + i * row_stride;
      for (int64_t g = 0; g < group; ++g) {
        const float* qg = qf + g * hs;
        float dot = 0.f;
        for (int64_t d = 0; d < hs; ++d) dot += qg[d] * to_float(kr[d]);
        scores[g * seq_len + t0 + i] = dot;
      }
    }
  }
  // Softmax numerators in place; the 1/sum is applied to the output.
  float inv_sum[64];
  for (int64_t g = 0; g < group; ++g) {
    float* sg = scores + g * seq_len;
    float max_score = sg[0];
    for (int64_t t = 1; t < seq_len; ++t) max_score = std::max(max_score, sg[t]);
    float sum = 0.f;
    for (int64_t t = 0; t < seq_len; ++t) {
      sg[t] = std::exp(sg[t] - max_score);
      sum += sg[t];
    }
    inv_sum[g] = 1.f / sum;
  }
  // Pass 2: acc[g] = sum_t p[g, t] v_t
  std::fill(acc, acc + group * hs, 0.f);
  for (int64_t t0 = 0, b = 0; t0 < seq_len; t0 += s.block_size, ++b) {
    const T* vb = v_cache + block_table[b] * block_stride;
    const int64_t n = std::min(s.block_size, seq_len - t0);
    for (int64_t i = 0; i < n; ++i) {
      const T* vr = vb + i * row_stride;
      for (int64_t g = 0; g < group; ++g) {
        const float p = scores[g * seq_len + t0 + i];
        float* ag = acc + g * hs;
        for (int64_t d = 0; d < hs; ++d) ag[d] += p * to_float(vr[d]);
      }
    }
  }
  for (int64_t g = 0; g < group; ++g)
    for (int64_t d = 0; d < hs; ++d) store(out + g * hs + d, acc[g * hs + d] * inv_sum[g]);
}

template <typename T, int HS>
void decode_all(const T* q, const T* k_cache, const T* v_cache, const int64_t* block_tables,
                const int64_t* seq_lens, T* out, int64_t num_seqs, int64_t max_seq_len, const Shape& s,
                int num_threads) {
  const int64_t group = s.num_heads / s.num_kv_heads;
  const int64_t num_items = num_seqs * s.num_kv_heads;
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<float> scores(group * std::max<int64_t>(max_seq_len, 1));
    std::vector<float> acc(group * s.head_size), qf(group * s.head_size);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < num_items; ++item) {
      const int64_t seq = item / s.num_kv_heads, kv_head = item % s.num_kv_heads;
      const int64_t seq_len = seq_lens[seq];
      const int64_t head_offset = (seq * s.num_heads + kv_head * group) * s.head_size;
      if (seq_len <= 0) {  // nothing to attend to: zeros, as an empty softmax-weighted sum
        for (int64_t i = 0; i < group * s.head_size; ++i) store(out + head_offset + i, 0.f);
        continue;
      }
      decode_one<T, HS>(q + head_offset, k_cache + kv_head * s.head_size, v_cache + kv_head * s.head_size,
                        block_tables + seq * s.max_blocks, seq_len, out + head_offset, s, scores.data(),
                        acc.data(), qf.data());
    }
  }
}

template <typename T>
void dispatch_head_size(const void* q, const void* k, const void* v, const int64_t* bt, const int64_t* sl,
                        void* out, int64_t num_seqs, int64_t max_seq_len, const Shape& s, int num_threads) {
  auto run = [&](auto head_size_tag) {
    constexpr int HS = decltype(head_size_tag)::value;
    decode_all<T, HS>(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), bt, sl,
                      static_cast<T*>(out), num_seqs, max_seq_len, s, num_threads);
  };
  switch (s.head_size) {
    case 64: run(std::integral_constant<int, 64>{}); break;
    case 128: run(std::integral_constant<int, 128>{}); break;
    default: run(std::integral_constant<int, 0>{}); break;
  }
}

}  // namespace

// dtype: 0 = float32, 1 = bfloat16. Returns 0, or -1 for arguments the kernel does not handle.
extern "C" int kc_paged_decode(int dtype, const void* q, const void* k_cache, const void* v_cache,
                               const int64_t* block_tables, const int64_t* seq_lens, void* out, int64_t num_seqs,
                               int64_t num_heads, int64_t num_kv_heads, int64_t head_size, int64_t block_size,
                               int64_t max_blocks, int64_t max_seq_len, float scale, int num_threads) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || num_heads / num_kv_heads > 64) return -1;
  const Shape s{num_heads, num_kv_heads, head_size, block_size, max_blocks, scale};
  if (dtype == 0) {
    dispatch_head_size<float>(q, k_cache, v_cache, block_tables, seq_lens, out, num_seqs, max_seq_len, s,
                              num_threads);
  } else if (dtype == 1) {
    dispatch_head_size<uint16_t>(q, k_cache, v_cache, block_tables, seq_lens, out, num_seqs, max_seq_len, s,
                                 num_threads);
  } else {
    return -1;
  }
  return 0;
}
