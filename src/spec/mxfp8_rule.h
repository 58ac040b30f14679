// The MXFP8 rules that host and device must apply identically: a block's E8M0 scale from its amax,
// the power-of-two factors that scale and descale with it, and the 128x4 swizzle of the scales.
// One definition for fusedattn/mxfp8.h's host functions and src/exec/mxfp8_quantize.cu, so the
// device quantizer and the host reference cannot disagree (see fusedattn/mxfp8.h for the why).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#ifndef FUSEDATTN_HOST_DEVICE
#if defined(__CUDACC__)
#define FUSEDATTN_HOST_DEVICE __host__ __device__
#else
#define FUSEDATTN_HOST_DEVICE
#endif
#endif

namespace fusedattn::detail {

constexpr int kMxBlock = 32;              // elements that share one scale
constexpr std::uint8_t kE8M0Nan = 0xff;   // E8M0's only special value
constexpr int kE8M0Bias = 127;
constexpr int kSwizzleRows = 128;         // rows of one 512-byte tile of the 128x4 layout
constexpr int kSwizzleBlocks = 4;         // scales (blocks) per row of a tile

/// The OCP MX rule: 2^(floor(log2 amax) - emax_elem), as E8M0 bits; amax = max |x| over the block.
/// NaN or infinity gives the NaN scale; an exponent below E8M0's -127 (amax 0 included) is raised
/// to -127. floor(log2 amax) is frexp's exponent minus one, exact for float subnormals too.
FUSEDATTN_HOST_DEVICE inline std::uint8_t mx_scale_bits_rule(float amax, int emax_elem) {
  if (amax != amax || amax > 3.40282347e38f) return kE8M0Nan;
  if (!(amax > 0.0f)) return 0;
  int frexp_exponent = 0;
  (void)frexpf(amax, &frexp_exponent);
  int exponent = frexp_exponent - 1 - emax_elem;
  if (exponent < -kE8M0Bias) exponent = -kE8M0Bias;
  if (exponent > kE8M0Bias) return kE8M0Nan;  // unreachable from a finite float with emax_elem >= 8
  return static_cast<std::uint8_t>(exponent + kE8M0Bias);
}

/// 1 / scale for scale bits 0..253: 2^(127 - bits), a normal float (2^127 .. 2^-126), so that
/// x * inverse is exact wherever the FP8 rounding can see it. The rule above yields at most
/// 127 + 119 = 246 (amax < 2^128, emax_elem >= 8).
FUSEDATTN_HOST_DEVICE inline float mx_inverse_scale(std::uint8_t bits) {
  const std::uint32_t float_bits = static_cast<std::uint32_t>(254 - bits) << 23;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(float_bits);
#else
  float value;
  std::memcpy(&value, &float_bits, sizeof value);
  return value;
#endif
}

/// x * 2^(bits - 127), exactly (ldexp: bits 0 is the float subnormal 2^-127, which a plain multiply
/// would lose under flush-to-zero); NaN for the NaN scale.
FUSEDATTN_HOST_DEVICE inline float mx_descale(float x, std::uint8_t bits) {
  if (bits == kE8M0Nan) return NAN;
  return ldexpf(x, static_cast<int>(bits) - kE8M0Bias);
}

/// Byte offset of scale (row, block) inside one swizzled matrix whose block count is padded to
/// `padded_blocks` (a multiple of 4): 512-byte tiles of 128 rows x 4 blocks, the tiles of one row
/// band (128 rows) side by side along the blocks, and inside a tile row r at (r % 32) * 16 +
/// (r / 32) * 4, its 4 blocks next to each other.
FUSEDATTN_HOST_DEVICE inline std::int64_t mx_swizzled_offset_rule(std::int64_t row, std::int64_t block,
                                                                  std::int64_t padded_blocks) {
  const std::int64_t tile = (row / kSwizzleRows) * (padded_blocks / kSwizzleBlocks) + block / kSwizzleBlocks;
  const std::int64_t in_band = row % kSwizzleRows;
  return tile * (kSwizzleRows * kSwizzleBlocks) + (in_band % 32) * 16 + (in_band / 32) * 4 + block % kSwizzleBlocks;
}

}  // namespace fusedattn::detail
