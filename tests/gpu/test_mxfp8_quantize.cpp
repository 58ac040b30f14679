// GPU tier: the MXFP8 device kernels against the host reference, bit for bit: FP8 bytes, swizzled
// E8M0 scales (padding included) and the dequantized 16-bit values, for random inputs whose
// strides are not contiguous, blocked along d and along s. Without a GPU each test skips and says why.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "fusedattn/errors.h"
#include "fusedattn/mxfp8.h"
#include "fusedattn/reference.h"
#include "device_copy.h"
#include "gpu_skip.h"
#include "testing/cuda_check.h"
#include "testing/device_buffer.h"

namespace fusedattn {
namespace {

using check::DeviceBuffer;

// Strides for logical [b, h, s, d] dims stored with the axes in `order` (outermost first), the
// innermost axis's rows padded by `gap` elements, so the tensor is not contiguous.
TensorDesc strided(DType dtype, const std::array<std::int64_t, 4>& dims, const std::array<int, 4>& order,
                   std::int64_t gap) {
  TensorDesc desc;
  desc.dtype = dtype;
  desc.dims = dims;
  std::int64_t stride = 1;
  for (int i = 3; i >= 0; --i) {
    desc.strides[order[i]] = stride;
    stride *= dims[order[i]] + (i == 3 ? gap : 0);
  }
  return desc;
}

constexpr std::array<int, 4> kSbhd{kSeq, kBatch, kHead, kDim};
constexpr std::array<int, 4> kBhsd{kBatch, kHead, kSeq, kDim};
constexpr std::array<int, 4> kBhds{kBatch, kHead, kDim, kSeq};  // the transposed copies: s fastest

std::int64_t offset_of(const TensorDesc& desc, std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
  return b * desc.strides[kBatch] + h * desc.strides[kHead] + s * desc.strides[kSeq] + d * desc.strides[kDim];
}

DeviceBuffer upload(const std::vector<std::uint8_t>& bytes) {
  DeviceBuffer buffer(bytes.size());
  check::check_cuda(cudaMemcpy(buffer.get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  return buffer;
}

DeviceBuffer poisoned(std::size_t bytes, int value) {
  DeviceBuffer buffer(bytes);
  check::check_cuda(cudaMemset(buffer.get(), value, bytes), "cudaMemset(poison)");
  return buffer;
}

struct Case {
  std::string name;
  DType source, element;
  std::array<std::int64_t, 4> dims;
  Axis blocked;
  TensorDesc src, dst, back;  // the 16-bit input, the FP8 output, the dequantized 16-bit output
};

Case make_case(const std::string& name, DType source, DType element, std::array<std::int64_t, 4> dims, Axis blocked,
               std::array<int, 4> src_order, std::array<int, 4> dst_order) {
  return {name,
          source,
          element,
          dims,
          blocked,
          strided(source, dims, src_order, 8),
          strided(element, dims, dst_order, 16),
          strided(source, dims, kSbhd, 3)};
}

// Values over ~40 binades with random signs, a few exact zeros, whole all-zero stretches, and
// each 32-run at its own magnitude.
std::vector<std::uint8_t> random_source(const TensorDesc& desc, std::mt19937& engine) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(desc.extent()) * 2, 0);
  for (std::int64_t b = 0; b < desc.batch(); ++b)
    for (std::int64_t h = 0; h < desc.heads(); ++h)
      for (std::int64_t s = 0; s < desc.seq(); ++s) {
        const double base = 40.0 * unit(engine) - 20.0;
        for (std::int64_t d = 0; d < desc.head_dim(); ++d) {
          const double u = unit(engine);
          double x = u < 0.03 || (s % 17 == 5) ? 0.0 : std::exp2(base - 8.0 * unit(engine)) * (1.0 + unit(engine));
          if (unit(engine) < 0.5) x = -x;
          const std::uint16_t bits = float_to_half_bits(static_cast<float>(x), desc.dtype);
          std::memcpy(bytes.data() + 2 * offset_of(desc, b, h, s, d), &bits, 2);
        }
      }
  return bytes;
}

float value_at(const std::vector<std::uint8_t>& bytes, const TensorDesc& desc, std::int64_t b, std::int64_t h,
               std::int64_t s, std::int64_t d) {
  std::uint16_t bits;
  std::memcpy(&bits, bytes.data() + 2 * offset_of(desc, b, h, s, d), 2);
  return half_bits_to_float(bits, desc.dtype);
}

std::vector<Case> cases() {
  return {
      make_case("q_bf16_e4m3_sbhd_to_bhsd", DType::bf16, DType::e4m3, {2, 3, 150, 72}, kDim, kSbhd, kBhsd),
      make_case("q_t_bf16_e4m3_sbhd_to_bhds", DType::bf16, DType::e4m3, {2, 3, 150, 72}, kSeq, kSbhd, kBhds),
      make_case("v_bf16_e5m2_bhds_to_bhds", DType::bf16, DType::e5m2, {1, 2, 129, 128}, kSeq, kBhds, kBhds),
      make_case("k_f16_e5m2_bhds_to_sbhd", DType::f16, DType::e5m2, {3, 1, 40, 256}, kDim, kBhds, kSbhd),
      make_case("tiny_bf16_e4m3", DType::bf16, DType::e4m3, {1, 1, 1, 7}, kDim, kSbhd, kBhsd),
  };
}

TEST(GpuMxfp8, QuantizeMatchesTheHostReferenceBitForBit) {
  FUSEDATTN_REQUIRE_GPU();
  const unsigned seed = std::random_device{}();
  std::mt19937 engine(seed);
  for (const Case& c : cases()) {
    const std::string where = c.name + " (src " + to_string(c.src) + ", dst " + to_string(c.dst) + "), random seed " +
                              std::to_string(seed);
    const Mxfp8ScaleShape shape = mxfp8_scale_shape(c.dims, c.blocked);
    const std::vector<std::uint8_t> src_bytes = random_source(c.src, engine);
    const DeviceBuffer src = upload(src_bytes);
    const DeviceBuffer dst = poisoned(bytes_of(c.dst), 0xff);
    const DeviceBuffer scales = poisoned(static_cast<std::size_t>(shape.swizzled_bytes()), 0xaa);
    const DeviceBuffer back = poisoned(bytes_of(c.back), 0xff);
    quantize_mxfp8(c.src, src.get(), c.dst, dst.get(), c.blocked, scales.as<std::uint8_t>(), nullptr);
    dequantize_mxfp8(c.dst, dst.get(), scales.as<std::uint8_t>(), c.blocked, c.back, back.get(), nullptr);
    check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const std::vector<std::uint8_t> got_data = copy_to_host(dst.get(), bytes_of(c.dst));
    const std::vector<std::uint8_t> got_scales = copy_to_host(scales.get(), static_cast<std::size_t>(shape.swizzled_bytes()));
    const std::vector<std::uint8_t> got_back = copy_to_host(back.get(), bytes_of(c.back));

    const std::int64_t cols = c.blocked == kDim ? c.dims[kDim] : c.dims[kSeq];
    for (std::int64_t b = 0; b < c.dims[kBatch]; ++b) {
      for (std::int64_t h = 0; h < c.dims[kHead]; ++h) {
        // The head as the host reference's row-major matrix, blocks along its columns.
        std::vector<float> matrix(static_cast<std::size_t>(shape.rows * cols));
        for (std::int64_t r = 0; r < shape.rows; ++r)
          for (std::int64_t k = 0; k < cols; ++k)
            matrix[r * cols + k] = c.blocked == kDim ? value_at(src_bytes, c.src, b, h, r, k)
                                                     : value_at(src_bytes, c.src, b, h, k, r);
        const Mxfp8HostMatrix ref = mxfp8_quantize_host(matrix, shape.rows, cols, c.element);
        const std::vector<float> ref_back = mxfp8_dequantize_host(ref);
        const std::vector<std::uint8_t> ref_scales = mxfp8_swizzle_scales(ref.scales, shape.rows, shape.blocks);
        const std::int64_t base = (b * c.dims[kHead] + h) * shape.matrix_bytes();
        for (std::int64_t i = 0; i < shape.matrix_bytes(); ++i) {
          ASSERT_EQ(got_scales[base + i], ref_scales[i]) << "scale byte " << i << " of head " << b << "," << h << ", "
                                                         << where;
        }
        for (std::int64_t r = 0; r < shape.rows; ++r) {
          for (std::int64_t k = 0; k < cols; ++k) {
            const std::int64_t s = c.blocked == kDim ? r : k, d = c.blocked == kDim ? k : r;
            const std::uint8_t want = ref.data[r * cols + k];
            ASSERT_EQ(got_data[offset_of(c.dst, b, h, s, d)], want)
                << "element " << b << "," << h << "," << s << "," << d << " of "
                << matrix[r * cols + k] << ", " << where;
            std::uint16_t got_bits;
            std::memcpy(&got_bits, got_back.data() + 2 * offset_of(c.back, b, h, s, d), 2);
            // NaN is NaN: the device's conversions write their own NaN payload (0x7fff).
            const bool both_nan = std::isnan(ref_back[r * cols + k]) && std::isnan(half_bits_to_float(got_bits, c.source));
            if (!both_nan) {
              ASSERT_EQ(got_bits, float_to_half_bits(ref_back[r * cols + k], c.source))
                  << "dequantized " << b << "," << h << "," << s << "," << d << ", " << where;
            }
          }
        }
      }
    }
  }
}

// A block holding a NaN or an infinity gets the NaN scale on the device too, and reads back NaN.
TEST(GpuMxfp8, NanAndInfinityBlocksGetTheNanScale) {
  FUSEDATTN_REQUIRE_GPU();
  const std::array<std::int64_t, 4> dims{1, 1, 2, 64};
  const TensorDesc src = strided(DType::bf16, dims, kBhsd, 0);
  const TensorDesc dst = strided(DType::e4m3, dims, kBhsd, 0);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(src.extent()) * 2, 0);
  auto put = [&](std::int64_t s, std::int64_t d, float x) {
    const std::uint16_t bits = float_to_half_bits(x, DType::bf16);
    std::memcpy(bytes.data() + 2 * offset_of(src, 0, 0, s, d), &bits, 2);
  };
  for (std::int64_t d = 0; d < 64; ++d) put(0, d, 1.0f), put(1, d, 2.0f);
  put(0, 3, NAN);       // row 0, block 0
  put(1, 40, -INFINITY);  // row 1, block 1
  const DeviceBuffer in = upload(bytes);
  const DeviceBuffer out = poisoned(bytes_of(dst), 0);
  const Mxfp8ScaleShape shape = mxfp8_scale_shape(dims, kDim);
  const DeviceBuffer scales = poisoned(static_cast<std::size_t>(shape.swizzled_bytes()), 0xaa);
  quantize_mxfp8(src, in.get(), dst, out.get(), kDim, scales.as<std::uint8_t>(), nullptr);
  check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const std::vector<std::uint8_t> got = copy_to_host(scales.get(), static_cast<std::size_t>(shape.swizzled_bytes()));
  EXPECT_EQ(got[mxfp8_swizzled_offset(0, 0, 4)], 0xff);
  EXPECT_EQ(got[mxfp8_swizzled_offset(0, 1, 4)], 119);  // amax 1: 2^-8
  EXPECT_EQ(got[mxfp8_swizzled_offset(1, 0, 4)], 120);  // amax 2: 2^-7
  EXPECT_EQ(got[mxfp8_swizzled_offset(1, 1, 4)], 0xff);
  EXPECT_EQ(got[mxfp8_swizzled_offset(2, 0, 4)], 0);    // padding
}

// The checks run before any GPU work, so they hold without a GPU too.
TEST(GpuMxfp8, RejectsBadTensorsBeforeAnyGpuWork) {
  const std::array<std::int64_t, 4> dims{1, 2, 64, 64};
  const TensorDesc bf16 = strided(DType::bf16, dims, kBhsd, 0);
  const TensorDesc e4m3 = strided(DType::e4m3, dims, kBhsd, 0);
  auto field_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const InvalidArgument& e) {
      return e.field();
    }
    return "(no InvalidArgument)";
  };
  EXPECT_EQ(field_of([&] { quantize_mxfp8(e4m3, nullptr, e4m3, nullptr, kDim, nullptr, nullptr); }), "src.dtype");
  EXPECT_EQ(field_of([&] { quantize_mxfp8(bf16, nullptr, bf16, nullptr, kDim, nullptr, nullptr); }), "dst.dtype");
  TensorDesc shorter = e4m3;
  shorter.dims[kSeq] = 32;
  EXPECT_EQ(field_of([&] { quantize_mxfp8(bf16, nullptr, shorter, nullptr, kDim, nullptr, nullptr); }), "dst.dims");
  EXPECT_EQ(field_of([&] { quantize_mxfp8(bf16, nullptr, e4m3, nullptr, kHead, nullptr, nullptr); }), "blocked");
  TensorDesc ragged = bf16;
  ragged.strides[kBatch] = 0;
  EXPECT_EQ(field_of([&] { quantize_mxfp8(ragged, nullptr, e4m3, nullptr, kDim, nullptr, nullptr); }), "src");
  EXPECT_EQ(field_of([&] { dequantize_mxfp8(bf16, nullptr, nullptr, kDim, bf16, nullptr, nullptr); }), "src.dtype");
  EXPECT_EQ(field_of([&] { dequantize_mxfp8(e4m3, nullptr, nullptr, kDim, e4m3, nullptr, nullptr); }), "dst.dtype");
}

}  // namespace
}  // namespace fusedattn
