// Plan: runs a compiled graph with the caller's pointers. The hot path: no allocation (unless
// the caller's allocator is asked for workspace), no synchronization, no string building.
#include <cstdint>
#include <cstdio>
#include <string>

#include "exec/cuda_check.h"
#include "exec/device.h"
#include "exec/padding_fill.h"
#include "fusedattn/attention.h"
#include "fusedattn/errors.h"
#include "graph/sdpa_graph.h"

namespace fusedattn {
namespace {

// cuDNN's attention kernels use 16-byte vector accesses on every operand.
constexpr std::uintptr_t kPointerAlignment = 16;

void require_pointer(const char* field, const void* pointer) {
  if (pointer == nullptr) throw InvalidArgument(field, "null", "a device pointer");
  if (reinterpret_cast<std::uintptr_t>(pointer) % kPointerAlignment != 0) {
    char text[32];
    std::snprintf(text, sizeof text, "%p", pointer);
    throw InvalidArgument(field, text, "a 16-byte aligned device pointer");
  }
}

void require_pass(Pass have, Pass want) {
  if (have != want) {
    throw InvalidArgument("plan", std::string(to_string(have)) + " plan",
                          std::string("a ") + to_string(want) + " plan for " + to_string(want) + " tensors");
  }
}

// Workspace for one call: the caller's buffer if big enough, else their allocator's, released
// after the work is enqueued (stream-ordered allocators make that safe).
class CallWorkspace {
 public:
  CallWorkspace(std::size_t needed, const Workspace& given, cudaStream_t stream)
      : needed_(needed), allocator_(nullptr), stream_(stream) {
    if (needed == 0) return;
    if (given.data && given.bytes >= needed) {
      data_ = given.data;
      require_pointer("workspace.data", data_);
    } else if (given.allocator) {
      data_ = given.allocator->allocate(needed, stream);
      if (!data_) throw CudaError("workspace allocator returned null for " + std::to_string(needed) + " bytes");
      allocator_ = given.allocator;
    } else {
      throw InvalidArgument("workspace", std::to_string(given.bytes) + " bytes and no allocator",
                            "at least " + std::to_string(needed) + " bytes (Plan::workspace_bytes()) or an allocator");
    }
  }
  ~CallWorkspace() {
    if (allocator_) allocator_->release(data_, needed_, stream_);
  }
  void* data() const noexcept { return data_; }

 private:
  std::size_t needed_;
  void* data_ = nullptr;
  WorkspaceAllocator* allocator_;
  cudaStream_t stream_;
};

}  // namespace

Plan::Plan(AttentionSpec spec, Pass pass, int device, std::shared_ptr<const graph::CompiledGraph> graph)
    : spec_(std::move(spec)), pass_(pass), device_(device), workspace_bytes_(graph->workspace_bytes()),
      graph_(std::move(graph)) {}

Plan::~Plan() = default;

void Plan::run(const ForwardTensors& t, float scale, cudaStream_t stream, const Workspace& workspace) const {
  require_pass(pass_, Pass::forward);
  require_pointer("tensors.q", t.q);
  require_pointer("tensors.k", t.k);
  require_pointer("tensors.v", t.v);
  require_pointer("tensors.o", t.o);
  if (spec_.stats) require_pointer("tensors.stats", t.stats);
  require_lengths(t.seq_len_q, t.seq_len_kv);
  void* by_uid[graph::kUidEnd] = {};
  by_uid[graph::kUidQ] = const_cast<void*>(t.q);
  by_uid[graph::kUidK] = const_cast<void*>(t.k);
  by_uid[graph::kUidV] = const_cast<void*>(t.v);
  by_uid[graph::kUidO] = t.o;
  by_uid[graph::kUidStats] = t.stats;
  by_uid[graph::kUidScale] = &scale;
  by_uid[graph::kUidSeqLenQ] = const_cast<std::int32_t*>(t.seq_len_q);
  by_uid[graph::kUidSeqLenKV] = const_cast<std::int32_t*>(t.seq_len_kv);
  execute(by_uid, stream, workspace);
  if (spec_.padding) detail::zero_rows_past_lengths(spec_.o, t.o, t.seq_len_q, stream);
}

void Plan::run(const BackwardTensors& t, float scale, cudaStream_t stream, const Workspace& workspace) const {
  require_pass(pass_, Pass::backward);
  require_pointer("tensors.q", t.q);
  require_pointer("tensors.k", t.k);
  require_pointer("tensors.v", t.v);
  require_pointer("tensors.o", t.o);
  require_pointer("tensors.d_o", t.d_o);
  require_pointer("tensors.stats", t.stats);
  require_pointer("tensors.d_q", t.d_q);
  require_pointer("tensors.d_k", t.d_k);
  require_pointer("tensors.d_v", t.d_v);
  require_lengths(t.seq_len_q, t.seq_len_kv);
  void* by_uid[graph::kUidEnd] = {};
  by_uid[graph::kUidQ] = const_cast<void*>(t.q);
  by_uid[graph::kUidK] = const_cast<void*>(t.k);
  by_uid[graph::kUidV] = const_cast<void*>(t.v);
  by_uid[graph::kUidO] = const_cast<void*>(t.o);
  by_uid[graph::kUidDO] = const_cast<void*>(t.d_o);
  by_uid[graph::kUidStats] = const_cast<float*>(t.stats);
  by_uid[graph::kUidDQ] = t.d_q;
  by_uid[graph::kUidDK] = t.d_k;
  by_uid[graph::kUidDV] = t.d_v;
  by_uid[graph::kUidScale] = &scale;
  by_uid[graph::kUidSeqLenQ] = const_cast<std::int32_t*>(t.seq_len_q);
  by_uid[graph::kUidSeqLenKV] = const_cast<std::int32_t*>(t.seq_len_kv);
  execute(by_uid, stream, workspace);
  if (spec_.padding) {
    detail::zero_rows_past_lengths(spec_.q, t.d_q, t.seq_len_q, stream);
    detail::zero_rows_past_lengths(spec_.k, t.d_k, t.seq_len_kv, stream);
    detail::zero_rows_past_lengths(spec_.v, t.d_v, t.seq_len_kv, stream);
  }
}

void Plan::require_lengths(const std::int32_t* seq_len_q, const std::int32_t* seq_len_kv) const {
  if (!spec_.padding) return;
  require_pointer("tensors.seq_len_q", seq_len_q);
  require_pointer("tensors.seq_len_kv", seq_len_kv);
}

void Plan::execute(void* const* by_uid, cudaStream_t stream, const Workspace& workspace) const {
  int device = detail::current_device();
  if (device != device_) {
    throw InvalidArgument("device", std::to_string(device),
                          "the device the plan was built for (" + std::to_string(device_) + "); make it current");
  }
  void* sorted[graph::kUidEnd];
  int count = 0;
  for (std::int64_t uid : graph_->uids()) sorted[count++] = by_uid[uid];
  CallWorkspace scratch(workspace_bytes_, workspace, stream);
  cudnnHandle_t handle = detail::handle_for(device_, stream);
  try {
    graph_->execute(handle, sorted, scratch.data());
  } catch (const CudnnError& error) {
    throw CudnnError(std::string(error.what()) + " [" + to_string(pass_) + " " + to_string(spec_) + "]");
  }
}

}  // namespace fusedattn
