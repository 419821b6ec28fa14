// The head-dim pairs cuda_flash has kernels for, as a constexpr list beside the generated X-macro
// (flash_head_dims.h, from DPA_FLASH_HEAD_DIM_PAIRS in src/CMakeLists.txt): the dispatch expands
// the macro (it needs the dims as template arguments), everything else reads the list.
#pragma once

#include "cuda/flash/flash_head_dims.h"

namespace dpa::cuda {

struct FlashHeadDimPair {
  int qk, v;
};

#define DPA_FLASH_PAIR_ENTRY(QK, V) FlashHeadDimPair{QK, V},
inline constexpr FlashHeadDimPair kFlashHeadDimPairs[] = {
    DPA_FLASH_HEAD_DIM_PAIRS(DPA_FLASH_PAIR_ENTRY)};
#undef DPA_FLASH_PAIR_ENTRY

}  // namespace dpa::cuda
