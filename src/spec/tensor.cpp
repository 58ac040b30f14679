// Tensor descriptors: element types, the "bf16[dims]/[strides]" text form and canonical strides.
#include "fusedattn/tensor.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <string_view>

#include "fusedattn/errors.h"
#include "spec/text.h"

namespace fusedattn {
namespace {

constexpr const char* kDtypeChoices =
    "one of f16 (also fp16, half, float16), bf16 (also bfloat16), e4m3 (also fp8_e4m3, float8_e4m3fn) or e5m2 (also "
    "fp8_e5m2, float8_e5m2)";
constexpr const char* kDescForm = "the form bf16[b,h,s,d]/[stride_b,stride_h,stride_s,stride_d]";

std::optional<DType> lookup_dtype(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  if (text == "f16" || text == "fp16" || text == "half" || text == "float16") return DType::f16;
  if (text == "bf16" || text == "bfloat16") return DType::bf16;
  // float8_e4m3fn and float8_e5m2: PyTorch's and JAX's names.
  if (text == "e4m3" || text == "fp8_e4m3" || text == "float8_e4m3fn") return DType::e4m3;
  if (text == "e5m2" || text == "fp8_e5m2" || text == "float8_e5m2") return DType::e5m2;
  return std::nullopt;
}

// Exactly four comma-separated integers; anything else (3 or 5 items, blanks) is malformed.
std::optional<std::array<std::int64_t, 4>> parse_four(std::string_view text) {
  std::array<std::int64_t, 4> out{};
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::size_t comma = text.find(',');
    bool last = i + 1 == out.size();
    if (last != (comma == std::string_view::npos)) return std::nullopt;
    auto value = detail::parse_int64(text.substr(0, comma));
    if (!value) return std::nullopt;
    out[i] = *value;
    if (!last) text.remove_prefix(comma + 1);
  }
  return out;
}

}  // namespace

std::size_t size_of(DType dtype) noexcept {
  switch (dtype) {
    case DType::f16:
    case DType::bf16: return 2;
    case DType::e4m3:
    case DType::e5m2: return 1;
  }
  return 0;
}

const char* to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
  }
  return "unknown";
}

DType parse_dtype(const std::string& text, const std::string& field) {
  if (auto dtype = lookup_dtype(text)) return *dtype;
  throw InvalidArgument(field, text, kDtypeChoices);
}

// Negative strides are accepted here (validate() rejects them) so that extent() stays a plain
// fact about any descriptor: the span between the lowest and the highest addressed element.
std::int64_t TensorDesc::extent() const noexcept {
  std::int64_t low = 0, high = 0;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] <= 0) return 0;
    std::int64_t span = (dims[i] - 1) * strides[i];
    (span < 0 ? low : high) += span;
  }
  return high - low + 1;
}

std::string to_string(const TensorDesc& desc) {
  return std::string(to_string(desc.dtype)) + detail::format_list(desc.dims) + "/" + detail::format_list(desc.strides);
}

TensorDesc parse_tensor_desc(const std::string& text, const std::string& field) {
  auto malformed = [&](const std::string& what) { return InvalidArgument(field, text, what + "; expected " + kDescForm); };
  std::string_view rest(text);
  std::size_t open = rest.find('[');
  if (open == std::string_view::npos) throw malformed("no '[' after the dtype");
  auto dtype = lookup_dtype(std::string(rest.substr(0, open)));
  if (!dtype) throw malformed("dtype '" + std::string(rest.substr(0, open)) + "' is not " + kDtypeChoices);
  rest.remove_prefix(open + 1);

  std::size_t middle = rest.find("]/[");
  if (middle == std::string_view::npos) throw malformed("no \"]/[\" between the dims and the strides");
  if (rest.empty() || rest.back() != ']') throw malformed("no ']' closing the strides");
  auto dims = parse_four(rest.substr(0, middle));
  if (!dims) throw malformed("the dims are not four comma-separated integers");
  auto strides = parse_four(rest.substr(middle + 3, rest.size() - middle - 4));
  if (!strides) throw malformed("the strides are not four comma-separated integers");

  TensorDesc desc;
  desc.dtype = *dtype;
  desc.dims = *dims;
  desc.strides = *strides;
  return desc;
}

std::array<std::int64_t, 4> contiguous_bhsd_strides(const std::array<std::int64_t, 4>& dims) noexcept {
  return {dims[kHead] * dims[kSeq] * dims[kDim], dims[kSeq] * dims[kDim], dims[kDim], 1};
}

}  // namespace fusedattn
