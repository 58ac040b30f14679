// fusedattn._core: the C++ core as a Python module (nanobind), typed. Framework-free: tensors
// arrive as (dtype name, sizes, strides) views and device addresses, so the PyTorch and JAX
// adapters share it and neither framework's headers are needed here (DESIGN.md §1, §11).
//
// What crosses: Config (the frozen configuration of a call, fusedattn/call.h), Spec (the
// validated spec), Pass, ForwardTensors / BackwardTensors (named device addresses), Plan.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fusedattn/attention.h"
#include "fusedattn/build_info.h"
#include "fusedattn/call.h"
#include "fusedattn/disk_cache.h"
#include "fusedattn/errors.h"
#include "fusedattn/output_shapes.h"
#include "fusedattn/plan_cache.h"
#include "fusedattn/spec.h"
#include "fusedattn/tensor_slots.h"
#include "fusedattn/warmup.h"
#include "fp8_backward_bindings.h"
#include "fp8_bindings.h"
#include "python_errors.h"
#include "score_mod_bindings.h"

namespace nb = nanobind;
using namespace nb::literals;
namespace fa = fusedattn;

namespace {

// --- Python values to the spec string's text for one option ----------------------------------

// A keyword argument's value in the spec string's form: bools as 0/1, a (left, right) pair as
// "left,right", None as the option's "none", anything else by str() (floats by repr(), exact).
std::string option_text(const nb::handle& value) {
  if (value.is_none()) return "none";
  if (nb::isinstance<nb::bool_>(value)) return nb::cast<bool>(value) ? "1" : "0";
  if (nb::isinstance<nb::tuple>(value) || nb::isinstance<nb::list>(value)) {
    std::string out;
    for (nb::handle item : value) out += (out.empty() ? "" : ",") + nb::cast<std::string>(nb::str(item));
    return out;
  }
  if (nb::isinstance<nb::float_>(value)) return nb::cast<std::string>(nb::repr(value));
  return nb::cast<std::string>(nb::str(value));
}

// ("bf16" or a framework's dtype name, sizes, strides) -> TensorView.
fa::TensorView tensor_view(const nb::handle& described, const char* name) {
  auto [dtype, sizes, strides] =
      nb::cast<std::tuple<std::string, std::vector<std::int64_t>, std::vector<std::int64_t>>>(described);
  fa::TensorView view;
  view.dtype = fa::parse_dtype(dtype, std::string(name) + ".dtype");
  if (sizes.size() > 4 || sizes.size() != strides.size()) {
    throw fa::InvalidArgument(std::string(name) + ".shape", std::to_string(sizes.size()) + " dims",
                              "3 or 4 dims, with as many strides");
  }
  view.rank = static_cast<int>(sizes.size());
  for (int axis = 0; axis < view.rank; ++axis) {
    view.sizes[axis] = sizes[axis];
    view.strides[axis] = strides[axis];
  }
  return view;
}

fa::CallShape call_shape(const nb::handle& q, const nb::handle& k, const nb::handle& v, std::int64_t sequences,
                         std::int64_t max_seq_q, std::int64_t max_seq_kv) {
  fa::CallShape shape;
  shape.q = tensor_view(q, "q");
  shape.k = tensor_view(k, "k");
  shape.v = tensor_view(v, "v");
  shape.sequences = sequences;
  shape.max_seq_q = max_seq_q;
  shape.max_seq_kv = max_seq_kv;
  return shape;
}

// --- tensor sets: named device addresses ---------------------------------------------------------

template <class T>
std::uintptr_t address(T* pointer) {
  return reinterpret_cast<std::uintptr_t>(pointer);
}

// One read-write int property per pointer member; 0 is none.
template <class Set, class Class, class T>
void address_property(Class& cls, const char* name, T* Set::*member) {
  cls.def_prop_rw(
      name, [member](const Set& set) { return address(set.*member); },
      [member](Set& set, std::uintptr_t value) { set.*member = reinterpret_cast<T*>(value); });
}

template <class Set, class Class, class T>
void ragged_property(Class& cls, const char* name, T* fa::RaggedTensors::*member) {
  cls.def_prop_rw(
      name, [member](const Set& set) { return address(set.ragged.*member); },
      [member](Set& set, std::uintptr_t value) { set.ragged.*member = reinterpret_cast<T*>(value); });
}

// Keyword construction (ForwardTensors(q=..., k=..., ...)) through the properties, so an unknown
// name is an error rather than silently ignored.
template <class Set>
void init_from_kwargs(Set* set, const nb::kwargs& kwargs) {
  new (set) Set();
  nb::object self = nb::find(set);
  nb::inst_mark_ready(self);  // constructed: the properties may now be set
  for (auto [name, value] : kwargs) nb::setattr(self, name, value);
}

template <class Set, class Class>
void common_properties(Class& cls) {
  // Every top-level tensor of the set, from the one list (fusedattn/tensor_slots.h).
  fa::for_each_tensor_slot<Set>([&cls](const char* name, fa::SlotRole, unsigned, auto member) {
    address_property<Set>(cls, name, member);
  });
  ragged_property<Set>(cls, "cu_seqlens_q", &fa::RaggedTensors::cu_seqlens_q);
  ragged_property<Set>(cls, "cu_seqlens_kv", &fa::RaggedTensors::cu_seqlens_kv);
  cls.def_prop_rw(
      "sequences", [](const Set& set) { return set.ragged.sequences; },
      [](Set& set, std::int64_t value) { set.ragged.sequences = value; });
  // A score modifier's values: its scalars (float32 [n]) and its tensors, by slot.
  cls.def_prop_rw(
      "score_mod_scalars", [](const Set& set) { return address(set.score_mod.scalars); },
      [](Set& set, std::uintptr_t value) { set.score_mod.scalars = reinterpret_cast<const float*>(value); });
  cls.def_prop_rw(
      "score_mod_tensors",
      [](const Set& set) {
        std::vector<std::uintptr_t> out;
        for (const float* t : set.score_mod.tensors) out.push_back(address(t));
        return out;
      },
      [](Set& set, const std::vector<std::uintptr_t>& values) {
        if (values.size() > set.score_mod.tensors.size()) {
          throw fa::InvalidArgument("score_mod_tensors", std::to_string(values.size()) + " tensors",
                                    "at most " + std::to_string(fa::kMaxScoreModTensors));
        }
        set.score_mod.tensors = {};
        for (std::size_t i = 0; i < values.size(); ++i) set.score_mod.tensors[i] = reinterpret_cast<const float*>(values[i]);
      });
}

nb::tuple dims_tuple(const std::array<std::int64_t, 4>& values) {
  return nb::make_tuple(values[0], values[1], values[2], values[3]);
}

// Python's autotune argument: None takes the process default (set_autotune), True / False this call's.
fa::PlanOptions plan_options(std::optional<bool> autotune) {
  fa::PlanOptions options;
  if (autotune) options.autotune = *autotune ? fa::Autotune::on : fa::Autotune::off;
  return options;
}

// A support answer as Python takes it: (ok, [(field, value, requirement, lifted_by)], policy_only, text,
// kernel).
std::tuple<bool, std::vector<std::tuple<std::string, std::string, std::string, std::string>>, std::string, std::string,
           std::string>
support_tuple(const fa::Support& support) {
  std::vector<std::tuple<std::string, std::string, std::string, std::string>> reasons;
  for (const fa::Reason& r : support.reasons) reasons.emplace_back(r.field, r.value, r.requirement, r.lifted_by);
  return {support.ok(), reasons, support.policy_only, support.to_string(), support.kernel};
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "fusedattn's C++ core: configs, specs, support answers, cached plans, and their execution.";
  // Plans and specs can still be referenced from adapter objects when the interpreter tears the
  // module down; that is by design, not a reference leak, and nanobind's report would be noise.
  nb::set_leak_warnings(false);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const fa::Error& error) {
      fa::python::set_python_error(error);
    }
  });

  nb::enum_<fa::Pass>(m, "Pass", "Which pass of attention: forward or backward.")
      .value("forward", fa::Pass::forward)
      .value("backward", fa::Pass::backward);

  nb::class_<fa::AttentionSpec>(m, "Spec", "What to compute; prints as the one-line spec string.")
      .def_static("parse", &fa::parse_spec, "text"_a,
                  "Parses a spec string (the form every spec prints as; `fusedattn run` takes it too).")
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
      .def_prop_ro("stats", [](const fa::AttentionSpec& spec) { return spec.stats; })
      .def_prop_ro("bias", [](const fa::AttentionSpec& spec) { return std::string(fa::to_string(spec.bias)); })
      .def_prop_ro("bias_dims",
                   [](const fa::AttentionSpec& spec) {
                     return dims_tuple(fa::bias_dims(spec.bias, spec.batch(), spec.heads_q(), spec.seq_q(),
                                                     spec.seq_kv()));
                   })
      .def_prop_ro("max_logit",
                   [](const fa::AttentionSpec& spec) { return std::string(fa::to_string(spec.max_logit)); })
      .def_prop_ro("default_scale", &fa::default_scale)
      .def_prop_ro("score_mod", [](const fa::AttentionSpec& spec) { return fa::to_string(spec.score_mod); })
      .def(
          "score_mod_tensor_shape",
          [](const fa::AttentionSpec& spec, int slot) {
            const fa::ScoreMod& mod = spec.score_mod;
            if (slot < 0 || slot >= mod.tensors()) {
              throw fa::InvalidArgument("slot", std::to_string(slot),
                                        "a tensor of the modifier (0 .. " + std::to_string(mod.tensors() - 1) + ")");
            }
            const std::array<std::int64_t, 4> dims =
                fa::tensor_dims(mod, slot, {spec.batch(), spec.heads_q(), spec.seq_q(), spec.seq_kv()});
            const std::uint8_t bits[4] = {fa::kAxisB, fa::kAxisH, fa::kAxisQ, fa::kAxisKv};
            std::vector<std::int64_t> shape;
            for (int axis = 0; axis < 4; ++axis) {
              if (mod.tensor_axes(slot) & bits[axis]) shape.push_back(dims[static_cast<std::size_t>(axis)]);
            }
            return shape;
          },
          "slot"_a, "The shape the modifier's tensor `slot` has in this call: the sizes of the axes it spans.");

  // What Config.spec returns: a Spec (it inherits every method above) that the core has validated,
  // read-only as every Spec is here, so get_plan and check_support take it without validating again.
  nb::class_<fa::ValidatedSpec, fa::AttentionSpec>(
      m, "ValidatedSpec", "A Spec validated where it was made (Config.spec): the plan path does not check it again.");

  m.def(
      "causal_window",
      [](const std::pair<std::int64_t, std::int64_t>& window) {
        const fa::Window closed = fa::causal_window(fa::Window{window.first, window.second});
        return std::make_pair(closed.left, closed.right);
      },
      "window"_a,
      "The window (left, right) under causal, by the rule every entry point shares (fusedattn/options.h): "
      "the right bound 0, the left kept; InvalidArgumentError for a right bound but 0 or -1 (one that looks ahead).");

  nb::class_<fa::CallConfig>(m, "Config",
                             "The frozen configuration of a call: its layouts and every option (fusedattn/call.h). "
                             "Options take the spec string's keys (window, align, bias, bias_grad, alibi, softmax, "
                             "max_logit, dropout, padding, deterministic, stats, kv_pages, fp8_scaling, ...) plus causal.")
      .def(
          "__init__",
          [](fa::CallConfig* config, const std::string& layout, const std::string& kv_layout,
             const nb::kwargs& options) {
            std::vector<std::pair<std::string, std::string>> texts;
            for (auto [name, value] : options) texts.emplace_back(nb::cast<std::string>(name), option_text(value));
            new (config) fa::CallConfig(fa::make_call_config(layout, kv_layout, texts));
          },
          "layout"_a = "bshd", "kv_layout"_a = "", "options"_a)
      .def_static("parse", &fa::parse_call_config, "text"_a, "The config that str(config) printed.")
      .def("__str__", [](const fa::CallConfig& config) { return fa::to_string(config); })
      .def("__repr__", [](const fa::CallConfig& config) { return "Config(\"" + fa::to_string(config) + "\")"; })
      .def("__eq__", [](const fa::CallConfig& a, const fa::CallConfig& b) { return a == b; })
      .def("__hash__", [](const fa::CallConfig& config) { return std::hash<std::string>{}(fa::to_string(config)); })
      .def_prop_ro("layout", [](const fa::CallConfig& config) { return std::string(fa::to_string(config.layout)); })
      .def_prop_ro("kv_layout",
                   [](const fa::CallConfig& config) { return std::string(fa::to_string(config.kv_layout)); })
      .def_prop_ro("window",
                   [](const fa::CallConfig& c) { return std::make_pair(c.options.window.left, c.options.window.right); })
      .def_prop_ro("bias", [](const fa::CallConfig& c) { return std::string(fa::to_string(c.options.bias)); })
      .def_prop_ro("bias_grad", [](const fa::CallConfig& c) { return c.options.bias_grad; })
      .def_prop_ro("softmax", [](const fa::CallConfig& c) { return std::string(fa::to_string(c.options.softmax)); })
      .def_prop_ro("dropout", [](const fa::CallConfig& c) { return c.options.dropout; })
      .def_prop_ro("padding", [](const fa::CallConfig& c) { return c.options.padding; })
      .def_prop_ro("max_logit",
                   [](const fa::CallConfig& c) { return std::string(fa::to_string(c.options.max_logit)); })
      .def_prop_ro("kv_pages", [](const fa::CallConfig& c) { return c.options.kv_pages; })
      .def_prop_ro("fp8_scaling",
                   [](const fa::CallConfig& c) { return std::string(fa::to_string(c.options.fp8_scaling)); })
      .def_prop_ro("stats", [](const fa::CallConfig& c) { return c.options.stats; })
      .def_prop_ro("score_mod", [](const fa::CallConfig& c) { return fa::to_string(c.options.score_mod); })
      .def_prop_ro("score_mod_scalars", [](const fa::CallConfig& c) { return c.options.score_mod.scalars(); })
      .def_prop_ro(
          "score_mod_tensor_axes",
          [](const fa::CallConfig& c) {
            static const char* const kNames[4] = {"b", "h", "q", "kv"};
            std::vector<std::string> out;
            for (int i = 0; i < c.options.score_mod.tensors(); ++i) {
              std::string axes;
              for (int axis = 0; axis < 4; ++axis) {
                if (c.options.score_mod.tensor_axes(i) & (1u << axis)) axes += (axes.empty() ? "" : ",") + std::string(kNames[axis]);
              }
              out.push_back(axes);
            }
            return out;
          },
          "Per tensor of the modifier, the axes it spans, as \"h,kv\".")
      .def_prop_ro("id", &fa::register_config,
                   "A small integer naming this config for the adapters' C++ fast paths (registered on first use).")
      .def(
          "spec",
          [](const fa::CallConfig& config, nb::handle q, nb::handle k, nb::handle v, std::int64_t sequences,
             std::int64_t max_seq_q, std::int64_t max_seq_kv) {
            return fa::make_spec(config, call_shape(q, k, v, sequences, max_seq_q, max_seq_kv));
          },
          "q"_a, "k"_a, "v"_a, "sequences"_a = 0, "max_seq_q"_a = 0, "max_seq_kv"_a = 0,
          "The validated spec (a ValidatedSpec) of a call on q, k, v, each (dtype name, sizes, strides) in the "
          "config's layouts.")
      .def(
          "output_axes",
          [](const fa::CallConfig& config, fa::Pass pass) {
            static const char* const kInputs[] = {"q", "k", "v"};
            nb::dict out;
            for (const fa::OutputAxes& o : fa::output_axes(config, pass)) {
              nb::list axes;
              for (const fa::AxisPick& pick : o.axes) {
                axes.append(nb::make_tuple(kInputs[static_cast<int>(pick.input)], pick.axis));
              }
              out[o.name.c_str()] = nb::tuple(axes);
            }
            return out;
          },
          "pass_"_a,
          "Each output of the pass by name (o, stats, max_logit; d_q, d_k, d_v, d_sink), as a tuple of (input, "
          "axis) picks: output axis i has the size of that axis of q, k or v (fusedattn/output_shapes.h).")
      .def(
          "with_bias",
          [](const fa::CallConfig& config, nb::handle bias, nb::handle q, nb::handle k, std::int64_t sequences,
             std::int64_t max_seq_q, std::int64_t max_seq_kv) {
            fa::CallShape shape;
            shape.q = tensor_view(q, "q");
            shape.k = tensor_view(k, "k");
            shape.sequences = sequences;
            shape.max_seq_q = max_seq_q;
            shape.max_seq_kv = max_seq_kv;
            fa::CallConfig biased = config;
            biased.options.bias = fa::bias_kind(tensor_view(bias, "bias"), config, shape);
            return biased;
          },
          "bias"_a, "q"_a, "k"_a, "sequences"_a = 0, "max_seq_q"_a = 0, "max_seq_kv"_a = 0,
          "This config with the bias kind (bhss, b1ss, 1hss, 11ss, 111s) of a bias of this shape beside q and k; "
          "InvalidArgumentError for a shape that is none of them.");

  auto forward_tensors = nb::class_<fa::ForwardTensors>(m, "ForwardTensors",
                                                        "Device addresses of a forward call, by name; 0 is none.");
  forward_tensors.def("__init__", &init_from_kwargs<fa::ForwardTensors>);
  common_properties<fa::ForwardTensors>(forward_tensors);

  auto backward_tensors = nb::class_<fa::BackwardTensors>(m, "BackwardTensors",
                                                          "Device addresses of a backward call, by name; 0 is none.");
  backward_tensors.def("__init__", &init_from_kwargs<fa::BackwardTensors>);
  common_properties<fa::BackwardTensors>(backward_tensors);
  fa::python::bind_fp8_scales(forward_tensors, backward_tensors);
  fa::python::bind_fp8_kernels(m);
  fa::python::bind_fp8_backward_choice(m);
  fa::python::bind_score_expressions(m);

  nb::class_<fa::Plan>(m, "Plan", "A compiled, cached plan: run it with a tensor set.")
      .def_prop_ro("workspace_bytes", &fa::Plan::workspace_bytes)
      .def_prop_ro("spec", [](const fa::Plan& plan) { return plan.spec(); })
      .def_prop_ro("pass_", &fa::Plan::pass)
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
          "run",
          [](const fa::Plan& plan, const fa::ForwardTensors& tensors, float scale, std::uintptr_t stream,
             std::uintptr_t workspace, std::size_t workspace_bytes) {
            plan.run(tensors, scale, reinterpret_cast<cudaStream_t>(stream),
                     fa::Workspace{reinterpret_cast<void*>(workspace), workspace_bytes});
          },
          "tensors"_a, "scale"_a, "stream"_a, "workspace"_a = 0, "workspace_bytes"_a = 0,
          "Enqueues a forward on `stream` (a cudaStream_t as an int).")
      .def(
          "run",
          [](const fa::Plan& plan, const fa::BackwardTensors& tensors, float scale, std::uintptr_t stream,
             std::uintptr_t workspace, std::size_t workspace_bytes) {
            plan.run(tensors, scale, reinterpret_cast<cudaStream_t>(stream),
                     fa::Workspace{reinterpret_cast<void*>(workspace), workspace_bytes});
          },
          "tensors"_a, "scale"_a, "stream"_a, "workspace"_a = 0, "workspace_bytes"_a = 0,
          "Enqueues a backward (dQ, dK, dV and the rest) on `stream`.");

  // Each takes a ValidatedSpec (from Config.spec) as it is, and validates any other Spec first: the
  // ValidatedSpec overloads come first, so nanobind tries them first.
  const char* const check_support_doc =
      "(supported, [(field, value, requirement, lifted_by)], policy_only, text, kernel) on the current device: the policy, "
      "then cuDNN's own check, which builds and caches the plan. With device (\"sm90\", \"sm100\", ...), or where "
      "the process has no GPU (then for SM 9.0), the policy's answer alone, policy_only saying so and why.";
  m.def(
      "check_support",
      [](const fa::ValidatedSpec& spec, fa::Pass pass, const std::optional<std::string>& device) {
        return support_tuple(device ? fa::check_support(spec.spec(), pass, *device) : fa::check_support(spec, pass));
      },
      "spec"_a, "pass_"_a, "device"_a = nb::none(), check_support_doc);
  m.def(
      "check_support",
      [](const fa::AttentionSpec& spec, fa::Pass pass, const std::optional<std::string>& device) {
        return support_tuple(device ? fa::check_support(spec, pass, *device) : fa::check_support(spec, pass));
      },
      "spec"_a, "pass_"_a, "device"_a = nb::none(), check_support_doc);
  const char* const get_plan_doc =
      "The cached plan (from memory, the disk cache, or built on first use); autotune=None takes the "
      "process default (set_autotune). Raises NotSupportedError with every reason.";
  m.def(
      "get_plan",
      [](const fa::ValidatedSpec& spec, fa::Pass pass, std::optional<bool> autotune) {
        return fa::get_plan(spec, pass, plan_options(autotune));
      },
      "spec"_a, "pass_"_a, "autotune"_a = nb::none(), get_plan_doc);
  m.def(
      "get_plan",
      [](const fa::AttentionSpec& spec, fa::Pass pass, std::optional<bool> autotune) {
        return fa::get_plan(spec, pass, plan_options(autotune));
      },
      "spec"_a, "pass_"_a, "autotune"_a = nb::none(), get_plan_doc);
  m.def("set_autotune", &fa::set_autotune, "enabled"_a,
        "Sets the process default of autotune (FUSEDATTN_AUTOTUNE=1 starts it on); returns the previous one.");
  m.def("plan_dir", &fa::plan_dir, "The disk cache's folder, '' when it is off.");
  m.def("set_plan_dir", &fa::set_plan_dir, "folder"_a, "Changes the disk cache's folder ('' turns it off).");
  m.def("default_plan_dir", &fa::default_plan_dir, "The folder used when FUSEDATTN_PLAN_DIR is not set.");
  m.def("reset_disk_cache_stats", &fa::reset_disk_cache_stats, "Zeroes the disk cache's counters.");
  m.def(
      "disk_cache_stats",
      [] {
        const fa::DiskCacheStats s = fa::disk_cache_stats();
        nb::dict out;
        out["loaded"] = s.loaded;
        out["missing"] = s.missing;
        out["rejected"] = s.rejected;
        out["stored"] = s.stored;
        out["store_failures"] = s.store_failures;
        out["pruned"] = s.pruned;
        out["load_ms"] = s.load_ms;
        return out;
      },
      "The disk cache's counters (fusedattn/disk_cache.h).");
  m.def(
      "warm_up",
      [](const std::vector<fa::AttentionSpec>& specs, const std::vector<fa::Pass>& passes, int threads,
         std::optional<bool> autotune) {
        fa::WarmupOptions options;
        options.threads = threads;
        options.plan = plan_options(autotune);
        std::vector<std::tuple<std::string, std::string, bool, std::string, double>> out;
        {
          nb::gil_scoped_release unlocked;  // the builds take seconds; other Python threads may run
          for (const fa::WarmupResult& r : fa::warm_up(specs, passes, options)) {
            out.emplace_back(fa::to_string(r.spec), fa::to_string(r.pass), r.ok, r.message, r.ms);
          }
        }
        return out;
      },
      "specs"_a, "passes"_a, "threads"_a = 0, "autotune"_a = nb::none(),
      "Builds (or restores) the plan of every spec for every pass in parallel threads: "
      "[(spec string, pass, ok, message, ms)].");
  m.def(
      "dense_axes",
      [] {
        nb::dict out;
        for (fa::AxisOrder order : {fa::AxisOrder::bshd, fa::AxisOrder::sbhd, fa::AxisOrder::bhsd}) {
          const std::array<int, 4> axes = fa::axes_of(order);
          out[fa::to_string(order)] = nb::make_tuple(axes[0], axes[1], axes[2], axes[3]);
        }
        return out;
      },
      "Per dense axis order (bshd, sbhd, bhsd), the tensor axis holding each logical axis (batch, heads, "
      "sequence, head dim): fusedattn/call.h's axes_of.");
  m.def("ragged_buckets", &fa::ragged_buckets, "spec"_a,
        "Every bucketed spec a ragged training loop up to this spec's sizes can meet.");
  m.def("build_info", [] { return fa::build_info().to_string(); }, "Versions compiled and loaded, and the GPU.");
  m.def("set_replay", &fa::set_replay, "enabled"_a,
        "Turns replay of repeated calls on or off for the process; returns the previous setting.");
  m.def("set_plan_cache_capacity", &fa::set_plan_cache_capacity, "capacity"_a,
        "Changes the plan cache's capacity (evicting at once where needed).");
  m.def("clear_plan_cache", &fa::clear_plan_cache, "Drops every cached plan and answer and zeroes the counters.");
  m.def(
      "plan_cache_stats",
      [] {
        const fa::CacheStats s = fa::plan_cache_stats();
        nb::dict out;
        out["hits"] = s.hits;
        out["misses"] = s.misses;
        out["builds"] = s.builds;
        out["failed_builds"] = s.failed_builds;
        out["build_ms"] = s.build_ms;
        out["evictions"] = s.evictions;
        out["size"] = s.size;
        out["capacity"] = s.capacity;
        out["live_plans"] = fa::live_plans();
        return out;
      },
      "The process-wide plan cache's counters, and the plans alive in the process (cached or held).");
}
