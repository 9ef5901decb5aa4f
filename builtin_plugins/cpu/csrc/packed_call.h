// A kernel called with its arguments in one array of 64-bit words: a recorded decode step
// (builtin_plugins/cpu/launch.py) replays its launches from C, one ctypes call for a run of them, instead of
// one ctypes call (and its per-argument conversion) each. An integer or pointer is one word; a float is the
// low 32 bits of its word (its bit pattern), a double the whole word. KC_PACKED(name) exports
// `int name_packed(const int64_t* words)`, which unpacks by name's own signature.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kc_common.h"

namespace kc_packed {

template <typename T>
inline T arg(int64_t word) {
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<T>(static_cast<intptr_t>(word));
  } else if constexpr (std::is_same_v<T, float>) {
    return kc::bit_cast<float>(static_cast<uint32_t>(word));
  } else if constexpr (std::is_same_v<T, double>) {
    return kc::bit_cast<double>(word);
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
