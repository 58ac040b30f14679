// fusedattn/attention.h — the C++ API: ask whether a spec is supported, get its cached plan, run it.
//
//   fusedattn::AttentionSpec spec = fusedattn::parse_spec("layout=bshd b=2 s_q=1024 ...");
//   auto plan = fusedattn::get_plan(spec, fusedattn::Pass::forward);   // built once, then cached
//   plan->run(fusedattn::ForwardTensors{q, k, v, o, stats}, scale, stream, {workspace, bytes});
//
// A cached run allocates nothing and never synchronizes, so it can be captured in a CUDA graph.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <cuda_runtime_api.h>

#include "fusedattn/autotune.h"
#include "fusedattn/fp8_scales.h"
#include "fusedattn/mxfp8_scales.h"
#include "fusedattn/spec.h"
#include "fusedattn/support.h"

namespace fusedattn {

/// Where the sequences of ragged (thd) tensors are, on the device; ignored for dense specs.
/// cu_seqlens_q (int32 [sequences + 1], starting at 0) counts Q tokens: sequence i has
/// cu_seqlens_q[i+1] - cu_seqlens_q[i] of them (0 is allowed) and, by default, starts at token
/// cu_seqlens_q[i], so sequences lie back to back. With cu_seqlens_q_padded it starts at token
/// cu_seqlens_q_padded[i] instead (each start at or after the previous sequence's end), leaving
/// gaps; O, dQ (and dK, dV on the KV side) are zero in every gap up to token
/// cu_seqlens_q_padded[sequences]. K and V likewise, with the _kv arrays; packed QKV layouts
/// (t3hd, th3d) need the KV arrays equal to Q's. Statistics are ragged too: float32 [T, h_q] by
/// Q token position (the padded one where given).
struct RaggedTensors {
  std::int64_t sequences = 0;  ///< sequences in this call, 1 .. the plan's batch; 0 in the one-call
                               ///< forms means the spec's batch
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_kv = nullptr;
  const std::int32_t* cu_seqlens_q_padded = nullptr;   ///< optional: sequence starts with gaps
  const std::int32_t* cu_seqlens_kv_padded = nullptr;  ///< optional: sequence starts with gaps
};

/// A score modifier's runtime values (spec.score_mod, fusedattn/score_mod.h), on the device, so a
/// captured call replays with whatever they hold then: `scalars` points at its scalars() float32
/// values ($0, $1, ... in order), and tensors[i] at tensor i, float32, contiguous over the axes it
/// spans in b, h, q, kv order (sizes b, h_q, s_q, s_kv), 16-byte aligned.
struct ScoreModTensors {
  const float* scalars = nullptr;
  std::array<const float*, kMaxScoreModTensors> tensors{};
};

/// Device pointers of a forward call. Each points at the tensor's first element (for packed
/// layouts, K and V point inside the shared buffer: see LayoutTensors offsets). All must be
/// 16-byte aligned. `stats` (float32 [b, h_q, s_q, 1], contiguous) is required when spec.stats;
/// its rows past a padded sequence's length are unspecified. `seq_len_q` and `seq_len_kv`
/// (int32 [b], on the device) go with spec.padding: entry b uses its first seq_len_q[b] queries
/// and seq_len_kv[b] keys, and O is zero in the rows past seq_len_q[b]. seq_len_kv is required;
/// seq_len_q may be null, for every entry's s_q queries (a decode step), which saves the caller
/// filling an array each call.
struct ForwardTensors {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* stats = nullptr;
  const std::int32_t* seq_len_q = nullptr;
  const std::int32_t* seq_len_kv = nullptr;
  const void* bias = nullptr;   ///< spec.bias != none: q's dtype, laid out as bias_desc(spec)
  const float* sink = nullptr;  ///< Softmax::sink: the per-head sink logits, float32 [h_q]
  float* max_logit = nullptr;   ///< MaxLogit::row: float32 [b, h_q, s_q] (-inf past a padded length);
                                ///< MaxLogit::head: float32 [h_q], over the batch and every valid row
  const std::int64_t* dropout_seed = nullptr;    ///< dropout > 0: Philox seed, int64 [1], device
  const std::int64_t* dropout_offset = nullptr;  ///< dropout > 0: Philox offset, int64 [1], device
  float* dropout_mask = nullptr;  ///< dropout_mask_out: float32 [b, h_q, s_q, s_kv], 1 kept / 0 dropped
  RaggedTensors ragged;           ///< ragged specs: where the sequences are (seq_len_* are then unused)
  /// Paged caches (spec.kv_pages > 0): k and v point at the page pools, and these int32
  /// [b, kv_pages] tables give each sequence's pages in order (entry j holds tokens
  /// j * page_size ..); seq_len_kv says how many tokens each sequence has. Pages past a
  /// sequence's length are not read, but their entries must still name a page of the pool.
  const std::int32_t* page_table_k = nullptr;
  const std::int32_t* page_table_v = nullptr;
  Fp8ForwardScales fp8;  ///< FP8 specs (q, k, v in E4M3 or E5M2): the scaling tensors (fp8_scales.h)
  Mxfp8ForwardTensors mxfp8;  ///< fp8_scaling=mxfp8 instead: the block scales (mxfp8_scales.h)
  ScoreModTensors score_mod;  ///< a score modifier's scalars and tensors
};

/// Device pointers of a backward call. Gradients share their inputs' descriptors (so a packed
/// QKV input gets a packed dQKV gradient); d_o shares O's. With padding, dQ is zero in the rows
/// past seq_len_q[b] and dK, dV in the rows past seq_len_kv[b]; both lengths are required here.
struct BackwardTensors {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;
  const void* d_o = nullptr;
  const float* stats = nullptr;
  void* d_q = nullptr;
  void* d_k = nullptr;
  void* d_v = nullptr;
  const std::int32_t* seq_len_q = nullptr;
  const std::int32_t* seq_len_kv = nullptr;
  const void* bias = nullptr;   ///< as in ForwardTensors
  const float* sink = nullptr;  ///< as in ForwardTensors
  void* d_bias = nullptr;       ///< spec.bias_grad: dBias, laid out as bias_desc(spec)
  float* d_sink = nullptr;      ///< Softmax::sink: dSink, float32 [h_q]
  const std::int64_t* dropout_seed = nullptr;    ///< the forward's seed and offset: the backward
  const std::int64_t* dropout_offset = nullptr;  ///< regenerates exactly the forward's mask from them
  RaggedTensors ragged;                          ///< as in ForwardTensors (the forward's offsets)
  Fp8BackwardScales fp8;                         ///< FP8 specs: the scaling tensors (fp8_scales.h)
  /// fp8_scaling=mxfp8 instead: the block scales and the FP8 copies (mxfp8_scales.h, which says
  /// what q, k, v, o and d_o above hold then).
  Mxfp8BackwardTensors mxfp8;
  ScoreModTensors score_mod;                     ///< as in ForwardTensors
};

/// Dropout's random stream: the same seed and offset give the same mask, in the forward and in
/// the backward that uses them. Between two training steps the offset must move past everything
/// a call draws: advance_dropout_offset() adds dropout_offset_increment(spec) to it on the device,
/// so when it is captured into a CUDA graph together with the calls, every replay draws anew.
std::int64_t dropout_offset_increment(const AttentionSpec& spec) noexcept;
void advance_dropout_offset(const AttentionSpec& spec, std::int64_t* offset, cudaStream_t stream);

/// Hands out scratch memory; adapters implement it with their framework's allocator. Memory is
/// released right after the work is enqueued, so the allocator must be stream-ordered.
class WorkspaceAllocator {
 public:
  virtual ~WorkspaceAllocator() = default;
  virtual void* allocate(std::size_t bytes, cudaStream_t stream) = 0;
  virtual void release(void* pointer, std::size_t bytes, cudaStream_t stream) = 0;
};

/// Scratch memory for one call: a caller's buffer of `bytes` (used when large enough), else the
/// allocator. A plan whose workspace_bytes() is 0 needs neither.
struct Workspace {
  void* data = nullptr;
  std::size_t bytes = 0;
  WorkspaceAllocator* allocator = nullptr;
};

/// How a plan's calls reached the GPU (Plan::replay_stats). A call whose pointers, workspace and
/// scale the plan has seen before is recorded into a CUDA graph and replayed from then on, which
/// costs a fraction of cuDNN's per-call host work (set_replay turns this off).
struct ReplayStats {
  std::uint64_t executed = 0;  ///< calls enqueued through cuDNN's execute
  std::uint64_t recorded = 0;  ///< calls recorded into CUDA graphs
  std::uint64_t replayed = 0;  ///< calls launched from a recorded graph (the recording call included)
  std::uint64_t evicted = 0;   ///< recorded graphs dropped to make room
};

/// Turns replay of repeated calls on or off for the whole process (FUSEDATTN_REPLAY=0 starts it
/// off); returns the previous setting. Recordings are kept while it is off.
bool set_replay(bool enabled) noexcept;

namespace graph {
class CompiledGraph;
}
namespace detail {
class ReplayCache;
class KvExpansion;
class DecodeSplitComposite;
class DecodeKernelCall;
}

/// A compiled cuDNN plan for one spec, pass and device. Immutable and shareable across threads.
class Plan {
 public:
  /// `graph` is the one built for the spec, except for an FP8 backward that runs its grouped K/V
  /// heads ungrouped (src/support/kv_expansion.h), whose graph is that of the ungrouped spec; null
  /// for a decode that runs on fusedattn's own decode kernel (src/support/decode_kernel_rule.h), or
  /// for a spec that runs as several calls, each a cached plan of its own that the plan then finds
  /// or builds: a paged decode split into key chunks (src/support/decode_split.h).
  Plan(AttentionSpec spec, Pass pass, int device, std::shared_ptr<const graph::CompiledGraph> graph);
  ~Plan();
  const AttentionSpec& spec() const noexcept { return spec_; }
  Pass pass() const noexcept { return pass_; }
  int device() const noexcept { return device_; }
  std::size_t workspace_bytes() const noexcept { return graph_workspace_bytes_ + scratch_bytes_; }

  /// Enqueues the forward pass on `stream`. Throws InvalidArgument, before any GPU work, for a
  /// tensor the spec has that is null or misaligned, one it lacks that is given, an output that
  /// shares memory with an input or another output, a missing workspace, or a plan of the other
  /// pass; CudnnError if cuDNN fails, CudaError if a launch or the workspace allocator does (both
  /// naming the pass and the spec).
  void run(const ForwardTensors& tensors, float scale, cudaStream_t stream, const Workspace& workspace = {}) const;
  /// Enqueues the backward pass (dQ, dK, dV) on `stream`; same errors as the forward.
  void run(const BackwardTensors& tensors, float scale, cudaStream_t stream, const Workspace& workspace = {}) const;

  /// Counters of this plan's calls: executed through cuDNN, recorded, replayed.
  ReplayStats replay_stats() const;

 private:
  friend class detail::DecodeSplitComposite;
  // What a forward leaves in O's rows past the sequence lengths: zeros (README), or what cuDNN left
  // there, for a split decode's partials, whose merge reads only the rows within the lengths (the
  // zeroing launch took 1.3-2.3 µs of a decode that takes 15-50 at b = 1).
  enum class RowsPastLengths { zeroed, untouched };
  // Whether a call seen before may be replayed from a recording (replay.h), or is executed by cuDNN:
  // a split decode's inner calls are, since a replay took 3-5 µs longer on the GPU there (H200,
  // b = 1 at 8k keys: 24.4 against 21.1 µs a decode), and its GPU time, not the host's, is what
  // bounds a decode step.
  enum class Recording { replayed, executed };
  void run(const ForwardTensors& tensors, float scale, cudaStream_t stream, const Workspace& workspace,
           RowsPastLengths rows, Recording recording) const;
  void enqueue(const ForwardTensors& tensors, float scale, cudaStream_t stream, const Workspace& workspace,
               RowsPastLengths rows, Recording recording) const;
  void enqueue(const BackwardTensors& tensors, float scale, cudaStream_t stream, const Workspace& workspace) const;
  // `workspace` has workspace_bytes(): cuDNN's part first, then ours.
  void execute(void* const* by_uid, cudaStream_t stream, void* workspace,
               Recording recording = Recording::replayed) const;
  void require_device() const;

  AttentionSpec spec_;
  Pass pass_;
  int device_;
  std::unique_ptr<const detail::KvExpansion> kv_expansion_;  // grouped K/V heads run ungrouped, or null
  std::unique_ptr<const detail::DecodeKernelCall> decode_kernel_;  // fusedattn's decode kernel, or null
  std::unique_ptr<const detail::DecodeSplitComposite> split_;  // a paged decode split into key chunks, or null
  std::size_t scratch_bytes_;          // ours after cuDNN's (ragged arrays, max logit rows, K/V expansion)
  std::size_t graph_workspace_bytes_;  // what cuDNN asks for
  std::shared_ptr<const graph::CompiledGraph> graph_;
  std::shared_ptr<float> zero_sink_;   // off_by_one: a sink of logit 0 per head, made at build time
  std::unique_ptr<detail::ReplayCache> replays_;  // recorded calls (src/exec/replay.h); goes before graph_
};

/// 1 / sqrt(d_qk), the scale of standard attention.
float default_scale(const AttentionSpec& spec) noexcept;

/// What the current device can do, and the library versions (compiled and loaded).
DeviceCaps current_device_caps();
Versions current_versions();

/// Full support answer on the current device: validation (throws InvalidArgument), the pure
/// policy, then cuDNN's own check, which builds the plan and caches it together with the answer,
/// so a later get_plan() for the same key is a hit and asking twice costs nothing. Asking about
/// the backward pass works without ever having built or run a forward.
/// Where the process has no GPU (no NVIDIA driver, or a driver that sees no GPU), the answer is the
/// policy's for SM 9.0 with the loaded cuDNN's version, and its policy_only says that cuDNN's own
/// check did not run and why, instead of a CudaError.
Support check_support(const AttentionSpec& spec, Pass pass);

/// The support answer for the device a target names ("sm80", "sm90", "sm100", "sm120"; "sm_90" too)
/// instead of the current GPU: validation, then the pure policy for that device with the loaded
/// cuDNN's version (the compiled one where none loads). Needs no GPU and makes no CUDA call;
/// cuDNN's own check does not run, and the answer's policy_only says so. Throws InvalidArgument
/// for the spec, or for a target that is not of that form or names an SM the policy does not know.
Support check_support(const AttentionSpec& spec, Pass pass, const std::string& device);

/// The cached plan for `spec` and `pass` on the current device: from memory, else restored from
/// the disk cache (fusedattn/disk_cache.h), else built on this first use and written there.
/// Throws InvalidArgument, NotSupported (every reason), CudnnError, CudaError or SetupError.
std::shared_ptr<const Plan> get_plan(const AttentionSpec& spec, Pass pass);
/// The same, with the plan chosen as `options` say (autotune: fusedattn/autotune.h).
std::shared_ptr<const Plan> get_plan(const AttentionSpec& spec, Pass pass, const PlanOptions& options);

/// check_support and get_plan of a spec validated already (make_spec, or ValidatedSpec's own
/// constructor): the same answers without validating it a second time in the same call.
Support check_support(const ValidatedSpec& spec, Pass pass);
std::shared_ptr<const Plan> get_plan(const ValidatedSpec& spec, Pass pass, const PlanOptions& options = {});

/// One-call forms: look up (or build) the plan, then run it.
void forward(const AttentionSpec& spec, const ForwardTensors& tensors, float scale, cudaStream_t stream,
             const Workspace& workspace = {});
void backward(const AttentionSpec& spec, const BackwardTensors& tensors, float scale, cudaStream_t stream,
              const Workspace& workspace = {});

}  // namespace fusedattn
