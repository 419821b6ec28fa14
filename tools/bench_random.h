// `dpa bench`'s inputs: approximately normal values drawn from a hash of (seed, element index),
// so that any number of threads fills a tensor with the same values. One xorshift stream per
// tensor on one thread drew about 90 M bf16 elements a second (session 50, on the build
// machine): over 20 s for the 2 G elements of a 256-sequence decode cache, whose row then
// printed nothing within its timeout, and about 2 s for a gpt-oss backward row, time the GPU
// machine spends idle (docs/perf.md, session 50).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

namespace dpa::tools {

// splitmix64's finaliser: a bijection of 64-bit words whose outputs pass as independent.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Element `index`'s draw: the four 16-bit parts of one hash, each a uniform on (0, 1), summed,
// centred and scaled (Irwin-Hall: mean 2, variance 1 / 3), so approximately N(0, 1), within
// [-2 sqrt(3), 2 sqrt(3)].
inline float normal_draw(uint64_t seed, uint64_t index) {
  const uint64_t bits = mix64(mix64(seed) + index);
  float sum = 0.f;
  for (int part = 0; part < 4; ++part)
    sum += (float((bits >> (16 * part)) & 0xFFFFu) + 0.5f) * (1.f / 65536.f);
  return (sum - 2.f) * 1.7320508f;
}

// out[i] = convert(stddev * normal_draw(seed, i)) for i < count, on `threads` threads (at least
// one; the values do not depend on the count).
template <typename T, typename Convert>
void fill_normal(T* out, size_t count, uint64_t seed, float stddev, Convert convert,
                 unsigned threads) {
  auto fill = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) out[i] = convert(stddev * normal_draw(seed, i));
  };
  // Below a million elements a thread's start costs more than it saves.
  const size_t workers = std::min<size_t>(std::max(threads, 1u), count / (1u << 20) + 1);
  if (workers == 1) {
    fill(0, count);
    return;
  }
  // jthreads join when the pool goes, also when a later thread fails to start. `convert` is
  // shared by every thread: a plain function of its argument.
  std::vector<std::jthread> pool;
  const size_t share = (count + workers - 1) / workers;
  for (size_t w = 0; w < workers; ++w)
    pool.emplace_back(fill, std::min(count, w * share), std::min(count, (w + 1) * share));
}

}  // namespace dpa::tools
