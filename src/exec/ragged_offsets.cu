// Ragged calls: lengths and element offsets for cuDNN from the caller's cumulative token counts.
//
// cuDNN wants per-entry lengths and, for each ragged tensor, where each entry's first element is;
// callers (like every varlen API) hold cumulative token counts. One small kernel derives all of it
// for every placement at once, rather than a chain of tiny kernels per tensor.
#include "exec/ragged_offsets.h"

#include <string>

#include "fusedattn/errors.h"

namespace fusedattn::detail {
namespace {

constexpr int kThreads = 128;
constexpr std::size_t kAlign = 256;

std::size_t round_up(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

struct Inputs {
  std::int64_t sequences, plan_batch;
  const std::int32_t *cu_q, *cu_kv, *start_q, *start_kv;
};

__global__ void prepare_kernel(Inputs in, TokenStrides strides, RaggedArrays out) {
  for (std::int64_t b = threadIdx.x; b <= in.plan_batch; b += blockDim.x) {
    const std::int64_t used = b < in.sequences ? b : in.sequences;  // entries past the call: empty, at the end
    const std::int64_t token_q = in.start_q[used], token_kv = in.start_kv[used];
    out.offset_q[b] = token_q * strides.q;
    out.offset_o[b] = token_q * strides.o;
    out.offset_stats[b] = token_q * strides.stats;
    out.offset_k[b] = token_kv * strides.k;
    out.offset_v[b] = token_kv * strides.v;
    if (b == in.plan_batch) continue;
    out.seq_len_q[b] = b < in.sequences ? in.cu_q[b + 1] - in.cu_q[b] : 0;
    out.seq_len_kv[b] = b < in.sequences ? in.cu_kv[b + 1] - in.cu_kv[b] : 0;
  }
}

}  // namespace

std::size_t RaggedArrays::bytes(std::int64_t plan_batch) noexcept {
  const auto n = static_cast<std::size_t>(plan_batch);
  return 2 * round_up(n * sizeof(std::int32_t)) + 5 * round_up((n + 1) * sizeof(std::int64_t));
}

RaggedArrays RaggedArrays::in(void* scratch, std::int64_t plan_batch) noexcept {
  const auto n = static_cast<std::size_t>(plan_batch);
  char* at = static_cast<char*>(scratch);
  auto take = [&](std::size_t bytes) {
    char* here = at;
    at += round_up(bytes);
    return here;
  };
  RaggedArrays out;
  out.seq_len_q = reinterpret_cast<std::int32_t*>(take(n * sizeof(std::int32_t)));
  out.seq_len_kv = reinterpret_cast<std::int32_t*>(take(n * sizeof(std::int32_t)));
  for (std::int64_t** offsets : {&out.offset_q, &out.offset_k, &out.offset_v, &out.offset_o, &out.offset_stats}) {
    *offsets = reinterpret_cast<std::int64_t*>(take((n + 1) * sizeof(std::int64_t)));
  }
  return out;
}

void prepare_ragged(const RaggedTensors& ragged, std::int64_t plan_batch, const TokenStrides& strides,
                    const RaggedArrays& out, cudaStream_t stream) {
  Inputs in{ragged.sequences,
            plan_batch,
            ragged.cu_seqlens_q,
            ragged.cu_seqlens_kv,
            ragged.cu_seqlens_q_padded ? ragged.cu_seqlens_q_padded : ragged.cu_seqlens_q,
            ragged.cu_seqlens_kv_padded ? ragged.cu_seqlens_kv_padded : ragged.cu_seqlens_kv};
  prepare_kernel<<<1, kThreads, 0, stream>>>(in, strides, out);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw CudaError(std::string("prepare_ragged launch failed: ") + cudaGetErrorString(status));
}

}  // namespace fusedattn::detail
