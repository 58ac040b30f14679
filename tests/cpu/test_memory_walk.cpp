// CPU tier: the memory-order walk of the FP8 element kernels (src/exec/memory_walk.h, fp8_rows.h),
// worked by hand: which tensor pairs share rows of consecutive elements, how long the rows are, how
// the rows are indexed, and the widest aligned group each takes.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>

#include "exec/fp8_rows.h"
#include "exec/memory_walk.h"
#include "fusedattn/tensor.h"

namespace fusedattn::detail {
namespace {

TensorDesc desc(DType dtype, std::array<std::int64_t, 4> dims, std::array<std::int64_t, 4> strides) {
  TensorDesc out;
  out.dtype = dtype;
  out.dims = dims;
  out.strides = strides;
  return out;
}

// [b, h, s, d] = [2, 16, 1024, 128] as bshd: strides {s*h*d, d, h*d, 1}.
const TensorDesc kBshd = desc(DType::bf16, {2, 16, 1024, 128}, {2097152, 128, 2048, 1});

TEST(MemoryWalk, ADenseTensorInOneOrderIsOneRow) {
  MemoryWalk walk;
  TensorDesc fp8 = kBshd;
  fp8.dtype = DType::e4m3;
  ASSERT_TRUE(plan_memory_walk(kBshd, fp8, walk));
  EXPECT_EQ(walk.outer, 0);
  EXPECT_EQ(walk.rows, 1);
  EXPECT_EQ(walk.row, 2 * 16 * 1024 * 128);
}

TEST(MemoryWalk, APackedViewIsRowsOfHeadsWithTheirOwnStrides) {
  // Q of a [b, s, 3, h, d] buffer into a dense bshd tensor: rows of h * d = 2048, indexed by b and s.
  const TensorDesc q = desc(DType::bf16, {2, 16, 1024, 128}, {3 * 2097152, 128, 3 * 2048, 1});
  TensorDesc dense = kBshd;
  dense.dtype = DType::e4m3;
  MemoryWalk walk;
  ASSERT_TRUE(plan_memory_walk(q, dense, walk));
  EXPECT_EQ(walk.row, 2048);
  EXPECT_EQ(walk.outer, 2);
  EXPECT_EQ(walk.rows, 2 * 1024);
  EXPECT_EQ(walk.dims[0], 2);
  EXPECT_EQ(walk.dims[1], 1024);
  EXPECT_EQ(walk.src_strides[0], 3 * 2097152);
  EXPECT_EQ(walk.src_strides[1], 3 * 2048);
  EXPECT_EQ(walk.dst_strides[0], 2097152);
  EXPECT_EQ(walk.dst_strides[1], 2048);
}

TEST(MemoryWalk, AxesOfOneElementWalkNowhere) {
  // b = 1 and h = 1 with odd strides change nothing: one row of s * d.
  const TensorDesc a = desc(DType::f16, {1, 1, 300, 64}, {999, 7, 64, 1});
  const TensorDesc b = desc(DType::e5m2, {1, 1, 300, 64}, {5, 3, 64, 1});
  MemoryWalk walk;
  ASSERT_TRUE(plan_memory_walk(a, b, walk));
  EXPECT_EQ(walk.outer, 0);
  EXPECT_EQ(walk.row, 300 * 64);
}

TEST(MemoryWalk, DifferentOrdersOrNoUnitStrideShareNoRow) {
  const TensorDesc sbhd = desc(DType::e4m3, {2, 16, 1024, 128}, {2048, 128, 2 * 2048, 1});
  MemoryWalk walk;
  EXPECT_TRUE(plan_memory_walk(kBshd, sbhd, walk));  // both have d then h contiguous: rows of h * d
  EXPECT_EQ(walk.row, 2048);
  const TensorDesc transposed = desc(DType::e4m3, {2, 16, 1024, 128}, {2097152, 1, 2048, 16});  // h fastest
  EXPECT_FALSE(plan_memory_walk(kBshd, transposed, walk));
  const TensorDesc every_other = desc(DType::bf16, {2, 16, 1024, 128}, {4194304, 256, 4096, 2});
  EXPECT_FALSE(plan_memory_walk(every_other, every_other, walk));
  TensorDesc empty = kBshd;
  empty.dims[2] = 0;
  EXPECT_FALSE(plan_memory_walk(empty, empty, walk));
}

TEST(MemoryWalk, GroupsAreTheWidestTheRowsAndPointersAlignTo) {
  alignas(64) static unsigned char memory[256];
  TensorDesc fp8 = kBshd;
  fp8.dtype = DType::e4m3;
  RowJob job;
  EXPECT_EQ(row_width(kBshd, memory, fp8, memory + 64, job), 16);
  EXPECT_EQ(job.groups, 2 * 16 * 1024 * 128 / 16);
  EXPECT_EQ(job.row_groups, job.groups);
  // 360 elements in one row: groups of 8.
  const TensorDesc small = desc(DType::bf16, {1, 3, 5, 24}, {360, 120, 24, 1});
  TensorDesc small_fp8 = small;
  small_fp8.dtype = DType::e4m3;
  EXPECT_EQ(row_width(small, memory, small_fp8, memory + 64, job), 8);
  EXPECT_EQ(job.groups, 45);
  // A 16-bit source 2 bytes off: no group fits; an FP8 destination 8 bytes off: groups of 8.
  EXPECT_EQ(row_width(kBshd, memory + 2, fp8, memory + 64, job), 0);
  EXPECT_EQ(row_width(kBshd, memory, fp8, memory + 72, job), 8);
  // An amax pass has no destination pointer.
  EXPECT_EQ(row_width(kBshd, memory, kBshd, nullptr, job), 16);
}

}  // namespace
}  // namespace fusedattn::detail
