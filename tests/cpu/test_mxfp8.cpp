// CPU tier: MXFP8 block scaling — the E8M0 codec, the OCP scale rule on hand-worked blocks, the
// 128x4 swizzle on hand-worked positions, and quantize/dequantize against a naive implementation.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "fusedattn/errors.h"
#include "fusedattn/fp8.h"
#include "fusedattn/mxfp8.h"

namespace fusedattn {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

float pow2(int exponent) { return static_cast<float>(std::ldexp(1.0, exponent)); }

template <class F>
void expect_invalid_argument(F&& call, const std::string& field) {
  try {
    call();
    FAIL() << "no InvalidArgument for " << field;
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), field) << e.what();
  }
}

// --- E8M0 --------------------------------------------------------------------------------------

TEST(Mxfp8E8M0, DecodesEveryPatternAndEncodesItBack) {
  for (int bits = 0; bits < 256; ++bits) {
    const float value = e8m0_bits_to_float(static_cast<std::uint8_t>(bits));
    if (bits == 0xff) {
      EXPECT_TRUE(std::isnan(value));
      continue;
    }
    // 2^(bits - 127) computed in double, where every one of them is a normal number.
    EXPECT_EQ(value, static_cast<float>(std::ldexp(1.0, bits - 127))) << "bits " << bits;
    EXPECT_GT(value, 0.0f) << "bits " << bits;  // bits 0 is the float subnormal 2^-127, not 0
    EXPECT_EQ(float_to_e8m0_bits(value), bits) << "bits " << bits;
  }
  EXPECT_EQ(e8m0_bits_to_float(0), pow2(-127));
  EXPECT_EQ(e8m0_bits_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_bits_to_float(254), pow2(127));
}

TEST(Mxfp8E8M0, EncodesOtherValuesByTruncationAndSaturation) {
  EXPECT_EQ(float_to_e8m0_bits(3.0f), 128);    // 2^1 <= 3 < 2^2
  EXPECT_EQ(float_to_e8m0_bits(0.75f), 126);   // 2^-1
  EXPECT_EQ(float_to_e8m0_bits(1.999f), 127);
  EXPECT_EQ(float_to_e8m0_bits(0.0f), 0);      // no zero in E8M0: the smallest, 2^-127
  EXPECT_EQ(float_to_e8m0_bits(-0.0f), 0);
  EXPECT_EQ(float_to_e8m0_bits(pow2(-130)), 0);
  EXPECT_EQ(float_to_e8m0_bits(std::numeric_limits<float>::max()), 0xfe);
  EXPECT_EQ(float_to_e8m0_bits(kInf), 0xff);
  EXPECT_EQ(float_to_e8m0_bits(kNan), 0xff);
  EXPECT_EQ(float_to_e8m0_bits(-1.0f), 0xff);  // no sign either
}

// --- the scale rule ----------------------------------------------------------------------------

TEST(Mxfp8ScaleRule, HandWorkedE4M3) {
  // 2^(floor(log2 amax) - 8)
  EXPECT_EQ(mxfp8_scale_bits(448.0f, DType::e4m3), 127);  // floor(log2 448) = 8: 2^0
  EXPECT_EQ(mxfp8_scale_bits(256.0f, DType::e4m3), 127);
  EXPECT_EQ(mxfp8_scale_bits(511.0f, DType::e4m3), 127);  // still 2^0: 511 will saturate to 448
  EXPECT_EQ(mxfp8_scale_bits(512.0f, DType::e4m3), 128);  // 2^1
  EXPECT_EQ(mxfp8_scale_bits(1.0f, DType::e4m3), 119);    // 2^-8
  EXPECT_EQ(mxfp8_scale_bits(0.75f, DType::e4m3), 118);   // floor(log2 0.75) = -1: 2^-9
  EXPECT_EQ(mxfp8_scale_bits(pow2(-119), DType::e4m3), 0);   // 2^-127 exactly
  EXPECT_EQ(mxfp8_scale_bits(pow2(-118), DType::e4m3), 1);
  EXPECT_EQ(mxfp8_scale_bits(pow2(-130), DType::e4m3), 0);   // 2^-138 raised to 2^-127
  EXPECT_EQ(mxfp8_scale_bits(pow2(-149), DType::e4m3), 0);   // the smallest float subnormal
  EXPECT_EQ(mxfp8_scale_bits(0.0f, DType::e4m3), 0);         // an all-zero block
  EXPECT_EQ(mxfp8_scale_bits(std::numeric_limits<float>::max(), DType::e4m3), 127 + 119);
  EXPECT_EQ(mxfp8_scale_bits(kInf, DType::e4m3), 0xff);
  EXPECT_EQ(mxfp8_scale_bits(kNan, DType::e4m3), 0xff);
}

TEST(Mxfp8ScaleRule, HandWorkedE5M2) {
  // 2^(floor(log2 amax) - 15)
  EXPECT_EQ(mxfp8_scale_bits(57344.0f, DType::e5m2), 127);  // floor(log2 57344) = 15: 2^0
  EXPECT_EQ(mxfp8_scale_bits(65536.0f, DType::e5m2), 128);
  EXPECT_EQ(mxfp8_scale_bits(1.0f, DType::e5m2), 112);      // 2^-15
  EXPECT_EQ(mxfp8_scale_bits(448.0f, DType::e5m2), 120);    // 2^(8 - 15)
  EXPECT_EQ(mxfp8_scale_bits(0.0f, DType::e5m2), 0);
}

TEST(Mxfp8ScaleRule, NeedsAnFp8ElementType) {
  expect_invalid_argument([] { mxfp8_scale_bits(1.0f, DType::bf16); }, "element");
  EXPECT_EQ(mxfp8_element_emax(DType::e4m3), 8);
  EXPECT_EQ(mxfp8_element_emax(DType::e5m2), 15);
  EXPECT_EQ(mxfp8_element_emax(DType::f16), 0);
}

// One row, hand-worked element by element: the block max sets the scale, small elements land on
// E4M3's subnormals (m * 2^-9 after scaling, m = 1..7) and round to nearest even there.
TEST(Mxfp8Quantize, HandWorkedBlockWithSubnormalResults) {
  std::vector<float> row(32, 0.0f);
  row[0] = 448.0f;                // scale 2^0
  row[1] = pow2(-7);              // 4 * 2^-9: subnormal, exact, bits 0x04
  row[2] = 0.3f * pow2(-9);       // below half the smallest subnormal: +0
  row[3] = 1.5f * pow2(-9);       // tie between 1 and 2 (* 2^-9): the even 2, bits 0x02
  row[4] = 2.5f * pow2(-9);       // tie between 2 and 3: the even 2
  row[5] = -pow2(-9);             // the smallest subnormal, negative: 0x81
  row[6] = pow2(-6);              // the smallest normal: 0x08
  row[7] = 7.5f * pow2(-9);       // tie between 7 * 2^-9 and 2^-6: the even 2^-6 (0x08)
  row[8] = -500.0f;               // past 448 within the scale's binade: saturates to -448
  const Mxfp8HostMatrix q = mxfp8_quantize_host(row, 1, 32, DType::e4m3);
  ASSERT_EQ(q.scales.size(), 1u);
  EXPECT_EQ(q.scales[0], 127);  // amax 500: floor(log2 500) = 8
  const std::vector<std::uint8_t> expected_bits = {0x7e, 0x04, 0x00, 0x02, 0x02, 0x81, 0x08, 0x08, 0xfe};
  for (std::size_t i = 0; i < expected_bits.size(); ++i) EXPECT_EQ(q.data[i], expected_bits[i]) << "element " << i;
  for (std::size_t i = expected_bits.size(); i < 32; ++i) EXPECT_EQ(q.data[i], 0x00) << "element " << i;
  const std::vector<float> back = mxfp8_dequantize_host(q);
  EXPECT_EQ(back[1], pow2(-7));
  EXPECT_EQ(back[3], pow2(-8));
  EXPECT_EQ(back[5], -pow2(-9));
  EXPECT_EQ(back[8], -448.0f);

  // Same elements 2^-8 smaller with amax 1 (scale 2^-8): the same bytes, the same subnormals.
  std::vector<float> small(row);
  for (float& x : small) x *= pow2(-8);
  small[0] = 1.0f;
  small[8] = 0.0f;
  const Mxfp8HostMatrix q_small = mxfp8_quantize_host(small, 1, 32, DType::e4m3);
  EXPECT_EQ(q_small.scales[0], 119);
  EXPECT_EQ(q_small.data[0], 0x78);  // 1 / 2^-8 = 256 = 2^8: exponent field 8 + 7 = 15, mantissa 0
  for (std::size_t i = 1; i < 8; ++i) EXPECT_EQ(q_small.data[i], expected_bits[i]) << "element " << i;
}

TEST(Mxfp8Quantize, HandWorkedE5M2Subnormals) {
  // E5M2's subnormals are m * 2^-16, m = 1..3; amax 57344 keeps the scale at 2^0.
  std::vector<float> row = {57344.0f, pow2(-16), 1.5f * pow2(-16), 0.4f * pow2(-16), 3.0f * pow2(-16)};
  const Mxfp8HostMatrix q = mxfp8_quantize_host(row, 1, 5, DType::e5m2);
  EXPECT_EQ(q.scales[0], 127);
  EXPECT_EQ(q.data[0], 0x7b);
  EXPECT_EQ(q.data[1], 0x01);
  EXPECT_EQ(q.data[2], 0x02);  // tie: to the even 2
  EXPECT_EQ(q.data[3], 0x00);
  EXPECT_EQ(q.data[4], 0x03);
}

TEST(Mxfp8Quantize, ZeroBlocksShortBlocksAndNanBlocks) {
  // Row 0: 32 zeros, then a short block of 8 values of 448. Row 1: a NaN in block 0, an infinity
  // in block 1 (each block reads back NaN throughout).
  std::vector<float> values(2 * 40, 0.0f);
  for (int c = 32; c < 40; ++c) values[c] = 448.0f;
  for (int c = 0; c < 40; ++c) values[40 + c] = 1.0f;
  values[40 + 3] = kNan;
  values[40 + 35] = -kInf;
  const Mxfp8HostMatrix q = mxfp8_quantize_host(values, 2, 40, DType::e4m3);
  ASSERT_EQ(q.scales.size(), 4u);
  EXPECT_EQ(q.scales[0], 0);     // all zero: the smallest scale
  EXPECT_EQ(q.scales[1], 127);   // only its own 8 elements count
  EXPECT_EQ(q.scales[2], 0xff);
  EXPECT_EQ(q.scales[3], 0xff);
  const std::vector<float> back = mxfp8_dequantize_host(q);
  for (int c = 0; c < 32; ++c) EXPECT_EQ(back[c], 0.0f) << c;
  for (int c = 32; c < 40; ++c) EXPECT_EQ(back[c], 448.0f) << c;
  for (int c = 0; c < 40; ++c) EXPECT_TRUE(std::isnan(back[40 + c])) << c;
}

TEST(Mxfp8Quantize, RejectsBadArguments) {
  expect_invalid_argument([] { mxfp8_quantize_host(std::vector<float>(10), 2, 6, DType::e4m3); }, "values");
  expect_invalid_argument([] { mxfp8_quantize_host(std::vector<float>(12), 2, 6, DType::bf16); }, "element");
  expect_invalid_argument([] { mxfp8_quantize_host({}, -1, 0, DType::e4m3); }, "rows");
  Mxfp8HostMatrix broken = mxfp8_quantize_host(std::vector<float>(12, 1.0f), 2, 6, DType::e4m3);
  broken.scales.pop_back();
  expect_invalid_argument([&] { mxfp8_dequantize_host(broken); }, "scales");
}

// --- shapes and the swizzle --------------------------------------------------------------------

TEST(Mxfp8ScaleShape, RowsBlocksAndPadding) {
  const Mxfp8ScaleShape q = mxfp8_scale_shape({2, 3, 100, 72}, kDim);  // a Q: blocks along d
  EXPECT_EQ(q.rows, 100);
  EXPECT_EQ(q.blocks, 3);  // ceil(72 / 32)
  EXPECT_EQ(q.padded_rows, 128);
  EXPECT_EQ(q.padded_blocks, 4);
  EXPECT_EQ(q.plain_bytes(), 2 * 3 * 100 * 3);
  EXPECT_EQ(q.swizzled_bytes(), 2 * 3 * 128 * 4);
  EXPECT_EQ(q.swizzled_dims(), (std::array<std::int64_t, 4>{2, 3, 128, 4}));

  const Mxfp8ScaleShape v = mxfp8_scale_shape({2, 3, 100, 72}, kSeq);  // the forward's V, or Q_T
  EXPECT_EQ(v.rows, 72);
  EXPECT_EQ(v.blocks, 4);  // ceil(100 / 32)
  EXPECT_EQ(v.padded_rows, 128);
  EXPECT_EQ(v.padded_blocks, 4);
  EXPECT_EQ(v.swizzled_dims(), (std::array<std::int64_t, 4>{2, 3, 4, 128}));

  const Mxfp8ScaleShape big = mxfp8_scale_shape({1, 1, 129, 256}, kDim);
  EXPECT_EQ(big.padded_rows, 256);
  EXPECT_EQ(big.blocks, 8);
  EXPECT_EQ(big.padded_blocks, 8);

  const Mxfp8ScaleShape empty = mxfp8_scale_shape({1, 1, 0, 64}, kDim);
  EXPECT_EQ(empty.swizzled_bytes(), 0);

  expect_invalid_argument([] { mxfp8_scale_shape({1, 1, 64, 64}, kBatch); }, "blocked");
  expect_invalid_argument([] { mxfp8_scale_shape({1, -1, 64, 64}, kDim); }, "dims[1]");
}

// A 256 x 8 scale matrix (say a Q with s = 256, d = 256) is 4 tiles of 512 bytes: rows 0-127 with
// blocks 0-3, rows 0-127 with blocks 4-7, then rows 128-255 likewise. Inside a tile the bytes run
// (r, 0..3), (r + 32, 0..3), (r + 64, 0..3), (r + 96, 0..3) for r = 0, 1, ..., 31.
TEST(Mxfp8Swizzle, HandWorkedOffsetsOf256x8) {
  struct Position {
    std::int64_t row, block, offset;
  };
  const std::vector<Position> positions = {
      {0, 0, 0},     {0, 1, 1},     {0, 2, 2},      {0, 3, 3},      // row 0, blocks 0-3: bytes 0-3
      {32, 0, 4},    {32, 3, 7},    {64, 0, 8},     {96, 0, 12},    // then rows 32, 64, 96
      {96, 3, 15},   {1, 0, 16},    {33, 0, 20},    {2, 0, 32},     // the next 16 bytes start at row 1
      {31, 0, 496},  {127, 3, 511},                                 // the tile's last row group
      {0, 4, 512},   {32, 5, 517},  {127, 7, 1023},                 // tile 1: blocks 4-7
      {128, 0, 1024}, {160, 0, 1028}, {129, 1, 1041},               // tile 2: rows 128-255
      {128, 4, 1536}, {255, 7, 2047},                               // tile 3
  };
  for (const Position& p : positions) {
    EXPECT_EQ(mxfp8_swizzled_offset(p.row, p.block, 8), p.offset) << "row " << p.row << " block " << p.block;
    // The same position through the array functions: one marked scale, everything else 0.
    std::vector<std::uint8_t> plain(256 * 8, 0);
    plain[static_cast<std::size_t>(p.row * 8 + p.block)] = 0xab;
    const std::vector<std::uint8_t> swizzled = mxfp8_swizzle_scales(plain, 256, 8);
    ASSERT_EQ(swizzled.size(), 2048u);
    for (std::size_t i = 0; i < swizzled.size(); ++i) {
      ASSERT_EQ(swizzled[i], i == static_cast<std::size_t>(p.offset) ? 0xab : 0) << "byte " << i;
    }
  }
}

TEST(Mxfp8Swizzle, PaddedShapeHandWorked) {
  // 130 x 5 pads to 256 x 8: the same 4 tiles; (129, 4) is tile 3, row 1 of it.
  EXPECT_EQ(mxfp8_swizzled_offset(129, 4, 8), 3 * 512 + 16);
  EXPECT_EQ(mxfp8_swizzled_offset(0, 4, 8), 512);
  // 1 x 1 pads to 128 x 4: one tile.
  const std::vector<std::uint8_t> one = mxfp8_swizzle_scales({0x42}, 1, 1);
  ASSERT_EQ(one.size(), 512u);
  EXPECT_EQ(one[0], 0x42);
  EXPECT_EQ(std::count(one.begin(), one.end(), 0), 511);
}

TEST(Mxfp8Swizzle, UnswizzleUndoesSwizzleAndPaddingStaysZero) {
  std::mt19937 engine(12345);
  std::uniform_int_distribution<int> byte(1, 255);  // never 0, so that padding is told apart
  for (const auto& [rows, blocks] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {1, 1}, {128, 4}, {130, 5}, {256, 8}, {300, 3}, {77, 2}, {0, 4}, {5, 0}}) {
    std::vector<std::uint8_t> plain(static_cast<std::size_t>(rows * blocks));
    for (auto& b : plain) b = static_cast<std::uint8_t>(byte(engine));
    const std::vector<std::uint8_t> swizzled = mxfp8_swizzle_scales(plain, rows, blocks);
    const std::int64_t padded = ((rows + 127) / 128 * 128) * ((blocks + 3) / 4 * 4);
    ASSERT_EQ(static_cast<std::int64_t>(swizzled.size()), padded) << rows << "x" << blocks;
    EXPECT_EQ(std::count(swizzled.begin(), swizzled.end(), 0), padded - rows * blocks) << rows << "x" << blocks;
    EXPECT_EQ(mxfp8_unswizzle_scales(swizzled, rows, blocks), plain) << rows << "x" << blocks;
  }
  // Every slot of a padded matrix has its own byte: the offsets are a permutation.
  std::vector<int> seen(384 * 12, 0);
  for (std::int64_t r = 0; r < 384; ++r) {
    for (std::int64_t j = 0; j < 12; ++j) ++seen[static_cast<std::size_t>(mxfp8_swizzled_offset(r, j, 12))];
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 384 * 12);
  expect_invalid_argument([] { mxfp8_swizzle_scales(std::vector<std::uint8_t>(7), 2, 4); }, "plain");
  expect_invalid_argument([] { mxfp8_unswizzle_scales(std::vector<std::uint8_t>(7), 2, 4); }, "swizzled");
}

// --- round trip against a naive implementation ------------------------------------------------

// Every finite value of an FP8 format with its code, from the format's definition alone.
struct NaiveFormat {
  int exponent_bits, mantissa_bits, bias;
  double max;
  std::vector<std::pair<double, int>> values;  // (value >= 0, code), increasing

  NaiveFormat(int e, int m, int b, double max_value) : exponent_bits(e), mantissa_bits(m), bias(b), max(max_value) {
    for (int code = 0; code < (1 << (e + m)); ++code) {
      const int exponent = code >> m, mantissa = code & ((1 << m) - 1);
      const double value = exponent == 0 ? std::ldexp(mantissa, 1 - bias - m)
                                         : std::ldexp((1 << m) + mantissa, exponent - bias - m);
      if (value <= max) values.emplace_back(value, code);
    }
  }
  double min_normal() const { return std::ldexp(1.0, 1 - bias); }

  // Nearest value, ties to the even code, saturating at max.
  double round(double x) const {
    const double magnitude = std::min(std::fabs(x), max);
    auto best = values.front();
    for (const auto& candidate : values) {
      const double gap = std::fabs(candidate.first - magnitude), best_gap = std::fabs(best.first - magnitude);
      if (gap < best_gap || (gap == best_gap && (candidate.second & 1) == 0)) best = candidate;
    }
    return std::copysign(best.first, x);
  }
};

// The straightforward MX: amax per block, 2^(floor(log2 amax) - emax) in double, clamped below at
// 2^-127, every element rounded by the table above.
struct NaiveMx {
  std::vector<double> values;
  std::vector<int> scale_exponents;
};

NaiveMx naive_mx(const std::vector<float>& x, std::int64_t rows, std::int64_t cols, const NaiveFormat& format,
                 int emax) {
  NaiveMx out;
  out.values.resize(x.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t first = 0; first < cols; first += 32) {
      const std::int64_t last = std::min(cols, first + 32);
      double amax = 0.0;
      for (std::int64_t c = first; c < last; ++c) amax = std::max(amax, std::fabs(double(x[r * cols + c])));
      const int exponent = amax == 0.0 ? -127 : std::max(-127, int(std::floor(std::log2(amax))) - emax);
      out.scale_exponents.push_back(exponent);
      for (std::int64_t c = first; c < last; ++c) {
        out.values[r * cols + c] = std::ldexp(format.round(std::ldexp(double(x[r * cols + c]), -exponent)), exponent);
      }
    }
  }
  return out;
}

// Values over ~60 binades, each block with its own magnitude, random signs, some exact zeros.
std::vector<float> spread_values(std::int64_t rows, std::int64_t cols, std::mt19937& engine) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int> block_exponent(-30, 30);
  std::vector<float> x(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    int base = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      if (c % 32 == 0) base = block_exponent(engine);
      const double u = unit(engine);
      const double magnitude = u < 0.03 ? 0.0 : std::exp2(base - 12.0 * unit(engine)) * (1.0 + unit(engine));
      x[r * cols + c] = static_cast<float>(unit(engine) < 0.5 ? -magnitude : magnitude);
    }
  }
  return x;
}

TEST(Mxfp8RoundTrip, MatchesTheNaiveImplementationAndTheFormatsBound) {
  const unsigned seed = std::random_device{}();
  std::mt19937 engine(seed);
  struct Format {
    DType dtype;
    NaiveFormat naive;
    double bound;  // half an ulp at the format's precision: 2^-(mantissa bits + 1)
  };
  const std::vector<Format> formats = {{DType::e4m3, NaiveFormat(4, 3, 7, 448.0), std::ldexp(1.0, -4)},
                                       {DType::e5m2, NaiveFormat(5, 2, 15, 57344.0), std::ldexp(1.0, -3)}};
  for (const auto& format : formats) {
    for (const auto& [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{{67, 100}, {5, 32}, {3, 7}}) {
      const std::string where = std::string(to_string(format.dtype)) + " " + std::to_string(rows) + "x" +
                                std::to_string(cols) + ", random seed " + std::to_string(seed);
      const std::vector<float> x = spread_values(rows, cols, engine);
      const Mxfp8HostMatrix q = mxfp8_quantize_host(x, rows, cols, format.dtype);
      const std::vector<float> back = mxfp8_dequantize_host(q);
      const NaiveMx naive = naive_mx(x, rows, cols, format.naive, mxfp8_element_emax(format.dtype));
      ASSERT_EQ(q.scales.size(), naive.scale_exponents.size()) << where;
      for (std::size_t j = 0; j < q.scales.size(); ++j) {
        ASSERT_EQ(int(q.scales[j]) - 127, naive.scale_exponents[j]) << "block " << j << ", " << where;
      }
      const std::int64_t blocks = (cols + 31) / 32;
      std::int64_t checked = 0;
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t c = 0; c < cols; ++c) {
          const std::size_t i = static_cast<std::size_t>(r * cols + c);
          ASSERT_EQ(double(back[i]), naive.values[i]) << "element " << r << "," << c << " of " << x[i] << ", " << where;
          // The bound: elements whose scaled magnitude is a normal FP8 value and not past the
          // largest, within half an ulp; past the largest (the OCP rule's top binade), clamped to
          // it, within 1/8; the subnormal range of the block is left out.
          const double scale = std::ldexp(1.0, q.scales[static_cast<std::size_t>(r * blocks + c / 32)] - 127);
          const double scaled = std::fabs(double(x[i])) / scale;
          const double error = std::fabs(double(back[i]) - double(x[i])) / std::fabs(double(x[i]));
          if (scaled > format.naive.max) {
            EXPECT_EQ(std::fabs(double(back[i])), format.naive.max * scale) << where;
            EXPECT_LT(error, 0.125) << where;
          } else if (scaled >= format.naive.min_normal()) {
            EXPECT_LE(error, format.bound) << "element " << r << "," << c << " of " << x[i] << ", " << where;
            ++checked;
          }
        }
      }
      EXPECT_GT(checked, rows * cols / 2) << where;  // the bound did look at most elements
    }
  }
}

}  // namespace
}  // namespace fusedattn
