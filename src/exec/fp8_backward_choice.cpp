// The FP8 backward's choice by measurement (fusedattn/fp8_backward_choice.h): both backwards timed
// on stand-in data, the answer memoized and kept in the disk cache.
#include "fusedattn/fp8_backward_choice.h"

#include <array>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "cache/disk_cache.h"
#include "exec/cuda_check.h"
#include "exec/device.h"
#include "exec/relaxed_capture.h"
#include "exec/stand_in_bench.h"
#include "fusedattn/attention.h"
#include "fusedattn/errors.h"
#include "fusedattn/fp8.h"
#include "fusedattn/lru_cache.h"
#include "graph/sdpa_graph.h"
#include "support/fp8_backward_record.h"

#ifndef FUSEDATTN_VERSION
#define FUSEDATTN_VERSION "unknown"
#endif

namespace fusedattn {
namespace {

// A choice is a few dozen bytes; a training job meets a handful of shapes, and a process that
// sweeps many still stays bounded.
constexpr std::size_t kMemoCapacity = 1024;

using Memo = LruCache<std::string, Fp8BackwardChoice>;

Memo& memo() {
  static Memo* cache = new Memo(kMemoCapacity);  // never destroyed, as the plan cache
  return *cache;
}

std::atomic<std::uint64_t> g_measurements{0};

std::string memo_key(const std::string& key, int device) { return key + " device=" + std::to_string(device); }

// The disk cache's key: the choice's key with everything a time depends on besides it (the GPU
// model, SM count and driver, cuDNN, the frontend and this build of fusedattn).
std::string disk_key(const std::string& key, int device) {
  const Versions& versions = detail::versions();
  return std::string("fusedattn=") + FUSEDATTN_VERSION + " graph=" + graph::build_stamp() + " " +
         detail::device_fingerprint(device) + " sm=" + std::to_string(detail::device_caps(device).sm()) +
         " cudnn=" + std::to_string(versions.cudnn_runtime) + " fe=" + std::to_string(versions.frontend) + " " + key;
}

// The eight tensors of one backward, placed one after another in stand-in memory.
struct BackwardBuffers {
  std::array<TensorDesc, 8> descs;  // q, k, v, o, dO, dQ, dK, dV
  std::array<char*, 8> at{};
  explicit BackwardBuffers(const AttentionSpec& spec)
      : descs{spec.q, spec.k, spec.v, spec.o, gradient_desc(spec.o, spec), gradient_desc(spec.q, spec),
              gradient_desc(spec.k, spec), gradient_desc(spec.v, spec)} {}
  std::size_t bytes() const {
    std::size_t total = 0;
    for (const TensorDesc& desc : descs) total += detail::stand_in_aligned(desc.extent() * size_of(desc.dtype));
    return total;
  }
  char* place(char* next) {
    for (std::size_t i = 0; i < descs.size(); ++i) {
      at[i] = next;
      next += detail::stand_in_aligned(descs[i].extent() * size_of(descs[i].dtype));
    }
    return next;
  }
  BackwardTensors tensors(float* stats) const {
    BackwardTensors t;
    t.q = at[0], t.k = at[1], t.v = at[2], t.o = at[3], t.d_o = at[4];
    t.d_q = at[5], t.d_k = at[6], t.d_v = at[7];
    t.stats = stats;
    return t;
  }
};

// Every FP8 scaling pointer at its own float of `scalars` (16 of them), so no two writers share one.
Fp8BackwardScales stand_in_scales(float* s) {
  return Fp8BackwardScales{s,      s + 1,  s + 2,  s + 3,  s + 4,  s + 5,  s + 6,  s + 7,
                           s + 8,  s + 9,  s + 10, s + 11, s + 12, s + 13, s + 14, s + 15};
}

Fp8BackwardChoice measure(const AttentionSpec& fp8, const AttentionSpec& model, int device) {
  // One measurement at a time in the process: two side by side would share the GPU.
  static std::mutex one_at_a_time;
  std::lock_guard<std::mutex> lock(one_at_a_time);
  detail::RelaxedCapture relaxed;
  std::shared_ptr<const Plan> fp8_plan;
  try {
    fp8_plan = get_plan(fp8, Pass::backward);
  } catch (const NotSupported&) {
    // Left null: only the model's backward can follow this FP8 forward.
  }
  std::shared_ptr<const Plan> model_plan = get_plan(model, Pass::backward);

  BackwardBuffers fp8_buffers(fp8), model_buffers(model);
  const std::size_t stats_bytes =
      detail::stand_in_aligned(static_cast<std::size_t>(fp8.batch() * fp8.heads_q() * fp8.seq_q()) * sizeof(float));
  const std::size_t workspace =
      std::max(fp8_plan ? fp8_plan->workspace_bytes() : 0, model_plan->workspace_bytes());
  Fp8BackwardChoice choice;
  {
    detail::Bench bench((fp8_plan ? fp8_buffers.bytes() : 0) + model_buffers.bytes() + stats_bytes +
                        detail::kStandInAlignment + workspace);
    char* next = model_buffers.place(bench.memory());
    if (fp8_plan) next = fp8_buffers.place(next);
    float* stats = reinterpret_cast<float*>(next);
    float* scalars = reinterpret_cast<float*>(next + stats_bytes);
    void* scratch = next + stats_bytes + detail::kStandInAlignment;
    detail::check_cuda(cudaMemsetAsync(bench.memory(), detail::kStandInByte, next + stats_bytes +
                                       detail::kStandInAlignment - bench.memory(), bench.stream()),
                       "cudaMemsetAsync(stand-in data)");
    const float scale = default_scale(fp8);
    const Workspace work{scratch, workspace, nullptr};
    const cudaStream_t stream = bench.stream();

    const BackwardTensors model_tensors = model_buffers.tensors(stats);
    choice.model_ms = bench.median_ms([&] { model_plan->run(model_tensors, scale, stream, work); });
    choice.fp8_ms = -1.0;
    if (fp8_plan) {
      BackwardTensors fp8_tensors = fp8_buffers.tensors(stats);
      fp8_tensors.fp8 = stand_in_scales(scalars);
      // What the adapters add around the FP8 backward: dO from the model's dtype into FP8 (with
      // its amax, as delayed scaling records it), dQ, dK and dV back into the model's dtype.
      const auto& f = fp8_buffers;
      const auto& m = model_buffers;
      const Fp8Quantization quantize{m.descs[4], m.at[4], f.descs[4], f.at[4], scalars, scalars + 12};
      const std::array<Fp8Dequantization, 3> dequantize{{{f.descs[5], f.at[5], m.descs[5], m.at[5], scalars},
                                                        {f.descs[6], f.at[6], m.descs[6], m.at[6], scalars},
                                                        {f.descs[7], f.at[7], m.descs[7], m.at[7], scalars}}};
      choice.fp8_ms = bench.median_ms([&] {
        quantize_fp8_many(&quantize, 1, stream);
        fp8_plan->run(fp8_tensors, scale, stream, work);
        dequantize_fp8_many(dequantize.data(), 3, stream);
      });
    }
    detail::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(fp8 backward choice)");
    detail::handle_for(device, nullptr);  // the handle must not keep the stream destroyed below
  }
  choice.chosen = detail::faster(choice.fp8_ms, choice.model_ms);
  g_measurements.fetch_add(1, std::memory_order_relaxed);
  return choice;
}

// From the disk cache, else measured and written there.
Fp8BackwardChoice restored_or_measured(const AttentionSpec& fp8, const AttentionSpec& model, const std::string& key,
                                       int device) {
  const std::string disk = disk_key(key, device);
  detail::DiskLookup lookup = detail::disk_lookup(disk);
  if (lookup.check == detail::PlanFileCheck::loaded) {
    if (auto kept = detail::parse_record(std::string(lookup.payload.begin(), lookup.payload.end()))) {
      detail::note_loaded(0.0);
      return *kept;
    }
    detail::note_unusable(lookup);
  }
  const Fp8BackwardChoice choice = measure(fp8, model, device);
  const std::string record = detail::to_record(choice);
  detail::disk_store(disk, std::vector<std::uint8_t>(record.begin(), record.end()));  // a refusal costs a re-measure
  return choice;
}

}  // namespace

Fp8BackwardChoice choose_fp8_backward(const AttentionSpec& spec, DType model_dtype) {
  const ValidatedSpec fp8(spec);
  detail::require_choosable(fp8.spec(), model_dtype);
  const AttentionSpec model = detail::model_precision_spec(fp8.spec(), model_dtype);
  const int device = detail::current_device();
  const std::string key = detail::fp8_backward_key(fp8.spec(), model_dtype);
  return *memo().get_or_build(memo_key(key, device), [&](const std::string&) {
    return std::make_shared<const Fp8BackwardChoice>(restored_or_measured(fp8.spec(), model, key, device));
  });
}

std::optional<Fp8BackwardChoice> known_fp8_backward_choice(const AttentionSpec& spec, DType model_dtype) {
  if (!detail::gpu_absence().empty()) return std::nullopt;
  const auto found = memo().peek(memo_key(detail::fp8_backward_key(spec, model_dtype), detail::current_device()));
  if (!found) return std::nullopt;
  return *found;
}

std::string fp8_backward_report(const AttentionSpec& spec) {
  if (!is_fp8(spec.q.dtype) || spec.fp8_kv_cache() || spec.fp8_scaling != Fp8Scaling::tensor) return "";
  for (DType model : {DType::bf16, DType::f16}) {
    if (auto known = known_fp8_backward_choice(spec, model)) return to_string(known->chosen);
  }
  return "not measured";
}

void clear_fp8_backward_choices() { memo().clear(); }

std::uint64_t fp8_backward_measurements() noexcept { return g_measurements.load(std::memory_order_relaxed); }

}  // namespace fusedattn
