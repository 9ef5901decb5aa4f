// Linear layers computed straight from GGUF (llama.cpp) quantized weights, as the file stores them: y[M, N] =
// x[M, K] W[N, K]^T (+ bias), W given as N rows of ggml blocks. At decode sizes a linear is bound by the bytes
// of weight it streams, so reading 4-6 bit blocks instead of a dequantized bfloat16 copy is the speed-up (and the
// memory stays at the file's size). Built and called as kc_common.h describes.
//
// Two kernels:
//  * kc_gguf_matmul: dequantize-in-register. Each thread owns groups of NR output rows; per K tile (256 values)
//    the group's blocks are dequantized into a 4 KiB L1 buffer and meet MR activation rows in float32 FMAs.
//    Every supported type, fp32 accumulation, activations used as given.
//  * kc_gguf_matmul_int: llama.cpp's integer dot products. Activations are quantized once per call to int8 with
//    one float scale per 32 values (Q8_0-like, for the 32-value block types) or per 256 (Q8_K-like, with
//    per-16 sums for the K-quants' mins and offsets); each weight block is unpacked to bytes and multiplied
//    with u8 x s8 dot products, 4x the multiply-adds per instruction of float32 FMAs, at the cost of the
//    activations' int8 rounding. The 32-value types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) have an AVX-512
//    VNNI path (two blocks per 512-bit vpdpbusd, four weight rows at a time, no per-row overhead: see
//    "AVX-512 VNNI integer path" below); the K-quants (Q4_K, Q5_K, Q6_K), and every type without AVX-512, use
//    256-bit AVX-VNNI / AVX2 vpmaddubsw (or scalar loops).
// Every output is one thread's sum in a fixed order: results do not depend on the number of threads.
// The weight rows are prefetched KC_GGUF_PREFETCH bytes ahead (from memory the hardware prefetchers alone left
// the kernels 1.5-2x slower than from cache).
//
// dequantize() values equal gguf-py's numpy reference bit for bit: every product in the block formulas is
// exact in float32 (an fp16 scale has 11 significant bits, the sub-scales and quants at most 8 + 6), so fused
// multiply-adds and -ffast-math's reassociation round only the final value, as numpy does.
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kc_common.h"
#include "packed_call.h"

namespace {

using kc::fvec;
using kc::loadv;
using kc::store;
using kc::to_bf16;
using kc::VW;

// ggml's type ids (the Python side passes them).
enum : int {
  Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14,
  IQ4_NL = 20, IQ4_XS = 23
};

template <int T> struct Traits;  // QK: values per block; BS: bytes per block
template <> struct Traits<Q4_0> { static constexpr int QK = 32, BS = 18; };
template <> struct Traits<Q4_1> { static constexpr int QK = 32, BS = 20; };
template <> struct Traits<Q5_0> { static constexpr int QK = 32, BS = 22; };
template <> struct Traits<Q5_1> { static constexpr int QK = 32, BS = 24; };
template <> struct Traits<Q8_0> { static constexpr int QK = 32, BS = 34; };
template <> struct Traits<Q2_K> { static constexpr int QK = 256, BS = 84; };
template <> struct Traits<Q3_K> { static constexpr int QK = 256, BS = 110; };
template <> struct Traits<Q4_K> { static constexpr int QK = 256, BS = 144; };
template <> struct Traits<Q5_K> { static constexpr int QK = 256, BS = 176; };
template <> struct Traits<Q6_K> { static constexpr int QK = 256, BS = 210; };
template <> struct Traits<IQ4_NL> { static constexpr int QK = 32, BS = 18; };
template <> struct Traits<IQ4_XS> { static constexpr int QK = 256, BS = 136; };

constexpr int8_t KVALUES_IQ4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

inline float fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#ifdef __F16C__
  return _cvtsh_ss(h);
#else
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal half: normal in float32
    int e = -1;
    uint32_t m = man;
    do { m <<= 1; ++e; } while (!(m & 0x400));
    bits = sign | uint32_t(112 - e) << 23 | (m & 0x3ff) << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

uint32_t load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// K-quants' 12 bytes of 6-bit sub-block scales and mins (ggml's get_scale_min_k4).
inline void scale_min_k4(const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    mn[j] = s[j + 4] & 63;
    sc[j + 4] = (s[j + 8] & 0xf) | ((s[j] >> 6) << 4);
    mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
  }
}

// One block into QK floats. Plain loops (GCC vectorises them, at 128 bits), or with AVX-512 BW/VL 32 values at a
// time as int8 -> float32 (the same single rounding: every product below is exact, see the top of the file;
// a plain multiply where the reference has no add, so that -0.0 stays -0.0).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define KC_DEQ512 1
inline __m512 lo16f(__m256i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(v))); }
inline __m512 hi16f(__m256i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(v, 1))); }
// 16 bytes of nibbles -> 32 bytes: low nibbles (values 0-15), then high nibbles (values 16-31)
inline __m256i nib32(const uint8_t* p) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), mask = _mm_set1_epi8(0xf);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), mask), _mm_and_si128(q, mask));
}
// y[0:16] = s0 * v, y[16:32] = s1 * v
inline void mul32(__m256i v, __m512 s0, __m512 s1, float* y) {
  _mm512_storeu_ps(y, _mm512_mul_ps(s0, lo16f(v)));
  _mm512_storeu_ps(y + 16, _mm512_mul_ps(s1, hi16f(v)));
}
// y[0:32] = s * v + c
inline void fma32(__m256i v, __m512 s, __m512 c, float* y) {
  _mm512_storeu_ps(y, _mm512_fmadd_ps(s, lo16f(v), c));
  _mm512_storeu_ps(y + 16, _mm512_fmadd_ps(s, hi16f(v), c));
}
// y[0:16] = s0 * v + c0, y[16:32] = s1 * v + c1
inline void fma32x2(__m256i v, float s0, float c0, float s1, float c1, float* y) {
  _mm512_storeu_ps(y, _mm512_fmadd_ps(_mm512_set1_ps(s0), lo16f(v), _mm512_set1_ps(c0)));
  _mm512_storeu_ps(y + 16, _mm512_fmadd_ps(_mm512_set1_ps(s1), hi16f(v), _mm512_set1_ps(c1)));
}
#elif defined(__AVX2__)
#define KC_DEQ256 1
// 8 bytes (the low half of v) as 8 floats, unsigned / signed
inline __m256 u8x8f(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }
inline __m256 s8x8f(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }
// 16 bytes of nibbles -> 32 floats as s * q + c (low nibbles first): GCC vectorised the plain loop at 128 bits
// only, and a Q4_1 row dequantized 4x slower than AVX2 allows (AVX2-only EPYC)
inline void nib32_fma(const uint8_t* p, __m256 s, __m256 c, float* y) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), mask = _mm_set1_epi8(0xf);
  const __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
  _mm256_storeu_ps(y, _mm256_fmadd_ps(s, u8x8f(lo), c));
  _mm256_storeu_ps(y + 8, _mm256_fmadd_ps(s, u8x8f(_mm_srli_si128(lo, 8)), c));
  _mm256_storeu_ps(y + 16, _mm256_fmadd_ps(s, u8x8f(hi), c));
  _mm256_storeu_ps(y + 24, _mm256_fmadd_ps(s, u8x8f(_mm_srli_si128(hi, 8)), c));
}
#endif
template <int T> void dequant_block(const uint8_t* b, float* __restrict y);

template <> void dequant_block<Q4_0>(const uint8_t* b, float* __restrict y) {
#ifdef KC_DEQ512
  const __m512 d = _mm512_set1_ps(fp16(b));
  mul32(_mm256_sub_epi8(nib32(b + 2), _mm256_set1_epi8(8)), d, d, y);
#elif defined(KC_DEQ256)
  const __m256 d = _mm256_set1_ps(fp16(b)), eight = _mm256_set1_ps(8.0f);  // d * (q - 8): -0.0 stays -0.0
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)), mask = _mm_set1_epi8(0xf);
  const __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int i = 0; i < 4; ++i) _mm256_storeu_ps(y + 8 * i, _mm256_mul_ps(d, _mm256_sub_ps(u8x8f(parts[i]), eight)));
#else
  const float d = fp16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float((qs[j] & 0xf) - 8);
    y[j + 16] = d * float((qs[j] >> 4) - 8);
  }
#endif
}
template <> void dequant_block<Q4_1>(const uint8_t* b, float* __restrict y) {
#ifdef KC_DEQ512
  fma32(nib32(b + 4), _mm512_set1_ps(fp16(b)), _mm512_set1_ps(fp16(b + 2)), y);
#elif defined(KC_DEQ256)
  nib32_fma(b + 4, _mm256_set1_ps(fp16(b)), _mm256_set1_ps(fp16(b + 2)), y);
#else
  const float d = fp16(b), m = fp16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(qs[j] & 0xf) + m;
    y[j + 16] = d * float(qs[j] >> 4) + m;
  }
#endif
}
template <> void dequant_block<Q5_0>(const uint8_t* b, float* __restrict y) {
#ifdef KC_DEQ512
  const __m256i v = _mm256_mask_add_epi8(nib32(b + 6), __mmask32(load32(b + 2)), nib32(b + 6), _mm256_set1_epi8(16));
  const __m512 d = _mm512_set1_ps(fp16(b));
  mul32(_mm256_sub_epi8(v, _mm256_set1_epi8(16)), d, d, y);
#else
  const float d = fp16(b);
  const uint32_t qh = load32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(int((qs[j] & 0xf) | ((qh >> j) & 1) << 4) - 16);
    y[j + 16] = d * float(int((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
  }
#endif
}
template <> void dequant_block<Q5_1>(const uint8_t* b, float* __restrict y) {
#ifdef KC_DEQ512
  const __m256i v = _mm256_mask_add_epi8(nib32(b + 8), __mmask32(load32(b + 4)), nib32(b + 8), _mm256_set1_epi8(16));
  fma32(v, _mm512_set1_ps(fp16(b)), _mm512_set1_ps(fp16(b + 2)), y);
#else
  const float d = fp16(b), m = fp16(b + 2);
  const uint32_t qh = load32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float((qs[j] & 0xf) | ((qh >> j) & 1) << 4) + m;
    y[j + 16] = d * float((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) + m;
  }
#endif
}
template <> void dequant_block<Q8_0>(const uint8_t* b, float* __restrict y) {
#ifdef KC_DEQ512
  const __m512 d = _mm512_set1_ps(fp16(b));
  mul32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), d, d, y);
#elif defined(KC_DEQ256)
  const __m256 d = _mm256_set1_ps(fp16(b));
  for (int i = 0; i < 4; ++i) {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * i));
    _mm256_storeu_ps(y + 8 * i, _mm256_mul_ps(d, s8x8f(q)));
  }
#else
  const float d = fp16(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * float(qs[j]);
#endif
}
// 16 bytes of IQ4 nibbles -> 32 values dl * kvalue (low nibbles first). The codebook lookup does not vectorise
// as a plain loop (7x slower than Q4_0's dequantization); vpshufb looks up 16 at a time.
inline void iq4_values(const uint8_t* qs, float dl, float* __restrict y) {
#ifdef KC_DEQ512  // (16-float stores: a later 64-byte load of them is forwarded from the store buffer)
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(KVALUES_IQ4));
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), mask = _mm_set1_epi8(0xf);
  const __m256i v = _mm256_set_m128i(_mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), mask)),
                                     _mm_shuffle_epi8(table, _mm_and_si128(q, mask)));
  mul32(v, _mm512_set1_ps(dl), _mm512_set1_ps(dl), y);
#elif defined(__AVX2__)
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(KVALUES_IQ4));
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), mask = _mm_set1_epi8(0xf);
  const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(q, mask));
  const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), mask));
  const __m256 d = _mm256_set1_ps(dl);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int i = 0; i < 4; ++i)
    _mm256_storeu_ps(y + 8 * i, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[i]))));
#else
  for (int j = 0; j < 16; ++j) {
    y[j] = dl * float(KVALUES_IQ4[qs[j] & 0xf]);
    y[j + 16] = dl * float(KVALUES_IQ4[qs[j] >> 4]);
  }
#endif
}

template <> void dequant_block<IQ4_NL>(const uint8_t* b, float* __restrict y) { iq4_values(b + 2, fp16(b), y); }
template <> void dequant_block<Q2_K>(const uint8_t* b, float* __restrict y) {
#ifdef KC_DEQ512
  const uint8_t *sc = b, *qs = b + 16;
  const float d = fp16(b + 80), dmin = fp16(b + 82);
  for (int g = 0; g < 8; ++g) {  // 32 values: bits 2*(g%4) of 32 bytes qs[(g/4)*32 ...]
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + (g / 4) * 32));
    const __m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 2 * (g % 4)), _mm256_set1_epi8(3));
    fma32x2(v, d * float(sc[2 * g] & 0xf), -(dmin * float(sc[2 * g] >> 4)), d * float(sc[2 * g + 1] & 0xf),
            -(dmin * float(sc[2 * g + 1] >> 4)), y + g * 32);
  }
#else
  const uint8_t *sc = b, *qs = b + 16;
  const float d = fp16(b + 80), dmin = fp16(b + 82);
  for (int g = 0; g < 8; ++g) {  // 32 values: bits 2*(g%4) of 32 bytes qs[(g/4)*32 ...]
    const uint8_t* q = qs + (g / 4) * 32;
    const int shift = 2 * (g % 4);
    for (int t = 0; t < 2; ++t) {
      const float dl = d * float(sc[g * 2 + t] & 0xf), ml = dmin * float(sc[g * 2 + t] >> 4);
      for (int l = 0; l < 16; ++l) y[g * 32 + t * 16 + l] = dl * float((q[t * 16 + l] >> shift) & 3) - ml;
    }
  }
#endif
}
template <> void dequant_block<Q3_K>(const uint8_t* b, float* __restrict y) {
#ifdef KC_DEQ512
  const uint8_t *hmask = b, *qs = b + 32, *s = b + 96;
  const float d = fp16(b + 108);
  float dl[16];
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? s[i] & 0xf : s[i - 8] >> 4, high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    dl[i] = d * float((low | high << 4) - 32);
  }
  const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hmask));
  for (int g = 0; g < 8; ++g) {  // minus 4 where the value's hmask bit g is clear
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + (g / 4) * 32));
    const __m256i low2 = _mm256_and_si256(_mm256_srli_epi16(q, 2 * (g % 4)), _mm256_set1_epi8(3));
    const __mmask32 set = _mm256_test_epi8_mask(hm, _mm256_set1_epi8(char(1 << g)));
    const __m256i v = _mm256_mask_sub_epi8(low2, __mmask32(~set), low2, _mm256_set1_epi8(4));
    mul32(v, _mm512_set1_ps(dl[2 * g]), _mm512_set1_ps(dl[2 * g + 1]), y + g * 32);
  }
#else
  const uint8_t *hmask = b, *qs = b + 32, *s = b + 96;
  const float d = fp16(b + 108);
  float dl[16];
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? s[i] & 0xf : s[i - 8] >> 4, high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    dl[i] = d * float((low | high << 4) - 32);
  }
  for (int g = 0; g < 8; ++g) {
    const uint8_t* q = qs + (g / 4) * 32;
    const int shift = 2 * (g % 4);
    for (int t = 0; t < 2; ++t) {
      const float s = dl[g * 2 + t];
      for (int l = t * 16; l < t * 16 + 16; ++l) {  // (branch-free: vectorises)
        const int v = ((q[l] >> shift) & 3) - 4 + 4 * ((hmask[l] >> g) & 1);
        y[g * 32 + l] = s * float(v);
      }
    }
  }
#endif
}
template <> void dequant_block<Q4_K>(const uint8_t* b, float* __restrict y) {
#ifdef KC_DEQ512
  const float d = fp16(b), dmin = fp16(b + 2);
  uint8_t sc[8], mn[8];
  scale_min_k4(b + 4, sc, mn);
  const __m256i mask = _mm256_set1_epi8(0xf);
  for (int c = 0; c < 4; ++c) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + c * 32));
    fma32(_mm256_and_si256(q, mask), _mm512_set1_ps(d * float(sc[2 * c])), _mm512_set1_ps(-(dmin * float(mn[2 * c]))),
          y + c * 64);
    fma32(_mm256_and_si256(_mm256_srli_epi16(q, 4), mask), _mm512_set1_ps(d * float(sc[2 * c + 1])),
          _mm512_set1_ps(-(dmin * float(mn[2 * c + 1]))), y + c * 64 + 32);
  }
#else
  const float d = fp16(b), dmin = fp16(b + 2);
  uint8_t sc[8], mn[8];
  scale_min_k4(b + 4, sc, mn);
  const uint8_t* qs = b + 16;
  for (int c = 0; c < 4; ++c) {
    const float d0 = d * float(sc[2 * c]), m0 = dmin * float(mn[2 * c]);
    const float d1 = d * float(sc[2 * c + 1]), m1 = dmin * float(mn[2 * c + 1]);
    for (int l = 0; l < 32; ++l) {
      y[c * 64 + l] = d0 * float(qs[c * 32 + l] & 0xf) - m0;
      y[c * 64 + 32 + l] = d1 * float(qs[c * 32 + l] >> 4) - m1;
    }
  }
#endif
}
template <> void dequant_block<Q5_K>(const uint8_t* b, float* __restrict y) {
#ifdef KC_DEQ512
  const float d = fp16(b), dmin = fp16(b + 2);
  uint8_t sc[8], mn[8];
  scale_min_k4(b + 4, sc, mn);
  const __m256i mask = _mm256_set1_epi8(0xf), one = _mm256_set1_epi8(1);
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
  for (int c = 0; c < 4; ++c) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 48 + c * 32));
    const __mmask32 h0 = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(char(1 << (2 * c))));
    const __mmask32 h1 = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(char(1 << (2 * c + 1))));
    const __m256i v0 = _mm256_mask_add_epi8(_mm256_and_si256(q, mask), h0, _mm256_and_si256(q, mask), _mm256_slli_epi16(one, 4));
    const __m256i q1 = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
    const __m256i v1 = _mm256_mask_add_epi8(q1, h1, q1, _mm256_slli_epi16(one, 4));
    fma32(v0, _mm512_set1_ps(d * float(sc[2 * c])), _mm512_set1_ps(-(dmin * float(mn[2 * c]))), y + c * 64);
    fma32(v1, _mm512_set1_ps(d * float(sc[2 * c + 1])), _mm512_set1_ps(-(dmin * float(mn[2 * c + 1]))), y + c * 64 + 32);
  }
#else
  const float d = fp16(b), dmin = fp16(b + 2);
  uint8_t sc[8], mn[8];
  scale_min_k4(b + 4, sc, mn);
  const uint8_t *qh = b + 16, *qs = b + 48;
  for (int c = 0; c < 4; ++c) {
    const int j0 = 2 * c, j1 = 2 * c + 1;
    const float d0 = d * float(sc[j0]), m0 = dmin * float(mn[j0]);
    const float d1 = d * float(sc[j1]), m1 = dmin * float(mn[j1]);
    for (int l = 0; l < 32; ++l) {
      y[c * 64 + l] = d0 * float((qs[c * 32 + l] & 0xf) | ((qh[l] >> j0) & 1) << 4) - m0;
      y[c * 64 + 32 + l] = d1 * float((qs[c * 32 + l] >> 4) | ((qh[l] >> j1) & 1) << 4) - m1;
    }
  }
#endif
}
template <> void dequant_block<Q6_K>(const uint8_t* b, float* __restrict y) {
#ifdef KC_DEQ512
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = fp16(b + 208);
  const __m256i mask = _mm256_set1_epi8(0xf), three = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
  for (int h = 0; h < 2; ++h) {
    const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + h * 64));
    const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + h * 64 + 32));
    const __m256i hh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + h * 32));
    const __m256i lows[4] = {_mm256_and_si256(l0, mask), _mm256_and_si256(l1, mask),
                             _mm256_and_si256(_mm256_srli_epi16(l0, 4), mask), _mm256_and_si256(_mm256_srli_epi16(l1, 4), mask)};
    for (int i = 0; i < 4; ++i) {  // values 32 i .. 32 i + 31 of this half: scales sc[8 h + 2 i], sc[8 h + 2 i + 1]
      const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hh, 2 * i), three), 4);
      const __m256i v = _mm256_sub_epi8(_mm256_or_si256(lows[i], hi), off);
      mul32(v, _mm512_set1_ps(d * float(sc[h * 8 + 2 * i])), _mm512_set1_ps(d * float(sc[h * 8 + 2 * i + 1])),
            y + h * 128 + 32 * i);
    }
  }
#else
  const uint8_t *ql = b, *qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = fp16(b + 208);
  for (int h = 0; h < 2; ++h) {
    const uint8_t *l0 = ql + h * 64, *hh = qh + h * 32;
    float* o = y + h * 128;
    const int8_t* s = sc + h * 8;
    for (int t = 0; t < 2; ++t) {  // 16 values per scale
      const float d0 = d * float(s[t]), d1 = d * float(s[2 + t]), d2 = d * float(s[4 + t]), d3 = d * float(s[6 + t]);
      for (int l = t * 16; l < t * 16 + 16; ++l) {
        o[l] = d0 * float(int((l0[l] & 0xf) | ((hh[l] >> 0) & 3) << 4) - 32);
        o[l + 32] = d1 * float(int((l0[l + 32] & 0xf) | ((hh[l] >> 2) & 3) << 4) - 32);
        o[l + 64] = d2 * float(int((l0[l] >> 4) | ((hh[l] >> 4) & 3) << 4) - 32);
        o[l + 96] = d3 * float(int((l0[l + 32] >> 4) | ((hh[l] >> 6) & 3) << 4) - 32);
      }
    }
  }
#endif
}
template <> void dequant_block<IQ4_XS>(const uint8_t* b, float* __restrict y) {
  const float d = fp16(b);
  uint16_t sh;
  std::memcpy(&sh, b + 2, 2);
  const uint8_t *sl = b + 4, *qs = b + 8;
  for (int j = 0; j < 8; ++j) {
    const int ls = ((sl[j / 2] >> (4 * (j % 2))) & 0xf) | ((sh >> (2 * j)) & 3) << 4;
    iq4_values(qs + j * 16, d * float(ls - 32), y + j * 32);
  }
}

// Software prefetch distance (bytes ahead in each weight row stream). The kernels walk a few rows at a time, each
// a stream of its own; from memory the hardware prefetchers alone left them 1.5-2x slower than from cache here.
#ifndef KC_GGUF_PREFETCH
#define KC_GGUF_PREFETCH 4096
#endif
inline void prefetch(const uint8_t* p) { __builtin_prefetch(p + KC_GGUF_PREFETCH, 0, 3); }

// ---------------------------------------------------------------------------------------------------------------
// dequantize: rows of blocks into float32 / bfloat16 rows.

// n floats -> bfloat16, rounded to nearest even as to_bf16 (n a multiple of 16 with AVX-512).
inline void bf16_row(const float* x, uint16_t* y, int n) {
#ifdef __AVX512F__
  for (int j = 0; j < n; j += 16) {
    const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(x + j));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + j), _mm512_cvtepi32_epi16(r));
  }
#else
  for (int j = 0; j < n; ++j) y[j] = to_bf16(x[j]);
#endif
}

template <int T>
void dequantize_rows(const uint8_t* raw, int64_t raw_stride, int64_t rows, int64_t cols, int out_code, void* out,
                     int num_threads) {
  constexpr int QK = Traits<T>::QK, BS = Traits<T>::BS;
  const int64_t nb = cols / QK;
#pragma omp parallel for num_threads(kc_threads(num_threads)) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = raw + r * raw_stride;
    if (out_code == kc::F32) {
      float* o = static_cast<float*>(out) + r * cols;
      for (int64_t b = 0; b < nb; ++b) dequant_block<T>(row + b * BS, o + b * QK);
    } else {
      uint16_t* o = static_cast<uint16_t*>(out) + r * cols;
      alignas(64) float tmp[QK];
      for (int64_t b = 0; b < nb; ++b) {
        dequant_block<T>(row + b * BS, tmp);
        bf16_row(tmp, o + b * QK, QK);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Dequantize-in-register matmul.

#ifdef __AVX512F__
constexpr int MR_MAX = 4;  // activation rows per pass (NR * MR accumulators of 32 registers)
#else
constexpr int MR_MAX = 2;  // 16 registers
#endif
constexpr int NR = 4;    // weight rows dequantized together (each activation load feeds NR FMAs)
constexpr int TK = 256;  // values per tile: one K-quant block or 8 of the 32-value blocks

// acc + w * x as one FMA instruction: a builtin -ffast-math leaves alone (written as `acc += w * x`, GCC unrolled and
// reassociated the sums differently for each tile shape, so a row's bits depended on the batch around it)
inline fvec fmav(fvec w, fvec x, fvec acc) {
#ifdef __AVX512F__
  return _mm512_fmadd_ps(w, x, acc);
#elif defined(__FMA__)
  return _mm256_fmadd_ps(w, x, acc);
#else
  return acc + w * x;
#endif
}
// (not inlined: -ffast-math may reassociate the sum differently at each inlined site, and a row's bits must
// not depend on which kernel computed it). A fixed tree of halvings where there are vector registers: the
// one-row kernels take one sum per output row, and the serial loop was 8% of Gemma 3's decode step (its LM head
// has 262,144 rows).
__attribute__((noinline)) float hsum(fvec v) {
#if defined(__AVX512F__) || defined(__AVX2__)
#ifdef __AVX512F__
  const __m512 x = v;
  const __m256 upper = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(x), upper);
#else
  __m256 h = v;
#endif
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
#else
  float s = 0;
  for (int i = 0; i < VW; ++i) s += v[i];
  return s;
#endif
}

template <int T>
inline void dequant_span(const uint8_t* row, int64_t k0, int len, float* __restrict out) {
  constexpr int QK = Traits<T>::QK, BS = Traits<T>::BS;
  for (int k = 0; k < len; k += QK) dequant_block<T>(row + (k0 + k) / QK * BS, out + k);
}

// acc[r][m] (vacc rows `stride` fvecs apart) += buf[r][0:len] * x[m][k0:k0+len]
template <int R, int MR>
inline void tile_fma(const float* buf, const float* x, int64_t K, int64_t k0, int len, fvec* vacc, int64_t stride) {
  fvec a[R][MR];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m) a[r][m] = vacc[r * stride + m];
  const float* xk = x + k0;
  for (int k = 0; k < len; k += VW) {
    fvec w[R];
    for (int r = 0; r < R; ++r) w[r] = loadv(buf + r * TK + k);
    for (int m = 0; m < MR; ++m) {
      const fvec xv = loadv(xk + m * K + k);
      for (int r = 0; r < R; ++r) a[r][m] = fmav(w[r], xv, a[r][m]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m) vacc[r * stride + m] = a[r][m];
}

template <int R>
inline void tile_all_rows(const float* buf, const float* x, int64_t M, int64_t K, int64_t k0, int len, fvec* vacc) {
  for (int64_t m0 = 0; m0 < M;) {
    const int64_t left = M - m0;
    const float* xm = x + m0 * K;
    fvec* va = vacc + m0;
    if (MR_MAX >= 4 && left >= 4) {
      tile_fma<R, (MR_MAX >= 4 ? 4 : 1)>(buf, xm, K, k0, len, va, M);
      m0 += MR_MAX >= 4 ? 4 : 1;
    } else if (left >= 2) {
      tile_fma<R, 2>(buf, xm, K, k0, len, va, M);
      m0 += 2;
    } else {
      tile_fma<R, 1>(buf, xm, K, k0, len, va, M);
      m0 += 1;
    }
  }
}

#if defined(KC_DEQ256)
// One activation row (decode at batch 1) on AVX2: each block's 32 values dequantized into four registers and
// multiplied at once instead of through the tile buffer (a store and a reload per 8 values; the matmul ran at
// half the speed the dequantization alone allows). The same operations in the same order as dequant_block +
// tile_fma, so a row's result does not depend on the batch it is in (tests/test_cpu_gguf_kernels.py checks).
template <int T> constexpr bool kMatvecType = T == Q4_0 || T == Q4_1;  // (Q8_0 ran 15% slower so: memory-bound)
template <int T> inline void block_regs(const uint8_t* b, __m256* w) {
  if constexpr (T == Q8_0) {
    const __m256 d = _mm256_set1_ps(fp16(b));
    for (int i = 0; i < 4; ++i)
      w[i] = _mm256_mul_ps(d, s8x8f(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * i))));
  } else {
    const uint8_t* qs = b + (T == Q4_0 ? 2 : 4);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), mask = _mm_set1_epi8(0xf);
    const __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    if constexpr (T == Q4_0) {
      const __m256 d = _mm256_set1_ps(fp16(b)), eight = _mm256_set1_ps(8.0f);
      for (int i = 0; i < 4; ++i) w[i] = _mm256_mul_ps(d, _mm256_sub_ps(u8x8f(parts[i]), eight));
    } else {
      const __m256 s = _mm256_set1_ps(fp16(b)), c = _mm256_set1_ps(fp16(b + 2));
      for (int i = 0; i < 4; ++i) w[i] = _mm256_fmadd_ps(s, u8x8f(parts[i]), c);
    }
  }
}

template <int T, typename Y>
void float_matvec(const float* x, int64_t K, const uint8_t* raw, int64_t raw_stride, int64_t N, const float* bias,
                  Y* y, int num_threads) {
  constexpr int BS = Traits<T>::BS, TILE = TK / 32;  // blocks per prefetch step, as float_matmul's tiles
  const int64_t groups = (N + NR - 1) / NR, nb = K / 32;
#pragma omp parallel for schedule(static) num_threads(kc_threads(num_threads))
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t n0 = g * NR;
    const int rows = int(std::min<int64_t>(NR, N - n0));
    const uint8_t* row[NR];
    for (int r = 0; r < NR; ++r) row[r] = raw + (n0 + std::min(r, rows - 1)) * raw_stride;  // a tail repeats its last
    fvec acc[NR] = {};
    for (int64_t b0 = 0; b0 < nb; b0 += TILE) {
      const int64_t b1 = std::min<int64_t>(nb, b0 + TILE);
      for (int r = 0; r < NR; ++r)
        for (int64_t o = b0 * BS; o < b1 * BS; o += 64) prefetch(row[r] + o);
      for (int64_t b = b0; b < b1; ++b) {
        __m256 xv[4];
        for (int i = 0; i < 4; ++i) xv[i] = _mm256_loadu_ps(x + b * 32 + 8 * i);
        for (int r = 0; r < NR; ++r) {
          __m256 w[4];
          block_regs<T>(row[r] + b * BS, w);
          for (int i = 0; i < 4; ++i) acc[r] = fmav(w[i], xv[i], acc[r]);
        }
      }
    }
    for (int r = 0; r < rows; ++r) store(y + n0 + r, hsum(acc[r]) + (bias ? bias[n0 + r] : 0.0f));
  }
}
#elif defined(KC_DEQ512)
// Up to 8 activation rows on AVX-512 the same way: blocks dequantized into registers, no tile buffer (through it
// every 16 dequantized values cost a store and a reload besides their FMAs). The operations and their order are
// those of dequant_block + tile_fma (fma32 / mul32's products, one FMA per 16 values in k order), so a row's
// bits do not depend on the path. One row (decode at batch 1): 10-30% faster than the tile path on a 2-core
// Zen 5 (see float_matvec for how many weight rows at a time); 5 rows (a speculative verification of 4 drafts):
// 1.4-1.8x a 1-row call instead of 2.1-2.8x (benchmarks/gguf_matmul.py --rows 1,5).
template <int T> constexpr bool kMatvecType = T == Q4_0 || T == Q4_1 || T == Q5_0 || T == Q5_1 || T == Q8_0 || T == Q4_K;
// (Each 16 bytes widened to 16 int32 lanes at once, the nibbles then masked and shifted per lane: the same
// integers and the same products as dequant_block's, in half the instructions of widening 32 int8 nibbles;
// one-row Q4_1 matmuls went from 10-11 to 12-13 GB/s.)
template <int T> inline void block_regs(const uint8_t* b, __m512* w) {
  if constexpr (T == Q8_0) {
    const __m512 d = _mm512_set1_ps(fp16(b));
    w[0] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(b + 2)))));
    w[1] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(b + 18)))));
  } else if constexpr (T == Q5_0 || T == Q5_1) {  // the fifth bits as masks: bit j of value j, bit 16 + j of 16 + j
    const int qs = T == Q5_0 ? 6 : 8;
    const uint32_t qh = load32(b + qs - 4);
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(b + qs))), sixteen = _mm512_set1_epi32(16);
    __m512i lo = _mm512_and_si512(v, _mm512_set1_epi32(0xf)), hi = _mm512_srli_epi32(v, 4);
    lo = _mm512_mask_add_epi32(lo, __mmask16(qh), lo, sixteen);
    hi = _mm512_mask_add_epi32(hi, __mmask16(qh >> 16), hi, sixteen);
    if constexpr (T == Q5_0) {
      const __m512 d = _mm512_set1_ps(fp16(b));
      w[0] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(lo, sixteen)));
      w[1] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(hi, sixteen)));
    } else {
      const __m512 s = _mm512_set1_ps(fp16(b)), c = _mm512_set1_ps(fp16(b + 2));
      w[0] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(lo), c);
      w[1] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(hi), c);
    }
  } else {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(b + (T == Q4_0 ? 2 : 4))));
    __m512i lo = _mm512_and_si512(v, _mm512_set1_epi32(0xf)), hi = _mm512_srli_epi32(v, 4);
    if constexpr (T == Q4_0) {
      const __m512 d = _mm512_set1_ps(fp16(b));
      lo = _mm512_sub_epi32(lo, _mm512_set1_epi32(8));
      hi = _mm512_sub_epi32(hi, _mm512_set1_epi32(8));
      w[0] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(lo));
      w[1] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(hi));
    } else {
      // both float16 scales converted by one instruction (two scalar conversions and broadcasts cost as much as
      // the rest of the block)
      int32_t dm_bits;
      std::memcpy(&dm_bits, b, 4);
      const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm_bits));
      const __m512 s = _mm512_broadcastss_ps(dm), c = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
      w[0] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(lo), c);
      w[1] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(hi), c);
    }
  }
}

// How the register kernels read a type: 256-value units (a K-quant super-block, or eight 32-value blocks), each
// 8 chunks of 32 values; make() once per unit and row (a K-quant's sub-block scales: d * sc and -(dmin * mn), as
// dequant_block makes them), chunk(j) the unit's values 32 j .. 32 j + 31 in two registers, in dequant_block's
// order.
template <int T> constexpr bool kRegsK = T == Q4_K || T == Q6_K;
template <int T> constexpr bool kRegsType = T == Q4_0 || T == Q4_1 || T == Q5_0 || T == Q5_1 || T == Q8_0 || kRegsK<T>;
template <int T> struct Chunks {  // the 32-value block types
  static constexpr int UNIT_BYTES = 8 * Traits<T>::BS;
  void make(const uint8_t*) {}
  void chunk(const uint8_t* unit, int j, __m512* w) const { block_regs<T>(unit + j * Traits<T>::BS, w); }
};
template <> struct Chunks<Q4_K> {
  static constexpr int UNIT_BYTES = Traits<Q4_K>::BS;
  float s[8], c[8];
  void make(const uint8_t* b) {
    const float d = fp16(b), dmin = fp16(b + 2);
    uint8_t sc[8], mn[8];
    scale_min_k4(b + 4, sc, mn);
    for (int j = 0; j < 8; ++j) s[j] = d * float(sc[j]), c[j] = -(dmin * float(mn[j]));
  }
  // chunk j: the low (j even) or high nibbles of bytes 32 (j / 2) .. + 31
  void chunk(const uint8_t* b, int j, __m512* w) const {
    const uint8_t* q = b + 16 + (j >> 1) * 32;
    const int shift = (j & 1) * 4;
    const __m512i mask = _mm512_set1_epi32(0xf);
    const __m512 sj = _mm512_set1_ps(s[j]), cj = _mm512_set1_ps(c[j]);
    for (int h = 0; h < 2; ++h) {
      const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(q + 16 * h)));
      w[h] = _mm512_fmadd_ps(sj, _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, shift), mask)), cj);
    }
  }
};
template <> struct Chunks<Q6_K> {
  static constexpr int UNIT_BYTES = Traits<Q6_K>::BS;
  float s[16];
  void make(const uint8_t* b) {
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = fp16(b + 208);
    for (int j = 0; j < 16; ++j) s[j] = d * float(sc[j]);
  }
  // chunk j = 4 h + i: low 4 bits from bytes 64 h + 32 (i & 1) .. (shifted for i >= 2), high 2 from 128 + 32 h
  void chunk(const uint8_t* b, int j, __m512* w) const {
    const int h = j >> 2, i = j & 3;
    const uint8_t *ql = b + h * 64 + (i & 1) * 32, *qh = b + 128 + h * 32;
    for (int half = 0; half < 2; ++half) {
      const __m512i lo = _mm512_and_si512(
          _mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(ql + 16 * half))), (i >> 1) * 4),
          _mm512_set1_epi32(0xf));
      const __m512i hi = _mm512_slli_epi32(
          _mm512_and_si512(_mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(qh + 16 * half))),
                                             2 * i),
                           _mm512_set1_epi32(3)),
          4);
      const __m512i v = _mm512_sub_epi32(_mm512_or_si512(lo, hi), _mm512_set1_epi32(32));
      w[half] = _mm512_mul_ps(_mm512_set1_ps(s[h * 8 + 2 * i + half]), _mm512_cvtepi32_ps(v));
    }
  }
};

// NR weight rows dequantized into registers meet MR activation rows: NR * MR accumulators. One group of
// output rows n0 .. n0 + rows (row[] points at their blocks) for the MR activation rows at x, into y.
template <int T, int NR_, int MR, typename Y>
inline void group_rows(const float* x, int64_t K, const uint8_t* const* row, int rows, int64_t n0, int64_t N,
                       const float* bias, Y* y) {
  constexpr int UB = Chunks<T>::UNIT_BYTES;
  const int64_t units = (K + 255) / 256;
  fvec acc[NR_][MR] = {};
  for (int64_t u = 0; u < units; ++u) {
    const int chunks = int(std::min<int64_t>(8, (K - u * 256) / 32));  // (a 32-value type's last unit: fewer)
    Chunks<T> src[NR_];
    for (int r = 0; r < NR_; ++r) {
      for (int64_t o = u * UB; o < u * UB + chunks * UB / 8; o += 64) prefetch(row[r] + o);
      src[r].make(row[r] + u * UB);
    }
    // (the sums copied in and out per unit: indexed in place, GCC stored all NR * MR of them back to the
    // stack every block, and a 5-row call was bound by those stores)
    fvec a[NR_][MR];
    for (int r = 0; r < NR_; ++r)
      for (int m = 0; m < MR; ++m) a[r][m] = acc[r][m];
    for (int j = 0; j < chunks; ++j) {
      __m512 w[NR_][2];
      for (int r = 0; r < NR_; ++r) src[r].chunk(row[r] + u * UB, j, w[r]);
      const int64_t k = u * 256 + j * 32;
      for (int m = 0; m < MR; ++m) {
        const fvec x0 = loadv(x + m * K + k), x1 = loadv(x + m * K + k + 16);
        for (int r = 0; r < NR_; ++r) {
          a[r][m] = fmav(fvec(w[r][0]), x0, a[r][m]);
          a[r][m] = fmav(fvec(w[r][1]), x1, a[r][m]);
        }
      }
    }
    for (int r = 0; r < NR_; ++r)
      for (int m = 0; m < MR; ++m) acc[r][m] = a[r][m];
  }
  for (int r = 0; r < rows; ++r) {
    const float bv = bias ? bias[n0 + r] : 0.0f;
    for (int m = 0; m < MR; ++m) store(y + m * N + n0 + r, hsum(acc[r][m]) + bv);
  }
}

template <int NR_>
inline void group_pointers(const uint8_t* raw, int64_t raw_stride, int64_t N, int64_t g, const uint8_t** row,
                           int64_t& n0, int& rows) {
  n0 = g * NR_;
  rows = int(std::min<int64_t>(NR_, N - n0));
  for (int r = 0; r < NR_; ++r) row[r] = raw + (n0 + std::min(r, rows - 1)) * raw_stride;
}

template <int T, int NR_, int MR, typename Y>
void float_rows(const float* x, int64_t K, const uint8_t* raw, int64_t raw_stride, int64_t N, const float* bias,
                Y* y, int num_threads) {
  kc_parallel_steal((N + NR_ - 1) / NR_, kc_threads(num_threads), [&](int64_t g) {
    const uint8_t* row[NR_];
    int64_t n0;
    int rows;
    group_pointers<NR_>(raw, raw_stride, N, g, row, n0, rows);
    group_rows<T, NR_, MR, Y>(x, K, row, rows, n0, N, bias, y);
  });
}

constexpr int64_t PASSES_MAX_M = 48;  // (FLOAT_ROWS_F32's largest crossover; above it the tile path)

// More than 8 activation rows: each group of weight rows meets them in passes of 4-8 rows (as even as they
// split: 9 = 5 + 4, 17 = 6 + 6 + 5), its blocks read from memory once and dequantized again per pass from L1.
// Every row's sums run as in the one-row kernel, so its bits do not depend on M.
template <int T, int NR_, typename Y>
void float_rows_passes(const float* x, int64_t M, int64_t K, const uint8_t* raw, int64_t raw_stride, int64_t N,
                       const float* bias, Y* y, int num_threads) {
  const int64_t passes = (M + 7) / 8, base = M / passes, extra = M % passes;
  kc_parallel_steal((N + NR_ - 1) / NR_, kc_threads(num_threads), [&](int64_t g) {
    const uint8_t* row[NR_];
    int64_t n0;
    int rows;
    group_pointers<NR_>(raw, raw_stride, N, g, row, n0, rows);
    for (int64_t p = 0, m0 = 0; p < passes; ++p) {
      const int mr = int(base + (p < extra));
      const float* xp = x + m0 * K;
      Y* yp = y + m0 * N;
      switch (mr) {
        case 4: group_rows<T, NR_, 4, Y>(xp, K, row, rows, n0, N, bias, yp); break;
        case 5: group_rows<T, NR_, 5, Y>(xp, K, row, rows, n0, N, bias, yp); break;
        case 6: group_rows<T, NR_, 6, Y>(xp, K, row, rows, n0, N, bias, yp); break;
        case 7: group_rows<T, NR_, 7, Y>(xp, K, row, rows, n0, N, bias, yp); break;
        default: group_rows<T, NR_, 8, Y>(xp, K, row, rows, n0, N, bias, yp); break;
      }
      m0 += mr;
    }
  });
}

template <int T, typename Y>
void float_matvec(const float* x, int64_t K, const uint8_t* raw, int64_t raw_stride, int64_t N, const float* bias,
                  Y* y, int num_threads) {
  // Few weight rows at a time: fewer streams from memory per thread. Q8_0 (the LM heads: memory-bound) and Q4_K
  // one row: 25-27 GB/s against the tile path's 20 (Gemma 3's 178 MB LM head 8.7 -> 6.7 ms), Q4_K 15-25% faster
  // than the tile path; the 4-5 bit types two (as fast as four for gate/up, 10-25% faster for down; eight were
  // 20% slower). Q6_K, 10% slower here at one row, stays on the tile path (kMatvecType).
  float_rows<T, (T == Q8_0 || T == Q4_K) ? 1 : 2, 1, Y>(x, K, raw, raw_stride, N, bias, y, num_threads);
}

// 4 weight rows x M sums up to 5 rows (2 rows for a K-quant's 3+, whose unit scales are held too), 2 x M above.
template <int T, int MR, typename Y>
void float_rows_m(const float* x, int64_t K, const uint8_t* raw, int64_t raw_stride, int64_t N, const float* bias,
                  Y* y, int num_threads) {
  constexpr int NR_ = (kRegsK<T> ? MR <= 2 : MR <= 5) ? 4 : 2;
  float_rows<T, NR_, MR, Y>(x, K, raw, raw_stride, N, bias, y, num_threads);
}

template <int T, typename Y>
bool float_small_m(const float* x, int64_t M, int64_t K, const uint8_t* raw, int64_t raw_stride, int64_t N,
                   const float* bias, Y* y, int num_threads) {
  if constexpr (kRegsType<T>) {
    switch (M) {
      case 2: float_rows_m<T, 2, Y>(x, K, raw, raw_stride, N, bias, y, num_threads); return true;
      case 3: float_rows_m<T, 3, Y>(x, K, raw, raw_stride, N, bias, y, num_threads); return true;
      case 4: float_rows_m<T, 4, Y>(x, K, raw, raw_stride, N, bias, y, num_threads); return true;
      case 5: float_rows_m<T, 5, Y>(x, K, raw, raw_stride, N, bias, y, num_threads); return true;
      case 6: float_rows_m<T, 6, Y>(x, K, raw, raw_stride, N, bias, y, num_threads); return true;
      case 7: float_rows_m<T, 7, Y>(x, K, raw, raw_stride, N, bias, y, num_threads); return true;
      case 8: float_rows_m<T, 8, Y>(x, K, raw, raw_stride, N, bias, y, num_threads); return true;
      default:
        if (M > PASSES_MAX_M) return false;
        // (2 weight rows: passes of 6-8 rows hold 12-16 sums; 4 where every pass is 4-5 rows and not a K-quant)
        if (!kRegsK<T> && M <= 10) float_rows_passes<T, 4, Y>(x, M, K, raw, raw_stride, N, bias, y, num_threads);
        else float_rows_passes<T, 2, Y>(x, M, K, raw, raw_stride, N, bias, y, num_threads);
        return true;
    }
  }
  return false;
}
#else
template <int T> constexpr bool kMatvecType = false;
template <int T, typename Y>
void float_matvec(const float*, int64_t, const uint8_t*, int64_t, int64_t, const float*, Y*, int) {}
#endif
#ifndef KC_DEQ512
template <int T, typename Y>
bool float_small_m(const float*, int64_t, int64_t, const uint8_t*, int64_t, int64_t, const float*, Y*, int) {
  return false;
}
#endif

template <int T, typename Y>
void float_matmul(const float* x, int64_t M, int64_t K, const uint8_t* raw, int64_t raw_stride, int64_t N,
                  const float* bias, Y* y, int num_threads) {
  if constexpr (kMatvecType<T>) {
    if (M == 1) return float_matvec<T, Y>(x, K, raw, raw_stride, N, bias, y, num_threads);
  }
  if (M > 1 && float_small_m<T, Y>(x, M, K, raw, raw_stride, N, bias, y, num_threads)) return;
  const int64_t groups = (N + NR - 1) / NR;
  const int nt = kc_threads(num_threads);
  constexpr int64_t BUF_VECS = NR * TK / VW;
  std::vector<fvec> scratch(size_t(nt) * (BUF_VECS + NR * M));  // per thread: the tile buffer, the sums
  kc_parallel_steal(groups, nt, [&](int64_t g) {
    fvec* mine = scratch.data() + size_t(omp_get_thread_num()) * (BUF_VECS + NR * M);
    float* buf = reinterpret_cast<float*>(mine);
    fvec* vacc = mine + BUF_VECS;
    const int64_t n0 = g * NR;
    const int rows = int(std::min<int64_t>(NR, N - n0));
    std::fill(vacc, vacc + NR * M, fvec{});
    for (int64_t k0 = 0; k0 < K; k0 += TK) {
      const int len = int(std::min<int64_t>(TK, K - k0));
      for (int r = 0; r < rows; ++r) {
        const uint8_t* row = raw + (n0 + r) * raw_stride;
        for (int64_t o = k0 / Traits<T>::QK * Traits<T>::BS; o < (k0 + len) / Traits<T>::QK * Traits<T>::BS; o += 64)
          prefetch(row + o);
        dequant_span<T>(row, k0, len, buf + r * TK);
      }
      if (rows == NR) {
        tile_all_rows<NR>(buf, x, M, K, k0, len, vacc);
      } else {
        for (int r = 0; r < rows; ++r) tile_all_rows<1>(buf + r * TK, x, M, K, k0, len, vacc + r * M);
      }
    }
    for (int r = 0; r < rows; ++r) {
      const float b = bias ? bias[n0 + r] : 0.0f;
      for (int64_t m = 0; m < M; ++m) store(y + m * N + n0 + r, hsum(vacc[r * M + m]) + b);
    }
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Integer dot products. 32 bytes at a time; without AVX2 the same operations as scalar loops.

typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));

#ifdef __AVX2__
typedef __m256i v256;
inline v256 ld(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline v256 zero256() { return _mm256_setzero_si256(); }
// 16 bytes -> 32 nibbles: low nibbles first, then high nibbles (the 32-value blocks' order).
inline v256 nibbles16(const uint8_t* p) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(a, 4), a), _mm256_set1_epi8(0xf));
}
inline v256 shr_mask(v256 v, int s, int mask) {  // per byte (v >> s) & mask, mask <= 0xff >> s
  return _mm256_and_si256(_mm256_srli_epi16(v, s), _mm256_set1_epi8(char(mask)));
}
inline v256 or256(v256 a, v256 b) { return _mm256_or_si256(a, b); }
inline v256 shl4(v256 v) { return _mm256_slli_epi16(v, 4); }  // callers keep each byte < 16
// 32 bits -> 32 bytes, 0x10 where the bit is set (Q5's fifth bit).
inline v256 bits_to_0x10(uint32_t bits) {
  const v256 bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(int(bits)),
                                         _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                           0x0101010101010101, 0x0000000000000000));
  const v256 pat = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, pat), pat), _mm256_set1_epi8(0x10));
}
// s8 x s8 via |a| (unsigned) x sign-applied b.
inline v256 abs8(v256 a) { return _mm256_sign_epi8(a, a); }
inline v256 sign8(v256 b, v256 a) { return _mm256_sign_epi8(b, a); }
// 8 lanes, each the sum of 4 consecutive u8 x s8 products.
inline v256 dot4(v256 u, v256 s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
// acc + pair sums of u8 x s8 products (16 int16 lanes) times sc16 (int16 lanes), pairwise: 8 int32 lanes.
inline v256 dot_scaled(v256 acc, v256 u, v256 s, v256 sc16) {
  const v256 p = _mm256_maddubs_epi16(u, s);  // |u| <= 63, |s| <= 127: no int16 saturation
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, p, sc16);
#elif defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(acc, p, sc16);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc16));
#endif
}
inline v256 madd16(v256 a, v256 b) { return _mm256_madd_epi16(a, b); }
inline v256 lut16(v256 idx, const uint8_t* table) {  // per byte table[idx & 15], idx < 16
  return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table))), idx);
}
inline v256 set16(int v) { return _mm256_set1_epi16(int16_t(v)); }
inline v256 set16x2(int lo, int hi) { return _mm256_set_m128i(_mm_set1_epi16(int16_t(hi)), _mm_set1_epi16(int16_t(lo))); }
inline v256 widen8to16(const int8_t* p) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline v256 sub32(v256 a, v256 b) { return _mm256_sub_epi32(a, b); }
inline v256 add32(v256 a, v256 b) { return _mm256_add_epi32(a, b); }
inline v256 shl32(v256 a, int s) { return _mm256_slli_epi32(a, s); }
inline f8 tofloat(v256 v) { return (f8)_mm256_cvtepi32_ps(v); }
#else
struct v256 {
  uint8_t b[32];
};
inline v256 ld(const void* p) { v256 v; std::memcpy(v.b, p, 32); return v; }
inline v256 zero256() { return v256{}; }
inline v256 nibbles16(const uint8_t* p) {
  v256 v;
  for (int j = 0; j < 16; ++j) { v.b[j] = p[j] & 0xf; v.b[j + 16] = p[j] >> 4; }
  return v;
}
inline v256 shr_mask(v256 v, int s, int mask) { for (auto& x : v.b) x = uint8_t((x >> s) & mask); return v; }
inline v256 or256(v256 a, v256 b) { for (int j = 0; j < 32; ++j) a.b[j] |= b.b[j]; return a; }
inline v256 shl4(v256 v) { for (auto& x : v.b) x = uint8_t(x << 4); return v; }
inline v256 bits_to_0x10(uint32_t bits) { v256 v; for (int j = 0; j < 32; ++j) v.b[j] = ((bits >> j) & 1) << 4; return v; }
inline v256 abs8(v256 a) { for (auto& x : a.b) x = uint8_t(std::abs(int(int8_t(x)))); return a; }
inline v256 sign8(v256 b, v256 a) {
  for (int j = 0; j < 32; ++j) {
    const int8_t s = int8_t(a.b[j]);
    b.b[j] = s < 0 ? uint8_t(-int8_t(b.b[j])) : s == 0 ? 0 : b.b[j];
  }
  return b;
}
inline int32_t lane32(const v256& v, int i) { int32_t x; std::memcpy(&x, v.b + 4 * i, 4); return x; }
inline int16_t lane16(const v256& v, int i) { int16_t x; std::memcpy(&x, v.b + 2 * i, 2); return x; }
inline v256 from32(const int32_t* x) { v256 v; std::memcpy(v.b, x, 32); return v; }
inline v256 from16(const int16_t* x) { v256 v; std::memcpy(v.b, x, 32); return v; }
inline v256 dot4(v256 u, v256 s) {
  int32_t r[8] = {};
  for (int j = 0; j < 32; ++j) r[j / 4] += int(u.b[j]) * int(int8_t(s.b[j]));
  return from32(r);
}
inline v256 dot_scaled(v256 acc, v256 u, v256 s, v256 sc16) {
  int32_t r[8];
  for (int i = 0; i < 8; ++i) {
    int sum = 0;
    for (int j = 0; j < 2; ++j) {
      const int p = 2 * i + j;
      sum += (int(u.b[2 * p]) * int8_t(s.b[2 * p]) + int(u.b[2 * p + 1]) * int8_t(s.b[2 * p + 1])) * lane16(sc16, p);
    }
    r[i] = lane32(acc, i) + sum;
  }
  return from32(r);
}
inline v256 madd16(v256 a, v256 b) {
  int32_t r[8];
  for (int i = 0; i < 8; ++i) r[i] = lane16(a, 2 * i) * lane16(b, 2 * i) + lane16(a, 2 * i + 1) * lane16(b, 2 * i + 1);
  return from32(r);
}
inline v256 set16(int v) { int16_t x[16]; for (auto& e : x) e = int16_t(v); return from16(x); }
inline v256 lut16(v256 idx, const uint8_t* table) { for (auto& e : idx.b) e = table[e & 15]; return idx; }
inline v256 set16x2(int lo, int hi) { int16_t x[16]; for (int i = 0; i < 16; ++i) x[i] = int16_t(i < 8 ? lo : hi); return from16(x); }
inline v256 widen8to16(const int8_t* p) { int16_t x[16]; for (int i = 0; i < 16; ++i) x[i] = p[i]; return from16(x); }
inline v256 sub32(v256 a, v256 b) { int32_t r[8]; for (int i = 0; i < 8; ++i) r[i] = lane32(a, i) - lane32(b, i); return from32(r); }
inline v256 add32(v256 a, v256 b) { int32_t r[8]; for (int i = 0; i < 8; ++i) r[i] = lane32(a, i) + lane32(b, i); return from32(r); }
inline v256 shl32(v256 a, int s) { int32_t r[8]; for (int i = 0; i < 8; ++i) r[i] = lane32(a, i) << s; return from32(r); }
inline f8 tofloat(v256 v) { i32x8 x; std::memcpy(&x, v.b, 32); return __builtin_convertvector(x, f8); }
#endif

inline float hsum8(f8 v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }

// Quantized activations. Per 32 values (the 32-value block types): int8 values, scale d and d * sum(q).
// Per 256 (K-quants): int8 values, scale d, and int16 sums of each 16 values.
struct Act {
  std::vector<int8_t> q;      // [M][K]
  std::vector<float> d, s;    // [M][K / QA]
  std::vector<int16_t> bsum;  // [M][K / 16] (K-quants)
  int64_t K, nb;
};

inline int nearest(float v) { return int(v + (v >= 0 ? 0.5f : -0.5f)); }  // ties away from zero, as roundf

Act quantize_act(const float* x, int64_t M, int64_t K, int qa, bool want_bsums, int num_threads) {
  Act a;
  a.K = K;
  a.nb = K / qa;
  a.q.resize(M * K);
  a.d.resize(M * a.nb);
  a.s.resize(M * a.nb);
  if (want_bsums) a.bsum.resize(M * (K / 16));
  const int64_t total = M * a.nb;
#pragma omp parallel for num_threads(kc_threads(num_threads)) schedule(static) if (total * qa > 65536)
  for (int64_t i = 0; i < total; ++i) {
    const float* v = x + i * qa;  // block i of the [M, K] contiguous rows (qa divides K)
    float amax = 0;
    for (int j = 0; j < qa; ++j) amax = std::max(amax, std::abs(v[j]));
    const float d = amax / 127.0f, id = d != 0 ? 127.0f / amax : 0.0f;
    int8_t* q = a.q.data() + i * qa;
    int sum = 0;
    for (int j = 0; j < qa; ++j) {
      const int t = std::min(127, std::max(-127, nearest(v[j] * id)));
      q[j] = int8_t(t);
      sum += t;
    }
    a.d[i] = d;
    a.s[i] = d * float(sum);
    if (want_bsums) {
      for (int j = 0; j < qa / 16; ++j) {
        int bs = 0;
        for (int l = 0; l < 16; ++l) bs += q[j * 16 + l];
        a.bsum[i * (qa / 16) + j] = int16_t(bs);
      }
    }
  }
  return a;
}

// One 32-value weight block as 32 bytes for the u8 x s8 dot product: `u` unsigned values (offset folded into
// `c`, which multiplies the activation block's d * sum(q)), or for Q8_0 / IQ4_NL signed values (SIGNED below).
struct Blk32 {
  v256 u;
  float d, c;
};
template <int T> inline Blk32 unpack32(const uint8_t* b);
template <> inline Blk32 unpack32<Q4_0>(const uint8_t* b) { const float d = fp16(b); return {nibbles16(b + 2), d, -8 * d}; }
template <> inline Blk32 unpack32<Q4_1>(const uint8_t* b) { return {nibbles16(b + 4), fp16(b), fp16(b + 2)}; }
template <> inline Blk32 unpack32<Q5_0>(const uint8_t* b) {
  const float d = fp16(b);
  return {or256(nibbles16(b + 6), bits_to_0x10(load32(b + 2))), d, -16 * d};
}
template <> inline Blk32 unpack32<Q5_1>(const uint8_t* b) {
  return {or256(nibbles16(b + 8), bits_to_0x10(load32(b + 4))), fp16(b), fp16(b + 2)};
}
template <> inline Blk32 unpack32<Q8_0>(const uint8_t* b) { return {ld(b + 2), fp16(b), 0.0f}; }
// kvalues_iq4nl + 128 as unsigned bytes (the AVX-512 path: vpdpbusd does not saturate; CM = -128 takes it off)
constexpr uint8_t KVALUES_IQ4_U8[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};
// IQ4_NL as signed bytes like Q8_0 (|u| x s via sign8): vpmaddubsw's int16 pair sums would saturate on u + 128.
template <> inline Blk32 unpack32<IQ4_NL>(const uint8_t* b) {
  return {lut16(nibbles16(b + 2), reinterpret_cast<const uint8_t*>(KVALUES_IQ4)), fp16(b), 0.0f};
}

template <int T, int MR>
void int_row32(const uint8_t* row, const Act& a, int64_t m0, float* out, float* cbuf) {
  constexpr int BS = Traits<T>::BS;
  f8 acc[2][MR] = {};  // two chains: even and odd blocks (the FMA latency, not its throughput, at one row)
  const int64_t nb = a.nb;
  for (int64_t b = 0; b < nb; ++b) {
    const Blk32 w = unpack32<T>(row + b * BS);
    cbuf[b] = w.c;
    constexpr bool SIGNED = T == Q8_0 || T == IQ4_NL;
    const v256 wu = SIGNED ? abs8(w.u) : w.u;
    for (int m = 0; m < MR; ++m) {
      const int64_t i = (m0 + m) * nb + b;
      v256 xs = ld(a.q.data() + i * 32);
      if (SIGNED) xs = sign8(xs, w.u);
      const float scale = w.d * a.d[i];
      acc[b & 1][m] += tofloat(dot4(wu, xs)) * scale;
    }
  }
  for (int m = 0; m < MR; ++m) {
    float c = 0;
    if (T != Q8_0 && T != IQ4_NL) {
      const float* s = a.s.data() + (m0 + m) * nb;
      for (int64_t b = 0; b < nb; ++b) c += cbuf[b] * s[b];
    }
    out[m] = hsum8(acc[0][m] + acc[1][m]) + c;
  }
}

template <int T, int MR>
void int_rowK(const uint8_t* row, const Act& a, int64_t m0, float* out);

// Q4_K, and Q5_K (FIVE: each quant's fifth bit from the 32 bytes of qh, bit j for 32-value group j).
template <int MR, bool FIVE = false>
void int_rowQ4K(const uint8_t* row, const Act& a, int64_t m0, float* out) {
  f8 acc[MR] = {};
  const int64_t nb = a.nb;
  constexpr int BS = FIVE ? 176 : 144, QS = FIVE ? 48 : 16;
  for (int64_t sb = 0; sb < nb; ++sb) {
    const uint8_t* b = row + sb * BS;
    const float d = fp16(b), dmin = fp16(b + 2);
    uint8_t sc[8], mn[8];
    scale_min_k4(b + 4, sc, mn);
    int16_t mins16[16];
    for (int i = 0; i < 16; ++i) mins16[i] = mn[i / 2];  // one min per 32 values = two 16-value sums
    v256 mv;
    std::memcpy(&mv, mins16, 32);
    v256 u[8];
    for (int c = 0; c < 4; ++c) {
      const v256 q = ld(b + QS + c * 32);
      u[2 * c] = shr_mask(q, 0, 0xf);
      u[2 * c + 1] = shr_mask(q, 4, 0xf);
      if constexpr (FIVE) {  // values <= 31: maddubs' pair sums stay within int16
        const v256 qh = ld(b + 16);
        u[2 * c] = or256(u[2 * c], shl4(shr_mask(qh, 2 * c, 1)));
        u[2 * c + 1] = or256(u[2 * c + 1], shl4(shr_mask(qh, 2 * c + 1, 1)));
      }
    }
    for (int m = 0; m < MR; ++m) {
      const int64_t i = (m0 + m) * nb + sb;
      const int8_t* xq = a.q.data() + i * 256;
      v256 isum = zero256();
      for (int j = 0; j < 8; ++j) isum = dot_scaled(isum, u[j], ld(xq + j * 32), set16(sc[j]));
      const v256 imin = madd16(mv, ld(a.bsum.data() + i * 16));
      acc[m] += tofloat(isum) * (d * a.d[i]) - tofloat(imin) * (dmin * a.d[i]);
    }
  }
  for (int m = 0; m < MR; ++m) out[m] = hsum8(acc[m]);
}

template <int MR>
void int_rowQ6K(const uint8_t* row, const Act& a, int64_t m0, float* out) {
  f8 acc[MR] = {};
  const int64_t nb = a.nb;
  for (int64_t sb = 0; sb < nb; ++sb) {
    const uint8_t* b = row + sb * 210;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = fp16(b + 208);
    v256 u[8];
    for (int h = 0; h < 2; ++h) {  // values g*32 + l: ql/qh bits as in dequant_block<Q6_K>
      const v256 l0 = ld(b + h * 64), l1 = ld(b + h * 64 + 32), hh = ld(b + 128 + h * 32);
      u[h * 4 + 0] = or256(shr_mask(l0, 0, 0xf), shl4(shr_mask(hh, 0, 3)));
      u[h * 4 + 1] = or256(shr_mask(l1, 0, 0xf), shl4(shr_mask(hh, 2, 3)));
      u[h * 4 + 2] = or256(shr_mask(l0, 4, 0xf), shl4(shr_mask(hh, 4, 3)));
      u[h * 4 + 3] = or256(shr_mask(l1, 4, 0xf), shl4(shr_mask(hh, 6, 3)));
    }
    const v256 sc16 = widen8to16(sc);
    for (int m = 0; m < MR; ++m) {
      const int64_t i = (m0 + m) * nb + sb;
      const int8_t* xq = a.q.data() + i * 256;
      v256 isum = zero256();
      for (int j = 0; j < 8; ++j) isum = dot_scaled(isum, u[j], ld(xq + j * 32), set16x2(sc[2 * j], sc[2 * j + 1]));
      // the -32 offset: 32 * sum over 16-value groups of scale * sum(x)
      isum = sub32(isum, shl32(madd16(sc16, ld(a.bsum.data() + i * 16)), 5));
      acc[m] += tofloat(isum) * (d * a.d[i]);
    }
  }
  for (int m = 0; m < MR; ++m) out[m] = hsum8(acc[m]);
}

template <int T, int MR>
inline void int_row(const uint8_t* row, const Act& a, int64_t m0, float* out, float* cbuf) {
  if constexpr (T == Q4_K) {
    int_rowQ4K<MR>(row, a, m0, out);
  } else if constexpr (T == Q5_K) {
    int_rowQ4K<MR, true>(row, a, m0, out);
  } else if constexpr (T == Q6_K) {
    int_rowQ6K<MR>(row, a, m0, out);
  } else {
    int_row32<T, MR>(row, a, m0, out, cbuf);
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define KC_INT512 1
// ---------------------------------------------------------------------------------------------------------------
// AVX-512 VNNI integer path for the 32-value block types: two blocks (a "pair") per 512-bit vpdpbusd.
//
// Every weight block becomes 32 unsigned bytes u: Q4_0 / Q5_0 their quants (the weight is d * (u - 8) or
// d * (u - 16)), Q8_0 and IQ4_NL their signed values + 128 (d * (u - 128)), Q4_1 / Q5_1 their quants (d * u + m).
// For activations x = da * q (q int8, one da per 32 values, ggml's Q8_0 scheme) a block's dot product is then
//   d * da * (sum(u q) + CM * sum(q))   (CM = -8, -16, -128)   or   d * da * sum(u q) + m * da * sum(q),
// all integer but the last multiplies. The activations are quantized once per call, pair by pair, into
//   q: 64 bytes in the order the weight's pair unpacks to: for the nibble types [block 0 values 0-15, block 1
//      values 0-15, block 0 16-31, block 1 16-31] (16 bytes of nibbles, once as they are, once shifted by 4),
//      for Q8_0 the plain order;
//   da: the 16 int32 lanes' da (each lane of the vpdpbusd sums 4 bytes of one block);
//   ex: CM * (each lane's sum of q), int32, the start value of the lane's vpdpbusd; for Q4_1 / Q5_1 instead
//       da * (each lane's sum of q) as float32, the factor of the lane's m.
// A weight pair is one masked 64-byte load (never past the pair's bytes) and word permutes (vpermw) that put
// its quants, and its d (and m) as each lane's scale, where the lanes want them. Per pair and activation row:
// one vpdpbusd, one int -> float conversion and two FMA-unit operations (d * da, then the accumulation). NR
// weight rows are done together (the activation loads and the final lane sums shared); an odd last block is
// paired with zero activations.

template <int T> struct Pack512;
template <> struct Pack512<Q4_0> { static constexpr bool NIB = true, MIN = false; static constexpr int CM = -8; };
template <> struct Pack512<Q4_1> { static constexpr bool NIB = true, MIN = true; static constexpr int CM = 0; };
template <> struct Pack512<Q5_0> { static constexpr bool NIB = true, MIN = false; static constexpr int CM = -16; };
template <> struct Pack512<Q5_1> { static constexpr bool NIB = true, MIN = true; static constexpr int CM = 0; };
template <> struct Pack512<Q8_0> { static constexpr bool NIB = false, MIN = false; static constexpr int CM = -128; };
template <> struct Pack512<IQ4_NL> { static constexpr bool NIB = true, MIN = false; static constexpr int CM = -128; };

// Byte offset of the quants (nibbles or int8) and of Q5's 32 high bits in a block.
template <int T> constexpr int qs_offset() { return T == Q4_0 || T == IQ4_NL ? 2 : T == Q4_1 ? 4 : T == Q5_0 ? 6 : T == Q5_1 ? 8 : 2; }
template <int T> constexpr int qh_offset() { return T == Q5_0 ? 2 : 4; }

// The lanes of a pair's vpdpbusd that belong to its second block.
constexpr __mmask16 second_block_lanes(bool nib) { return nib ? 0xF0F0 : 0xFF00; }

// vpermw word indices into a pair's bytes (every field of these blocks sits at an even offset): q, the nibble
// types' quants as [qs0, qs1, qs0, qs1]; d, words 0-15 each lane's block's d, words 16-31 its m.
struct PairWords {
  alignas(64) int16_t q[32];
  alignas(64) int16_t d[32];
  PairWords(int bs, int qs, bool nib) {
    for (int j = 0; j < 32; ++j) q[j] = int16_t(((j / 8) % 2) * bs / 2 + qs / 2 + j % 8);
    for (int l = 0; l < 16; ++l) {
      const int block = nib ? (l / 4) % 2 : l / 8;
      d[l] = int16_t(block * bs / 2);
      d[16 + l] = int16_t(block * bs / 2 + 1);
    }
  }
};

// One weight pair: u bytes, each lane's d (and m).
struct WPair {
  __m512i w;
  __m512 d, m;
};

// `end`: the end of the weight's last row. A pair is read with a plain 64-byte load where that stays inside the
// weight (bytes past the pair are ignored), else with a masked one that reads the pair's bytes only. (Masked
// loads alone ran 2x slower from memory on Zen 5: they do not train the hardware prefetchers.) A lone last block
// is always read masked, so that its missing partner's d and m are zero.
template <int T>
inline WPair unpack_pair(const uint8_t* b0, bool two, const uint8_t* end, const PairWords& pw) {
  constexpr int BS = Traits<T>::BS, QS = qs_offset<T>();
  WPair r;
  if constexpr (T == Q8_0) {
    const uint8_t* b1 = two ? b0 + BS : b0;  // a lone block meets zero activations in the second half
    const __m512i w = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + QS))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1 + QS)), 1);
    r.w = _mm512_xor_si512(w, _mm512_set1_epi8(char(0x80)));  // q + 128 as an unsigned byte
    const __m512i v = two && b0 + 64 <= end ? _mm512_loadu_si512(b0)
                                            : _mm512_maskz_loadu_epi8(two ? __mmask64(3) | __mmask64(3) << BS : 3, b0);
    r.d = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(_mm512_load_si512(pw.d), v)));
    r.m = _mm512_setzero_ps();
  } else {
    const __m512i v = two && b0 + 64 <= end ? _mm512_loadu_si512(b0)
                                            : _mm512_maskz_loadu_epi8((__mmask64(1) << ((two ? 2 : 1) * BS)) - 1, b0);
    const __m512i q = _mm512_permutexvar_epi16(_mm512_load_si512(pw.q), v);
    __m512i w = _mm512_and_si512(_mm512_mask_srli_epi16(q, __mmask32(0xffff0000u), q, 4), _mm512_set1_epi8(0x0f));
    if constexpr (T == Q5_0 || T == Q5_1) {  // the fifth bit: qh bit j of block i -> byte j % 16 + 16 i + 32 (j / 16)
      const uint64_t h0 = load32(b0 + qh_offset<T>()), h1 = two ? load32(b0 + BS + qh_offset<T>()) : 0;
      const __mmask64 k = (h0 & 0xffff) | (h1 & 0xffff) << 16 | (h0 >> 16) << 32 | (h1 >> 16) << 48;
      w = _mm512_mask_add_epi8(w, k, w, _mm512_set1_epi8(0x10));
    }
    if constexpr (T == IQ4_NL) {
      const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(KVALUES_IQ4_U8)));
      w = _mm512_shuffle_epi8(table, w);  // kvalues_iq4nl + 128
    }
    r.w = w;
    const __m512i dm = _mm512_permutexvar_epi16(_mm512_load_si512(pw.d), v);
    r.d = _mm512_cvtph_ps(_mm512_castsi512_si256(dm));
    r.m = Pack512<T>::MIN ? _mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm, 1)) : _mm512_setzero_ps();
  }
  return r;
}

// Quantized activations: per row and pair, 3 x 64 bytes (q, da, ex; see above).
struct Act512 {
  struct alignas(64) Line { int8_t b[64]; };
  std::vector<Line> lines;  // [M][pairs][3]
  int64_t pairs;
  const Line* at(int64_t m, int64_t p) const { return lines.data() + (m * pairs + p) * 3; }
};

template <int T>
Act512 quantize_act512(const float* x, int64_t M, int64_t K, int num_threads) {
  constexpr bool NIB = Pack512<T>::NIB;
  Act512 a;
  const int64_t nb = K / 32;
  a.pairs = (nb + 1) / 2;
  a.lines.resize(M * a.pairs * 3);
  const int64_t total = M * a.pairs;
#pragma omp parallel for num_threads(kc_threads(num_threads)) schedule(static) if (total > 1024)
  for (int64_t i = 0; i < total; ++i) {
    const int64_t m = i / a.pairs, p = i % a.pairs;
    int8_t* q = a.lines[i * 3].b;
    float da[2] = {0.0f, 0.0f};
    for (int h = 0; h < 2; ++h) {
      const int64_t b = 2 * p + h;
      // nibble layout: values 0-15 of the pair's first block at 0, second at 16; values 16-31 at 32 / 48
      const int lo = NIB ? h * 16 : h * 32, hi = NIB ? lo + 32 : lo + 16;
      if (b >= nb) {
        std::memset(q + lo, 0, 16);
        std::memset(q + hi, 0, 16);
        continue;
      }
      const float* v = x + m * K + b * 32;
      const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      const float d = amax / 127.0f, id = d != 0 ? 127.0f / amax : 0.0f;
      // round to nearest even (as ggml's AVX quantize_row_q8_0); |v * id| <= 127
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + lo), _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + hi), _mm512_cvtsepi32_epi8(q1));
      da[h] = d;
    }
    const __m512i sum4 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), _mm512_load_si512(q));
    const __m512 dav = _mm512_mask_blend_ps(second_block_lanes(NIB), _mm512_set1_ps(da[0]), _mm512_set1_ps(da[1]));
    _mm512_store_ps(a.lines[i * 3 + 1].b, dav);
    if constexpr (Pack512<T>::MIN) {
      _mm512_store_ps(a.lines[i * 3 + 2].b, _mm512_mul_ps(dav, _mm512_cvtepi32_ps(sum4)));
    } else {
      _mm512_store_si512(a.lines[i * 3 + 2].b, _mm512_mullo_epi32(sum4, _mm512_set1_epi32(Pack512<T>::CM)));
    }
  }
  return a;
}

// The lane sums of 4 vectors.
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));  // a b a b per 128 bits
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512d abd = _mm512_castps_pd(ab), cdd = _mm512_castps_pd(cd);
  const __m512 sum = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(abd, cdd)),
                                   _mm512_castpd_ps(_mm512_unpackhi_pd(abd, cdd)));  // a b c d per 128 bits
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(sum),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sum), 1)));  // (no DQ)
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// out[r * MR + m] = weight row r (of NR) . activation row m0 + m (of MR). BUF: the rows' pairs were unpacked
// into wb[r] (3 lines per pair: w, d, m); else they are read from the ggml blocks.
template <int T, int NR, int MR, bool BUF>
inline void int512_tile(const uint8_t* const* rows, const uint8_t* end, const Act512::Line* const* wb, int64_t nb,
                        const Act512& a, int64_t m0, const PairWords& pw, float* out) {
  constexpr int BS = Traits<T>::BS;
  constexpr bool MIN = Pack512<T>::MIN;
  __m512 acc[NR][MR], accm[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = accm[r][m] = _mm512_setzero_ps();
  for (int64_t p = 0; p < a.pairs; ++p) {
    __m512i xv[MR], ex[MR];
    __m512 dav[MR];
    for (int m = 0; m < MR; ++m) {
      const Act512::Line* l = a.at(m0 + m, p);
      xv[m] = _mm512_load_si512(l[0].b);
      dav[m] = _mm512_load_ps(l[1].b);
      ex[m] = _mm512_load_si512(l[2].b);
    }
    for (int r = 0; r < NR; ++r) {
      WPair w;
      if constexpr (BUF) {
        const Act512::Line* l = wb[r] + p * 3;
        w.w = _mm512_load_si512(l[0].b);
        w.d = _mm512_load_ps(l[1].b);
        w.m = MIN ? _mm512_load_ps(l[2].b) : _mm512_setzero_ps();
      } else {
        prefetch(rows[r] + 2 * p * BS);
        w = unpack_pair<T>(rows[r] + 2 * p * BS, 2 * p + 1 < nb, end, pw);
      }
      for (int m = 0; m < MR; ++m) {
        const __m512i dot = _mm512_dpbusd_epi32(MIN ? _mm512_setzero_si512() : ex[m], w.w, xv[m]);
        acc[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(w.d, dav[m]), acc[r][m]);
        if constexpr (MIN) accm[r][m] = _mm512_fmadd_ps(w.m, _mm512_castsi512_ps(ex[m]), accm[r][m]);
      }
    }
  }
  __m512 sums[NR * MR];
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) sums[r * MR + m] = MIN ? _mm512_add_ps(acc[r][m], accm[r][m]) : acc[r][m];
  int i = 0;
  for (; i + 4 <= NR * MR; i += 4) _mm_storeu_ps(out + i, reduce4(sums[i], sums[i + 1], sums[i + 2], sums[i + 3]));
  for (; i < NR * MR; ++i) out[i] = _mm512_reduce_add_ps(sums[i]);
}

// NR weight rows at a time per thread: 4 for up to 2 activation rows, else 2. Up to 4 activation rows: one
// pass straight over the blocks; more: the NR rows unpacked once into L1 buffers, then walked by groups of up
// to 4 activation rows.
template <int T, int NR>
void int512_run(const Act512& a, int64_t M, int64_t nb, const uint8_t* raw, int64_t raw_stride, int64_t N,
                const float* bias, int y_code, void* y, int num_threads) {
  constexpr int BS = Traits<T>::BS;
  static const PairWords pw(BS, qs_offset<T>(), Pack512<T>::NIB);
  const int64_t groups = (N + NR - 1) / NR;
  const uint8_t* end = raw + (N - 1) * raw_stride + nb * BS;
#pragma omp parallel num_threads(kc_threads(num_threads))
  {
    std::vector<Act512::Line> buf(M > 4 ? NR * a.pairs * 3 : 0);
    const Act512::Line* wb[NR] = {};
    for (int r = 0; r < NR && M > 4; ++r) wb[r] = buf.data() + r * a.pairs * 3;
    alignas(64) float out[NR * 4];
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t n0 = g * NR;
      const int nr = int(std::min<int64_t>(NR, N - n0));
      const uint8_t* rows[NR];
      for (int r = 0; r < NR; ++r) rows[r] = raw + (n0 + std::min(r, nr - 1)) * raw_stride;  // a short group repeats its last row
      if (M > 4) {
        for (int r = 0; r < NR; ++r) {
          Act512::Line* l = buf.data() + r * a.pairs * 3;
          for (int64_t p = 0; p < a.pairs; ++p, l += 3) {
            prefetch(rows[r] + 2 * p * BS);
            const WPair w = unpack_pair<T>(rows[r] + 2 * p * BS, 2 * p + 1 < nb, end, pw);
            _mm512_store_si512(l[0].b, w.w);
            _mm512_store_ps(l[1].b, w.d);
            _mm512_store_ps(l[2].b, w.m);
          }
        }
      }
      for (int64_t m0 = 0; m0 < M;) {
        const int mr = int(std::min<int64_t>(4, M - m0));
        if constexpr (NR == 4) {  // M <= 2
          if (mr == 2) int512_tile<T, NR, 2, false>(rows, end, wb, nb, a, m0, pw, out);
          else int512_tile<T, NR, 1, false>(rows, end, wb, nb, a, m0, pw, out);
        } else if (M <= 4) {
          if (mr == 4) int512_tile<T, NR, 4, false>(rows, end, wb, nb, a, m0, pw, out);
          else int512_tile<T, NR, 3, false>(rows, end, wb, nb, a, m0, pw, out);
        } else {
          switch (mr) {
            case 4: int512_tile<T, NR, 4, true>(rows, end, wb, nb, a, m0, pw, out); break;
            case 3: int512_tile<T, NR, 3, true>(rows, end, wb, nb, a, m0, pw, out); break;
            case 2: int512_tile<T, NR, 2, true>(rows, end, wb, nb, a, m0, pw, out); break;
            default: int512_tile<T, NR, 1, true>(rows, end, wb, nb, a, m0, pw, out); break;
          }
        }
        for (int r = 0; r < nr; ++r) {
          const float b = bias ? bias[n0 + r] : 0.0f;
          for (int m = 0; m < mr; ++m) {
            const int64_t i = (m0 + m) * N + n0 + r;
            if (y_code == 0) static_cast<float*>(y)[i] = out[r * mr + m] + b;
            else static_cast<uint16_t*>(y)[i] = to_bf16(out[r * mr + m] + b);
          }
        }
        m0 += mr;
      }
    }
  }
}

template <int T>
void int512_matmul(const float* x, int64_t M, int64_t K, const uint8_t* raw, int64_t raw_stride, int64_t N,
                   const float* bias, int y_code, void* y, int num_threads) {
  const Act512 a = quantize_act512<T>(x, M, K, num_threads);
  if (M <= 2) int512_run<T, 4>(a, M, K / 32, raw, raw_stride, N, bias, y_code, y, num_threads);
  else int512_run<T, 2>(a, M, K / 32, raw, raw_stride, N, bias, y_code, y, num_threads);
}
#endif

template <int T, typename Y>
void int_matmul_avx2(const float* x, int64_t M, int64_t K, const uint8_t* raw, int64_t raw_stride, int64_t N,
                     const float* bias, Y* y, int num_threads);

template <int T, typename Y>
void int_matmul(const float* x, int64_t M, int64_t K, const uint8_t* raw, int64_t raw_stride, int64_t N,
                const float* bias, Y* y, int num_threads) {
  constexpr int QA = Traits<T>::QK;  // activation block: 32 or 256, as the weight's
#ifdef KC_INT512
  if constexpr (QA == 32) {
    int512_matmul<T>(x, M, K, raw, raw_stride, N, bias, std::is_same_v<Y, float> ? 0 : 1, y, num_threads);
  } else {
    int_matmul_avx2<T, Y>(x, M, K, raw, raw_stride, N, bias, y, num_threads);
  }
#else
  int_matmul_avx2<T, Y>(x, M, K, raw, raw_stride, N, bias, y, num_threads);
#endif
}

// AVX2 (or scalar) integer dot products: one weight row at a time, 32 values per instruction.
template <int T, typename Y>
void int_matmul_avx2(const float* x, int64_t M, int64_t K, const uint8_t* raw, int64_t raw_stride, int64_t N,
                     const float* bias, Y* y, int num_threads) {
  constexpr int QA = Traits<T>::QK;
  const Act a = quantize_act(x, M, K, QA, QA == 256, num_threads);
#pragma omp parallel num_threads(kc_threads(num_threads))
  {
    std::vector<float> cbuf(a.nb);
    float out[8];
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const uint8_t* row = raw + n * raw_stride;
      for (int64_t o = 0; o < a.nb * Traits<T>::BS; o += 64) prefetch(row + o);
      const float b = bias ? bias[n] : 0.0f;
      for (int64_t m0 = 0; m0 < M;) {
        const int64_t left = M - m0;
        const int mr = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
        switch (mr) {
          case 8: int_row<T, 8>(row, a, m0, out, cbuf.data()); break;
          case 4: int_row<T, 4>(row, a, m0, out, cbuf.data()); break;
          case 2: int_row<T, 2>(row, a, m0, out, cbuf.data()); break;
          default: int_row<T, 1>(row, a, m0, out, cbuf.data()); break;
        }
        for (int m = 0; m < mr; ++m) store(y + (m0 + m) * N + n, out[m] + b);
        m0 += mr;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------

template <template <int> class F, typename... A>
int dispatch_all(int type, A&&... args) {
  switch (type) {
    case Q4_0: F<Q4_0>::run(args...); return kc::OK;
    case Q4_1: F<Q4_1>::run(args...); return kc::OK;
    case Q5_0: F<Q5_0>::run(args...); return kc::OK;
    case Q5_1: F<Q5_1>::run(args...); return kc::OK;
    case Q8_0: F<Q8_0>::run(args...); return kc::OK;
    case Q2_K: F<Q2_K>::run(args...); return kc::OK;
    case Q3_K: F<Q3_K>::run(args...); return kc::OK;
    case Q4_K: F<Q4_K>::run(args...); return kc::OK;
    case Q5_K: F<Q5_K>::run(args...); return kc::OK;
    case Q6_K: F<Q6_K>::run(args...); return kc::OK;
    case IQ4_NL: F<IQ4_NL>::run(args...); return kc::OK;
    case IQ4_XS: F<IQ4_XS>::run(args...); return kc::OK;
    default: return kc::BAD_ARGS;
  }
}

int block_values(int type) {
  switch (type) {
    case Q2_K: case Q3_K: case Q4_K: case Q5_K: case Q6_K: case IQ4_XS: return 256;
    case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: case IQ4_NL: return 32;
    default: return 0;
  }
}

bool int_dot_type(int type) {
  return type == Q4_0 || type == Q4_1 || type == Q5_0 || type == Q5_1 || type == Q8_0 || type == IQ4_NL ||
         type == Q4_K || type == Q5_K || type == Q6_K;
}

template <int T> struct Dequant {
  static void run(const uint8_t* raw, int64_t raw_stride, int64_t rows, int64_t cols, int out_code, void* out,
                  int nt) {
    dequantize_rows<T>(raw, raw_stride, rows, cols, out_code, out, nt);
  }
};

template <int T> struct FloatMM {
  static void run(const float* x, int64_t M, int64_t K, const uint8_t* raw, int64_t rs, int64_t N, const float* bias,
                  int y_code, void* y, int nt) {
    if (y_code == kc::F32) float_matmul<T, float>(x, M, K, raw, rs, N, bias, static_cast<float*>(y), nt);
    else float_matmul<T, uint16_t>(x, M, K, raw, rs, N, bias, static_cast<uint16_t*>(y), nt);
  }
};

template <int T> struct IntMM {
  static void run(const float* x, int64_t M, int64_t K, const uint8_t* raw, int64_t rs, int64_t N, const float* bias,
                  int y_code, void* y, int nt) {
    if constexpr (T == Q4_0 || T == Q4_1 || T == Q5_0 || T == Q5_1 || T == Q8_0 || T == IQ4_NL || T == Q4_K ||
                  T == Q5_K || T == Q6_K) {
      if (y_code == kc::F32) int_matmul<T, float>(x, M, K, raw, rs, N, bias, static_cast<float*>(y), nt);
      else int_matmul<T, uint16_t>(x, M, K, raw, rs, N, bias, static_cast<uint16_t*>(y), nt);
    }
  }
};

// Activations as contiguous float32 rows (bfloat16 widened once per call).
const float* float_rows(int x_code, const void* x, int64_t x_stride, int64_t M, int64_t K, std::vector<float>& tmp) {
  if (x_code == kc::F32 && x_stride == K) return static_cast<const float*>(x);
  tmp.resize(M * K);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) {
      tmp[m * K + k] = x_code == kc::F32 ? static_cast<const float*>(x)[m * x_stride + k]
                                         : kc::to_float(static_cast<const uint16_t*>(x)[m * x_stride + k]);
    }
  }
  return tmp.data();
}

int matmul_common(bool int_dot, int type, int x_code, const void* x, int64_t x_stride, const uint8_t* raw,
                  int64_t raw_stride, const float* bias, void* y, int64_t M, int64_t N, int64_t K, int num_threads) {
  const int qk = block_values(type);
  if (qk == 0 || (int_dot && !int_dot_type(type)) || K <= 0 || K % qk != 0 || M <= 0 || N <= 0 || x_stride < K ||
      (x_code != kc::F32 && x_code != kc::BF16))
    return kc::BAD_ARGS;
  std::vector<float> tmp;
  const float* xf = float_rows(x_code, x, x_stride, M, K, tmp);
  num_threads = kc_threads(num_threads);
  return int_dot ? dispatch_all<IntMM>(type, xf, M, K, raw, raw_stride, N, bias, x_code, y, num_threads)
                 : dispatch_all<FloatMM>(type, xf, M, K, raw, raw_stride, N, bias, x_code, y, num_threads);
}

}  // namespace

// Bit 0: the integer dot products use VNNI (vpdpbusd); bit 1: AVX2 (vpmaddubsw); neither: scalar loops.
// Bit 2: the 32-value types' AVX-512 VNNI path.
extern "C" int kc_gguf_features() {
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
  int features = 3;
#elif defined(__AVX2__)
  int features = 2;
#else
  int features = 0;
#endif
#ifdef KC_INT512
  features |= 4;
#endif
  return features;
}

// raw: `rows` rows of ggml blocks, raw_stride bytes apart; cols values per row -> out [rows, cols] contiguous,
// float32 or bfloat16 (out_code: kc::Dtype).
extern "C" int kc_gguf_dequantize(int type, const uint8_t* raw, int64_t raw_stride, int64_t rows, int64_t cols,
                                  int out_code, void* out, int num_threads) {
  const int qk = block_values(type);
  if (qk == 0 || cols % qk != 0 || rows < 0 || (out_code != kc::F32 && out_code != kc::BF16)) return kc::BAD_ARGS;
  return dispatch_all<Dequant>(type, raw, raw_stride, rows, cols, out_code, out, kc_threads(num_threads));
}

// y [M, N] (contiguous, x's dtype) = x [M, K] (rows x_stride elements apart; x_code: kc::Dtype) times the
// [N, K] weight of ggml blocks (rows raw_stride bytes apart) transposed, + bias (float32 [N] or null).
extern "C" int kc_gguf_matmul(int type, int x_code, const void* x, int64_t x_stride, const uint8_t* raw,
                              int64_t raw_stride, const float* bias, void* y, int64_t M, int64_t N, int64_t K,
                              int num_threads) {
  return matmul_common(false, type, x_code, x, x_stride, raw, raw_stride, bias, y, M, N, K, num_threads);
}

extern "C" int kc_gguf_matmul_int(int type, int x_code, const void* x, int64_t x_stride, const uint8_t* raw,
                                  int64_t raw_stride, const float* bias, void* y, int64_t M, int64_t N, int64_t K,
                                  int num_threads) {
  return matmul_common(true, type, x_code, x, x_stride, raw, raw_stride, bias, y, M, N, K, num_threads);
}

KC_PACKED(kc_gguf_dequantize)
KC_PACKED(kc_gguf_matmul)
KC_PACKED(kc_gguf_matmul_int)
