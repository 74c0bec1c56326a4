// Element-wise loops with numpy broadcasting, for the operators computed in the
// engine's own code (integer and boolean tensors, and float cases oneDNN cannot take).
#pragma once

#include <array>
#include <cstdint>

#include "core/tensor.h"
#include "engine/internal/op_util.h"

namespace shoal::engine::internal {

// Calls fn(out_index, {offset in input 0, offset in input 1, ...}) for every output
// element, where each input broadcasts into `out` with the given strides.
template <size_t N, typename Fn>
void BroadcastLoop(const Shape& out, const std::array<std::vector<int64_t>, N>& strides, Fn&& fn) {
  const int64_t n = Product(out);
  if (n == 0) return;
  const size_t rank = out.size();
  if (rank == 0) {
    std::array<int64_t, N> zero{};
    fn(int64_t{0}, zero);
    return;
  }
  const int64_t inner = out[rank - 1];
  std::array<int64_t, N> inner_stride;
  for (size_t k = 0; k < N; ++k) inner_stride[k] = strides[k][rank - 1];
  std::vector<int64_t> idx(rank, 0);
  std::array<int64_t, N> base{};
  for (int64_t o = 0; o < n; o += inner) {
    std::array<int64_t, N> off = base;
    for (int64_t i = 0; i < inner; ++i) {
      fn(o + i, off);
      for (size_t k = 0; k < N; ++k) off[k] += inner_stride[k];
    }
    for (size_t d = rank - 1; d-- > 0;) {
      if (++idx[d] < out[d]) {
        for (size_t k = 0; k < N; ++k) base[k] += strides[k][d];
        break;
      }
      for (size_t k = 0; k < N; ++k) base[k] -= strides[k][d] * (out[d] - 1);
      idx[d] = 0;
    }
  }
}

}  // namespace shoal::engine::internal
