// FP8 per-tensor scaling on the device, the element-wise calls of fusedattn/fp8.h: amax, quantize
// and dequantize, of one tensor or of several in one call (the scale updates are in
// fp8_scale_updates.cu).
//
// Two walks. Tensors that share rows of consecutive elements (dense in one axis order, or packed
// views with gaps between whole rows) take the memory-order path of fp8_rows.cu: wide loads and
// stores, and up to four tensors of one dtype pair in one launch. Any other pair (bshd into sbhd)
// takes the logical walk here: grid-stride loops over the [b, h, s, d] order, each element's
// address from the strides. Conversions are cuda_fp8.h's with __NV_SATFINITE, which the host codecs
// (src/reference/fp8_codec.cpp) reproduce bit for bit, the same in both walks.
//
// Amax is reduced on the bits of |x| (abs_bits: NaN propagates). Each block reduces to one value and
// does one atomicMax into the output, which is zeroed on the stream first.
//
// A ragged tensor (batch stride 0) is refused: its sequences sit at run-time offsets these calls do
// not take, and read as written (every entry at offset 0, as gather_to_float_gpu reads it) a
// quantize would race b writes onto the first entry. Pass the packed tokens as one dense entry.
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "exec/cuda_check.h"
#include "exec/element_conversions.cuh"
#include "exec/fp8_rows.h"
#include "exec/strided_elements.cuh"
#include "fusedattn/errors.h"
#include "fusedattn/fp8.h"

namespace fusedattn {

namespace {

constexpr int kThreads = 256;

using detail::abs_bits;
using detail::E4M3;
using detail::E5M2;
using detail::from_float;
using detail::launch_rows;
using detail::row_width;
using detail::RowJob;
using detail::RowJobs;
using detail::kMaxRowJobs;
using detail::RowOp;
using detail::grid_stride_blocks;
using detail::make_strided;
using detail::Strided;
using detail::strided_offset;
using detail::to_float;

__device__ void block_max_into(unsigned int mine, unsigned int* out) { detail::block_max_into<kThreads>(mine, out); }

template <class T>
__global__ void amax_kernel(Strided t, std::int64_t n, const T* data, unsigned int* amax) {
  unsigned int mine = 0;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t x = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < n; x += step) {
    mine = max(mine, abs_bits(to_float(data[strided_offset(t, x)])));
  }
  block_max_into(mine, amax);
}

template <class Src, class Dst>
__global__ void quantize_kernel(Strided src_t, Strided dst_t, std::int64_t n, const Src* src, Dst* dst,
                                const float* scale, unsigned int* amax) {
  const float s = *scale;
  unsigned int mine = 0;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t x = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < n; x += step) {
    const float value = to_float(src[strided_offset(src_t, x)]);
    mine = max(mine, abs_bits(value));
    dst[strided_offset(dst_t, x)] = from_float<Dst>(value * s);
  }
  if (amax != nullptr) block_max_into(mine, amax);  // uniform over the grid
}

template <class Src, class Dst>
__global__ void dequantize_kernel(Strided src_t, Strided dst_t, std::int64_t n, const Src* src, Dst* dst,
                                  const float* descale) {
  const float s = *descale;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t x = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < n; x += step) {
    dst[strided_offset(dst_t, x)] = from_float<Dst>(to_float(src[strided_offset(src_t, x)]) * s);
  }
}

// --- input checks: each names the field, the value and the requirement, before anything is enqueued

bool is_16_bit(DType dtype) { return dtype == DType::f16 || dtype == DType::bf16; }

// `name` of the call's one tensor, or of tensors[i] of a call that takes several.
std::string field(int index, const char* name) {
  return index < 0 ? std::string(name) : "tensors[" + std::to_string(index) + "]." + name;
}

void require_dtype(const std::string& field, DType dtype, bool ok, const char* requirement) {
  if (!ok) throw InvalidArgument(field, to_string(dtype), requirement);
}

void require_pointer(const std::string& field, const void* pointer, const char* requirement) {
  if (pointer == nullptr) throw InvalidArgument(field, "null", requirement);
}

void require_tensor(const std::string& field, const TensorDesc& desc) {
  for (int axis = 0; axis < 4; ++axis) {
    if (desc.dims[axis] < 0) throw InvalidArgument(field, to_string(desc), "dims must not be negative");
  }
  if (desc.elements() > 0 && desc.ragged()) {
    throw InvalidArgument(field, to_string(desc),
                          "must not be ragged (batch stride 0): its run-time offsets are not taken here; pass "
                          "the packed tokens as one dense entry [1, h, tokens, d]");
  }
}

// The checks quantize and dequantize share: one tensor into another of the same dims, both there.
void require_pair(int i, const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, const void* dst,
                  const float* factor, const char* factor_name) {
  if (src_desc.dims != dst_desc.dims) {
    throw InvalidArgument(field(i, "dst_desc.dims"), to_string(dst_desc),
                          "must equal src_desc's dims (" + to_string(src_desc) + ")");
  }
  require_tensor(field(i, "src_desc"), src_desc);
  require_tensor(field(i, "dst_desc"), dst_desc);
  require_pointer(field(i, factor_name), factor, "must point to a float32 in device memory");
  if (src_desc.elements() > 0) {
    require_pointer(field(i, "src"), src, "must point to the tensor in device memory");
    require_pointer(field(i, "dst"), dst, "must point to the tensor in device memory");
  }
}

void require_count(int count, const void* tensors) {
  if (count < 0) throw InvalidArgument("count", std::to_string(count), "must not be negative");
  if (count > 0) require_pointer("tensors", tensors, "must point to `count` tensors");
}

void zero_amax(float* amax, cudaStream_t stream) {
  detail::check_cuda(cudaMemsetAsync(amax, 0, sizeof(float), stream), "cudaMemsetAsync(amax)");
}

// --- the logical walk, for tensors the memory-order path (fp8_rows.cu) does not take ------------

template <class T>
void launch_amax(const TensorDesc& desc, const void* data, float* amax, cudaStream_t stream) {
  const std::int64_t n = desc.elements();
  amax_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(
      make_strided(desc), n, static_cast<const T*>(data), reinterpret_cast<unsigned int*>(amax));
  detail::check_cuda(cudaGetLastError(), "measure_amax's kernel launch");
}

template <class Src, class Dst>
void launch_quantize(const Fp8Quantization& t, cudaStream_t stream) {
  const std::int64_t n = t.src_desc.elements();
  quantize_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(
      make_strided(t.src_desc), make_strided(t.dst_desc), n, static_cast<const Src*>(t.src), static_cast<Dst*>(t.dst),
      t.scale, reinterpret_cast<unsigned int*>(t.amax));
  detail::check_cuda(cudaGetLastError(), "quantize_fp8's kernel launch");
}

template <class Src, class Dst>
void launch_dequantize(const Fp8Dequantization& t, cudaStream_t stream) {
  const std::int64_t n = t.src_desc.elements();
  dequantize_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(
      make_strided(t.src_desc), make_strided(t.dst_desc), n, static_cast<const Src*>(t.src), static_cast<Dst*>(t.dst),
      t.descale);
  detail::check_cuda(cudaGetLastError(), "dequantize_fp8's kernel launch");
}

void walk_logically(const Fp8Quantization& t, cudaStream_t stream) {
  const bool e4m3 = t.dst_desc.dtype == DType::e4m3;
  if (t.src_desc.dtype == DType::bf16) {
    if (e4m3) return launch_quantize<__nv_bfloat16, E4M3>(t, stream);
    return launch_quantize<__nv_bfloat16, E5M2>(t, stream);
  }
  if (e4m3) return launch_quantize<__half, E4M3>(t, stream);
  launch_quantize<__half, E5M2>(t, stream);
}

void walk_logically(const Fp8Dequantization& t, cudaStream_t stream) {
  const bool e4m3 = t.src_desc.dtype == DType::e4m3;
  if (t.dst_desc.dtype == DType::bf16) {
    if (e4m3) return launch_dequantize<E4M3, __nv_bfloat16>(t, stream);
    return launch_dequantize<E5M2, __nv_bfloat16>(t, stream);
  }
  if (e4m3) return launch_dequantize<E4M3, __half>(t, stream);
  launch_dequantize<E5M2, __half>(t, stream);
}

// --- the memory-order path: tensors of one dtype pair and width share a launch ------------------

struct RowTensor {
  DType src, dst;
  int width;
  RowJob job;
};

// One tensor pair on the memory-order path (width > 0), or width 0 where the logical walk must take it.
RowTensor row_of(const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, void* dst,
                 const float* factor, float* amax) {
  RowTensor row{src_desc.dtype, dst_desc.dtype, 0, RowJob{}};
  row.width = row_width(src_desc, src, dst_desc, dst, row.job);
  row.job.src = src;
  row.job.dst = dst;
  row.job.factor = factor;
  row.job.amax = reinterpret_cast<unsigned int*>(amax);
  return row;
}

void launch_grouped(RowOp op, const std::vector<RowTensor>& tensors, cudaStream_t stream) {
  std::vector<bool> launched(tensors.size(), false);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (launched[i]) continue;
    const RowTensor& first = tensors[i];
    RowJobs jobs;
    int count = 0;
    for (std::size_t j = i; j < tensors.size() && count < kMaxRowJobs; ++j) {
      const RowTensor& t = tensors[j];
      if (launched[j] || t.src != first.src || t.dst != first.dst || t.width != first.width) continue;
      jobs.job[count++] = t.job;
      launched[j] = true;
    }
    launch_rows(op, first.src, first.dst, jobs, count, first.width, stream);
  }
}

// --- one call over several tensors: what quantize and dequantize differ in, then the one loop ---

void require_tensor_of(int at, const Fp8Quantization& t) {
  require_dtype(field(at, "src_desc.dtype"), t.src_desc.dtype, is_16_bit(t.src_desc.dtype),
                "must be f16 or bf16 to quantize");
  require_dtype(field(at, "dst_desc.dtype"), t.dst_desc.dtype, is_fp8(t.dst_desc.dtype),
                "must be e4m3 or e5m2 to quantize into");
  require_pair(at, t.src_desc, t.src, t.dst_desc, t.dst, t.scale, "scale");
}

void require_tensor_of(int at, const Fp8Dequantization& t) {
  require_dtype(field(at, "src_desc.dtype"), t.src_desc.dtype, is_fp8(t.src_desc.dtype),
                "must be e4m3 or e5m2 to dequantize");
  require_dtype(field(at, "dst_desc.dtype"), t.dst_desc.dtype, is_16_bit(t.dst_desc.dtype),
                "must be f16 or bf16 to dequantize into");
  require_pair(at, t.src_desc, t.src, t.dst_desc, t.dst, t.descale, "descale");
}

const float* factor_of(const Fp8Quantization& t) { return t.scale; }
const float* factor_of(const Fp8Dequantization& t) { return t.descale; }
float* amax_of(const Fp8Quantization& t) { return t.amax; }
float* amax_of(const Fp8Dequantization&) { return nullptr; }

// Every tensor checked before anything is enqueued; then each amax zeroed, and each tensor on the
// memory-order path (grouped into launches) or, where that cannot take it, the logical walk.
template <class Tensor>
void run_many(RowOp op, const Tensor* tensors, int count, cudaStream_t stream) {
  require_count(count, tensors);
  for (int i = 0; i < count; ++i) require_tensor_of(count == 1 ? -1 : i, tensors[i]);
  std::vector<RowTensor> rows;
  for (int i = 0; i < count; ++i) {
    const Tensor& t = tensors[i];
    if (amax_of(t) != nullptr) zero_amax(amax_of(t), stream);
    if (t.src_desc.elements() == 0) continue;
    const RowTensor row = row_of(t.src_desc, t.src, t.dst_desc, t.dst, factor_of(t), amax_of(t));
    if (row.width > 0) rows.push_back(row);
    else walk_logically(t, stream);
  }
  launch_grouped(op, rows, stream);
}

}  // namespace

void measure_amax(const TensorDesc& desc, const void* data, float* amax, cudaStream_t stream) {
  require_tensor("desc", desc);
  require_pointer("amax", amax, "must point to a float32 in device memory");
  if (desc.elements() > 0) require_pointer("data", data, "must point to the tensor in device memory");
  zero_amax(amax, stream);
  if (desc.elements() == 0) return;
  const RowTensor row = row_of(desc, data, desc, nullptr, nullptr, amax);
  if (row.width > 0) return launch_grouped(RowOp::amax, {row}, stream);
  switch (desc.dtype) {
    case DType::f16: return launch_amax<__half>(desc, data, amax, stream);
    case DType::bf16: return launch_amax<__nv_bfloat16>(desc, data, amax, stream);
    case DType::e4m3: return launch_amax<E4M3>(desc, data, amax, stream);
    case DType::e5m2: return launch_amax<E5M2>(desc, data, amax, stream);
  }
}

void quantize_fp8_many(const Fp8Quantization* tensors, int count, cudaStream_t stream) {
  run_many(RowOp::quantize, tensors, count, stream);
}

void dequantize_fp8_many(const Fp8Dequantization* tensors, int count, cudaStream_t stream) {
  run_many(RowOp::dequantize, tensors, count, stream);
}

void quantize_fp8(const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, void* dst,
                  const float* scale, float* amax, cudaStream_t stream) {
  const Fp8Quantization one{src_desc, src, dst_desc, dst, scale, amax};
  quantize_fp8_many(&one, 1, stream);
}

void dequantize_fp8(const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, void* dst,
                    const float* descale, cudaStream_t stream) {
  const Fp8Dequantization one{src_desc, src, dst_desc, dst, descale};
  dequantize_fp8_many(&one, 1, stream);
}

}  // namespace fusedattn
