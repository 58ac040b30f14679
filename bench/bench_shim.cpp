// bench/bench_shim.cpp — C ABI for bench/run_bench.py: times fusedattn on tensors PyTorch owns,
// so fusedattn and PyTorch run in one process, on the same data, on the same stream.
//
// Every function returns as bench/c_abi.h says, with "<kind>: <message>" in `err` on failure.
// A `stream` of NULL is the legacy default stream; pass torch.cuda.current_stream().cuda_stream.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "testing/cuda_check.h"
#include "c_abi.h"
#include "forward_call.h"
#include "host_timing.h"
#include "fusedattn/attention.h"
#include "fusedattn/build_info.h"
#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/plan_cache.h"

namespace fa = fusedattn;
using fa::bench::ForwardCall;
using fa::bench::guarded;
using fa::bench::prepare_forward;
using fa::bench::scale_for;
using fa::bench::spec_for;
using fa::bench::workspace_for;

namespace {

// An instantiated CUDA graph holding one 4-byte memset: what launching any graph costs at least.
class GraphOfOneMemset {
 public:
  explicit GraphOfOneMemset(void* target) {
    cudaGraph_t graph = nullptr;
    fa::check::check_cuda(cudaGraphCreate(&graph, 0), "cudaGraphCreate");
    cudaMemsetParams params{};
    params.dst = target;
    params.value = 0;
    params.elementSize = 1;
    params.width = 4;
    params.height = 1;
    cudaGraphNode_t node = nullptr;
    cudaError_t added = cudaGraphAddMemsetNode(&node, graph, nullptr, 0, &params);
    cudaError_t instantiated = added == cudaSuccess ? cudaGraphInstantiate(&exec_, graph, 0) : added;
    cudaGraphDestroy(graph);
    fa::check::check_cuda(instantiated, "cudaGraphAddMemsetNode / cudaGraphInstantiate");
  }
  ~GraphOfOneMemset() { cudaGraphExecDestroy(exec_); }
  GraphOfOneMemset(const GraphOfOneMemset&) = delete;
  GraphOfOneMemset& operator=(const GraphOfOneMemset&) = delete;
  void launch(cudaStream_t stream) const { fa::check::check_cuda(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch"); }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace

extern "C" {

/// Canonical spec string for a problem in a named layout (so Python need not know the grammar).
/// `page_size` and `pages` size a paged layout's pools (0 otherwise).
int fa_make_spec(const char* layout, const char* dtype, long long b, long long s_q, long long s_kv, long long h_q,
                 long long h_kv, long long d_qk, long long d_v, int causal, int bottom_right, long long page_size,
                 long long pages, char* out, int outlen, char* err, int errlen) {
  return guarded(err, errlen, [&] {
    fa::ProblemShape shape;
    shape.page_size = page_size;
    shape.pages = pages;
    shape.dtype = fa::parse_dtype(dtype, "dtype");
    shape.batch = b;
    shape.seq_q = s_q;
    shape.seq_kv = s_kv;
    shape.heads_q = h_q;
    shape.heads_kv = h_kv;
    shape.head_dim_qk = d_qk;
    shape.head_dim_v = d_v;
    fa::AttentionSpec spec = fa::spec_for_layout(fa::parse_layout(layout, "layout"), shape);
    spec.window = causal != 0 ? fa::kCausal : fa::Window{};
    spec.alignment = bottom_right != 0 ? fa::Alignment::bottom_right : fa::Alignment::top_left;
    spec.stats = true;
    fa::validate(spec);
    const std::string text = fa::to_string(spec);
    if (static_cast<int>(text.size()) >= outlen) throw fa::InvalidArgument("outlen", std::to_string(outlen), "too small for the spec string");
    std::memcpy(out, text.c_str(), text.size() + 1);
  });
}

/// Turns replay of repeated calls on or off (fusedattn::set_replay), for the host-time comparison
/// of both in one process. Returns the previous setting.
int fa_bench_set_replay(int enabled) { return fa::set_replay(enabled != 0) ? 1 : 0; }

/// Host time to enqueue one forward, two ways: the one-call API (cache lookup included) and a held
/// plan's run(); and, as the floor of any replayed call, the launch of a CUDA graph of one 4-byte
/// memset node (into O). Run with replay off (fa_bench_set_replay), Plan::run is the cuDNN-only
/// baseline: every call goes through cuDNN's execute. Only enqueueing is timed (synchronized before
/// and after the loop); keep the shape tiny or the launch queue fills and this becomes kernel time.
int fa_bench_host_overhead(const char* spec, const void* q, const void* k, const void* v, void* o, float* stats,
                           float scale, void* stream, int calls, double* us_per_call_api,
                           double* us_per_call_plan_run, double* us_per_call_graph_floor, char* err, int errlen) {
  return guarded(err, errlen, [&] {
    if (calls < 1) throw fa::InvalidArgument("calls", std::to_string(calls), "at least 1");
    const ForwardCall c = prepare_forward(spec, q, k, v, o, stats, scale, stream);
    const GraphOfOneMemset floor(o);
    const std::function<void()> loops[3] = {
        [&] { fa::forward(c.spec, c.tensors, c.scale, c.stream, c.workspace); },
        [&] { c.plan->run(c.tensors, c.scale, c.stream, c.workspace); },
        [&] { floor.launch(c.stream); },
    };
    double* medians[3] = {us_per_call_api, us_per_call_plan_run, us_per_call_graph_floor};
    fa::bench::interleaved_medians(calls, c.stream, loops, 3, medians);
  });
}

/// Enqueues `calls` forward calls (stats written when `stats` is not NULL) and returns without
/// synchronizing. Python times them with the same CUDA-event harness it uses for PyTorch, behind
/// a spin kernel, so both libraries are measured by one method on a busy, clocked-up GPU.
int fa_bench_enqueue_forward(const char* spec, const void* q, const void* k, const void* v, void* o, float* stats,
                             float scale, void* stream, int calls, char* err, int errlen) {
  return guarded(err, errlen, [&] {
    const ForwardCall c = prepare_forward(spec, q, k, v, o, stats, scale, stream);
    for (int i = 0; i < calls; ++i) fa::forward(c.spec, c.tensors, c.scale, c.stream, c.workspace);
  });
}

/// Enqueues `calls` forward (with stats) + backward pairs and returns without synchronizing.
int fa_bench_enqueue_forward_backward(const char* spec, const void* q, const void* k, const void* v, void* o,
                                      float* stats, const void* d_o, void* d_q, void* d_k, void* d_v, float scale,
                                      void* stream, int calls, char* err, int errlen) {
  return guarded(err, errlen, [&] {
    if (stats == nullptr) throw fa::InvalidArgument("stats", "NULL", "forward+backward needs a stats buffer");
    const ForwardCall c = prepare_forward(spec, q, k, v, o, stats, scale, stream);
    const fa::Workspace bwd_ws = workspace_for(fa::get_plan(c.spec, fa::Pass::backward));
    const fa::BackwardTensors bwd{q, k, v, o, d_o, stats, d_q, d_k, d_v};
    for (int i = 0; i < calls; ++i) {
      fa::forward(c.spec, c.tensors, c.scale, c.stream, c.workspace);
      fa::backward(c.spec, bwd, c.scale, c.stream, bwd_ws);
    }
  });
}

/// A packed training step: enqueues `calls` ragged forward (with stats) + backward pairs over
/// `sequences` sequences packed back to back (cu_seqlens: int32 [sequences + 1] on the device,
/// shared by Q and KV) through the one-call API, as a training loop would, and returns without
/// synchronizing. *host_us: enqueueing time per pair (plan lookups included; a first call at a new
/// bucket also builds its plans, which the cache counters show).
int fa_bench_ragged_step(const char* spec, long long sequences, const int* cu_seqlens, const void* q, const void* k,
                         const void* v, void* o, float* stats, const void* d_o, void* d_q, void* d_k, void* d_v,
                         float scale, void* stream, int calls, double* host_us, char* err, int errlen) {
  return guarded(err, errlen, [&] {
    const fa::AttentionSpec s = spec_for(spec, /*stats=*/true);
    const auto start = std::chrono::steady_clock::now();
    fa::ForwardTensors f{q, k, v, o, stats};
    fa::BackwardTensors b{q, k, v, o, d_o, stats, d_q, d_k, d_v};
    f.ragged = b.ragged = fa::RaggedTensors{sequences, cu_seqlens, cu_seqlens, nullptr, nullptr};
    const float sc = scale_for(s, scale);
    const auto st = static_cast<cudaStream_t>(stream);
    for (int i = 0; i < calls; ++i) {
      fa::forward(s, f, sc, st, workspace_for(fa::get_plan(s, fa::Pass::forward)));
      fa::backward(s, b, sc, st, workspace_for(fa::get_plan(s, fa::Pass::backward)));
    }
    *host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / calls;
  });
}

/// Decode over a paged cache: enqueues `calls` forward calls (no statistics) with the pools,
/// int32 page tables [b, kv_pages] and int32 lengths [b] on the device; no synchronization.
int fa_bench_enqueue_paged_forward(const char* spec, const void* q, const void* k_pool, const void* v_pool, void* o,
                                   const int* seq_len_q, const int* seq_len_kv, const int* table_k,
                                   const int* table_v, float scale, void* stream, int calls, char* err, int errlen) {
  return guarded(err, errlen, [&] {
    const ForwardCall c = prepare_forward(spec, q, k_pool, v_pool, o, nullptr, scale, stream);
    fa::ForwardTensors t = c.tensors;
    t.seq_len_q = seq_len_q;
    t.seq_len_kv = seq_len_kv;
    t.page_table_k = table_k;
    t.page_table_v = table_v;
    for (int i = 0; i < calls; ++i) c.plan->run(t, c.scale, c.stream, c.workspace);
  });
}

/// Host time of building the forward and backward plans from a cold cache (clears the cache).
int fa_bench_plan_build(const char* spec, double* forward_ms, double* backward_ms, char* err, int errlen) {
  return guarded(err, errlen, [&] {
    const fa::AttentionSpec s = spec_for(spec, /*stats=*/true);
    fa::clear_plan_cache();
    auto start = std::chrono::steady_clock::now();
    fa::get_plan(s, fa::Pass::forward);
    *forward_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    start = std::chrono::steady_clock::now();
    fa::get_plan(s, fa::Pass::backward);
    *backward_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  });
}

/// Counters of the process-wide plan cache.
int fa_bench_cache_stats(unsigned long long* builds, double* build_ms, unsigned long long* hits,
                         unsigned long long* misses, unsigned long long* evictions) {
  fa::CacheStats stats;
  const int rc = guarded(nullptr, 0, [&] { stats = fa::plan_cache_stats(); });
  *builds = stats.builds;
  *build_ms = stats.build_ms;
  *hits = stats.hits;
  *misses = stats.misses;
  *evictions = stats.evictions;
  return rc;
}

/// fusedattn's build info, multi-line; the string lives until the process ends.
const char* fa_build_info() {
  static const std::string text = fa::build_info().to_string();
  return text.c_str();
}

}  // extern "C"
