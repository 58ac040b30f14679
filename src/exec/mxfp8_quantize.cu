// MXFP8 quantization on the device: 16-bit [b, h, s, d] tensors of any strides into FP8 data and
// 128x4-swizzled E8M0 scales blocked along d or s, and back.
//
// One thread per scale slot of the padded scale tensor: it reads its 32 elements twice (amax, then
// the conversion) and writes its scale byte, or a 0 where the slot is padding. Simple and
// memory-bound, not tuned: blocked along d a thread reads 64 contiguous bytes, so neighbouring
// threads' loads do not coalesce; blocked along s (the transposed operands) they do when d is the
// fastest source axis. The rules (scale, factors, swizzle) are spec/mxfp8_rule.h's, as on the host.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>

#include "fusedattn/errors.h"
#include "fusedattn/mxfp8.h"
#include "spec/mxfp8_rule.h"

namespace fusedattn {
namespace {

constexpr int kThreads = 256;

// What a kernel needs of one problem; dims and strides in elements, logical [b, h, s, d].
struct MxProblem {
  std::int64_t heads, seq, dim;
  std::int64_t wide_strides[4];    // the 16-bit tensor's
  std::int64_t narrow_strides[4];  // the FP8 tensor's
  bool blocked_on_dim;             // blocks along d (else along s)
  bool wide_is_bf16;
  bool narrow_is_e4m3;
  int emax_elem;
  std::int64_t rows, blocks, padded_rows, padded_blocks;
};

__device__ float load_wide(const std::uint16_t* data, std::int64_t offset, bool bf16) {
  const std::uint16_t bits = data[offset];
  return bf16 ? __bfloat162float(__ushort_as_bfloat16(bits)) : __half2float(__ushort_as_half(bits));
}

__device__ std::uint16_t to_wide(float value, bool bf16) {
  return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(value)) : __half_as_ushort(__float2half_rn(value));
}

__device__ std::uint8_t to_fp8(float value, bool e4m3) {
  return __nv_cvt_float_to_fp8(value, __NV_SATFINITE, e4m3 ? __NV_E4M3 : __NV_E5M2);
}

__device__ float from_fp8(std::uint8_t bits, bool e4m3) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(bits, e4m3 ? __NV_E4M3 : __NV_E5M2)));
}

// Element k of block row `row` of head (b, h): its offset under `strides`.
__device__ std::int64_t element_offset(const MxProblem& p, const std::int64_t* strides, std::int64_t b,
                                       std::int64_t h, std::int64_t row, std::int64_t k) {
  const std::int64_t s = p.blocked_on_dim ? row : k, d = p.blocked_on_dim ? k : row;
  return b * strides[kBatch] + h * strides[kHead] + s * strides[kSeq] + d * strides[kDim];
}

// The slot's (b, h, row, block) from its index in the padded scale tensor, matrix by matrix.
struct Slot {
  std::int64_t b, h, row, block, matrix;
};

__device__ Slot slot_at(const MxProblem& p, std::int64_t index) {
  const std::int64_t per_matrix = p.padded_rows * p.padded_blocks;
  Slot slot;
  slot.matrix = index / per_matrix;
  const std::int64_t within = index % per_matrix;
  slot.b = slot.matrix / p.heads;
  slot.h = slot.matrix % p.heads;
  slot.row = within / p.padded_blocks;
  slot.block = within % p.padded_blocks;
  return slot;
}

__global__ void quantize_kernel(MxProblem p, const std::uint16_t* src, std::uint8_t* dst, std::uint8_t* scales,
                                std::int64_t slots) {
  const std::int64_t per_matrix = p.padded_rows * p.padded_blocks;
  const std::int64_t length = p.blocked_on_dim ? p.dim : p.seq;
  for (std::int64_t index = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; index < slots;
       index += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const Slot slot = slot_at(p, index);
    std::uint8_t* scale = scales + slot.matrix * per_matrix +
                          detail::mx_swizzled_offset_rule(slot.row, slot.block, p.padded_blocks);
    if (slot.row >= p.rows || slot.block >= p.blocks) {
      *scale = 0;
      continue;
    }
    const std::int64_t first = slot.block * detail::kMxBlock;
    const std::int64_t last = first + detail::kMxBlock < length ? first + detail::kMxBlock : length;
    float amax = 0.0f;
    bool nan = false;
    for (std::int64_t k = first; k < last; ++k) {
      const float x = load_wide(src, element_offset(p, p.wide_strides, slot.b, slot.h, slot.row, k), p.wide_is_bf16);
      nan = nan || x != x;
      amax = fmaxf(amax, fabsf(x));  // fmaxf drops NaN, hence the flag
    }
    const std::uint8_t bits = detail::mx_scale_bits_rule(nan ? NAN : amax, p.emax_elem);
    *scale = bits;
    const float inverse = bits == detail::kE8M0Nan ? NAN : detail::mx_inverse_scale(bits);
    for (std::int64_t k = first; k < last; ++k) {
      const float x = load_wide(src, element_offset(p, p.wide_strides, slot.b, slot.h, slot.row, k), p.wide_is_bf16);
      dst[element_offset(p, p.narrow_strides, slot.b, slot.h, slot.row, k)] = to_fp8(x * inverse, p.narrow_is_e4m3);
    }
  }
}

__global__ void dequantize_kernel(MxProblem p, const std::uint8_t* src, const std::uint8_t* scales, std::uint16_t* dst,
                                  std::int64_t slots) {
  const std::int64_t per_matrix = p.padded_rows * p.padded_blocks;
  const std::int64_t length = p.blocked_on_dim ? p.dim : p.seq;
  for (std::int64_t index = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; index < slots;
       index += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const Slot slot = slot_at(p, index);
    if (slot.row >= p.rows || slot.block >= p.blocks) continue;
    const std::uint8_t bits =
        scales[slot.matrix * per_matrix + detail::mx_swizzled_offset_rule(slot.row, slot.block, p.padded_blocks)];
    const std::int64_t first = slot.block * detail::kMxBlock;
    const std::int64_t last = first + detail::kMxBlock < length ? first + detail::kMxBlock : length;
    for (std::int64_t k = first; k < last; ++k) {
      const float x = from_fp8(src[element_offset(p, p.narrow_strides, slot.b, slot.h, slot.row, k)], p.narrow_is_e4m3);
      dst[element_offset(p, p.wide_strides, slot.b, slot.h, slot.row, k)] =
          to_wide(detail::mx_descale(x, bits), p.wide_is_bf16);
    }
  }
}

// The checks both directions share; `wide` is the 16-bit side, `narrow` the FP8 side.
MxProblem make_problem(const TensorDesc& wide, const char* wide_name, const TensorDesc& narrow,
                       const char* narrow_name, Axis blocked) {
  const std::string wide_field = std::string(wide_name) + ".dtype";
  const std::string narrow_field = std::string(narrow_name) + ".dtype";
  if (wide.dtype != DType::f16 && wide.dtype != DType::bf16) {
    throw InvalidArgument(wide_field, to_string(wide.dtype), "f16 or bf16");
  }
  if (!is_fp8(narrow.dtype)) throw InvalidArgument(narrow_field, to_string(narrow.dtype), "e4m3 or e5m2");
  if (wide.dims != narrow.dims) {
    throw InvalidArgument(std::string(narrow_name) + ".dims", to_string(narrow), std::string("the dims of ") +
                                                                                     wide_name + ", " + to_string(wide));
  }
  for (const TensorDesc* desc : {&wide, &narrow}) {
    if (desc->ragged()) {
      throw InvalidArgument(desc == &wide ? wide_name : narrow_name, to_string(*desc),
                            "a dense tensor (batch stride != 0): ragged MXFP8 tensors are not supported");
    }
  }
  const Mxfp8ScaleShape shape = mxfp8_scale_shape(wide.dims, blocked);  // checks the axis and the dims
  MxProblem p{};
  p.heads = wide.heads();
  p.seq = wide.seq();
  p.dim = wide.head_dim();
  for (int axis = 0; axis < 4; ++axis) {
    p.wide_strides[axis] = wide.strides[axis];
    p.narrow_strides[axis] = narrow.strides[axis];
  }
  p.blocked_on_dim = blocked == kDim;
  p.wide_is_bf16 = wide.dtype == DType::bf16;
  p.narrow_is_e4m3 = narrow.dtype == DType::e4m3;
  p.emax_elem = mxfp8_element_emax(narrow.dtype);
  p.rows = shape.rows;
  p.blocks = shape.blocks;
  p.padded_rows = shape.padded_rows;
  p.padded_blocks = shape.padded_blocks;
  return p;
}

unsigned grid_for(std::int64_t slots) {
  const std::int64_t wanted = (slots + kThreads - 1) / kThreads;
  return static_cast<unsigned>(wanted < 65535 * 16 ? wanted : 65535 * 16);  // the loop covers the rest
}

void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw CudaError(std::string(kernel) + " launch failed: " + cudaGetErrorString(status));
}

}  // namespace

void quantize_mxfp8(const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, void* dst, Axis blocked,
                    std::uint8_t* scales, cudaStream_t stream) {
  const MxProblem p = make_problem(src_desc, "src", dst_desc, "dst", blocked);
  const std::int64_t slots = src_desc.batch() * src_desc.heads() * p.padded_rows * p.padded_blocks;
  if (slots == 0) return;
  quantize_kernel<<<grid_for(slots), kThreads, 0, stream>>>(p, static_cast<const std::uint16_t*>(src),
                                                            static_cast<std::uint8_t*>(dst), scales, slots);
  check_launch("quantize_mxfp8");
}

void dequantize_mxfp8(const TensorDesc& src_desc, const void* src, const std::uint8_t* scales, Axis blocked,
                      const TensorDesc& dst_desc, void* dst, cudaStream_t stream) {
  const MxProblem p = make_problem(dst_desc, "dst", src_desc, "src", blocked);
  const std::int64_t slots = dst_desc.batch() * dst_desc.heads() * p.padded_rows * p.padded_blocks;
  if (slots == 0) return;
  dequantize_kernel<<<grid_for(slots), kThreads, 0, stream>>>(p, static_cast<const std::uint8_t*>(src), scales,
                                                              static_cast<std::uint16_t*>(dst), slots);
  check_launch("dequantize_mxfp8");
}

}  // namespace fusedattn
