// Advancing dropout's Philox offset on the device, so that captured CUDA graphs advance it too.
#include <string>

#include "fusedattn/attention.h"
#include "fusedattn/errors.h"

namespace fusedattn {
namespace {

__global__ void add_kernel(std::int64_t* offset, std::int64_t increment) { *offset += increment; }

}  // namespace

// One Philox draw per attention probability is the most any call can use, so moving the offset
// by b·h·s_q·s_kv keeps consecutive calls' streams disjoint whatever cuDNN's exact consumption.
std::int64_t dropout_offset_increment(const AttentionSpec& spec) noexcept {
  return spec.batch() * spec.heads_q() * spec.seq_q() * spec.seq_kv();
}

void advance_dropout_offset(const AttentionSpec& spec, std::int64_t* offset, cudaStream_t stream) {
  if (offset == nullptr) throw InvalidArgument("offset", "null", "a device pointer to the int64 dropout offset");
  add_kernel<<<1, 1, 0, stream>>>(offset, dropout_offset_increment(spec));
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw CudaError(std::string("advance_dropout_offset launch failed: ") + cudaGetErrorString(status));
}

}  // namespace fusedattn
