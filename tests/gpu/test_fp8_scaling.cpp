// GPU tier: the FP8 scaling kernels (fusedattn/fp8.h) and FP8 gather/scatter against the host codecs,
// byte for byte, on strided tensors; the input checks (the scale updates: test_fp8_scale_updates.cpp).
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "device_copy.h"
#include "fp8_images.h"
#include "fusedattn/errors.h"
#include "fusedattn/fp8.h"
#include "fusedattn/reference.h"
#include "gpu_skip.h"
#include "testing/cuda_check.h"
#include "testing/device_buffer.h"

namespace fusedattn {
namespace {

using namespace fp8_test;  // NOLINT: the helpers these tests share with test_fp8_rows_gpu.cpp

// --- quantize ---------------------------------------------------------------------------------

// Values where rounding is delicate, as 16-bit inputs (with scale 2 several land exactly on FP8
// midpoints): ties in the normal range, at the saturation boundary (464 / 61440) and below the
// smallest subnormals, zeros of both signs, overflow (1e6 is infinite in f16) and infinities.
const std::vector<float>& specials() {
  static const std::vector<float> values = {0.0f, -0.0f, 0.53125f, 0.5625f, -0.59375f, 232.0f, 30720.0f,
                                            std::ldexp(1.0f, -11), 3 * std::ldexp(1.0f, -11), std::ldexp(1.0f, -18),
                                            1e-5f, -1e-5f, 1e6f, -1e6f, kInf, -kInf, 200.0f, -300.0f};
  return values;
}

// A bshd bf16/f16 view quantized into an sbhd FP8 one, every byte against the host codec applied
// to the same 16-bit value times the scale, and the fused amax against the host's.
void check_quantize(DType src_type, DType dst_type, float scale) {
  Rng rng;
  SCOPED_TRACE(rng.trace() + ", " + to_string(src_type) + " -> " + to_string(dst_type) + ", scale " +
               std::to_string(scale));
  const std::int64_t b = 2, h = 3, s = 37, d = 72;
  HostImage src(bshd(src_type, b, h, s, d)), expected(sbhd(dst_type, b, h, s, d));
  const std::vector<float> values = rng.normal(src.desc.elements(), 40.0f);
  for (std::int64_t n = 0; n < src.desc.elements(); ++n) src.set_value(n, values[static_cast<std::size_t>(n)]);
  for (std::size_t k = 0; k < specials().size(); ++k) {
    src.set_value(static_cast<std::int64_t>(k * 97 + 5), specials()[k]);
  }
  for (std::int64_t n = 0; n < src.desc.elements(); ++n) expected.set_value(n, src.value(n) * scale);

  DeviceBuffer d_src = upload(src.bytes), d_dst = upload(HostImage(expected.desc).bytes);
  DeviceBuffer d_scale = upload(std::vector<float>{scale}), d_amax = poisoned_scalar();
  quantize_fp8(src.desc, d_src.get(), expected.desc, d_dst.get(), d_scale.as<float>(), d_amax.as<float>(), nullptr);
  synchronize();

  const std::vector<std::uint8_t> got = copy_to_host(d_dst.get(), d_dst.bytes());
  for (std::int64_t n = 0; n < src.desc.elements(); ++n) {
    const std::size_t at = static_cast<std::size_t>(offset_of(expected.desc, n));
    ASSERT_EQ(got[at], expected.bits(n)) << "element " << n << ": " << src.value(n) << " * " << scale;
  }
  expected.expect_gaps_untouched(got);
  EXPECT_EQ(bits_of(download_scalar(d_amax)), bits_of(host_amax(src)));
}

TEST(Fp8ScalingGpu, QuantizeBf16ToE4m3) {
  FUSEDATTN_REQUIRE_GPU();
  for (float scale : {2.0f, 0.3f, 5.5f}) check_quantize(DType::bf16, DType::e4m3, scale);
}

TEST(Fp8ScalingGpu, QuantizeBf16ToE5m2) {
  FUSEDATTN_REQUIRE_GPU();
  for (float scale : {2.0f, 0.3f, 900.0f}) check_quantize(DType::bf16, DType::e5m2, scale);
}

TEST(Fp8ScalingGpu, QuantizeF16ToE4m3) {
  FUSEDATTN_REQUIRE_GPU();
  for (float scale : {2.0f, 0.3f, 5.5f}) check_quantize(DType::f16, DType::e4m3, scale);
}

TEST(Fp8ScalingGpu, QuantizeF16ToE5m2) {
  FUSEDATTN_REQUIRE_GPU();
  for (float scale : {2.0f, 0.3f, 900.0f}) check_quantize(DType::f16, DType::e5m2, scale);
}

// Without an amax pointer the bytes are the same and nothing else is written.
TEST(Fp8ScalingGpu, QuantizeWithoutAmax) {
  FUSEDATTN_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  HostImage src(bhsd(DType::bf16, 1, 2, 50, 64)), expected(bhsd(DType::e4m3, 1, 2, 50, 64));
  const std::vector<float> values = rng.normal(src.desc.elements(), 1.0f);
  for (std::int64_t n = 0; n < src.desc.elements(); ++n) {
    src.set_value(n, values[static_cast<std::size_t>(n)]);
    expected.set_value(n, src.value(n) * 100.0f);
  }
  DeviceBuffer d_src = upload(src.bytes), d_dst = upload(HostImage(expected.desc).bytes);
  DeviceBuffer d_scale = upload(std::vector<float>{100.0f});
  quantize_fp8(src.desc, d_src.get(), expected.desc, d_dst.get(), d_scale.as<float>(), nullptr, nullptr);
  synchronize();
  EXPECT_EQ(copy_to_host(d_dst.get(), d_dst.bytes()), expected.bytes);
}

// --- amax -------------------------------------------------------------------------------------

void check_amax(const HostImage& image) {
  DeviceBuffer d_data = upload(image.bytes), d_amax = poisoned_scalar();
  measure_amax(image.desc, d_data.get(), d_amax.as<float>(), nullptr);
  synchronize();
  EXPECT_EQ(bits_of(download_scalar(d_amax)), bits_of(host_amax(image))) << to_string(image.desc);
}

TEST(Fp8ScalingGpu, AmaxOfStridedTensorsMatchesHost) {
  FUSEDATTN_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (DType dtype : {DType::f16, DType::bf16}) {
    HostImage image(bshd(dtype, 3, 5, 41, 40));
    const std::vector<float> values = rng.normal(image.desc.elements(), 3.0f);
    for (std::int64_t n = 0; n < image.desc.elements(); ++n) image.set_value(n, values[static_cast<std::size_t>(n)]);
    check_amax(image);
  }
  // FP8 tensors: the amax of their stored values, over random patterns other than NaN (E5M2's
  // infinities included, so its amax may be infinite).
  for (DType dtype : {DType::e4m3, DType::e5m2}) {
    HostImage image(sbhd(dtype, 2, 4, 33, 24));
    for (std::int64_t n = 0; n < image.desc.elements(); ++n) {
      std::uint8_t bits;
      do bits = static_cast<std::uint8_t>(rng.engine()); while (std::isnan(fp8_bits_to_float(bits, dtype)));
      image.set_bits(n, bits);
    }
    check_amax(image);
  }
}

// More elements than the grid covers in one pass (4096 blocks of 256), with the largest last.
TEST(Fp8ScalingGpu, AmaxCoversTheWholeGridStride) {
  FUSEDATTN_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  HostImage image(bhsd(DType::bf16, 1, 1, 1, 2 * 4096 * 256 + 123));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (std::int64_t n = 0; n < image.desc.elements(); ++n) image.set_value(n, dist(rng.engine));
  image.set_value(image.desc.elements() - 1, -7.5f);
  check_amax(image);
  EXPECT_EQ(host_amax(image), 7.5f);
}

TEST(Fp8ScalingGpu, NanShowsInTheAmax) {
  FUSEDATTN_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  HostImage src(bshd(DType::bf16, 2, 2, 100, 32));
  const std::vector<float> values = rng.normal(src.desc.elements(), 1.0f);
  for (std::int64_t n = 0; n < src.desc.elements(); ++n) src.set_value(n, values[static_cast<std::size_t>(n)]);
  const std::int64_t at = std::uniform_int_distribution<std::int64_t>(0, src.desc.elements() - 1)(rng.engine);
  src.set_value(at, kNan);
  src.set_value((at + 1) % src.desc.elements(), kInf);  // NaN beats infinity too

  DeviceBuffer d_src = upload(src.bytes), d_amax = poisoned_scalar();
  measure_amax(src.desc, d_src.get(), d_amax.as<float>(), nullptr);
  synchronize();
  EXPECT_TRUE(std::isnan(download_scalar(d_amax)));

  // Quantizing records it the same way, and the NaN element stays NaN.
  const TensorDesc dst_desc = bhsd(DType::e4m3, 2, 2, 100, 32);
  DeviceBuffer d_dst(bytes_of(dst_desc)), d_scale = upload(std::vector<float>{1.0f}), d_fused = poisoned_scalar();
  quantize_fp8(src.desc, d_src.get(), dst_desc, d_dst.get(), d_scale.as<float>(), d_fused.as<float>(), nullptr);
  synchronize();
  EXPECT_TRUE(std::isnan(download_scalar(d_fused)));
  const std::vector<std::uint8_t> got = copy_to_host(d_dst.get(), d_dst.bytes());
  EXPECT_TRUE(std::isnan(fp8_bits_to_float(got[static_cast<std::size_t>(offset_of(dst_desc, at))], DType::e4m3)));

  // An E4M3 tensor holding its NaN pattern.
  HostImage fp8(bhsd(DType::e4m3, 1, 1, 4, 16));
  for (std::int64_t n = 0; n < fp8.desc.elements(); ++n) fp8.set_value(n, static_cast<float>(n));
  fp8.set_bits(17, 0xff);
  DeviceBuffer d_fp8 = upload(fp8.bytes), d_fp8_amax = poisoned_scalar();
  measure_amax(fp8.desc, d_fp8.get(), d_fp8_amax.as<float>(), nullptr);
  synchronize();
  EXPECT_TRUE(std::isnan(download_scalar(d_fp8_amax)));
}

TEST(Fp8ScalingGpu, EmptyTensorHasAmaxZero) {
  FUSEDATTN_REQUIRE_GPU();
  const TensorDesc empty = bhsd(DType::bf16, 2, 0, 16, 64);
  DeviceBuffer d_amax = poisoned_scalar(), d_scale = upload(std::vector<float>{1.0f});
  measure_amax(empty, nullptr, d_amax.as<float>(), nullptr);
  synchronize();
  EXPECT_EQ(bits_of(download_scalar(d_amax)), 0u);

  DeviceBuffer d_fused = poisoned_scalar();
  quantize_fp8(empty, nullptr, bhsd(DType::e5m2, 2, 0, 16, 64), nullptr, d_scale.as<float>(), d_fused.as<float>(),
               nullptr);
  synchronize();
  EXPECT_EQ(bits_of(download_scalar(d_fused)), 0u);
}

// --- dequantize -------------------------------------------------------------------------------

// Every FP8 pattern into each 16-bit type, with descale 1 (the exact value) and with one that
// rounds.
TEST(Fp8ScalingGpu, DequantizeEveryPattern) {
  FUSEDATTN_REQUIRE_GPU();
  for (DType fp8 : {DType::e4m3, DType::e5m2}) {
    HostImage src(bhsd(fp8, 1, 1, 1, 256));
    for (std::int64_t n = 0; n < 256; ++n) src.set_bits(n, static_cast<std::uint32_t>(n));
    DeviceBuffer d_src = upload(src.bytes);
    for (DType wide : {DType::f16, DType::bf16}) {
      for (float descale : {1.0f, 0.3f, 1e-3f}) {
        SCOPED_TRACE(std::string(to_string(fp8)) + " -> " + to_string(wide) + ", descale " + std::to_string(descale));
        const TensorDesc dst_desc = bhsd(wide, 1, 1, 1, 256);
        DeviceBuffer d_dst(bytes_of(dst_desc)), d_descale = upload(std::vector<float>{descale});
        dequantize_fp8(src.desc, d_src.get(), dst_desc, d_dst.get(), d_descale.as<float>(), nullptr);
        synchronize();
        const std::vector<float> got = as_floats(copy_to_host(d_dst.get(), d_dst.bytes()), wide);
        for (std::int64_t n = 0; n < 256; ++n) {
          const float want = half_bits_to_float(float_to_half_bits(src.value(n) * descale, wide), wide);
          ASSERT_TRUE(same_float(got[static_cast<std::size_t>(n)], want))
              << "pattern " << n << ": got " << got[static_cast<std::size_t>(n)] << ", want " << want;
        }
      }
    }
  }
}

// Quantize with the scale scale_from_amax derives from the measured amax, then dequantize with its
// descale, across layouts: each element is the host's composition, and close to the input.
TEST(Fp8ScalingGpu, DequantizeRoundTrip) {
  FUSEDATTN_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const std::int64_t b = 2, h = 4, s = 45, d = 64;
  for (DType fp8 : {DType::e4m3, DType::e5m2}) {
    HostImage src(bshd(DType::bf16, b, h, s, d));
    const std::vector<float> values = rng.normal(src.desc.elements(), 0.02f);
    for (std::int64_t n = 0; n < src.desc.elements(); ++n) src.set_value(n, values[static_cast<std::size_t>(n)]);
    const TensorDesc mid_desc = sbhd(fp8, b, h, s, d), out_desc = bhsd(DType::bf16, b, h, s, d);
    DeviceBuffer d_src = upload(src.bytes), d_mid(bytes_of(mid_desc)), d_out(bytes_of(out_desc));
    DeviceBuffer d_amax = poisoned_scalar(), d_scale = poisoned_scalar(), d_descale = poisoned_scalar();
    measure_amax(src.desc, d_src.get(), d_amax.as<float>(), nullptr);
    scale_from_amax(d_amax.as<float>(), fp8, 0, d_scale.as<float>(), d_descale.as<float>(), nullptr);
    quantize_fp8(src.desc, d_src.get(), mid_desc, d_mid.get(), d_scale.as<float>(), nullptr, nullptr);
    dequantize_fp8(mid_desc, d_mid.get(), out_desc, d_out.get(), d_descale.as<float>(), nullptr);
    synchronize();

    const float amax = host_amax(src), scale = fp8_max(fp8) / amax, descale = 1.0f / scale;
    EXPECT_EQ(download_scalar(d_scale), scale);
    EXPECT_EQ(download_scalar(d_descale), descale);
    HostImage mid(mid_desc);
    mid.bytes = copy_to_host(d_mid.get(), d_mid.bytes());
    HostImage out(out_desc);
    out.bytes = copy_to_host(d_out.get(), d_out.bytes());
    std::vector<float> input(values.size()), output(values.size());
    for (std::int64_t n = 0; n < src.desc.elements(); ++n) {
      const std::uint8_t q = float_to_fp8_bits(src.value(n) * scale, fp8);
      ASSERT_EQ(mid.bits(n), q) << "element " << n;
      const std::uint16_t want = float_to_half_bits(fp8_bits_to_float(q, fp8) * descale, DType::bf16);
      ASSERT_EQ(out.bits(n), want) << "element " << n;
      input[static_cast<std::size_t>(n)] = src.value(n);
      output[static_cast<std::size_t>(n)] = out.value(n);
    }
    // Half an ulp of 3 (E4M3) or 2 (E5M2) mantissa bits, relative, plus bf16's own rounding.
    const double bound = fp8 == DType::e4m3 ? 0.07 : 0.13;
    EXPECT_LT(relative_error(output.data(), input.data(), static_cast<std::int64_t>(input.size())), bound);
  }
}

// --- FP8 gather / scatter (the GPU reference's conversions) -----------------------------------

std::vector<float> conversion_sweep(DType dtype) {
  std::vector<float> values;
  for (std::uint32_t bits = 0; bits < 0x7f800000u; bits += 4099) {
    values.push_back(float_of(bits));
    values.push_back(-float_of(bits));
  }
  // Every value, the midpoints between neighbours and the floats either side of them.
  for (unsigned b = 0; b + 1 < 0x7f; ++b) {
    const float low = fp8_bits_to_float(static_cast<std::uint8_t>(b), dtype);
    const float high = fp8_bits_to_float(static_cast<std::uint8_t>(b + 1), dtype);
    if (!std::isfinite(low) || !std::isfinite(high)) continue;
    const float mid = (low + high) / 2;
    for (float x : {low, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInf)}) {
      values.push_back(x);
      values.push_back(-x);
    }
  }
  for (float x : {464.0f, 465.0f, 61440.0f, 1e6f, kInf, -kInf, kNan, -kNan, float_of(0x7f800001u),
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()}) {
    values.push_back(x);
  }
  return values;
}

// scatter_from_float_gpu rounds every float as float_to_fp8_bits does, and gather_to_float_gpu
// widens every byte as fp8_bits_to_float does: the device and host codecs agree.
TEST(Fp8ScalingGpu, DeviceConversionsMatchHostCodec) {
  FUSEDATTN_REQUIRE_GPU();
  for (DType dtype : {DType::e4m3, DType::e5m2}) {
    SCOPED_TRACE(to_string(dtype));
    const std::vector<float> values = conversion_sweep(dtype);
    const auto n = static_cast<std::int64_t>(values.size());
    const TensorDesc desc = bhsd(dtype, 1, 1, 1, n);
    DeviceBuffer d_values = upload(values), d_fp8(bytes_of(desc)), d_back(values.size() * sizeof(float));
    scatter_from_float_gpu(desc, d_values.as<float>(), d_fp8.get(), nullptr);
    gather_to_float_gpu(desc, d_fp8.get(), d_back.as<float>(), nullptr);
    synchronize();
    const std::vector<std::uint8_t> bytes = copy_to_host(d_fp8.get(), d_fp8.bytes());
    const std::vector<float> back = download_floats(d_back);
    int failures = 0;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const std::uint8_t want = float_to_fp8_bits(values[i], dtype);
      // NaN is compared as a class: cuda_fp8.h writes 0x7F, but the encoding is not what matters.
      const bool nan = std::isnan(fp8_bits_to_float(want, dtype));
      const bool ok = nan ? std::isnan(fp8_bits_to_float(bytes[i], dtype)) : bytes[i] == want;
      if (!ok && ++failures <= 10) {
        ADD_FAILURE() << values[i] << " (bits " << std::hex << bits_of(values[i]) << "): device 0x" << int{bytes[i]}
                      << ", host 0x" << int{want} << std::dec;
      }
      if (!same_float(back[i], fp8_bits_to_float(bytes[i], dtype)) && ++failures <= 10) {
        ADD_FAILURE() << "byte 0x" << std::hex << int{bytes[i]} << std::dec << " widened to " << back[i];
      }
    }
    EXPECT_EQ(failures, 0);
  }
}

// Strided FP8 scatter and gather write and read only the tensor's own bytes.
TEST(Fp8ScalingGpu, GatherScatterStridedFp8) {
  FUSEDATTN_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (DType dtype : {DType::e4m3, DType::e5m2}) {
    // K's slice of a packed [b, s, 3, h, d] QKV buffer.
    const std::int64_t b = 2, h = 3, s = 7, d = 16;
    HostImage expected(make_desc(dtype, {b, h, s, d}, {s * 3 * h * d, d, 3 * h * d, 1}));
    const std::vector<float> values = rng.normal(expected.desc.elements(), 100.0f);
    for (std::int64_t n = 0; n < expected.desc.elements(); ++n) {
      expected.set_value(n, values[static_cast<std::size_t>(n)]);
    }
    DeviceBuffer d_values = upload(values), d_fp8 = upload(HostImage(expected.desc).bytes);
    DeviceBuffer d_back(values.size() * sizeof(float));
    scatter_from_float_gpu(expected.desc, d_values.as<float>(), d_fp8.get(), nullptr);
    gather_to_float_gpu(expected.desc, d_fp8.get(), d_back.as<float>(), nullptr);
    synchronize();
    const std::vector<std::uint8_t> got = copy_to_host(d_fp8.get(), d_fp8.bytes());
    const std::vector<float> back = download_floats(d_back);
    for (std::int64_t n = 0; n < expected.desc.elements(); ++n) {
      ASSERT_EQ(got[static_cast<std::size_t>(offset_of(expected.desc, n))], expected.bits(n)) << "element " << n;
      ASSERT_TRUE(same_float(back[static_cast<std::size_t>(n)], expected.value(n))) << "element " << n;
    }
    expected.expect_gaps_untouched(got);
  }
}

// --- input checks -----------------------------------------------------------------------------

template <class Call>
void expect_invalid(Call&& call, const std::string& field, const std::string& value) {
  try {
    call();
    ADD_FAILURE() << "no InvalidArgument naming " << field;
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), field) << e.what();
    EXPECT_EQ(e.value(), value) << e.what();
  }
}

// The checks throw before any CUDA call, so these need no GPU: the pointers (host addresses) are
// never dereferenced.
TEST(Fp8ScalingChecks, BadInputsAreRejectedNamingTheField) {
  float scalars[4] = {};
  std::uint8_t bytes[16] = {};
  float* f = scalars;
  const TensorDesc bf16 = bhsd(DType::bf16, 1, 2, 3, 4), e4m3 = bhsd(DType::e4m3, 1, 2, 3, 4);
  expect_invalid([&] { quantize_fp8(e4m3, bytes, e4m3, bytes, f, f, nullptr); }, "src_desc.dtype", "e4m3");
  expect_invalid([&] { quantize_fp8(bf16, bytes, bf16, bytes, f, f, nullptr); }, "dst_desc.dtype", "bf16");
  expect_invalid([&] { quantize_fp8(bf16, bytes, bhsd(DType::e4m3, 1, 2, 3, 8), bytes, f, f, nullptr); },
                 "dst_desc.dims", to_string(bhsd(DType::e4m3, 1, 2, 3, 8)));
  const TensorDesc ragged = make_desc(DType::bf16, {2, 2, 3, 4}, {0, 4, 8, 1});
  expect_invalid([&] { quantize_fp8(ragged, bytes, bhsd(DType::e4m3, 2, 2, 3, 4), bytes, f, f, nullptr); }, "src_desc",
                 to_string(ragged));
  expect_invalid([&] { quantize_fp8(bf16, bytes, e4m3, bytes, nullptr, f, nullptr); }, "scale", "null");
  expect_invalid([&] { dequantize_fp8(bf16, bytes, bf16, bytes, f, nullptr); }, "src_desc.dtype", "bf16");
  expect_invalid([&] { dequantize_fp8(e4m3, bytes, bhsd(DType::e5m2, 1, 2, 3, 4), bytes, f, nullptr); },
                 "dst_desc.dtype", "e5m2");
  expect_invalid([&] { measure_amax(make_desc(DType::f16, {1, -1, 3, 4}, {12, 12, 4, 1}), bytes, f, nullptr); },
                 "desc", to_string(make_desc(DType::f16, {1, -1, 3, 4}, {12, 12, 4, 1})));
  expect_invalid([&] { measure_amax(bf16, bytes, nullptr, nullptr); }, "amax", "null");
  expect_invalid([&] { scale_from_amax(f, DType::f16, 0, f, f, nullptr); }, "dtype", "f16");
  expect_invalid([&] { update_delayed_scaling(f, f, 4, f, DType::bf16, 0, f, f, nullptr); }, "dtype", "bf16");
  expect_invalid([&] { update_delayed_scaling(f, f, 0, f, DType::e4m3, 0, f, f, nullptr); }, "length", "0");
}

TEST(Fp8ScalingChecks, MessageNamesFieldValueAndRequirement) {
  float scale = 1.0f;
  std::uint8_t bytes[16] = {};
  const TensorDesc e5m2 = bhsd(DType::e5m2, 1, 1, 2, 4);
  try {
    quantize_fp8(e5m2, bytes, e5m2, bytes, &scale, nullptr, nullptr);
    ADD_FAILURE() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "src_desc.dtype = e5m2: must be f16 or bf16 to quantize");
  }
}

// A rejected call enqueues nothing: the amax it would have zeroed keeps its old value.
TEST(Fp8ScalingGpu, RejectedQuantizeEnqueuesNothing) {
  FUSEDATTN_REQUIRE_GPU();
  const TensorDesc src = bhsd(DType::bf16, 1, 1, 4, 16), bad_dst = bhsd(DType::f16, 1, 1, 4, 16);
  DeviceBuffer d_src(bytes_of(src)), d_dst(bytes_of(bad_dst)), d_scale = upload(std::vector<float>{1.0f});
  DeviceBuffer d_amax = upload(std::vector<float>{42.0f});
  EXPECT_THROW(quantize_fp8(src, d_src.get(), bad_dst, d_dst.get(), d_scale.as<float>(), d_amax.as<float>(), nullptr),
               InvalidArgument);
  synchronize();
  EXPECT_EQ(download_scalar(d_amax), 42.0f);
}

}  // namespace
}  // namespace fusedattn
