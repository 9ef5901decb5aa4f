// Paged decode attention for the CPU platform: one query token per sequence, keys and values read once,
// straight from the paged cache (no gathered copy). Built and called as kc_common.h describes.
//
// Layouts (contiguous): q/out [num_seqs, num_heads, head_size], the query heads of one KV head adjacent
// (GQA); key cache [num_blocks, num_kv_heads, head_size, block_size] (transposed within a block, so a query
// meets a whole block of keys in one vector step), value cache [num_blocks, num_kv_heads, block_size,
// head_size]; block_tables [num_seqs, max_blocks] and seq_lens [num_seqs] int64. Accumulation is float32
// for both float32 and bfloat16 inputs. With a sliding window W > 0 a query at position p sees positions
// p - W + 1 .. p only: blocks wholly before that are neither read nor checked (the engine may have freed them).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "kc_common.h"
#include "packed_call.h"

#ifndef KC_PREFETCH_BLOCKS  // how far ahead in a block table the decode loops prefetch (0: none)
#define KC_PREFETCH_BLOCKS 2
#endif

namespace {

using kc::fvec;
using kc::loadv;
using kc::store;
using kc::to_float;
using kc::VW;

struct Shape {
  int64_t num_heads, num_kv_heads, head_size, block_size, max_blocks;
  float scale;
  int64_t window;  // 0: the whole sequence
};

// The first position a decode query at seq_len - 1 sees.
inline int64_t first_visible(const Shape& s, int64_t seq_len) {
  return s.window > 0 ? std::max<int64_t>(0, seq_len - s.window) : 0;
}

// Vectors of kc::VW floats (the machine's width: 16 with AVX-512, else 8). Wider generic vectors than the
// registers (16 floats on AVX2) made GCC spill every intermediate through the stack: 2.7x (bfloat16) and 1.5x
// (float32) slower, at 8-13 GB/s where the cache streams at about 20.
#ifdef __AVX512F__
constexpr int ACC = 16;  // accumulators a loop keeps in registers (of 32)
#else
constexpr int ACC = 8;  // (of 16 on AVX2)
#endif

// f(std::integral_constant<int, R>) for R = rows (1 <= rows <= G): the row count as a template argument.
template <int G, typename F>
inline void with_rows(int64_t rows, F&& f) {
  if constexpr (G > 1) {
    if (rows < G) {
      with_rows<G - 1>(rows, f);
      return;
    }
  }
  f(std::integral_constant<int, G>{});
}

// The largest divisor of n that is at most limit.
constexpr int divisor_at_most(int n, int limit) {
  for (int d = limit; d > 1; --d)
    if (n % d == 0) return d;
  return 1;
}

// scores[g, t] -> exp(scores[g, t] - max_g); inv_sum[g] = 1 / sum_t of them (and max_g, the sum, when asked).
inline void softmax_numerators(float* scores, int64_t stride, int64_t group, int64_t seq_len, float* inv_sum,
                               float* maxes = nullptr, float* sums = nullptr) {
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
    if (maxes) maxes[g] = max_score, sums[g] = sum;
  }
}

// Scores of GB query rows against one block of keys (kt: [hs, bs], transposed): each key vector is loaded
// (and widened from bfloat16) once and used by all GB rows; with few rows, J partial sums per row hide the
// FMA latency.
template <int GB, int NV, int NB, typename T>
inline void block_scores(const T* kt, const float* qf, float* scores, int64_t stride) {
  constexpr int64_t hs = 16 * NV, bs = 16 * NB;
  constexpr int C = bs / VW, J = GB * C >= 4 ? 1 : 2;
  fvec part[GB][J][C] = {};
  for (int64_t d = 0; d < hs; d += J)
    for (int j = 0; j < J; ++j)
      for (int c = 0; c < C; ++c) {
        const fvec k = loadv(kt + (d + j) * bs + c * VW);
        for (int g = 0; g < GB; ++g) part[g][j][c] += qf[g * hs + d + j] * k;
      }
  for (int g = 0; g < GB; ++g)
    for (int c = 0; c < C; ++c) {  // the last block's tail lanes are never read back
      fvec sum = part[g][0][c];
      if constexpr (J == 2) sum += part[g][1][c];
      std::memcpy(scores + g * stride + c * VW, &sum, sizeof sum);
    }
}

// acc[g, :CW * VW] += sum_i p[g, i] v_i[:CW * VW] over one block's n value rows (vb: [bs, hs], at the first
// column) for GV query rows; each value vector is loaded (and widened) once for all GV rows, whose
// accumulators stay in registers.
template <int GV, int CW, typename T>
inline void block_values(const T* vb, int64_t hs, int64_t n, const float* p, int64_t stride, float* acc) {
  fvec a[GV][CW];
  for (int g = 0; g < GV; ++g)
    for (int c = 0; c < CW; ++c) a[g][c] = loadv(acc + g * hs + c * VW);
  for (int64_t i = 0; i < n; ++i)
    for (int c = 0; c < CW; ++c) {
      const fvec v = loadv(vb + i * hs + c * VW);
      for (int g = 0; g < GV; ++g) a[g][c] += p[g * stride + i] * v;
    }
  for (int g = 0; g < GV; ++g)
    for (int c = 0; c < CW; ++c) std::memcpy(acc + g * hs + c * VW, &a[g][c], sizeof a[g][c]);
}

// The blocks a sequence reads are wherever its block table says: the hardware prefetcher cannot follow them,
// so the slabs of the block KC_PREFETCH_BLOCKS ahead are requested while this one computes.
inline void prefetch(const void* start, int64_t bytes) {
  const char* p = static_cast<const char*>(start);
  for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(p + offset, 0, 1);
}

// A span of a sequence's positions [lo, hi) that one work item reads; with `partial` set, the item writes its
// rows' (max score, sum of exponentials, unnormalised weighted sum of values) there, hs + 2 floats a row, for
// merge_spans; without, the finished output.
struct Span {
  int64_t lo, hi;
  float* partial;
};

// One sequence's kv heads [0, num_item_heads) (pointers already at the first) for head size 16 * NV and
// block size 16 * NB, with GCC vector types (AVX-512 / AVX2 / NEON as the machine has). Keys are stored
// transposed ([hs, bs] per block and head), so a query meets a whole block of keys in one vector FMA per d;
// values are [bs, hs] rows. Blocks are the outer loop: each block's slabs for these heads are adjacent in
// memory, so a sequence's cache is read as a few long streams instead of many 4 KiB pieces.
template <typename T, typename C, int NV, int NB>
void decode_one_vec(const T* q, const C* k_cache, const C* v_cache, const int64_t* block_table, int64_t query_len,
                    const Span& span, T* out, const Shape& s, int64_t num_item_heads, float* scores, float* qf) {
  constexpr int64_t hs = 16 * NV, bs = 16 * NB, slab = hs * bs;
  // Query rows per pass over a block, so that each pass's accumulators fit the registers: for the scores a
  // block is bs / VW vectors per row; for the values a row is hs / VW vectors, taken CW at a time.
  constexpr int GS = std::min(4, std::max(1, ACC / int(bs / VW)));
  constexpr int CW = divisor_at_most(int(hs / VW), ACC), GV = std::min(4, std::max(1, ACC / CW));
  const int64_t group = s.num_heads / s.num_kv_heads, num_rows = num_item_heads * group;
  const int64_t block_stride = s.num_kv_heads * slab;  // one block holds every kv head's slab
  // Scores cover whole blocks from the first visible one: position t is column t - base.
  const int64_t seq_len = span.hi;  // (below: the span's end)
  const int64_t start = std::max(first_visible(s, query_len), span.lo), first_block = start / bs, base = first_block * bs;
  const int64_t stride = (seq_len - base + bs - 1) / bs * bs;  // a score row per query head
  for (int64_t i = 0; i < num_rows * hs; ++i) qf[i] = to_float(q[i]) * s.scale;

  // Pass 1: scores[h * group + g, t - base] = q . k_t
  const int64_t item_bytes = num_item_heads * slab * sizeof(C), last_block = (seq_len - 1) / bs;
  for (int64_t t0 = base, b = first_block; t0 < seq_len; t0 += bs, ++b) {
    if (b + KC_PREFETCH_BLOCKS <= last_block)
      prefetch(k_cache + block_table[b + KC_PREFETCH_BLOCKS] * block_stride, item_bytes);
    for (int64_t h = 0; h < num_item_heads; ++h) {
      const C* kt = k_cache + block_table[b] * block_stride + h * slab;
      for (int64_t g = 0; g < group; g += GS) {
        const int64_t row = h * group + g;
        const float* qr = qf + row * hs;
        float* sr = scores + row * stride + (t0 - base);
        with_rows<GS>(std::min<int64_t>(GS, group - g),
                      [&](auto rows) { block_scores<decltype(rows)::value, NV, NB>(kt, qr, sr, stride); });
      }
    }
  }
  float inv_sum[1024], maxes[1024], sums[1024];
  const int64_t skip = start - base;  // the first block's positions before the window
  softmax_numerators(scores + skip, stride, num_rows, seq_len - start, inv_sum, span.partial ? maxes : nullptr, sums);
  for (int64_t row = 0; row < num_rows; ++row) std::fill(scores + row * stride, scores + row * stride + skip, 0.f);

  // Pass 2: out[row] = sum_t p[row, t] v_t / sum, accumulated in qf (no longer needed) between blocks.
  float* acc = qf;
  std::fill(acc, acc + num_rows * hs, 0.f);
  for (int64_t t0 = base, b = first_block; t0 < seq_len; t0 += bs, ++b) {
    const int64_t n = std::min(bs, seq_len - t0);
    if (b + KC_PREFETCH_BLOCKS <= last_block)
      prefetch(v_cache + block_table[b + KC_PREFETCH_BLOCKS] * block_stride, item_bytes);
    for (int64_t h = 0; h < num_item_heads; ++h) {
      const C* vb = v_cache + block_table[b] * block_stride + h * slab;
      for (int64_t g = 0; g < group; g += GV) {
        const int64_t row = h * group + g;
        const float* pr = scores + row * stride + (t0 - base);
        with_rows<GV>(std::min<int64_t>(GV, group - g), [&](auto rows) {
          for (int64_t col = 0; col < hs; col += CW * VW)
            block_values<decltype(rows)::value, CW>(vb + col, hs, n, pr, stride, acc + row * hs + col);
        });
      }
    }
  }
  if (span.partial) {
    for (int64_t row = 0; row < num_rows; ++row) {
      float* p = span.partial + row * (hs + 2);
      p[0] = maxes[row], p[1] = sums[row];
      std::memcpy(p + 2, acc + row * hs, hs * sizeof(float));
    }
    return;
  }
  for (int64_t row = 0; row < num_rows; ++row)
    for (int64_t d = 0; d < hs; ++d) store(out + row * hs + d, acc[row * hs + d] * inv_sum[row]);
}

// out[row] from a sequence's spans in order: the softmax over all of them, each span's sums rescaled to the
// largest max (the order and the operations fixed, so a row's bits depend only on its sequence).
template <typename T>
void merge_spans(const float* partials, int64_t num_spans, int64_t num_rows, int64_t hs, T* out) {
  const int64_t span_floats = num_rows * (hs + 2);
  std::vector<float> acc(hs);
  for (int64_t row = 0; row < num_rows; ++row) {
    float max_score = partials[row * (hs + 2)];
    for (int64_t c = 1; c < num_spans; ++c) max_score = std::max(max_score, partials[c * span_floats + row * (hs + 2)]);
    float sum = 0.f;
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t c = 0; c < num_spans; ++c) {
      const float* p = partials + c * span_floats + row * (hs + 2);
      const float w = std::exp(p[0] - max_score);
      sum += p[1] * w;
      for (int64_t d = 0; d < hs; ++d) acc[d] += p[2 + d] * w;
    }
    const float inv_sum = 1.f / sum;
    for (int64_t d = 0; d < hs; ++d) store(out + row * hs + d, acc[d] * inv_sum);
  }
}

// Any head and block size, plain loops (the vector path covers the common shapes).
template <typename T, typename C>
void decode_one_head(const T* q, const C* k_cache, const C* v_cache, const int64_t* block_table,
                     int64_t seq_len, T* out, const Shape& s, float* scores, float* qf) {
  const int64_t hs = s.head_size, bs = s.block_size;
  const int64_t group = s.num_heads / s.num_kv_heads;
  const int64_t block_stride = s.num_kv_heads * hs * bs;
  const int64_t start = first_visible(s, seq_len), len = seq_len - start;  // scores[g, t - start]
  for (int64_t i = 0; i < group * hs; ++i) qf[i] = to_float(q[i]) * s.scale;
  for (int64_t t0 = start / bs * bs, b = start / bs; t0 < seq_len; t0 += bs, ++b) {
    const C* kt = k_cache + block_table[b] * block_stride;
    const int64_t n = std::min(bs, seq_len - t0);
    for (int64_t g = 0; g < group; ++g)
      for (int64_t i = std::max<int64_t>(0, start - t0); i < n; ++i) {
        float dot = 0.f;
        for (int64_t d = 0; d < hs; ++d) dot += qf[g * hs + d] * to_float(kt[d * bs + i]);
        scores[g * len + t0 + i - start] = dot;
      }
  }
  float inv_sum[64];
  softmax_numerators(scores, len, group, len, inv_sum);
  for (int64_t g = 0; g < group; ++g) {
    float* acc = qf + g * hs;  // q is no longer needed: its buffer holds the output row
    std::fill(acc, acc + hs, 0.f);
    for (int64_t t0 = start / bs * bs, b = start / bs; t0 < seq_len; t0 += bs, ++b) {
      const C* vb = v_cache + block_table[b] * block_stride;
      const int64_t n = std::min(bs, seq_len - t0);
      for (int64_t i = std::max<int64_t>(0, start - t0); i < n; ++i) {
        const float p = scores[g * len + t0 + i - start];
        for (int64_t d = 0; d < hs; ++d) acc[d] += p * to_float(vb[i * hs + d]);
      }
    }
    for (int64_t d = 0; d < hs; ++d) store(out + g * hs + d, acc[d] * inv_sum[g]);
  }
}

template <typename T, typename C>
void decode_one_generic(const T* q, const C* k_cache, const C* v_cache, const int64_t* block_table,
                        int64_t seq_len, T* out, const Shape& s, int64_t num_item_heads, float* scores, float* qf) {
  // (whole sequences only: decode_all never splits for this path)
  const int64_t group_elems = s.num_heads / s.num_kv_heads * s.head_size, slab = s.head_size * s.block_size;
  for (int64_t h = 0; h < num_item_heads; ++h)
    decode_one_head(q + h * group_elems, k_cache + h * slab, v_cache + h * slab, block_table, seq_len,
                    out + h * group_elems, s, scores, qf);
}

using DecodeOne = void (*)(const void*, const void*, const void*, const int64_t*, int64_t, const Span&, void*,
                           const Shape&, int64_t, float*, float*);
using MergeSpans = void (*)(const float*, int64_t, int64_t, int64_t, void*);
struct Decoder {
  DecodeOne decode_one;
  bool splits;  // whether decode_one takes a span shorter than the sequence
  MergeSpans merge;
};

template <typename T, typename C, int NV, int NB>
void vec_entry(const void* q, const void* k, const void* v, const int64_t* bt, int64_t len, const Span& span,
               void* out, const Shape& s, int64_t num_item_heads, float* scores, float* qf) {
  decode_one_vec<T, C, NV, NB>(static_cast<const T*>(q), static_cast<const C*>(k), static_cast<const C*>(v), bt, len,
                            span, static_cast<T*>(out), s, num_item_heads, scores, qf);
}

template <typename T, typename C>
void generic_entry(const void* q, const void* k, const void* v, const int64_t* bt, int64_t len, const Span&,
                   void* out, const Shape& s, int64_t num_item_heads, float* scores, float* qf) {
  decode_one_generic<T, C>(static_cast<const T*>(q), static_cast<const C*>(k), static_cast<const C*>(v), bt, len,
                        static_cast<T*>(out), s, num_item_heads, scores, qf);
}

template <typename T>
void merge_entry(const float* partials, int64_t num_spans, int64_t num_rows, int64_t hs, void* out) {
  merge_spans<T>(partials, num_spans, num_rows, hs, static_cast<T*>(out));
}

template <typename T, typename C, int NV>
Decoder pick_block(int64_t block_size) {
  if (block_size == 16) return {vec_entry<T, C, NV, 1>, true, merge_entry<T>};
  if (block_size == 32) return {vec_entry<T, C, NV, 2>, true, merge_entry<T>};
  return {generic_entry<T, C>, false, merge_entry<T>};
}

// T: the queries' and the output's element type; C: the cache's (bfloat16 under float32 queries halves the
// bytes each step reads and the cache's memory; every product is still float32).
template <typename T, typename C>
Decoder pick(const Shape& s) {
  switch (s.head_size) {
    case 64: return pick_block<T, C, 4>(s.block_size);
    case 80: return pick_block<T, C, 5>(s.block_size);
    case 96: return pick_block<T, C, 6>(s.block_size);
    case 128: return pick_block<T, C, 8>(s.block_size);
    case 256: return pick_block<T, C, 16>(s.block_size);  // Gemma 3 (the plain loops were 3% of its decode step)
    default: return {generic_entry<T, C>, false, merge_entry<T>};
  }
}

// Positions per span of a long sequence: a sequence's spans start at multiples of it, whatever the batch around
// it, so its rows' bits never depend on the batch; one span (every sequence up to this long) is the whole
// sequence, computed as before spans existed. At batch 1 the work items were its kv heads alone: SmolLM2's 3 on 2
// threads left one thread idle a third of the time, Gemma 3's 1 kept one thread for the whole attention.
constexpr int64_t SPAN = 512;

void decode_all(const Decoder& decoder, int64_t element_size, int64_t cache_element_size, const char* q, const char* k_cache, const char* v_cache,
                const int64_t* block_tables, const int64_t* seq_lens, char* out, int64_t num_seqs,
                int64_t max_seq_len, const Shape& s, int num_threads) {
  const int64_t group = s.num_heads / s.num_kv_heads;
  // A work item is a whole sequence (its cache streamed block by block), or one (sequence, kv head) when
  // there are too few sequences to keep every thread busy, and one span of it when the sequence is long.
  const int64_t item_heads = num_seqs >= 4 * kc_threads(num_threads) ? s.num_kv_heads : 1;
  const int64_t items_per_seq = s.num_kv_heads / item_heads;
  const int64_t head_stride = s.head_size * s.block_size * cache_element_size;  // one kv head's slab of a block
  const int64_t padded_len = (std::max<int64_t>(max_seq_len, 1) + s.block_size - 1) / s.block_size * s.block_size;
  const int64_t rows = item_heads * group, span_floats = rows * (s.head_size + 2);
  struct Item {
    int64_t seq, kv_head, lo, hi, slot;  // slot: its partial sums' index among partials, -1 for a whole sequence
  };
  struct Merge {
    int64_t seq, kv_head, first, num_spans;
  };
  std::vector<Item> items;
  std::vector<Merge> merges;
  int64_t num_partials = 0;
  for (int64_t seq = 0; seq < num_seqs; ++seq) {
    const int64_t len = seq_lens[seq], lo = first_visible(s, len) / SPAN * SPAN;
    const int64_t spans = decoder.splits && len > 0 ? (len - lo + SPAN - 1) / SPAN : 1;
    for (int64_t i = 0; i < items_per_seq; ++i) {
      if (spans > 1) merges.push_back({seq, i * item_heads, num_partials, spans});
      for (int64_t c = 0; c < spans; ++c)
        items.push_back(spans > 1 ? Item{seq, i * item_heads, lo + c * SPAN, std::min(len, lo + (c + 1) * SPAN),
                                         num_partials++}
                                  : Item{seq, i * item_heads, 0, len, -1});
    }
  }
  std::vector<float> partials(num_partials * span_floats);
  const int64_t num_items = int64_t(items.size()), num_merges = int64_t(merges.size());
#pragma omp parallel num_threads(kc_threads(num_threads))
  {
    std::vector<float> scores(rows * padded_len), qf(rows * s.head_size);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < num_items; ++i) {
      const Item& item = items[i];
      const int64_t seq_len = seq_lens[item.seq];
      const int64_t head_offset = (item.seq * s.num_heads + item.kv_head * group) * s.head_size * element_size;
      if (seq_len <= 0) {  // nothing to attend to: zeros, as an empty softmax-weighted sum
        std::memset(out + head_offset, 0, rows * s.head_size * element_size);
        continue;
      }
      const Span span{item.lo, item.hi, item.slot < 0 ? nullptr : partials.data() + item.slot * span_floats};
      decoder.decode_one(q + head_offset, k_cache + item.kv_head * head_stride, v_cache + item.kv_head * head_stride,
                         block_tables + item.seq * s.max_blocks, seq_len, span, out + head_offset, s, item_heads,
                         scores.data(), qf.data());
    }
#pragma omp for schedule(static)
    for (int64_t m = 0; m < num_merges; ++m) {
      const Merge& merge = merges[m];
      const int64_t head_offset = (merge.seq * s.num_heads + merge.kv_head * group) * s.head_size * element_size;
      decoder.merge(partials.data() + merge.first * span_floats, merge.num_spans, rows, s.head_size,
                    out + head_offset);
    }
  }
}

}  // namespace

template <typename T, typename C>
void write_kv(const T* k, const T* v, int64_t k_token_stride, int64_t v_token_stride, C* k_cache, C* v_cache,
              const int64_t* slot_mapping, int64_t num_tokens, int64_t num_kv_heads, int64_t head_size,
              int64_t block_size, int num_threads) {
  const int64_t head_stride = head_size * block_size, block_stride = num_kv_heads * head_stride;
#pragma omp parallel for num_threads(kc_threads(num_threads)) if (num_tokens * num_kv_heads * head_size > 65536)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    const int64_t block = slot / block_size, offset = slot % block_size;
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      const T* kr = k + t * k_token_stride + h * head_size;
      C* kt = k_cache + block * block_stride + h * head_stride + offset;  // column `offset` of [hs, bs]
      const T* vr = v + t * v_token_stride + h * head_size;
      C* vc = v_cache + block * block_stride + h * head_stride + offset * head_size;
      if constexpr (std::is_same_v<T, C>) {
        for (int64_t d = 0; d < head_size; ++d) kt[d * block_size] = kr[d];
        std::memcpy(vc, vr, head_size * sizeof(T));
      } else {  // float32 rows into a bfloat16 cache: rounded to nearest even, as torch's .to(bfloat16)
        for (int64_t d = 0; d < head_size; ++d) store(kt + d * block_size, to_float(kr[d]));
        for (int64_t d = 0; d < head_size; ++d) store(vc + d, to_float(vr[d]));
      }
    }
  }
}

// The new tokens' keys and values into their slots: each key into column `offset` of its block's transposed
// [head_size, block_size] slab, each value into row `offset` of the [block_size, head_size] slab. k/v rows
// are [num_kv_heads, head_size] contiguous, `*_token_stride` elements apart. Returns OK, BAD_ARGS for an unknown
// dtype, OUT_OF_RANGE for a slot outside the cache (nothing is written then).
extern "C" int kc_write_kv(int dtype, int cache_dtype, const void* k, const void* v, int64_t k_token_stride, int64_t v_token_stride,
                           void* k_cache, void* v_cache, const int64_t* slot_mapping, int64_t num_tokens,
                           int64_t num_kv_heads, int64_t head_size, int64_t block_size, int64_t num_cache_blocks,
                           int num_threads) {
  for (int64_t t = 0; t < num_tokens; ++t)
    if (slot_mapping[t] < 0 || slot_mapping[t] >= num_cache_blocks * block_size) return kc::OUT_OF_RANGE;
  if (cache_dtype != dtype && !(dtype == kc::F32 && cache_dtype == kc::BF16)) return kc::BAD_ARGS;
  return kc::with_dtype(dtype, [&](auto type) {
    using T = decltype(type);
    return kc::with_dtype(cache_dtype, [&](auto cache_type) {
      using C = decltype(cache_type);
      write_kv(static_cast<const T*>(k), static_cast<const T*>(v), k_token_stride, v_token_stride,
               static_cast<C*>(k_cache), static_cast<C*>(v_cache), slot_mapping, num_tokens, num_kv_heads, head_size,
               block_size, num_threads);
    });
  });
}

// dtype: kc::Dtype. Returns OK, BAD_ARGS for shapes the kernel does not handle, OUT_OF_RANGE for a block table
// that points outside the cache.
extern "C" int kc_paged_decode(int dtype, int cache_dtype, const void* q, const void* k_cache, const void* v_cache,
                               const int64_t* block_tables, const int64_t* seq_lens, void* out, int64_t num_seqs,
                               int64_t num_heads, int64_t num_kv_heads, int64_t head_size, int64_t block_size,
                               int64_t max_blocks, int64_t num_cache_blocks, float scale, int64_t window,
                               int num_threads) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || num_heads / num_kv_heads > 64) return kc::BAD_ARGS;
  if (num_heads > 1024 || block_size <= 0 || head_size <= 0 || window < 0) return kc::BAD_ARGS;
  if (dtype != kc::F32 && dtype != kc::BF16) return kc::BAD_ARGS;
  if (cache_dtype != dtype && !(dtype == kc::F32 && cache_dtype == kc::BF16)) return kc::BAD_ARGS;
  const Shape s{num_heads, num_kv_heads, head_size, block_size, max_blocks, scale, window};
  // Every block a sequence reads must exist: a bad table is an error here, not a read out of bounds.
  int64_t max_seq_len = 0;
  for (int64_t seq = 0; seq < num_seqs; ++seq) {
    const int64_t num_blocks = (seq_lens[seq] + block_size - 1) / block_size;
    if (num_blocks > max_blocks) return kc::OUT_OF_RANGE;
    for (int64_t b = first_visible(s, seq_lens[seq]) / block_size; b < num_blocks; ++b) {
      const int64_t block = block_tables[seq * max_blocks + b];
      if (block < 0 || block >= num_cache_blocks) return kc::OUT_OF_RANGE;
    }
    max_seq_len = std::max(max_seq_len, seq_lens[seq]);
  }
  return kc::with_dtype(dtype, [&](auto type) {
    using T = decltype(type);
    return kc::with_dtype(cache_dtype, [&](auto cache_type) {
      using C = decltype(cache_type);
      decode_all(pick<T, C>(s), sizeof(T), sizeof(C), static_cast<const char*>(q), static_cast<const char*>(k_cache),
                 static_cast<const char*>(v_cache), block_tables, seq_lens, static_cast<char*>(out), num_seqs,
                 max_seq_len, s, num_threads);
    });
  });
}

KC_PACKED(kc_write_kv)
KC_PACKED(kc_paged_decode)
