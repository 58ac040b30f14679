// fusedattn/tensor.h — how the core sees a tensor: element type, logical [b, h, s, d] dims, strides.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace fusedattn {

/// Element types of attention inputs and outputs: the 16-bit floats, and the two 8-bit floats of
/// FP8 attention (OCP FP8: E4M3 with a largest finite value of 448 and no infinities, E5M2 with
/// 57344 and IEEE-style infinities), which carry a per-tensor scale beside them (fusedattn/fp8.h).
enum class DType : std::uint8_t { f16, bf16, e4m3, e5m2 };

/// Bytes per element.
std::size_t size_of(DType dtype) noexcept;
/// "f16" / "bf16" / "e4m3" / "e5m2".
const char* to_string(DType dtype) noexcept;
/// Parses "f16"/"fp16"/"half", "bf16", "e4m3"/"fp8_e4m3" and "e5m2"/"fp8_e5m2"; throws
/// InvalidArgument naming `field` otherwise.
DType parse_dtype(const std::string& text, const std::string& field);
/// E4M3 or E5M2.
constexpr bool is_fp8(DType dtype) noexcept { return dtype == DType::e4m3 || dtype == DType::e5m2; }

/// Positions of the logical axes in `TensorDesc::dims` and `TensorDesc::strides`.
enum Axis : int { kBatch = 0, kHead = 1, kSeq = 2, kDim = 3 };

/// One attention tensor. Dims are always logical [batch, heads, sequence, head dim]; the memory
/// layout lives entirely in the strides (in elements), so the core never needs layout names.
struct TensorDesc {
  DType dtype = DType::bf16;
  std::array<std::int64_t, 4> dims{};
  std::array<std::int64_t, 4> strides{};

  std::int64_t batch() const noexcept { return dims[kBatch]; }
  std::int64_t heads() const noexcept { return dims[kHead]; }
  std::int64_t seq() const noexcept { return dims[kSeq]; }
  std::int64_t head_dim() const noexcept { return dims[kDim]; }
  std::int64_t elements() const noexcept { return dims[0] * dims[1] * dims[2] * dims[3]; }
  /// A ragged tensor (thd layouts) has a batch stride of 0: its sequences are placed by offsets
  /// given at run time, and dims[kSeq] is the longest sequence a call may hold.
  bool ragged() const noexcept { return strides[kBatch] == 0; }
  /// Number of elements from the first to one past the last addressed element.
  std::int64_t extent() const noexcept;

  friend bool operator==(const TensorDesc& a, const TensorDesc& b) noexcept {
    return a.dtype == b.dtype && a.dims == b.dims && a.strides == b.strides;
  }
  friend bool operator!=(const TensorDesc& a, const TensorDesc& b) noexcept { return !(a == b); }
};

/// "bf16[2,16,1024,128]/[2097152,128,2048,1]": the form the spec string uses.
std::string to_string(const TensorDesc& desc);
/// Inverse of to_string(TensorDesc); throws InvalidArgument naming `field` on malformed text.
TensorDesc parse_tensor_desc(const std::string& text, const std::string& field);

/// Dense [b, h, s, d] strides (d fastest): the canonical form the references use.
std::array<std::int64_t, 4> contiguous_bhsd_strides(const std::array<std::int64_t, 4>& dims) noexcept;

}  // namespace fusedattn
