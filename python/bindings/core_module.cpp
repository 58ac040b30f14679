// fusedattn._core: the C++ core as a Python module (nanobind). Framework-free: tensors arrive as
// device addresses and shapes as tuples, so the PyTorch and JAX adapters share it and neither
// framework's headers are needed here (DESIGN.md §1).
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "fusedattn/attention.h"
#include "fusedattn/build_info.h"
#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/plan_cache.h"
#include "fusedattn/spec.h"
#include "python_errors.h"

namespace nb = nanobind;
using namespace nb::literals;
namespace fa = fusedattn;

namespace {

fa::Pass parse_pass(const std::string& text) {
  if (text == "forward") return fa::Pass::forward;
  if (text == "backward") return fa::Pass::backward;
  throw fa::InvalidArgument("pass", text, "forward or backward");
}

template <class Tensors>
void fill_common(Tensors& t, std::uintptr_t seq_len_q, std::uintptr_t seq_len_kv, std::uintptr_t bias,
                 std::uintptr_t sink, std::uintptr_t dropout_seed, std::uintptr_t dropout_offset,
                 std::int64_t sequences, std::uintptr_t cu_seqlens_q, std::uintptr_t cu_seqlens_kv) {
  t.seq_len_q = reinterpret_cast<const std::int32_t*>(seq_len_q);
  t.seq_len_kv = reinterpret_cast<const std::int32_t*>(seq_len_kv);
  t.bias = reinterpret_cast<const void*>(bias);
  t.sink = reinterpret_cast<const float*>(sink);
  t.dropout_seed = reinterpret_cast<const std::int64_t*>(dropout_seed);
  t.dropout_offset = reinterpret_cast<const std::int64_t*>(dropout_offset);
  t.ragged.sequences = sequences;
  t.ragged.cu_seqlens_q = reinterpret_cast<const std::int32_t*>(cu_seqlens_q);
  t.ragged.cu_seqlens_kv = reinterpret_cast<const std::int32_t*>(cu_seqlens_kv);
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "fusedattn's C++ core: specs, support answers, cached plans, and their execution.";
  // The adapters keep specs and plans for the whole process (their per-signature caches), so
  // some are still alive when the interpreter tears the module down: that is by design, not a
  // reference leak, and nanobind's report of it at exit would only be noise.
  nb::set_leak_warnings(false);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const fa::Error& error) {
      fa::python::set_python_error(error);
    }
  });

  nb::class_<fa::AttentionSpec>(m, "Spec", "What to compute; prints as the one-line spec string.")
      .def_static("parse", &fa::parse_spec, "text"_a,
                  "Parses a spec string, the one grammar every adapter builds specs in (fusedattn run takes it too).")
      .def("__str__", [](const fa::AttentionSpec& spec) { return fa::to_string(spec); })
      .def("__repr__", [](const fa::AttentionSpec& spec) { return "Spec(\"" + fa::to_string(spec) + "\")"; })
      .def("__eq__", [](const fa::AttentionSpec& a, const fa::AttentionSpec& b) { return a == b; })
      .def("__hash__", [](const fa::AttentionSpec& spec) { return fa::hash_value(spec); })
      .def("validate", &fa::validate)
      .def_prop_ro("batch", &fa::AttentionSpec::batch)
      .def_prop_ro("heads_q", &fa::AttentionSpec::heads_q)
      .def_prop_ro("heads_kv", &fa::AttentionSpec::heads_kv)
      .def_prop_ro("seq_q", &fa::AttentionSpec::seq_q)
      .def_prop_ro("seq_kv", &fa::AttentionSpec::seq_kv)
      .def_prop_ro("head_dim_qk", &fa::AttentionSpec::head_dim_qk)
      .def_prop_ro("head_dim_v", &fa::AttentionSpec::head_dim_v)
      .def_prop_ro("default_scale", &fa::default_scale);

  m.def(
      "check_support",
      [](const fa::AttentionSpec& spec, const std::string& pass) {
        const fa::Support support = fa::check_support(spec, parse_pass(pass));
        std::vector<std::tuple<std::string, std::string, std::string, std::string>> reasons;
        for (const fa::Reason& r : support.reasons) reasons.emplace_back(r.field, r.value, r.requirement, r.lifted_by);
        return std::make_tuple(support.ok(), reasons, support.to_string());
      },
      "spec"_a, "pass_"_a,
      "(supported, [(field, value, requirement, lifted_by)], text) on the current device: the policy, then "
      "cuDNN's own check, which builds and caches the plan.");

  nb::class_<fa::Plan>(m, "Plan", "A compiled, cached plan: run it with device addresses.")
      .def_prop_ro("workspace_bytes", &fa::Plan::workspace_bytes)
      .def_prop_ro("spec", [](const fa::Plan& plan) { return plan.spec(); })
      .def_prop_ro(
          "replay_stats",
          [](const fa::Plan& plan) {
            const fa::ReplayStats s = plan.replay_stats();
            nb::dict out;
            out["executed"] = s.executed;
            out["recorded"] = s.recorded;
            out["replayed"] = s.replayed;
            out["evicted"] = s.evicted;
            return out;
          },
          "Calls executed through cuDNN, recorded, replayed from a recording, and recordings evicted.")
      .def(
          "forward",
          [](const fa::Plan& plan, std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t o,
             std::uintptr_t stats, float scale, std::uintptr_t stream, std::uintptr_t workspace,
             std::size_t workspace_bytes, std::uintptr_t seq_len_q, std::uintptr_t seq_len_kv, std::uintptr_t bias,
             std::uintptr_t sink, std::uintptr_t dropout_seed, std::uintptr_t dropout_offset, std::int64_t sequences,
             std::uintptr_t cu_seqlens_q, std::uintptr_t cu_seqlens_kv, std::uintptr_t page_table_k,
             std::uintptr_t page_table_v, std::uintptr_t max_logit) {
            fa::ForwardTensors t;
            t.max_logit = reinterpret_cast<float*>(max_logit);
            t.page_table_k = reinterpret_cast<const std::int32_t*>(page_table_k);
            t.page_table_v = reinterpret_cast<const std::int32_t*>(page_table_v);
            t.q = reinterpret_cast<const void*>(q);
            t.k = reinterpret_cast<const void*>(k);
            t.v = reinterpret_cast<const void*>(v);
            t.o = reinterpret_cast<void*>(o);
            t.stats = reinterpret_cast<float*>(stats);
            fill_common(t, seq_len_q, seq_len_kv, bias, sink, dropout_seed, dropout_offset, sequences, cu_seqlens_q,
                        cu_seqlens_kv);
            plan.run(t, scale, reinterpret_cast<cudaStream_t>(stream),
                     fa::Workspace{reinterpret_cast<void*>(workspace), workspace_bytes});
          },
          "q"_a, "k"_a, "v"_a, "o"_a, "stats"_a, "scale"_a, "stream"_a, "workspace"_a, "workspace_bytes"_a,
          nb::kw_only(), "seq_len_q"_a = 0, "seq_len_kv"_a = 0, "bias"_a = 0, "sink"_a = 0, "dropout_seed"_a = 0,
          "dropout_offset"_a = 0, "sequences"_a = 0, "cu_seqlens_q"_a = 0, "cu_seqlens_kv"_a = 0,
          "page_table_k"_a = 0, "page_table_v"_a = 0, "max_logit"_a = 0,
          "Enqueues the forward on `stream` (a cudaStream_t as an int). Addresses are ints; 0 is none.")
      .def(
          "backward",
          [](const fa::Plan& plan, std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t o,
             std::uintptr_t d_o, std::uintptr_t stats, std::uintptr_t d_q, std::uintptr_t d_k, std::uintptr_t d_v,
             float scale, std::uintptr_t stream, std::uintptr_t workspace, std::size_t workspace_bytes,
             std::uintptr_t seq_len_q, std::uintptr_t seq_len_kv, std::uintptr_t bias, std::uintptr_t sink,
             std::uintptr_t d_bias, std::uintptr_t d_sink, std::uintptr_t dropout_seed, std::uintptr_t dropout_offset,
             std::int64_t sequences, std::uintptr_t cu_seqlens_q, std::uintptr_t cu_seqlens_kv) {
            fa::BackwardTensors t;
            t.q = reinterpret_cast<const void*>(q);
            t.k = reinterpret_cast<const void*>(k);
            t.v = reinterpret_cast<const void*>(v);
            t.o = reinterpret_cast<const void*>(o);
            t.d_o = reinterpret_cast<const void*>(d_o);
            t.stats = reinterpret_cast<const float*>(stats);
            t.d_q = reinterpret_cast<void*>(d_q);
            t.d_k = reinterpret_cast<void*>(d_k);
            t.d_v = reinterpret_cast<void*>(d_v);
            t.d_bias = reinterpret_cast<void*>(d_bias);
            t.d_sink = reinterpret_cast<float*>(d_sink);
            fill_common(t, seq_len_q, seq_len_kv, bias, sink, dropout_seed, dropout_offset, sequences, cu_seqlens_q,
                        cu_seqlens_kv);
            plan.run(t, scale, reinterpret_cast<cudaStream_t>(stream),
                     fa::Workspace{reinterpret_cast<void*>(workspace), workspace_bytes});
          },
          "q"_a, "k"_a, "v"_a, "o"_a, "d_o"_a, "stats"_a, "d_q"_a, "d_k"_a, "d_v"_a, "scale"_a, "stream"_a,
          "workspace"_a, "workspace_bytes"_a, nb::kw_only(), "seq_len_q"_a = 0, "seq_len_kv"_a = 0, "bias"_a = 0,
          "sink"_a = 0, "d_bias"_a = 0, "d_sink"_a = 0, "dropout_seed"_a = 0, "dropout_offset"_a = 0,
          "sequences"_a = 0, "cu_seqlens_q"_a = 0, "cu_seqlens_kv"_a = 0,
          "Enqueues the backward (dQ, dK, dV) on `stream`.");

  m.def(
      "get_plan", [](const fa::AttentionSpec& spec, const std::string& pass) { return fa::get_plan(spec, parse_pass(pass)); },
      "spec"_a, "pass_"_a, "The cached plan (built on first use); raises NotSupportedError with every reason.");
  m.def("build_info", [] { return fa::build_info().to_string(); }, "Versions compiled and loaded, and the GPU.");
  m.def("set_replay", &fa::set_replay, "enabled"_a,
        "Turns replay of repeated calls on or off for the process; returns the previous setting.");
  m.def(
      "plan_cache_stats",
      [] {
        const fa::CacheStats s = fa::plan_cache_stats();
        nb::dict out;
        out["hits"] = s.hits;
        out["misses"] = s.misses;
        out["builds"] = s.builds;
        out["build_ms"] = s.build_ms;
        out["evictions"] = s.evictions;
        out["size"] = s.size;
        return out;
      },
      "The process-wide plan cache's counters.");
}
