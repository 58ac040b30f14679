// Internal: how an element-wise kernel walks a source and a destination tensor together in memory
// order rather than in the logical [b, h, s, d] order, so that it reads and writes whole rows of
// consecutive elements with wide loads and stores and finds a row's start with a few divisions per
// row instead of four per element.
//
// A pair of tensors can be walked so when both have a run of consecutive elements (stride 1) along
// the same axes: the source's axes in its memory order (largest stride first), the innermost ones
// merged while they are contiguous in both tensors, form the row; what is left (at most three axes)
// indexes the rows, each tensor with its own strides. Dense tensors in one axis order (every layout's
// own tensors, and the adapters' outputs allocated like their inputs) are one row; a packed view
// (Q of a [b, s, 3, h, d] buffer) is rows of h * d with gaps between them. Tensors whose innermost
// axes differ (bshd into sbhd) have no common row and take the logical walk.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "fusedattn/tensor.h"

namespace fusedattn::detail {

/// A pair of tensors walked in memory order: `rows` rows of `row` consecutive elements; row r
/// starts at sum over k of (r's k-th digit in `dims`) * strides[k] in each tensor (outermost first).
struct MemoryWalk {
  int outer = 0;  ///< axes that index the rows, 0 to 3
  std::int64_t dims[3] = {1, 1, 1};
  std::int64_t src_strides[3] = {0, 0, 0}, dst_strides[3] = {0, 0, 0};
  std::int64_t row = 0;   ///< consecutive elements in a row
  std::int64_t rows = 0;  ///< product of dims
};

/// The memory-order walk of `src` and `dst` (same dims), or false where they share no row of
/// consecutive elements (the innermost axis of either has a stride other than 1, or the two run along
/// different axes), or where a tensor is empty.
inline bool plan_memory_walk(const TensorDesc& src, const TensorDesc& dst, MemoryWalk& out) {
  if (src.dims != dst.dims || src.elements() <= 0) return false;
  std::array<int, 4> axes{};
  int count = 0;
  for (int axis = 0; axis < 4; ++axis) {
    if (src.dims[axis] > 1) axes[count++] = axis;  // an axis of one element walks nowhere
  }
  if (count == 0) {  // a single element: one row of one
    out = MemoryWalk{};
    out.row = 1;
    out.rows = 1;
    return true;
  }
  // The source's memory order, innermost last; equal strides over two real axes would overlap.
  std::sort(axes.begin(), axes.begin() + count, [&](int a, int b) { return src.strides[a] > src.strides[b]; });
  const int inner = axes[count - 1];
  if (src.strides[inner] != 1 || dst.strides[inner] != 1) return false;
  std::int64_t row = src.dims[inner];
  int next = count - 2;
  while (next >= 0 && src.strides[axes[next]] == row && dst.strides[axes[next]] == row) {
    row *= src.dims[axes[next]];
    --next;
  }
  MemoryWalk walk;
  walk.row = row;
  walk.outer = next + 1;
  walk.rows = 1;
  for (int k = 0; k < walk.outer; ++k) {
    const int axis = axes[k];
    walk.dims[k] = src.dims[axis];
    walk.src_strides[k] = src.strides[axis];
    walk.dst_strides[k] = dst.strides[axis];
    walk.rows *= src.dims[axis];
  }
  out = walk;
  return true;
}

/// Whether every row of `walk` starts on a multiple of `elements` in both tensors (their strides
/// and its length multiples of it): with 16-byte aligned base pointers, each group of `elements`
/// is then one aligned vector in each.
inline bool rows_align_to(const MemoryWalk& walk, std::int64_t elements) {
  if (walk.row % elements != 0) return false;
  for (int k = 0; k < walk.outer; ++k) {
    if (walk.src_strides[k] % elements != 0 || walk.dst_strides[k] % elements != 0) return false;
  }
  return true;
}

}  // namespace fusedattn::detail
