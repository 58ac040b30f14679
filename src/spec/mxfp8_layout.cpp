// MXFP8 scales on the host: the E8M0 codec, the block scale rule, the scale tensor's shape and its
// 128x4 swizzle (the rules themselves live in spec/mxfp8_rule.h, shared with the device kernels).
#include "fusedattn/mxfp8.h"

#include <cmath>
#include <limits>
#include <string>

#include "fusedattn/errors.h"
#include "spec/mxfp8_rule.h"

namespace fusedattn {
namespace {

std::int64_t round_up(std::int64_t value, std::int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

void require_size(const char* field, std::size_t seen, std::int64_t expected) {
  if (static_cast<std::int64_t>(seen) != expected) {
    throw InvalidArgument(field, std::to_string(seen) + " bytes", std::to_string(expected) + " bytes");
  }
}

void require_counts(std::int64_t rows, std::int64_t blocks) {
  if (rows < 0) throw InvalidArgument("rows", std::to_string(rows), ">= 0");
  if (blocks < 0) throw InvalidArgument("blocks", std::to_string(blocks), ">= 0");
}

}  // namespace

float e8m0_bits_to_float(std::uint8_t bits) noexcept {
  if (bits == detail::kE8M0Nan) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(bits) - detail::kE8M0Bias);
}

std::uint8_t float_to_e8m0_bits(float value) noexcept {
  if (std::isnan(value) || value < 0.0f || value == std::numeric_limits<float>::infinity()) return detail::kE8M0Nan;
  if (value < std::ldexp(1.0f, -detail::kE8M0Bias)) return 0;  // zero too: E8M0 has none
  int frexp_exponent = 0;
  (void)std::frexp(value, &frexp_exponent);
  const int exponent = frexp_exponent - 1;  // floor(log2 value), in [-127, 127]: at most 0xFE
  return static_cast<std::uint8_t>(exponent + detail::kE8M0Bias);
}

std::uint8_t mxfp8_scale_bits(float amax, DType element) {
  if (!is_fp8(element)) {
    throw InvalidArgument("element", to_string(element), "e4m3 or e5m2 (the element types of MXFP8)");
  }
  return detail::mx_scale_bits_rule(amax, mxfp8_element_emax(element));
}

Mxfp8ScaleShape mxfp8_scale_shape(const std::array<std::int64_t, 4>& dims, Axis blocked) {
  if (blocked != kDim && blocked != kSeq) {
    throw InvalidArgument("blocked", std::to_string(static_cast<int>(blocked)),
                          "kDim (3) or kSeq (2): MXFP8 blocks run along d or along s");
  }
  for (int axis = 0; axis < 4; ++axis) {
    if (dims[axis] < 0) throw InvalidArgument("dims[" + std::to_string(axis) + "]", std::to_string(dims[axis]), ">= 0");
  }
  Mxfp8ScaleShape shape;
  shape.blocked = blocked;
  shape.batch = dims[kBatch];
  shape.heads = dims[kHead];
  shape.rows = blocked == kDim ? dims[kSeq] : dims[kDim];
  shape.blocks = (dims[blocked] + kMxfp8BlockSize - 1) / kMxfp8BlockSize;
  shape.padded_rows = round_up(shape.rows, detail::kSwizzleRows);
  shape.padded_blocks = round_up(shape.blocks, detail::kSwizzleBlocks);
  return shape;
}

std::int64_t mxfp8_swizzled_offset(std::int64_t row, std::int64_t block, std::int64_t padded_blocks) noexcept {
  return detail::mx_swizzled_offset_rule(row, block, padded_blocks);
}

std::vector<std::uint8_t> mxfp8_swizzle_scales(const std::vector<std::uint8_t>& plain, std::int64_t rows,
                                               std::int64_t blocks) {
  require_counts(rows, blocks);
  require_size("plain", plain.size(), rows * blocks);
  const std::int64_t padded_blocks = round_up(blocks, detail::kSwizzleBlocks);
  std::vector<std::uint8_t> swizzled(static_cast<std::size_t>(round_up(rows, detail::kSwizzleRows) * padded_blocks), 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < blocks; ++j) {
      swizzled[static_cast<std::size_t>(detail::mx_swizzled_offset_rule(r, j, padded_blocks))] =
          plain[static_cast<std::size_t>(r * blocks + j)];
    }
  }
  return swizzled;
}

std::vector<std::uint8_t> mxfp8_unswizzle_scales(const std::vector<std::uint8_t>& swizzled, std::int64_t rows,
                                                 std::int64_t blocks) {
  require_counts(rows, blocks);
  const std::int64_t padded_blocks = round_up(blocks, detail::kSwizzleBlocks);
  require_size("swizzled", swizzled.size(), round_up(rows, detail::kSwizzleRows) * padded_blocks);
  std::vector<std::uint8_t> plain(static_cast<std::size_t>(rows * blocks));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < blocks; ++j) {
      plain[static_cast<std::size_t>(r * blocks + j)] =
          swizzled[static_cast<std::size_t>(detail::mx_swizzled_offset_rule(r, j, padded_blocks))];
    }
  }
  return plain;
}

}  // namespace fusedattn
