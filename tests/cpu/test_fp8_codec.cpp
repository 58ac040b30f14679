// CPU tier: the host FP8 codecs (fusedattn/fp8.h) on every bit pattern, hand-worked values, and a
// dense sweep against a brute-force nearest-value reference.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fusedattn/fp8.h"

namespace fusedattn {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

std::uint32_t bits_of(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

float float_of(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

std::string hex(unsigned value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%02X", value);
  return text;
}

bool is_nan_pattern(std::uint8_t bits, DType dtype) {
  if (dtype == DType::e4m3) return (bits & 0x7fu) == 0x7fu;
  return (bits & 0x7cu) == 0x7cu && (bits & 0x03u) != 0;  // E5M2: exponent all ones, mantissa not 0
}

bool is_infinity_pattern(std::uint8_t bits, DType dtype) {
  return dtype == DType::e5m2 && (bits & 0x7fu) == 0x7cu;
}

class Fp8Codec : public ::testing::TestWithParam<DType> {};

INSTANTIATE_TEST_SUITE_P(Types, Fp8Codec, ::testing::Values(DType::e4m3, DType::e5m2),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(to_string(info.param));
                         });

// Every finite pattern (signed zeros too) decodes and re-encodes to itself; NaNs decode to NaN and
// encode to NaN; E5M2's infinities decode to infinity and saturate to the largest finite value.
TEST_P(Fp8Codec, EveryBitPatternRoundTrips) {
  const DType dtype = GetParam();
  int nans = 0;
  for (unsigned b = 0; b < 256; ++b) {
    const auto bits = static_cast<std::uint8_t>(b);
    const float value = fp8_bits_to_float(bits, dtype);
    const std::uint8_t back = float_to_fp8_bits(value, dtype);
    if (is_nan_pattern(bits, dtype)) {
      ++nans;
      EXPECT_TRUE(std::isnan(value)) << hex(b);
      EXPECT_TRUE(is_nan_pattern(back, dtype)) << hex(b) << " re-encoded as " << hex(back);
    } else if (is_infinity_pattern(bits, dtype)) {
      EXPECT_EQ(value, (b & 0x80u) ? -kInf : kInf) << hex(b);
      EXPECT_EQ(back, (b & 0x80u) | 0x7bu) << hex(b);
    } else {
      EXPECT_TRUE(std::isfinite(value)) << hex(b);
      EXPECT_EQ(std::signbit(value), (b & 0x80u) != 0) << hex(b);
      EXPECT_EQ(back, bits) << hex(b) << " decoded as " << value;
    }
  }
  EXPECT_EQ(nans, dtype == DType::e4m3 ? 2 : 6);
}

// Finite values increase with the pattern, so no two patterns of one sign share a value.
TEST_P(Fp8Codec, FiniteValuesAreOrdered) {
  const DType dtype = GetParam();
  float previous = -1.0f;
  for (unsigned b = 0; b < 0x80; ++b) {
    const auto bits = static_cast<std::uint8_t>(b);
    if (is_nan_pattern(bits, dtype) || is_infinity_pattern(bits, dtype)) continue;
    const float value = fp8_bits_to_float(bits, dtype);
    EXPECT_GT(value, previous) << hex(b);
    EXPECT_EQ(fp8_bits_to_float(static_cast<std::uint8_t>(b | 0x80u), dtype), -value) << hex(b);
    previous = value;
  }
  EXPECT_EQ(previous, fp8_max(dtype));
}

TEST(Fp8CodecValues, Maxima) {
  EXPECT_EQ(fp8_max(DType::e4m3), 448.0f);
  EXPECT_EQ(fp8_max(DType::e5m2), 57344.0f);
  EXPECT_EQ(fp8_max(DType::f16), 0.0f);
  EXPECT_EQ(fp8_max(DType::bf16), 0.0f);
  EXPECT_EQ(fp8_bits_to_float(0x7e, DType::e4m3), 448.0f);
  EXPECT_EQ(fp8_bits_to_float(0x7b, DType::e5m2), 57344.0f);
  EXPECT_EQ(float_to_fp8_bits(448.0f, DType::e4m3), 0x7e);
  EXPECT_EQ(float_to_fp8_bits(57344.0f, DType::e5m2), 0x7b);
}

TEST(Fp8CodecValues, E4M3HandWorked) {
  const DType t = DType::e4m3;
  EXPECT_EQ(float_to_fp8_bits(1.0f, t), 0x38);    // exponent 7 (bias 7), mantissa 0
  EXPECT_EQ(fp8_bits_to_float(0x39, t), 1.125f);  // one mantissa step is 2^-3
  EXPECT_EQ(float_to_fp8_bits(-2.0f, t), 0xc0);
  // Subnormals: steps of 2^-9 below the smallest normal 2^-6.
  EXPECT_EQ(fp8_bits_to_float(0x01, t), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_bits_to_float(0x07, t), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_bits_to_float(0x08, t), std::ldexp(1.0f, -6));
  EXPECT_EQ(float_to_fp8_bits(std::ldexp(1.0f, -9), t), 0x01);
  // Ties to even: 2^-10 is halfway between 0 and 2^-9; 3 * 2^-10 between 0x01 and 0x02.
  EXPECT_EQ(float_to_fp8_bits(std::ldexp(1.0f, -10), t), 0x00);
  EXPECT_EQ(float_to_fp8_bits(std::nextafter(std::ldexp(1.0f, -10), 1.0f), t), 0x01);
  EXPECT_EQ(float_to_fp8_bits(3 * std::ldexp(1.0f, -10), t), 0x02);
  EXPECT_EQ(float_to_fp8_bits(1.0625f, t), 0x38);  // between 1 (0x38) and 1.125 (0x39)
  EXPECT_EQ(float_to_fp8_bits(1.1875f, t), 0x3a);  // between 1.125 (0x39) and 1.25 (0x3a)
  EXPECT_EQ(float_to_fp8_bits(15.0f * std::ldexp(1.0f, -10), t), 0x08);  // carry into the smallest normal
  // Saturation: 464 is halfway from 448 to the 480 that 0x7F would be, and rounds to the even 448.
  EXPECT_EQ(float_to_fp8_bits(464.0f, t), 0x7e);
  EXPECT_EQ(float_to_fp8_bits(465.0f, t), 0x7e);
  EXPECT_EQ(float_to_fp8_bits(1e6f, t), 0x7e);
  EXPECT_EQ(float_to_fp8_bits(-1e6f, t), 0xfe);
  EXPECT_EQ(float_to_fp8_bits(kInf, t), 0x7e);
  EXPECT_EQ(float_to_fp8_bits(-kInf, t), 0xfe);
  EXPECT_EQ(float_to_fp8_bits(std::numeric_limits<float>::max(), t), 0x7e);
  // Signed zeros, and underflow keeps the sign.
  EXPECT_EQ(float_to_fp8_bits(0.0f, t), 0x00);
  EXPECT_EQ(float_to_fp8_bits(-0.0f, t), 0x80);
  EXPECT_EQ(float_to_fp8_bits(-1e-30f, t), 0x80);
  EXPECT_TRUE(std::signbit(fp8_bits_to_float(0x80, t)));
  EXPECT_EQ(fp8_bits_to_float(0x80, t), 0.0f);
  // NaN: 0x7F and 0xFF decode to NaN; any NaN encodes to 0x7F, as cuda_fp8.h does.
  EXPECT_TRUE(std::isnan(fp8_bits_to_float(0x7f, t)));
  EXPECT_TRUE(std::isnan(fp8_bits_to_float(0xff, t)));
  EXPECT_EQ(float_to_fp8_bits(kNan, t), 0x7f);
  EXPECT_EQ(float_to_fp8_bits(-kNan, t), 0x7f);
  EXPECT_EQ(float_to_fp8_bits(float_of(0x7f800001u), t), 0x7f);  // a signalling NaN
}

TEST(Fp8CodecValues, E5M2HandWorked) {
  const DType t = DType::e5m2;
  EXPECT_EQ(float_to_fp8_bits(1.0f, t), 0x3c);  // exponent 15 (bias 15), mantissa 0
  EXPECT_EQ(fp8_bits_to_float(0x3d, t), 1.25f);
  // Subnormals: steps of 2^-16 below the smallest normal 2^-14.
  EXPECT_EQ(fp8_bits_to_float(0x01, t), std::ldexp(1.0f, -16));
  EXPECT_EQ(fp8_bits_to_float(0x03, t), 3 * std::ldexp(1.0f, -16));
  EXPECT_EQ(fp8_bits_to_float(0x04, t), std::ldexp(1.0f, -14));
  EXPECT_EQ(float_to_fp8_bits(std::ldexp(1.0f, -16), t), 0x01);
  EXPECT_EQ(float_to_fp8_bits(std::ldexp(1.0f, -17), t), 0x00);  // halfway to 2^-16: even 0
  EXPECT_EQ(float_to_fp8_bits(std::nextafter(std::ldexp(1.0f, -17), 1.0f), t), 0x01);
  EXPECT_EQ(float_to_fp8_bits(3 * std::ldexp(1.0f, -17), t), 0x02);
  EXPECT_EQ(float_to_fp8_bits(1.125f, t), 0x3c);  // between 1 (0x3c) and 1.25 (0x3d)
  EXPECT_EQ(float_to_fp8_bits(1.375f, t), 0x3e);  // between 1.25 (0x3d) and 1.5 (0x3e)
  // Saturation: 61440 is halfway from 57344 to 65536 and rounds up, past the largest finite value,
  // so saturates; so does everything above, and infinity.
  EXPECT_EQ(float_to_fp8_bits(61440.0f, t), 0x7b);
  EXPECT_EQ(float_to_fp8_bits(1e6f, t), 0x7b);
  EXPECT_EQ(float_to_fp8_bits(-1e6f, t), 0xfb);
  EXPECT_EQ(float_to_fp8_bits(kInf, t), 0x7b);
  EXPECT_EQ(float_to_fp8_bits(-kInf, t), 0xfb);
  EXPECT_EQ(fp8_bits_to_float(0x7c, t), kInf);
  EXPECT_EQ(fp8_bits_to_float(0xfc, t), -kInf);
  EXPECT_EQ(float_to_fp8_bits(-0.0f, t), 0x80);
  EXPECT_EQ(float_to_fp8_bits(-1e-30f, t), 0x80);
  for (unsigned b : {0x7du, 0x7eu, 0x7fu, 0xfdu, 0xfeu, 0xffu}) {
    EXPECT_TRUE(std::isnan(fp8_bits_to_float(static_cast<std::uint8_t>(b), t))) << hex(b);
  }
  EXPECT_EQ(float_to_fp8_bits(kNan, t), 0x7f);
  EXPECT_EQ(float_to_fp8_bits(-kNan, t), 0x7f);
}

// An independent reference: the nearest finite value of x's sign found by scanning the decoded
// table, ties to the pattern whose last bit is 0. Only finite candidates compete, which is what
// saturation means. Distances are exact in double for |x| up to 4 * max (a float's 24 bits and
// FP8's span of 2^-16 to 2^16 fit in 53 bits), so larger |x| are clamped there, where the nearest
// value is already the largest; tiny |x| need no exactness, as nothing ties there but at 0.
std::uint8_t brute_force_encode(float x, DType dtype) {
  if (std::isnan(x)) return 0x7f;
  const unsigned sign = std::signbit(x) ? 0x80u : 0u;
  const double target = std::fmin(std::fabs(static_cast<double>(x)), 4.0 * fp8_max(dtype));
  unsigned best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (unsigned b = 0; b < 0x80; ++b) {
    const auto bits = static_cast<std::uint8_t>(b);
    if (is_nan_pattern(bits, dtype) || is_infinity_pattern(bits, dtype)) continue;
    const double distance = std::fabs(static_cast<double>(fp8_bits_to_float(bits, dtype)) - target);
    if (distance < best_distance || (distance == best_distance && (b & 1u) == 0)) {
      best = b;
      best_distance = distance;
    }
  }
  return static_cast<std::uint8_t>(sign | best);
}

void expect_matches_brute_force(const std::vector<float>& values, DType dtype) {
  int failures = 0;
  for (float x : values) {
    const std::uint8_t got = float_to_fp8_bits(x, dtype), want = brute_force_encode(x, dtype);
    if (got != want && ++failures <= 10) {
      ADD_FAILURE() << to_string(dtype) << ": " << x << " (bits " << std::hex << bits_of(x) << std::dec
                    << ") encoded as " << hex(got) << ", nearest is " << hex(want);
    }
  }
  EXPECT_EQ(failures, 0);
}

// Every float from 2^-20 to 2^17 at a stride of 997 patterns, both signs: each binade of FP8,
// below its subnormals and past its maximum.
TEST_P(Fp8Codec, DenseSweepMatchesNearestValue) {
  std::vector<float> values;
  for (std::uint32_t bits = bits_of(std::ldexp(1.0f, -20)); bits < bits_of(std::ldexp(1.0f, 17)); bits += 997) {
    values.push_back(float_of(bits));
    values.push_back(-float_of(bits));
  }
  expect_matches_brute_force(values, GetParam());
}

// The places where rounding decides: each midpoint between neighbouring values (exact in float),
// the floats either side of it, and the values themselves.
TEST_P(Fp8Codec, MidpointsMatchNearestValue) {
  const DType dtype = GetParam();
  std::vector<float> finite;
  for (unsigned b = 0; b < 0x80; ++b) {
    const auto bits = static_cast<std::uint8_t>(b);
    if (is_nan_pattern(bits, dtype) || is_infinity_pattern(bits, dtype)) continue;
    finite.push_back(fp8_bits_to_float(bits, dtype));
  }
  // Past the maximum: the value one step above it (480 / 65536), so its midpoint (464 / 61440) is tried.
  const float top = finite.back(), step = top - finite[finite.size() - 2];
  finite.push_back(top + step);
  std::vector<float> values;
  for (std::size_t i = 0; i + 1 < finite.size(); ++i) {
    const float mid = (finite[i] + finite[i + 1]) / 2;
    for (float x : {finite[i], mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInf)}) {
      values.push_back(x);
      values.push_back(-x);
    }
  }
  expect_matches_brute_force(values, dtype);
}

// Random float patterns over the whole range: huge, tiny, subnormal floats, infinities, NaNs.
TEST_P(Fp8Codec, RandomPatternsMatchNearestValue) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("random seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::vector<float> values(200000);
  for (float& x : values) x = float_of(static_cast<std::uint32_t>(rng()));
  values.push_back(kInf);
  values.push_back(-kInf);
  values.push_back(std::numeric_limits<float>::denorm_min());
  expect_matches_brute_force(values, GetParam());
}

}  // namespace
}  // namespace fusedattn
