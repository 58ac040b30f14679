// Plan: runs a compiled graph with the caller's pointers. The hot path: no allocation (unless
// the caller's allocator is asked for workspace), no synchronization, no string building.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "exec/decode_kernel.h"
#include "exec/decode_split.h"
#include "exec/cuda_check.h"
#include "exec/device.h"
#include "exec/full_lengths.h"
#include "exec/kv_expansion.h"
#include "exec/max_logit.h"
#include "exec/padding_fill.h"
#include "exec/ragged_offsets.h"
#include "exec/replay.h"
#include "exec/uid_pointers.h"
#include "fusedattn/attention.h"
#include "fusedattn/errors.h"
#include "fusedattn/plan_cache.h"
#include "graph/sdpa_graph.h"
#include "spec/naming_errors.h"
#include "spec/tensor_set.h"

namespace fusedattn {
namespace {

// The amaxes an FP8 call writes start at zero on the stream: cuDNN's FP8 kernels reduce into them,
// and whether they store the amax or take the max with what the buffer holds is not documented,
// so zeroing first makes each call's amax its own either way (an XLA result buffer, for one,
// starts with whatever was there).
void zero_amaxes(std::initializer_list<float*> amaxes, cudaStream_t stream) {
  for (float* amax : amaxes) detail::check_cuda(cudaMemsetAsync(amax, 0, sizeof(float), stream), "cudaMemsetAsync(amax)");
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
      detail::require_pointer("workspace.data", data_);
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

constexpr std::size_t kScratchAlignment = 256;

std::size_t round_up(std::size_t bytes) { return (bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment; }

std::size_t row_bytes(const AttentionSpec& spec) {
  return round_up(static_cast<std::size_t>(spec.batch() * spec.heads_q() * spec.seq_q()) * sizeof(float));
}

bool is_ragged(const AttentionSpec& spec) { return spec.ragged_q() || spec.ragged_kv(); }

std::size_t ragged_bytes(const AttentionSpec& spec) {
  return is_ragged(spec) ? round_up(detail::RaggedArrays::bytes(spec.batch())) : 0;
}

// A padded dense forward may come without seq_len_q (attention.h): every entry's s_q, written here.
bool lengths_q_of_our_own(const AttentionSpec& spec, Pass pass) {
  return pass == Pass::forward && spec.padding && !is_ragged(spec);
}
std::size_t full_rows_bytes(const AttentionSpec& spec, Pass pass) {
  return lengths_q_of_our_own(spec, pass) ? round_up(static_cast<std::size_t>(spec.batch()) * sizeof(std::int32_t)) : 0;
}

// Ours after cuDNN's workspace: a ragged call's lengths and offsets, or a padded forward's query
// lengths; then, for a forward with a max logit, the row maxima when the caller wants them per
// head, and the sums of exponentials when there are no statistics to hold them.
std::size_t scratch_for(const AttentionSpec& spec, Pass pass) {
  std::size_t bytes = ragged_bytes(spec) + full_rows_bytes(spec, pass);
  if (pass != Pass::forward || spec.max_logit == MaxLogit::none) return bytes;
  return bytes + (spec.max_logit == MaxLogit::head ? row_bytes(spec) : 0) + (spec.stats ? 0 : row_bytes(spec));
}

detail::TokenStrides token_strides(const AttentionSpec& spec) {
  detail::TokenStrides strides;
  strides.q = spec.q.strides[kSeq];
  strides.k = spec.k.strides[kSeq];
  strides.v = spec.v.strides[kSeq];
  strides.o = spec.o.strides[kSeq];
  strides.stats = spec.heads_q();  // ragged statistics: [T, h_q]
  return strides;
}

// Prepares a ragged call's arrays in `scratch` and points the graph's UIDs at them.
detail::RaggedArrays place_ragged(const AttentionSpec& spec, const RaggedTensors& ragged, void* scratch, void** by_uid,
                                  cudaStream_t stream) {
  const detail::RaggedArrays arrays = detail::RaggedArrays::in(scratch, spec.batch());
  detail::prepare_ragged(ragged, spec.batch(), token_strides(spec), arrays, stream);
  by_uid[graph::kUidSeqLenQ] = by_uid[graph::kUidScoreModSeqLenQ] = arrays.seq_len_q;
  by_uid[graph::kUidSeqLenKV] = by_uid[graph::kUidScoreModSeqLenKV] = arrays.seq_len_kv;
  by_uid[graph::kUidOffsetQ] = arrays.offset_q;
  by_uid[graph::kUidOffsetK] = arrays.offset_k;
  by_uid[graph::kUidOffsetV] = arrays.offset_v;
  by_uid[graph::kUidOffsetO] = arrays.offset_o;
  by_uid[graph::kUidOffsetStats] = arrays.offset_stats;
  return arrays;
}

// The lengths a call's outputs are cut at: the caller's, or for a ragged plan those prepared from
// its cumulative offsets. A dense plan ignores the ragged arrays, as documented.
template <class Tensors>
const std::int32_t* lengths_q(const AttentionSpec& spec, const Tensors& t, const detail::RaggedArrays& ragged) {
  return is_ragged(spec) ? ragged.seq_len_q : t.seq_len_q;
}
template <class Tensors>
const std::int32_t* lengths_kv(const AttentionSpec& spec, const Tensors& t, const detail::RaggedArrays& ragged) {
  return is_ragged(spec) ? ragged.seq_len_kv : t.seq_len_kv;
}

// An output's positions past each sequence's length are zero (README): rows past the length in a
// dense tensor, and in a ragged one the gaps up to where the next sequence starts, which exist
// only when the caller placed sequences apart (padded starts).
void zero_past_lengths(const AttentionSpec& spec, const TensorDesc& desc, void* data, const std::int32_t* lengths,
                       const std::int64_t* ragged_offsets, const std::int32_t* padded_starts, cudaStream_t stream) {
  if (!spec.padding) return;
  if (!desc.ragged()) {
    detail::zero_rows_past_lengths(desc, data, lengths, stream);
  } else if (padded_starts != nullptr) {
    detail::zero_ragged_gaps(desc, data, ragged_offsets, lengths, stream);
  }
}

// off_by_one is a sink whose logits are all zero; the plan owns that tensor (made once, at build).
std::shared_ptr<float> zero_sink(const AttentionSpec& spec) {
  if (spec.softmax != Softmax::off_by_one) return nullptr;
  void* zeros = nullptr;
  const std::size_t bytes = static_cast<std::size_t>(spec.heads_q()) * sizeof(float);
  detail::check_cuda(cudaMalloc(&zeros, bytes), "cudaMalloc(off_by_one sink)");
  std::shared_ptr<float> owned(static_cast<float*>(zeros), [](float* p) { cudaFree(p); });
  // On a stream of its own: the legacy default stream would wait for every blocking stream, and
  // fail if one of them is being captured (plans may be built during a caller's capture).
  cudaStream_t stream = nullptr;
  detail::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  const cudaError_t set = cudaMemsetAsync(zeros, 0, bytes, stream);
  const cudaError_t done = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  detail::check_cuda(set, "cudaMemsetAsync(off_by_one sink)");
  detail::check_cuda(done, "cudaStreamSynchronize(off_by_one sink)");
  return owned;
}

bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();  // not ours to report: cuDNN's execute meets the same condition and says so
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

// Replays the call from a recording where it can; false: the caller executes it through cuDNN.
// Under stream capture the caller's own graph records cuDNN's kernels, so there is nothing to save.
bool replayed(detail::ReplayCache& replays, const graph::CompiledGraph& graph, void* const* by_uid, void** sorted,
              cudaStream_t stream, cudnnHandle_t handle, void* workspace) {
  if (!detail::replay_enabled() || stream_is_capturing(stream)) {
    replays.note_executed();
    return false;
  }
  detail::ReplayKey key;
  for (std::int64_t uid : graph.uids()) {
    key.pointers[key.count++] = uid == graph::kUidScale ? nullptr : by_uid[uid];  // the value counts, not where it sits
  }
  std::memcpy(&key.scale_bits, by_uid[graph::kUidScale], sizeof key.scale_bits);
  key.workspace = workspace;
  return replays.launch(key, stream, graph, handle, sorted, workspace);
}

}  // namespace

namespace {
// Plans alive in the process, cached or held by a caller: what the cache's bound really bounds only
// while nobody else keeps plans (the adapters keep none).
std::atomic<std::size_t> g_live_plans{0};
}  // namespace

namespace {
// Without a graph the spec runs on fusedattn's decode kernel (support/decode_kernel_rule.h), or as
// several calls, each a plan of its own: a paged decode split into key chunks (support/decode_split.h).
std::unique_ptr<const detail::DecodeKernelCall> decode_kernel_of(const AttentionSpec& spec, Pass pass, int device,
                                                                 bool has_graph) {
  if (has_graph) return nullptr;
  const std::optional<detail::DecodeKernelShape> shape = detail::decode_kernel_in_use(spec, pass, device);
  return shape ? std::make_unique<const detail::DecodeKernelCall>(spec, *shape) : nullptr;
}

std::unique_ptr<const detail::DecodeSplitComposite> split_of(const AttentionSpec& spec, Pass pass, int device,
                                                             bool has_graph) {
  if (has_graph) return nullptr;
  const detail::DecodeSplit split = detail::decode_split_in_use(spec, pass, device);
  if (!split.split()) throw std::logic_error("fusedattn: a plan without a graph for a spec that is not split");
  return std::make_unique<const detail::DecodeSplitComposite>(spec, split);
}
}  // namespace

Plan::Plan(AttentionSpec spec, Pass pass, int device, std::shared_ptr<const graph::CompiledGraph> graph)
    : spec_(std::move(spec)), pass_(pass), device_(device),
      kv_expansion_(graph && detail::expands_kv_heads_on(spec_, pass, device)
                        ? std::make_unique<const detail::KvExpansion>(spec_)
                        : nullptr),
      decode_kernel_(decode_kernel_of(spec_, pass, device, graph != nullptr)),
      split_(split_of(spec_, pass, device, graph != nullptr || decode_kernel_ != nullptr)),
      scratch_bytes_(decode_kernel_ ? decode_kernel_->workspace_bytes()
                     : split_       ? split_->workspace_bytes()
                                    : scratch_for(spec_, pass) + (kv_expansion_ ? kv_expansion_->workspace_bytes() : 0)),
      graph_workspace_bytes_(!graph ? 0 : scratch_bytes_ ? round_up(graph->workspace_bytes()) : graph->workspace_bytes()),
      graph_(std::move(graph)), zero_sink_(zero_sink(spec_)),
      replays_(std::make_unique<detail::ReplayCache>()) {
  g_live_plans.fetch_add(1, std::memory_order_relaxed);
}

Plan::~Plan() { g_live_plans.fetch_sub(1, std::memory_order_relaxed); }

std::size_t live_plans() noexcept { return g_live_plans.load(std::memory_order_relaxed); }

// A CUDA or cuDNN failure while enqueueing names the plan's pass and spec.
void Plan::run(const ForwardTensors& t, float scale, cudaStream_t stream, const Workspace& workspace) const {
  run(t, scale, stream, workspace, RowsPastLengths::zeroed, Recording::replayed);
}

void Plan::run(const ForwardTensors& t, float scale, cudaStream_t stream, const Workspace& workspace,
               RowsPastLengths rows, Recording recording) const {
  detail::naming_the_call(pass_, spec_, [&] { enqueue(t, scale, stream, workspace, rows, recording); });
}

void Plan::run(const BackwardTensors& t, float scale, cudaStream_t stream, const Workspace& workspace) const {
  detail::naming_the_call(pass_, spec_, [&] { enqueue(t, scale, stream, workspace); });
}

void Plan::enqueue(const ForwardTensors& t, float scale, cudaStream_t stream, const Workspace& workspace,
                   RowsPastLengths rows, Recording recording) const {
  require_pass(pass_, Pass::forward);
  require_device();
  detail::check_tensor_set(spec_, t);
  detail::check_scale(scale);
  CallWorkspace scratch(workspace_bytes(), workspace, stream);  // first: a failing allocator leaves nothing written
  if (decode_kernel_) {
    decode_kernel_->forward(t, scale, stream, static_cast<char*>(scratch.data()));
    return;
  }
  if (split_) {
    split_->forward(t, scale, stream, static_cast<char*>(scratch.data()));
    return;
  }
  detail::PointersByUid pointers = detail::forward_pointers(t, &scale);
  if (spec_.fp8_scaling == Fp8Scaling::mxfp8) {
    zero_amaxes({t.mxfp8.amax_o}, stream);
  } else if (is_fp8(spec_.q.dtype)) {
    zero_amaxes({t.fp8.amax_s, t.fp8.amax_o}, stream);
  }
  void** by_uid = pointers.at;
  if (zero_sink_) by_uid[graph::kUidSink] = zero_sink_.get();
  char* ours = static_cast<char*>(scratch.data()) + graph_workspace_bytes_;
  detail::RaggedArrays ragged;
  if (is_ragged(spec_)) ragged = place_ragged(spec_, t.ragged, ours, by_uid, stream);
  ours += ragged_bytes(spec_);
  const bool full_rows = lengths_q_of_our_own(spec_, pass_) && t.seq_len_q == nullptr;
  if (full_rows) {  // cuDNN's padding mask reads both lengths
    auto* lengths = reinterpret_cast<std::int32_t*>(ours);
    detail::fill_lengths(lengths, spec_.batch(), static_cast<std::int32_t>(spec_.seq_q()), stream);
    by_uid[graph::kUidSeqLenQ] = by_uid[graph::kUidScoreModSeqLenQ] = lengths;
  }
  ours += full_rows_bytes(spec_, pass_);
  float* row_maxima = t.max_logit;
  if (spec_.max_logit == MaxLogit::head) {
    row_maxima = reinterpret_cast<float*>(ours);
    ours += row_bytes(spec_);
  }
  by_uid[graph::kUidMaxLogit] = row_maxima;
  if (!spec_.stats) by_uid[graph::kUidSumExp] = ours;
  execute(by_uid, stream, scratch.data(), recording);
  // Null with full rows too: the row maxima then treat every row as within its length.
  const std::int32_t* lengths = spec_.padding && !is_ragged(spec_) ? t.seq_len_q : nullptr;
  if (rows == RowsPastLengths::zeroed && !full_rows) {  // full rows leave no row past a length
    zero_past_lengths(spec_, spec_.o, t.o, lengths_q(spec_, t, ragged), ragged.offset_o,
                      t.ragged.cu_seqlens_q_padded, stream);
  }
  if (spec_.max_logit == MaxLogit::none) return;
  const std::int64_t b = spec_.batch(), h = spec_.heads_q(), s_q = spec_.seq_q();
  detail::finish_row_maxima(row_maxima, spec_.stats ? t.stats : nullptr, b, h, s_q, lengths, stream);
  if (spec_.max_logit == MaxLogit::head) {
    detail::reduce_row_maxima_per_head(row_maxima, b, h, s_q, lengths, t.max_logit, stream);
  }
}

void Plan::enqueue(const BackwardTensors& t, float scale, cudaStream_t stream, const Workspace& workspace) const {
  require_pass(pass_, Pass::backward);
  require_device();
  detail::check_tensor_set(spec_, t);
  detail::check_scale(scale);
  CallWorkspace scratch(workspace_bytes(), workspace, stream);  // first: a failing allocator leaves nothing written
  detail::PointersByUid pointers = detail::backward_pointers(t, &scale);
  if (spec_.fp8_scaling == Fp8Scaling::mxfp8) {
    zero_amaxes({t.mxfp8.amax_d_q, t.mxfp8.amax_d_k, t.mxfp8.amax_d_v}, stream);
  } else if (is_fp8(spec_.q.dtype)) {
    zero_amaxes({t.fp8.amax_d_q, t.fp8.amax_d_k, t.fp8.amax_d_v, t.fp8.amax_d_p}, stream);
  }
  void** by_uid = pointers.at;
  if (zero_sink_) by_uid[graph::kUidSink] = zero_sink_.get();
  char* ours = static_cast<char*>(scratch.data()) + graph_workspace_bytes_;  // ragged and expansion never meet
  detail::RaggedArrays ragged;
  if (is_ragged(spec_)) ragged = place_ragged(spec_, t.ragged, ours, by_uid, stream);
  if (kv_expansion_) kv_expansion_->before(t, ours, by_uid, stream);
  execute(by_uid, stream, scratch.data());
  if (kv_expansion_) kv_expansion_->after(t, ours, stream);
  const std::int32_t* kv_lengths = lengths_kv(spec_, t, ragged);
  const std::int32_t* kv_padded = t.ragged.cu_seqlens_kv_padded;
  zero_past_lengths(spec_, spec_.q, t.d_q, lengths_q(spec_, t, ragged), ragged.offset_q, t.ragged.cu_seqlens_q_padded,
                    stream);
  zero_past_lengths(spec_, spec_.k, t.d_k, kv_lengths, ragged.offset_k, kv_padded, stream);
  zero_past_lengths(spec_, spec_.v, t.d_v, kv_lengths, ragged.offset_v, kv_padded, stream);
}

ReplayStats Plan::replay_stats() const { return replays_->stats(); }

void Plan::require_device() const {
  int device = detail::current_device();
  if (device != device_) {
    throw InvalidArgument("device", std::to_string(device),
                          "the device the plan was built for (" + std::to_string(device_) + "); make it current");
  }
}

void Plan::execute(void* const* by_uid, cudaStream_t stream, void* workspace, Recording recording) const {
  void* sorted[graph::kUidEnd];
  int count = 0;
  for (std::int64_t uid : graph_->uids()) sorted[count++] = by_uid[uid];
  cudnnHandle_t handle = detail::handle_for(device_, stream);
  if (recording == Recording::executed) {
    replays_->note_executed();
  } else if (replayed(*replays_, *graph_, by_uid, sorted, stream, handle, workspace)) {
    return;
  }
  graph_->execute(handle, sorted, workspace);
}

}  // namespace fusedattn
