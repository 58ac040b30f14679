// GPU tier: the FP8 element kernels' memory-order path (src/exec/fp8_rows.cu) and the calls that
// take several tensors (quantize_fp8_many, dequantize_fp8_many), byte for byte against the host
// codecs: dense tensors in one axis order (groups of 16, and of 8 where the length allows no more),
// packed views whose rows have gaps between them (which must stay untouched), a base pointer off a
// group's alignment (the logical walk takes it), and Q, K, V of mixed layouts in one call.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fp8_images.h"
#include "fusedattn/errors.h"
#include "fusedattn/fp8.h"
#include "gpu_skip.h"

namespace fusedattn {
namespace {

using namespace fp8_test;  // NOLINT: the helpers shared with test_fp8_scaling.cpp

// A [b, h, s, d] view of a [b, s, parts, h, d] buffer's first part: Q of a packed QKV buffer, rows
// of h * d elements with 2 * h * d elements of gap after each.
TensorDesc packed_part(DType dtype, std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d, int parts) {
  return make_desc(dtype, {b, h, s, d}, {s * parts * h * d, d, parts * h * d, 1});
}

// An image of `desc` filled from a normal draw with the delicate values planted among it.
HostImage random_image(const TensorDesc& desc, Rng& rng, float sigma) {
  HostImage image(desc);
  const std::vector<float> values = rng.normal(desc.elements(), sigma);
  for (std::int64_t n = 0; n < desc.elements(); ++n) image.set_value(n, values[static_cast<std::size_t>(n)]);
  const std::vector<float> planted = {0.0f, -0.0f, 0.53125f, -0.59375f, 232.0f, 30720.0f, 1e-5f, 1e6f, -1e6f,
                                      std::numeric_limits<float>::infinity(), -300.0f};
  for (std::size_t k = 0; k < planted.size() && static_cast<std::int64_t>(k * 31 + 3) < desc.elements(); ++k) {
    image.set_value(static_cast<std::int64_t>(k * 31 + 3), planted[k]);
  }
  return image;
}

// quantize_fp8 of `src_desc` into `dst_desc` (offset by `shift` elements from an aligned buffer in
// both), every element against the host codec, the gaps untouched, the amax the host's.
void check_quantize(const TensorDesc& src_desc, const TensorDesc& dst_desc, float scale, std::int64_t shift) {
  Rng rng;
  SCOPED_TRACE(rng.trace() + ": " + to_string(src_desc) + " -> " + to_string(dst_desc) + ", scale " +
               std::to_string(scale) + ", shift " + std::to_string(shift));
  HostImage src = random_image(src_desc, rng, 30.0f), expected(dst_desc);
  for (std::int64_t n = 0; n < src_desc.elements(); ++n) expected.set_value(n, src.value(n) * scale);
  const std::size_t src_shift = static_cast<std::size_t>(shift) * size_of(src_desc.dtype);
  const std::size_t dst_shift = static_cast<std::size_t>(shift) * size_of(dst_desc.dtype);
  std::vector<std::uint8_t> src_bytes(src_shift, kPoison), dst_bytes(dst_shift, kPoison);
  src_bytes.insert(src_bytes.end(), src.bytes.begin(), src.bytes.end());
  dst_bytes.insert(dst_bytes.end(), expected.bytes.size(), kPoison);
  DeviceBuffer d_src = upload(src_bytes), d_dst = upload(dst_bytes);
  DeviceBuffer d_scale = upload(std::vector<float>{scale}), d_amax = poisoned_scalar();
  quantize_fp8(src_desc, static_cast<const std::uint8_t*>(d_src.get()) + src_shift, dst_desc,
               static_cast<std::uint8_t*>(d_dst.get()) + dst_shift, d_scale.as<float>(), d_amax.as<float>(), nullptr);
  synchronize();
  const std::vector<std::uint8_t> all = copy_to_host(d_dst.get(), d_dst.bytes());
  const std::vector<std::uint8_t> got(all.begin() + static_cast<std::ptrdiff_t>(dst_shift), all.end());
  for (std::int64_t n = 0; n < src_desc.elements(); ++n) {
    ASSERT_EQ(got[static_cast<std::size_t>(offset_of(dst_desc, n))], expected.bits(n))
        << "element " << n << ": " << src.value(n) << " * " << scale;
  }
  expected.expect_gaps_untouched(got);
  EXPECT_EQ(bits_of(download_scalar(d_amax)), bits_of(host_amax(src)));
}

const DType kSixteen[] = {DType::bf16, DType::f16};
const DType kFp8[] = {DType::e4m3, DType::e5m2};

TEST(Fp8RowsGpu, DenseTensorsInOneOrderMatchTheHostCodec) {
  FUSEDATTN_REQUIRE_GPU();
  for (DType wide : kSixteen) {
    for (DType fp8 : kFp8) {
      check_quantize(bshd(wide, 2, 4, 33, 64), bshd(fp8, 2, 4, 33, 64), 3.0f, 0);  // groups of 16
      check_quantize(bhsd(wide, 1, 3, 5, 24), bhsd(fp8, 1, 3, 5, 24), 0.7f, 0);    // 360 elements: groups of 8
      check_quantize(sbhd(wide, 3, 2, 17, 128), sbhd(fp8, 3, 2, 17, 128), 40.0f, 0);
    }
  }
}

TEST(Fp8RowsGpu, PackedViewsWriteTheirRowsAndLeaveTheGaps) {
  FUSEDATTN_REQUIRE_GPU();
  for (DType fp8 : kFp8) {
    check_quantize(packed_part(DType::bf16, 2, 4, 19, 64, 3), packed_part(fp8, 2, 4, 19, 64, 3), 2.0f, 0);
    check_quantize(packed_part(DType::f16, 1, 2, 7, 40, 2), packed_part(fp8, 1, 2, 7, 40, 2), 5.0f, 0);  // rows of 80
  }
}

TEST(Fp8RowsGpu, PointersOffAGroupTakeTheLogicalWalkWithTheSameBytes) {
  FUSEDATTN_REQUIRE_GPU();
  check_quantize(bshd(DType::bf16, 1, 2, 9, 64), bshd(DType::e4m3, 1, 2, 9, 64), 1.5f, 1);
  check_quantize(bshd(DType::f16, 1, 2, 9, 64), bshd(DType::e5m2, 1, 2, 9, 64), 1.5f, 3);
}

// Q, K, V of one forward (bshd, a packed view, sbhd into bshd: the last takes the logical walk) in
// one call equal three single calls, bytes and amaxes; dequantizing them back the same.
TEST(Fp8RowsGpu, SeveralTensorsInOneCallEqualOneCallEach) {
  FUSEDATTN_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const TensorDesc sources[3] = {bshd(DType::bf16, 2, 4, 40, 64), packed_part(DType::bf16, 2, 4, 40, 64, 3),
                                 sbhd(DType::bf16, 2, 4, 40, 64)};
  const TensorDesc targets[3] = {bshd(DType::e4m3, 2, 4, 40, 64), packed_part(DType::e4m3, 2, 4, 40, 64, 3),
                                 bshd(DType::e4m3, 2, 4, 40, 64)};
  std::vector<DeviceBuffer> src, together, alone, scale, amax_together, amax_alone;
  std::vector<Fp8Quantization> jobs;
  for (int i = 0; i < 3; ++i) {
    src.push_back(upload(random_image(sources[i], rng, 10.0f + 20.0f * i).bytes));
    together.push_back(upload(HostImage(targets[i]).bytes));
    alone.push_back(upload(HostImage(targets[i]).bytes));
    scale.push_back(upload(std::vector<float>{4.0f + i}));
    amax_together.push_back(poisoned_scalar());
    amax_alone.push_back(poisoned_scalar());
  }
  for (int i = 0; i < 3; ++i) {
    jobs.push_back({sources[i], src[i].get(), targets[i], together[i].get(), scale[i].as<float>(),
                    amax_together[i].as<float>()});
    quantize_fp8(sources[i], src[i].get(), targets[i], alone[i].get(), scale[i].as<float>(), amax_alone[i].as<float>(),
                 nullptr);
  }
  quantize_fp8_many(jobs.data(), 3, nullptr);
  std::vector<DeviceBuffer> back_together, back_alone;
  std::vector<Fp8Dequantization> back_jobs;
  for (int i = 0; i < 3; ++i) {
    back_together.push_back(upload(HostImage(sources[i]).bytes));
    back_alone.push_back(upload(HostImage(sources[i]).bytes));
    back_jobs.push_back({targets[i], together[i].get(), sources[i], back_together[i].get(), scale[i].as<float>()});
    dequantize_fp8(targets[i], alone[i].get(), sources[i], back_alone[i].get(), scale[i].as<float>(), nullptr);
  }
  dequantize_fp8_many(back_jobs.data(), 3, nullptr);
  synchronize();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(copy_to_host(together[i].get(), together[i].bytes()), copy_to_host(alone[i].get(), alone[i].bytes()))
        << "tensor " << i;
    EXPECT_EQ(bits_of(download_scalar(amax_together[i])), bits_of(download_scalar(amax_alone[i]))) << "tensor " << i;
    EXPECT_EQ(copy_to_host(back_together[i].get(), back_together[i].bytes()),
              copy_to_host(back_alone[i].get(), back_alone[i].bytes()))
        << "tensor " << i;
  }
}

// Amaxes of several tensors (16-bit and FP8, dense, packed and in another order) in one call,
// side by side in one buffer as a state keeps them (one memset zeroes them): each equals the host's.
TEST(Fp8RowsGpu, AmaxesOfSeveralTensorsInOneCallMatchTheHost) {
  FUSEDATTN_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const TensorDesc descs[4] = {bshd(DType::bf16, 2, 4, 40, 64), packed_part(DType::f16, 2, 4, 40, 64, 3),
                               sbhd(DType::bf16, 2, 4, 40, 64), bshd(DType::e4m3, 1, 2, 24, 64)};
  std::vector<HostImage> images;
  std::vector<DeviceBuffer> data;
  for (int i = 0; i < 4; ++i) {
    images.push_back(random_image(descs[i], rng, 3.0f));
    for (std::int64_t at : {127, 158, 220, 251, 282, 313}) {
      images.back().set_value(at, 0.5f);  // the large planted values (and infinity) made small, so
    }                                     // that each amax is the one planted below
    images.back().set_value(100 + 7 * i, -50.0f * static_cast<float>(i + 1));
    data.push_back(upload(images.back().bytes));
  }
  DeviceBuffer amaxes = upload(std::vector<float>(4, kNan));
  std::vector<Fp8Amax> jobs;
  for (int i = 0; i < 4; ++i) jobs.push_back({descs[i], data[i].get(), amaxes.as<float>() + i});
  measure_amax_many(jobs.data(), 4, nullptr);
  synchronize();
  const std::vector<float> got = download_floats(amaxes);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bits_of(got[i]), bits_of(host_amax(images[i]))) << "tensor " << i;
  jobs[2].desc = make_desc(DType::bf16, {2, 4, 40, 64}, {0, 64, 256, 1});  // ragged: refused by its index
  try {
    measure_amax_many(jobs.data(), 4, nullptr);
    FAIL() << "a ragged tensor was measured";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.field(), "tensors[2].desc");
  }
}

// A bad tensor among several is named by its index, and nothing of the call is enqueued.
TEST(Fp8RowsGpu, ABadTensorAmongSeveralIsNamedAndNothingRuns) {
  FUSEDATTN_REQUIRE_GPU();
  const TensorDesc src = bshd(DType::bf16, 1, 2, 8, 64), dst = bshd(DType::e4m3, 1, 2, 8, 64);
  DeviceBuffer d_src = upload(HostImage(src).bytes), d_dst = upload(HostImage(dst).bytes);
  DeviceBuffer d_scale = upload(std::vector<float>{1.0f}), d_amax = poisoned_scalar();
  const Fp8Quantization jobs[2] = {{src, d_src.get(), dst, d_dst.get(), d_scale.as<float>(), d_amax.as<float>()},
                                   {src, d_src.get(), src, d_dst.get(), d_scale.as<float>(), nullptr}};
  try {
    quantize_fp8_many(jobs, 2, nullptr);
    FAIL() << "a bf16 destination was taken";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.field(), "tensors[1].dst_desc.dtype");
  }
  synchronize();
  EXPECT_EQ(copy_to_host(d_dst.get(), d_dst.bytes()), HostImage(dst).bytes);  // the first was not run
  EXPECT_TRUE(std::isnan(download_scalar(d_amax)));                           // nor its amax zeroed
}

}  // namespace
}  // namespace fusedattn
