// Host FP8 codecs (OCP E4M3 "fn" and E5M2), bit for bit what cuda_fp8.h's device conversions give.
//
// Written out by hand, as host_convert.cpp does for the 16-bit types, so that the CPU tier needs no
// CUDA headers and the rules are visible. What must agree with __nv_cvt_float_to_fp8(x,
// __NV_SATFINITE, kind) (cuda_fp8.hpp, CUDA 13.0): one rounding from float, to nearest with ties to
// even, subnormals kept; |x| at or past the largest finite value (infinity too) gives that value
// with x's sign; a result that rounds to zero keeps x's sign; NaN gives 0x7F whatever its sign,
// because the header first replaces every NaN by the positive 0x7FFFFFFF.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "fusedattn/fp8.h"

namespace fusedattn {

namespace {

// The two formats, as the few numbers the codecs need.
struct Fp8Format {
  int mantissa_bits;
  int bias;
  std::uint8_t max_bits;  // largest finite magnitude: 0x7E = 448 (E4M3), 0x7B = 57344 (E5M2)
  std::uint32_t max_float_bits;
};

constexpr Fp8Format kE4M3{3, 7, 0x7e, 0x43e00000u};   // 448 = 1.75 * 2^8
constexpr Fp8Format kE5M2{2, 15, 0x7b, 0x47600000u};  // 57344 = 1.75 * 2^15
// The NaN the device writes for every NaN input, in both formats.
constexpr std::uint8_t kNanBits = 0x7f;

std::uint32_t float_bits(float value) noexcept {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// Drops the low `shift` bits of `value`, rounding to nearest with ties to even.
std::uint32_t shift_round_even(std::uint32_t value, std::uint32_t shift) noexcept {
  const std::uint32_t kept = value >> shift;
  const std::uint32_t rest = value & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1);
  return (rest > half || (rest == half && (kept & 1u))) ? kept + 1u : kept;
}

std::uint8_t encode(float value, const Fp8Format& f) noexcept {
  const std::uint32_t bits = float_bits(value);
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return kNanBits;
  // Saturation needs no tie rule of its own: E4M3's midpoint past 448 (464) rounds to the even 448,
  // and E5M2's past 57344 (61440) rounds up to 65536, which overflows and so saturates too.
  if (magnitude >= f.max_float_bits) return static_cast<std::uint8_t>(sign | f.max_bits);
  const std::uint32_t exponent = magnitude >> 23;
  const std::uint32_t min_normal_exponent = static_cast<std::uint32_t>(127 + 1 - f.bias);
  if (exponent < min_normal_exponent) {  // subnormal in FP8 (or zero)
    // value / (smallest subnormal) = significand * 2^(exponent - 150 - (1 - bias - mantissa_bits)).
    const std::uint32_t shift = static_cast<std::uint32_t>(150 + 1 - f.bias - f.mantissa_bits) - exponent;
    // Past 24 the value is below half the smallest subnormal; float subnormals are far below too.
    if (exponent == 0 || shift > 24u) return sign;
    const std::uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
    // A carry out of the subnormal range gives exactly the smallest normal's encoding.
    return static_cast<std::uint8_t>(sign | shift_round_even(significand, shift));
  }
  // Normal: rebias the exponent and round off the low mantissa bits; a carry runs into the exponent,
  // which is the correctly rounded result (and stays at most max_bits, as magnitude < max here).
  const std::uint32_t rebias = static_cast<std::uint32_t>(127 - f.bias) << 23;
  return static_cast<std::uint8_t>(sign | shift_round_even(magnitude - rebias, 23u - f.mantissa_bits));
}

float decode(std::uint8_t bits, const Fp8Format& f, bool has_infinity) noexcept {
  const bool negative = (bits & 0x80u) != 0;
  const int exponent_mask = (0x7f >> f.mantissa_bits);
  const int exponent = (bits >> f.mantissa_bits) & exponent_mask;
  const int mantissa = bits & ((1 << f.mantissa_bits) - 1);
  float magnitude;
  if (has_infinity && exponent == exponent_mask) {  // E5M2: IEEE-style infinities and NaNs
    if (mantissa != 0) return std::numeric_limits<float>::quiet_NaN();
    magnitude = std::numeric_limits<float>::infinity();
  } else if (!has_infinity && (bits & 0x7fu) == 0x7fu) {  // E4M3: the one NaN, either sign
    return std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {  // zero or subnormal: mantissa * 2^(1 - bias - mantissa_bits)
    magnitude = std::ldexp(static_cast<float>(mantissa), 1 - f.bias - f.mantissa_bits);
  } else {
    magnitude = std::ldexp(static_cast<float>((1 << f.mantissa_bits) | mantissa), exponent - f.bias - f.mantissa_bits);
  }
  return negative ? -magnitude : magnitude;
}

}  // namespace

float fp8_max(DType dtype) noexcept {
  switch (dtype) {
    case DType::e4m3: return 448.0f;
    case DType::e5m2: return 57344.0f;
    default: return 0.0f;
  }
}

float fp8_bits_to_float(std::uint8_t bits, DType dtype) noexcept {
  if (dtype == DType::e4m3) return decode(bits, kE4M3, false);
  if (dtype == DType::e5m2) return decode(bits, kE5M2, true);
  return std::numeric_limits<float>::quiet_NaN();
}

std::uint8_t float_to_fp8_bits(float value, DType dtype) noexcept {
  if (dtype == DType::e4m3) return encode(value, kE4M3);
  if (dtype == DType::e5m2) return encode(value, kE5M2);
  return kNanBits;
}

}  // namespace fusedattn
