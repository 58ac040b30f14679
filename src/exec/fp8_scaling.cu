// FP8 per-tensor scaling on the device, the element-wise calls of fusedattn/fp8.h: amax, quantize
// and dequantize, of one tensor or of several in one call (the scale updates are in
// fp8_scale_updates.cu).
//
// Two walks. Tensors that share rows of consecutive elements (dense in one axis order, or packed
// views with gaps between whole rows) take the memory-order path of fp8_rows.cu: wide loads and
// stores, and up to four tensors of one dtype pair in one launch. Any other pair (bshd into sbhd)
// takes the logical walk of fp8_strided_walk.cu. Conversions are cuda_fp8.h's with __NV_SATFINITE,
// which the host codecs (src/reference/fp8_codec.cpp) reproduce bit for bit, the same in both
// walks. Each amax is zeroed on the stream first (those at consecutive addresses by one memset),
// then every block does one atomicMax into it.
//
// A ragged tensor (batch stride 0) is refused: its sequences sit at run-time offsets these calls do
// not take, and read as written (every entry at offset 0, as gather_to_float_gpu reads it) a
// quantize would race b writes onto the first entry. Pass the packed tokens as one dense entry.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "exec/cuda_check.h"
#include "exec/fp8_rows.h"
#include "exec/fp8_strided_walk.h"
#include "fusedattn/errors.h"
#include "fusedattn/fp8.h"

namespace fusedattn {

namespace {

using detail::launch_rows;
using detail::row_width;
using detail::RowJob;
using detail::RowJobs;
using detail::kMaxRowJobs;
using detail::RowOp;
using detail::walk_logically;

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

// Every amax zeroed before any kernel adds to it: one memset per run of consecutive addresses (a
// state's amaxes of Q, K and V sit side by side).
void zero_amaxes(std::vector<float*> amaxes, cudaStream_t stream) {
  std::sort(amaxes.begin(), amaxes.end());
  for (std::size_t first = 0; first < amaxes.size();) {
    std::size_t last = first;
    while (last + 1 < amaxes.size() && amaxes[last + 1] <= amaxes[last] + 1) ++last;
    const std::size_t bytes = (amaxes[last] - amaxes[first] + 1) * sizeof(float);
    detail::check_cuda(cudaMemsetAsync(amaxes[first], 0, bytes, stream), "cudaMemsetAsync(amax)");
    first = last + 1;
  }
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

void require_tensor_of(int at, const Fp8Amax& t) {
  require_tensor(field(at, "desc"), t.desc);
  require_pointer(field(at, "amax"), t.amax, "must point to a float32 in device memory");
  if (t.desc.elements() > 0) require_pointer(field(at, "data"), t.data, "must point to the tensor in device memory");
}

float* amax_of(const Fp8Quantization& t) { return t.amax; }
float* amax_of(const Fp8Dequantization&) { return nullptr; }
float* amax_of(const Fp8Amax& t) { return t.amax; }
std::int64_t elements_of(const Fp8Amax& t) { return t.desc.elements(); }
template <class Pair>
std::int64_t elements_of(const Pair& t) {
  return t.src_desc.elements();
}
RowTensor row_of(const Fp8Quantization& t) { return row_of(t.src_desc, t.src, t.dst_desc, t.dst, t.scale, t.amax); }
RowTensor row_of(const Fp8Dequantization& t) {
  return row_of(t.src_desc, t.src, t.dst_desc, t.dst, t.descale, nullptr);
}
RowTensor row_of(const Fp8Amax& t) { return row_of(t.desc, t.data, t.desc, nullptr, nullptr, t.amax); }

// Every tensor checked before anything is enqueued; then the amaxes zeroed, and each tensor on the
// memory-order path (grouped into launches) or, where that cannot take it, the logical walk.
template <class Tensor>
void run_many(RowOp op, const Tensor* tensors, int count, cudaStream_t stream) {
  require_count(count, tensors);
  for (int i = 0; i < count; ++i) require_tensor_of(count == 1 ? -1 : i, tensors[i]);
  std::vector<float*> amaxes;
  for (int i = 0; i < count; ++i) {
    if (amax_of(tensors[i]) != nullptr) amaxes.push_back(amax_of(tensors[i]));
  }
  zero_amaxes(amaxes, stream);
  std::vector<RowTensor> rows;
  for (int i = 0; i < count; ++i) {
    const Tensor& t = tensors[i];
    if (elements_of(t) == 0) continue;
    const RowTensor row = row_of(t);
    if (row.width > 0) rows.push_back(row);
    else walk_logically(t, stream);
  }
  launch_grouped(op, rows, stream);
}

}  // namespace

void measure_amax_many(const Fp8Amax* tensors, int count, cudaStream_t stream) {
  run_many(RowOp::amax, tensors, count, stream);
}

void measure_amax(const TensorDesc& desc, const void* data, float* amax, cudaStream_t stream) {
  const Fp8Amax one{desc, data, amax};
  measure_amax_many(&one, 1, stream);
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
