// Division by a divisor fixed at run time and used many times (a key block's query tiles per
// head, once or more per iteration): the quotient by a multiply-high, an add and a shift
// (Granlund and Montgomery's round-up method, as CUTLASS's FastDivmod) instead of the ~20
// instructions of an integer division by a run-time value. Host and device, so that the host
// tests check it.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace dpa::cuda {

// Exact for 0 <= n < 2^31 and 1 <= divisor < 2^31: with s = ceil(log2 divisor) and
// m = floor(2^32 (2^s - divisor) / divisor) + 1 (below 2^32), n / divisor =
// (mulhi(n, m) + n) >> s, and mulhi(n, m) + n < 2n does not overflow 32 bits.
struct FastDivider {
  uint32_t divisor = 1, multiplier = 1, shift = 0;

  FastDivider() = default;
  // `d` must be at least 1 (a caller with a possibly empty count passes max(count, 1)).
  DPA_HOST_DEVICE explicit FastDivider(int d) : divisor(uint32_t(d)) {
    while ((uint64_t(1) << shift) < divisor) ++shift;
    multiplier = uint32_t((uint64_t(1) << 32) * ((uint64_t(1) << shift) - divisor) / divisor + 1);
  }

  DPA_HOST_DEVICE int quotient(int n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t high = __umulhi(uint32_t(n), multiplier);
#else
    const uint32_t high = uint32_t((uint64_t(uint32_t(n)) * multiplier) >> 32);
#endif
    return int((high + uint32_t(n)) >> shift);
  }
};

}  // namespace dpa::cuda
