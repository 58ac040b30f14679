// bench/bench_module.cpp — fusedattn_bench, the benchmark's Python module (nanobind): fusedattn's
// C++ API timed on tensors PyTorch owns, so both libraries run in one process, on the same data,
// on the same stream (bench/run_bench.py, bench/run_bench_varlen.py).
//
// Tensors and streams cross as integer device addresses (tensor.data_ptr(),
// torch.cuda.current_stream().cuda_stream; 0 is the legacy default stream); every argument after
// the spec is a keyword. Loops whose host time is the result run here, in C++: timed from Python
// they would measure Python. Errors are fusedattn.errors' classes, as from fusedattn._core.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "forward_call.h"
#include "fusedattn/attention.h"
#include "fusedattn/autotune.h"
#include "fusedattn/disk_cache.h"
#include "fusedattn/build_info.h"
#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/plan_cache.h"
#include "host_timing.h"
#include "python_errors.h"
#include "testing/cuda_check.h"

namespace nb = nanobind;
using namespace nb::literals;
namespace fa = fusedattn;

namespace {

using Address = std::uintptr_t;

template <class T = void>
T* at(Address address) {
  return reinterpret_cast<T*>(address);
}

cudaStream_t stream_at(Address address) { return reinterpret_cast<cudaStream_t>(address); }

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

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

std::string make_spec(const std::string& layout, const std::string& dtype, std::int64_t b, std::int64_t s_q,
                      std::int64_t s_kv, std::int64_t h_q, std::int64_t h_kv, std::int64_t d_qk, std::int64_t d_v,
                      bool causal, bool bottom_right, std::int64_t page_size, std::int64_t pages) {
  fa::ProblemShape shape;
  shape.dtype = fa::parse_dtype(dtype, "dtype");
  shape.batch = b;
  shape.seq_q = s_q;
  shape.seq_kv = s_kv;
  shape.heads_q = h_q;
  shape.heads_kv = h_kv;
  shape.head_dim_qk = d_qk;
  shape.head_dim_v = d_v;
  shape.page_size = page_size;
  shape.pages = pages;
  fa::AttentionSpec spec = fa::spec_for_layout(fa::parse_layout(layout, "layout"), shape);
  spec.window = causal ? fa::kCausal : fa::Window{};
  spec.alignment = bottom_right ? fa::Alignment::bottom_right : fa::Alignment::top_left;
  spec.stats = true;
  fa::validate(spec);
  return fa::to_string(spec);
}

// Host time to enqueue one forward, two ways: the one-call API (cache lookup included) and a held
// plan's run(); and, as the floor of any replayed call, the launch of a CUDA graph of one 4-byte
// memset node (into O). With replay off (set_replay), Plan::run is the cuDNN-only baseline: every
// call goes through cuDNN's execute. Only enqueueing is timed (synchronized before and after each
// loop); keep the shape tiny or the launch queue fills and this becomes kernel time.
nb::dict host_overhead(const std::string& spec, Address q, Address k, Address v, Address o, Address stats,
                       std::optional<float> scale, Address stream, int calls) {
  if (calls < 1) throw fa::InvalidArgument("calls", std::to_string(calls), "at least 1");
  const fa::bench::ForwardCall c =
      fa::bench::prepare_forward(spec, fa::ForwardTensors{at(q), at(k), at(v), at(o), at<float>(stats)}, scale,
                                 stream_at(stream));
  const GraphOfOneMemset floor(at(o));
  const std::vector<double> us = fa::bench::interleaved_medians(
      calls, c.stream,
      {[&] { fa::forward(c.spec, c.tensors, c.scale, c.stream, c.workspace); },
       [&] { c.plan->run(c.tensors, c.scale, c.stream, c.workspace); }, [&] { floor.launch(c.stream); }});
  nb::dict out;
  out["api_us"] = us[0];
  out["plan_run_us"] = us[1];
  out["graph_floor_us"] = us[2];
  return out;
}

// `calls` forward calls, enqueued without synchronizing: Python times them with the CUDA-event
// harness it times PyTorch with, behind a spin kernel, so both are measured one way.
void enqueue_forward(const std::string& spec, Address q, Address k, Address v, Address o, Address stats,
                     std::optional<float> scale, Address stream, int calls) {
  const fa::bench::ForwardCall c =
      fa::bench::prepare_forward(spec, fa::ForwardTensors{at(q), at(k), at(v), at(o), at<float>(stats)}, scale,
                                 stream_at(stream));
  for (int i = 0; i < calls; ++i) fa::forward(c.spec, c.tensors, c.scale, c.stream, c.workspace);
}

// `calls` forward (with stats) + backward pairs, enqueued without synchronizing.
void enqueue_forward_backward(const std::string& spec, Address q, Address k, Address v, Address o, Address stats,
                              Address d_o, Address d_q, Address d_k, Address d_v, std::optional<float> scale,
                              Address stream, int calls) {
  if (stats == 0) throw fa::InvalidArgument("stats", "0", "forward+backward needs a stats buffer");
  const fa::bench::ForwardCall c =
      fa::bench::prepare_forward(spec, fa::ForwardTensors{at(q), at(k), at(v), at(o), at<float>(stats)}, scale,
                                 stream_at(stream));
  const fa::Workspace backward_workspace = fa::bench::workspace_for(fa::get_plan(c.spec, fa::Pass::backward));
  const fa::BackwardTensors backward{at(q), at(k), at(v), at(o), at(d_o), at<float>(stats), at(d_q), at(d_k), at(d_v)};
  for (int i = 0; i < calls; ++i) {
    fa::forward(c.spec, c.tensors, c.scale, c.stream, c.workspace);
    fa::backward(c.spec, backward, c.scale, c.stream, backward_workspace);
  }
}

// A packed training step: `calls` ragged forward (with stats) + backward pairs over `sequences`
// sequences packed back to back (cu_seqlens: int32 [sequences + 1], shared by Q and KV) through
// the one-call API, as a training loop makes them, without synchronizing. Returns the host
// microseconds of enqueueing per pair (plan lookups included; a first call at a new bucket also
// builds its plans, which the cache counters show).
double ragged_step(const std::string& spec, std::int64_t sequences, Address cu_seqlens, Address q, Address k,
                   Address v, Address o, Address stats, Address d_o, Address d_q, Address d_k, Address d_v,
                   std::optional<float> scale, Address stream, int calls) {
  if (calls < 1) throw fa::InvalidArgument("calls", std::to_string(calls), "at least 1");
  const fa::AttentionSpec s = fa::bench::spec_for(spec, /*stats=*/true);
  const auto start = std::chrono::steady_clock::now();
  fa::ForwardTensors f{at(q), at(k), at(v), at(o), at<float>(stats)};
  fa::BackwardTensors b{at(q), at(k), at(v), at(o), at(d_o), at<float>(stats), at(d_q), at(d_k), at(d_v)};
  const auto* cu = at<const std::int32_t>(cu_seqlens);
  f.ragged = b.ragged = fa::RaggedTensors{sequences, cu, cu, nullptr, nullptr};
  const float sc = fa::bench::scale_for(s, scale);
  for (int i = 0; i < calls; ++i) {
    fa::forward(s, f, sc, stream_at(stream), fa::bench::workspace_for(fa::get_plan(s, fa::Pass::forward)));
    fa::backward(s, b, sc, stream_at(stream), fa::bench::workspace_for(fa::get_plan(s, fa::Pass::backward)));
  }
  return ms_since(start) * 1000.0 / calls;
}

// Decode over a paged cache: `calls` forward calls (no statistics) on the pools, with int32 page
// tables [b, kv_pages] and int32 lengths [b] on the device, through a held plan; no synchronization.
void enqueue_paged_forward(const std::string& spec, Address q, Address k_pool, Address v_pool, Address o,
                           Address seq_len_q, Address seq_len_kv, Address page_table_k, Address page_table_v,
                           std::optional<float> scale, Address stream, int calls) {
  fa::ForwardTensors t{at(q), at(k_pool), at(v_pool), at(o), nullptr};
  t.seq_len_q = at<const std::int32_t>(seq_len_q);
  t.seq_len_kv = at<const std::int32_t>(seq_len_kv);
  t.page_table_k = at<const std::int32_t>(page_table_k);
  t.page_table_v = at<const std::int32_t>(page_table_v);
  const fa::bench::ForwardCall c = fa::bench::prepare_forward(spec, t, scale, stream_at(stream));
  for (int i = 0; i < calls; ++i) c.plan->run(c.tensors, c.scale, c.stream, c.workspace);
}

// Host milliseconds of building the forward and backward plans from a cold cache (it clears it)
// with the disk cache off, then of restoring them from the disk cache (when on) after clearing
// it again, as a new process would.
nb::dict plan_build_ms(const std::string& spec) {
  const fa::AttentionSpec s = fa::bench::spec_for(spec, /*stats=*/true);
  const std::string folder = fa::plan_dir();
  nb::dict out;
  for (const char* what : {"build", "restore", "restore"}) {  // the first restore writes missing entries
    fa::set_plan_dir(std::string(what) == "build" ? "" : folder);
    if (std::string(what) == "restore" && folder.empty()) break;
    fa::clear_plan_cache();
    auto start = std::chrono::steady_clock::now();
    fa::get_plan(s, fa::Pass::forward);
    out[(std::string("plan_") + what + "_fwd_ms").c_str()] = ms_since(start);
    start = std::chrono::steady_clock::now();
    fa::get_plan(s, fa::Pass::backward);
    out[(std::string("plan_") + what + "_bwd_ms").c_str()] = ms_since(start);
  }
  fa::set_plan_dir(folder);
  return out;
}

}  // namespace

NB_MODULE(fusedattn_bench, m) {
  m.doc() = "fusedattn's C++ API timed for the benchmarks: tensors as device addresses, host loops in C++.";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const fa::Error& error) {
      fa::python::set_python_error(error);
    }
  });

  m.def("build_info", [] { return fa::build_info().to_string(); }, "fusedattn's build info, multi-line.");
  m.def("set_replay", &fa::set_replay, "enabled"_a,
        "Turns replay of repeated calls on or off for the whole process; returns the previous setting.");
  m.def("set_autotune", &fa::set_autotune, "enabled"_a,
        "Sets the process default of autotune (plans timed and chosen); returns the previous setting.");
  m.def("make_spec", &make_spec, "layout"_a, nb::kw_only(), "dtype"_a = "bf16", "b"_a, "s_q"_a, "s_kv"_a, "h_q"_a,
        "h_kv"_a, "d_qk"_a, "d_v"_a, "causal"_a = false, "bottom_right"_a = false, "page_size"_a = 0, "pages"_a = 0,
        "The spec string of a problem in a named layout, statistics on (so Python need not know the grammar); "
        "page_size and pages size a paged layout's pools.");
  m.def("host_overhead", &host_overhead, "spec"_a, nb::kw_only(), "q"_a, "k"_a, "v"_a, "o"_a, "stats"_a = 0,
        "scale"_a = nb::none(), "stream"_a = 0, "calls"_a,
        "Host microseconds per forward call, medians of 11 interleaved rounds of `calls` calls: "
        "{'api_us': fusedattn::forward, 'plan_run_us': Plan::run, 'graph_floor_us': a CUDA graph of one memset}.");
  m.def("enqueue_forward", &enqueue_forward, "spec"_a, nb::kw_only(), "q"_a, "k"_a, "v"_a, "o"_a, "stats"_a = 0,
        "scale"_a = nb::none(), "stream"_a = 0, "calls"_a = 1,
        "Enqueues `calls` forward calls (statistics written when `stats` is given); no synchronization.");
  m.def("enqueue_forward_backward", &enqueue_forward_backward, "spec"_a, nb::kw_only(), "q"_a, "k"_a, "v"_a, "o"_a,
        "stats"_a, "d_o"_a, "d_q"_a, "d_k"_a, "d_v"_a, "scale"_a = nb::none(), "stream"_a = 0, "calls"_a = 1,
        "Enqueues `calls` forward + backward pairs; no synchronization.");
  m.def("ragged_step", &ragged_step, "spec"_a, nb::kw_only(), "sequences"_a, "cu_seqlens"_a, "q"_a, "k"_a, "v"_a,
        "o"_a, "stats"_a, "d_o"_a, "d_q"_a, "d_k"_a, "d_v"_a, "scale"_a = nb::none(), "stream"_a = 0, "calls"_a = 1,
        "Enqueues `calls` packed forward + backward pairs through the one-call API; returns host microseconds "
        "per pair.");
  m.def("enqueue_paged_forward", &enqueue_paged_forward, "spec"_a, nb::kw_only(), "q"_a, "k_pool"_a, "v_pool"_a,
        "o"_a, "seq_len_q"_a, "seq_len_kv"_a, "page_table_k"_a, "page_table_v"_a, "scale"_a = nb::none(),
        "stream"_a = 0, "calls"_a = 1, "Enqueues `calls` decode calls over paged caches; no synchronization.");
  m.def("plan_build_ms", &plan_build_ms, "spec"_a,
        "Host milliseconds of building the forward and backward plans from a cleared cache: "
        "{'plan_build_fwd_ms', 'plan_build_bwd_ms'}.");
}
