// Host MXFP8 quantization of a float matrix and its inverse: the reference the device kernels
// (src/exec/mxfp8_quantize.cu) are checked against, bit for bit.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "fusedattn/errors.h"
#include "fusedattn/fp8.h"
#include "fusedattn/mxfp8.h"
#include "spec/mxfp8_rule.h"

namespace fusedattn {
namespace {

void require_matrix(std::int64_t rows, std::int64_t cols, DType element) {
  if (rows < 0) throw InvalidArgument("rows", std::to_string(rows), ">= 0");
  if (cols < 0) throw InvalidArgument("cols", std::to_string(cols), ">= 0");
  if (!is_fp8(element)) {
    throw InvalidArgument("element", to_string(element), "e4m3 or e5m2 (the element types of MXFP8)");
  }
}

}  // namespace

Mxfp8HostMatrix mxfp8_quantize_host(const std::vector<float>& values, std::int64_t rows, std::int64_t cols,
                                    DType element) {
  require_matrix(rows, cols, element);
  if (static_cast<std::int64_t>(values.size()) != rows * cols) {
    throw InvalidArgument("values", std::to_string(values.size()) + " values",
                          "rows * cols = " + std::to_string(rows * cols) + " values");
  }
  const std::int64_t blocks = (cols + kMxfp8BlockSize - 1) / kMxfp8BlockSize;
  Mxfp8HostMatrix out;
  out.rows = rows;
  out.cols = cols;
  out.element = element;
  out.data.resize(values.size());
  out.scales.resize(static_cast<std::size_t>(rows * blocks));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < blocks; ++j) {
      const std::int64_t first = r * cols + j * kMxfp8BlockSize;
      const std::int64_t last = r * cols + std::min(cols, (j + 1) * kMxfp8BlockSize);
      // max |x| that remembers a NaN (std::max would drop it, depending on the argument order)
      float amax = 0.0f;
      for (std::int64_t i = first; i < last; ++i) {
        const float magnitude = std::fabs(values[static_cast<std::size_t>(i)]);
        amax = std::isnan(magnitude) || std::isnan(amax) ? std::numeric_limits<float>::quiet_NaN()
                                                         : std::max(amax, magnitude);
      }
      const std::uint8_t bits = detail::mx_scale_bits_rule(amax, mxfp8_element_emax(element));
      out.scales[static_cast<std::size_t>(r * blocks + j)] = bits;
      // A NaN block stores NaN elements: the scale alone already makes it read back NaN.
      const float inverse = bits == detail::kE8M0Nan ? std::numeric_limits<float>::quiet_NaN()
                                                     : detail::mx_inverse_scale(bits);
      for (std::int64_t i = first; i < last; ++i) {
        out.data[static_cast<std::size_t>(i)] = float_to_fp8_bits(values[static_cast<std::size_t>(i)] * inverse, element);
      }
    }
  }
  return out;
}

std::vector<float> mxfp8_dequantize_host(const Mxfp8HostMatrix& matrix) {
  require_matrix(matrix.rows, matrix.cols, matrix.element);
  const std::int64_t blocks = (matrix.cols + kMxfp8BlockSize - 1) / kMxfp8BlockSize;
  if (static_cast<std::int64_t>(matrix.data.size()) != matrix.rows * matrix.cols) {
    throw InvalidArgument("data", std::to_string(matrix.data.size()) + " bytes",
                          "rows * cols = " + std::to_string(matrix.rows * matrix.cols) + " bytes");
  }
  if (static_cast<std::int64_t>(matrix.scales.size()) != matrix.rows * blocks) {
    throw InvalidArgument("scales", std::to_string(matrix.scales.size()) + " bytes",
                          "rows * ceil(cols / 32) = " + std::to_string(matrix.rows * blocks) + " bytes");
  }
  std::vector<float> out(matrix.data.size());
  for (std::int64_t r = 0; r < matrix.rows; ++r) {
    for (std::int64_t c = 0; c < matrix.cols; ++c) {
      const auto i = static_cast<std::size_t>(r * matrix.cols + c);
      const std::uint8_t bits = matrix.scales[static_cast<std::size_t>(r * blocks + c / kMxfp8BlockSize)];
      out[i] = detail::mx_descale(fp8_bits_to_float(matrix.data[i], matrix.element), bits);
    }
  }
  return out;
}

}  // namespace fusedattn
