// What every CPU kernel library of this directory shares. Each is built at first use by
// builtin_plugins/cpu/native.py (whose cache key hashes this header too) and called through ctypes: no torch
// headers, and OpenMP resolves to the libgomp torch loaded. The conventions of an entry point:
//  * tensors arrive as raw pointers with a dtype code (Dtype: float32 or bfloat16, bfloat16 as its uint16_t bits);
//  * the last argument is a thread count, resolved per call by kc_threads;
//  * the result is a Status, checked before anything is written: the Python side raises (ValueError) unless OK.
#pragma once

#include <omp.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>

// A kernel's thread count: n, or for n <= 0 the calling thread's OpenMP setting (torch.set_num_threads, one
// runtime with torch's), read at each call: a recorded decode step then follows a thread count changed after
// it was recorded (the CPU worker follows the cores other processes leave free).
inline int kc_threads(int n) { return n > 0 ? n : omp_get_max_threads(); }

// body(i) for i in [0, n) on `threads` threads: each thread starts on its contiguous static share, from the
// front (one sequential stream of weight rows, which the prefetches follow), and a thread done with its own takes
// what is left of the others' from their backs. With a plain static split a thread the OS preempts (for the
// front end's process, the client, a neighbour) or whose core the host runs slower holds back its whole share
// while the others spin at the loop's end (barrier waits were 10-19% of a decode step on a 2-core VM);
// schedule(dynamic) balanced that but broke the sequential streams (7% slower when idle). Each i runs on one
// thread, so results do not depend on who ran it.
struct alignas(64) KcStealRange {
  std::atomic<uint64_t> front_back;  // front << 32 | back: an owner's take and a thief's in one compare-exchange
};
template <typename Body>
inline void kc_parallel_steal(int64_t n, int threads, Body&& body) {
  if (threads <= 1 || n <= 1 || n >= (int64_t(1) << 32)) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && n > 1)
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  KcStealRange local[8];
  std::unique_ptr<KcStealRange[]> heap(threads > 8 ? new KcStealRange[threads] : nullptr);
  KcStealRange* ranges = heap ? heap.get() : local;
  for (int t = 0; t < threads; ++t)
    ranges[t].front_back.store(uint64_t(n * t / threads) << 32 | uint64_t(n * (t + 1) / threads),
                               std::memory_order_relaxed);
#pragma omp parallel num_threads(threads)
  {
    const int me = omp_get_thread_num();  // (a team smaller than asked: the others take the missing shares)
    for (int k = 0; k < threads; ++k) {
      std::atomic<uint64_t>& fb = ranges[(me + k) % threads].front_back;
      const bool own = k == 0;
      uint64_t v = fb.load(std::memory_order_relaxed);
      for (;;) {
        const uint64_t front = v >> 32, back = v & 0xffffffffu;
        if (front >= back) break;
        const uint64_t next = own ? (front + 1) << 32 | back : front << 32 | (back - 1);
        if (fb.compare_exchange_weak(v, next, std::memory_order_relaxed)) {
          body(int64_t(own ? front : back - 1));
          v = fb.load(std::memory_order_relaxed);
        }
      }
    }
  }
}

namespace kc {

enum Status : int {
  OK = 0,
  BAD_ARGS = -1,      // a shape, dtype or option the kernel does not handle
  OUT_OF_RANGE = -2,  // an index (block table, slot) outside the memory it addresses
};

enum Dtype : int { F32 = 0, BF16 = 1 };  // the Python side's DTYPE_CODES

// The bits of a value as another type of the same size (std::bit_cast before C++20).
template <typename To, typename From>
inline To bit_cast(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast between types of different sizes");
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

// bfloat16 is the high half of a float32: widening is a shift, narrowing rounds to nearest even (as torch does)
// and keeps a NaN a (quiet) NaN.
inline float to_float(float x) { return x; }
inline float to_float(uint16_t x) { return bit_cast<float>(uint32_t(x) << 16); }
inline uint16_t to_bf16(float x) {
  const uint32_t bits = bit_cast<uint32_t>(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
inline void store(float* dst, float x) { *dst = x; }
inline void store(uint16_t* dst, float x) { *dst = to_bf16(x); }

// f(T{}) with T the element type of dtype code `code` (float, or uint16_t for bfloat16): one instantiation per
// dtype instead of an if/else of casts per entry point. Returns f's Status (OK where f returns nothing), or
// BAD_ARGS for an unknown code.
template <typename T, typename F>
inline int call_typed(F& f) {
  if constexpr (std::is_void_v<decltype(f(T{}))>) {
    f(T{});
    return OK;
  } else {
    return f(T{});
  }
}
template <typename F>
inline int with_dtype(int code, F&& f) {
  if (code == F32) return call_typed<float>(f);
  if (code == BF16) return call_typed<uint16_t>(f);
  return BAD_ARGS;
}

// Float vectors of the machine's width: 16 lanes with AVX-512, else 8. (Wider generic vectors than the registers
// made GCC spill every intermediate through the stack.)
#ifdef __AVX512F__
constexpr int VW = 16;
#else
constexpr int VW = 8;
#endif
typedef float fvec __attribute__((vector_size(VW * 4)));

inline fvec loadv(const float* p) {
  fvec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline fvec loadv(const uint16_t* p) {  // VW bfloat16 -> float32: a 16-bit shift
#if defined(__AVX512F__)  // vpmovzxwd + vpslld, as on AVX2 (GCC splits the generic widening into halves)
  return (fvec)_mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
#elif defined(__AVX2__)
  return (fvec)_mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
#else
  typedef uint16_t hvec __attribute__((vector_size(VW * 2)));
  typedef uint32_t uvec __attribute__((vector_size(VW * 4)));
  hvec h;
  std::memcpy(&h, p, sizeof h);
  return (fvec)(__builtin_convertvector(h, uvec) << 16);
#endif
}

}  // namespace kc
