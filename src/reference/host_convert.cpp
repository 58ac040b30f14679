// Host-side 16-bit float conversion, strided gather/scatter and the relative-error metric of the tests.
//
// The conversions are written out by hand rather than taken from cuda_fp16.h so that the CPU tier
// needs no CUDA headers and so that every rounding rule is visible here.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "fusedattn/reference.h"

namespace fusedattn {

namespace {

std::uint32_t float_bits(float value) noexcept {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

float bits_float(std::uint32_t bits) noexcept {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// IEEE binary16: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits.
float f16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf, or NaN with its payload
  return bits_float(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

// Drops the low `shift` bits of `value`, rounding to nearest with ties to even.
std::uint32_t shift_round_even(std::uint32_t value, std::uint32_t shift) noexcept {
  const std::uint32_t kept = value >> shift;
  const std::uint32_t rest = value & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1);
  return (rest > half || (rest == half && (kept & 1u))) ? kept + 1u : kept;
}

std::uint16_t float_to_f16(float value) noexcept {
  const std::uint32_t bits = float_bits(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN: keep the top payload bits and force quiet, so it stays NaN
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  // 65520 is halfway between the largest half (65504) and 65536; ties-to-even rounds it up to inf.
  if (magnitude >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (magnitude < 0x38800000u) {  // below 2^-14: the result is subnormal (or zero)
    const std::uint32_t exponent = magnitude >> 23;
    // value / 2^-24 = (1.mantissa * 2^23) * 2^(exponent - 126), so shift right by 126 - exponent.
    const std::uint32_t shift = 126u - exponent;
    if (shift > 24u) return static_cast<std::uint16_t>(sign);  // below 2^-25: rounds to zero
    const std::uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
    // A carry out of the subnormal range yields 0x400, which is exactly the smallest normal.
    return static_cast<std::uint16_t>(sign | shift_round_even(significand, shift));
  }
  // Normal: rebias the exponent (127 -> 15, i.e. subtract 112 << 23) and round off 13 bits. A
  // mantissa carry runs into the exponent, which is the correctly rounded result.
  return static_cast<std::uint16_t>(sign | shift_round_even(magnitude - 0x38000000u, 13));
}

// bfloat16 is the upper half of a float.
std::uint16_t float_to_bf16(float value) noexcept {
  const std::uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: truncating could clear the payload, so force quiet
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest even; overflow carries into the exponent and correctly gives infinity.
  const std::uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

// Offset of the n-th element of the logical [b, h, s, d] order in a strided buffer.
std::int64_t strided_offset(const TensorDesc& desc, std::int64_t n) noexcept {
  std::int64_t offset = 0;
  for (int axis = 3; axis >= 0; --axis) {
    offset += (n % desc.dims[axis]) * desc.strides[axis];
    n /= desc.dims[axis];
  }
  return offset;
}

}  // namespace

float half_bits_to_float(std::uint16_t bits, DType dtype) noexcept {
  if (dtype == DType::bf16) return bits_float(static_cast<std::uint32_t>(bits) << 16);
  return f16_to_float(bits);
}

std::uint16_t float_to_half_bits(float value, DType dtype) noexcept {
  return dtype == DType::bf16 ? float_to_bf16(value) : float_to_f16(value);
}

std::vector<double> gather_to_double(const TensorDesc& desc, const std::uint16_t* src) {
  std::vector<double> out(static_cast<std::size_t>(desc.elements()));
  for (std::int64_t n = 0; n < desc.elements(); ++n) {
    out[static_cast<std::size_t>(n)] = half_bits_to_float(src[strided_offset(desc, n)], desc.dtype);
  }
  return out;
}

// Goes through float: double -> float -> 16 bits can in rare ties differ from rounding the double
// directly, which is immaterial for test inputs.
void scatter_from_double(const TensorDesc& desc, const double* src, std::uint16_t* dst) {
  for (std::int64_t n = 0; n < desc.elements(); ++n) {
    dst[strided_offset(desc, n)] = float_to_half_bits(static_cast<float>(src[n]), desc.dtype);
  }
}

// A value where the reference is not finite (e.g. the -inf log-sum-exp of a fully masked row)
// must match it exactly and is then left out of both norms; anything else there is an error.
template <class A, class B>
double relative_error(const A* out, const B* ref, std::int64_t n) {
  const double inf = std::numeric_limits<double>::infinity();
  double diff_sq = 0.0, ref_sq = 0.0, out_sq = 0.0;
  for (std::int64_t x = 0; x < n; ++x) {
    const double o = static_cast<double>(out[x]);
    const double r = static_cast<double>(ref[x]);
    if (!std::isfinite(r)) {
      if (o == r) continue;  // same infinity; NaN never equals anything, so it never passes
      return inf;
    }
    if (!std::isfinite(o)) return inf;
    diff_sq += (o - r) * (o - r);
    ref_sq += r * r;
    out_sq += o * o;
  }
  if (ref_sq == 0.0) return std::sqrt(out_sq);
  return std::sqrt(diff_sq) / std::sqrt(ref_sq);
}

template double relative_error<double, double>(const double*, const double*, std::int64_t);
template double relative_error<float, float>(const float*, const float*, std::int64_t);
template double relative_error<float, double>(const float*, const double*, std::int64_t);

}  // namespace fusedattn
