// A kernel called with its arguments in one array of 64-bit words: a recorded decode step
// (builtin_plugins/cpu/graphs.py) replays its launches from C, one ctypes call for a run of them, instead of
// one ctypes call (and its per-argument conversion) each. An integer or pointer is one word; a float is the
// low 32 bits of its word (its bit pattern), a double the whole word. KC_PACKED(name) exports
// `int name_packed(const int64_t* words)`, which unpacks by name's own signature.
#pragma once

#include <omp.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

// A kernel's thread count: n, or for n <= 0 the calling thread's OpenMP setting (torch.set_num_threads, one
// runtime with torch's), read at each call: a recorded decode step then follows a thread count changed after
// it was recorded (the CPU worker follows the cores other processes leave free).
inline int kc_threads(int n) { return n > 0 ? n : omp_get_max_threads(); }

namespace kc_packed {

template <typename T>
inline T arg(int64_t word) {
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<T>(static_cast<intptr_t>(word));
  } else if constexpr (std::is_same_v<T, float>) {
    const uint32_t bits = static_cast<uint32_t>(word);
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
  } else if constexpr (std::is_same_v<T, double>) {
    double value;
    std::memcpy(&value, &word, sizeof value);
    return value;
  } else {
    return static_cast<T>(word);
  }
}

template <typename... A, std::size_t... I>
inline int call(int (*fn)(A...), const int64_t* words, std::index_sequence<I...>) {
  return fn(arg<A>(words[I])...);
}

template <typename... A>
inline int call(int (*fn)(A...), const int64_t* words) {
  return call(fn, words, std::index_sequence_for<A...>{});
}

}  // namespace kc_packed

#define KC_PACKED(name) \
  extern "C" int name##_packed(const int64_t* words) { return kc_packed::call(name, words); }
