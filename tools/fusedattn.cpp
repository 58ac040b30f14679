// tools/fusedattn.cpp — the `fusedattn` command: build info, support answers, checked runs,
// benchmarks and a demo, each taking the one-line spec string that errors and logs print.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "support_matrix.h"
#include "fusedattn/attention.h"
#include "fusedattn/autotune.h"
#include "fusedattn/build_info.h"
#include "fusedattn/disk_cache.h"
#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/plan_cache.h"
#include "fusedattn/ragged.h"
#include "fusedattn/reference.h"
#include "fusedattn/warmup.h"
#include "testing/attention_buffers.h"
#include "testing/cuda_check.h"
#include "testing/device_buffer.h"
#include "testing/fp8_check.h"
#include "testing/kernel_timing.h"
#include "testing/reference_check.h"

namespace fa = fusedattn;

namespace {

// Exit codes: the shell tests and scripts depend on them.
enum Exit : int { kOk = 0, kFailed = 1, kUsage = 2, kNotSupported = 3, kNoGpu = 4, kError = 5 };

const char* const kUsageLine =
    "usage: fusedattn {info | support SPEC [--pass forward|backward|both] | run SPEC [--no-backward] [--seed N]"
    " [--scale X] [--autotune] | bench SPEC [--iters N] [--autotune] | warmup [SPEC] [--file FILE] [--buckets]"
    " [--pass P] [--threads N] [--autotune] | demo | support-matrix [--out FILE] | --help}";

const char* const kHelp = R"(
  info       build, cuDNN and GPU information
  support    is SPEC supported here, and if not, every reason (exit 0 yes, 1 no)
  run        run SPEC on the GPU and compare with a reference (exit 0 pass, 1 fail)
  bench      kernel time, TFLOP/s, host time per call and plan build time of SPEC
  warmup     build the plans of SPEC (and of each line of FILE, '-' for standard input) in parallel
             threads into the disk cache, each ragged spec's buckets too with --buckets; prints the
             time each plan took (restored, built or tuned) and the disk cache's counters
  demo       a checked forward+backward on a standard problem (CPU reference only without a GPU)
  support-matrix  check_support over features x masks x head dims x layouts x dtypes, as markdown
             (to FILE with --out; the pure policy for SM 9.0 without a GPU, and it says so)
  --autotune (run, bench, warmup) time every plan cuDNN offers and keep the fastest, remembered in
             the disk cache (FUSEDATTN_PLAN_DIR, default ~/.cache/fusedattn/plans; =off turns it off)

SPEC is the one-line string every fusedattn error and log prints, for example
  "layout=bshd b=2 s=1024 h=16 d=128 causal"
(causal closes the window's right side: "... causal window=256,-1" is a causal sliding window of 256
keys, and a window with a right bound of 1 or more beside causal is refused.)
Exit codes: 0 ok, 1 check failed / not supported, 2 usage or invalid spec, 3 not supported (run,
bench), 4 no GPU, 5 CUDA / cuDNN / setup error.
)";

struct UsageError {
  std::string message;
};

// The command line, split into the command, the spec and the --options that follow.
struct CommandLine {
  std::string command;
  std::string spec;
  std::map<std::string, std::string> options;  // "--seed" -> "42"; flags map to ""

  bool has(const std::string& name) const { return options.count(name) != 0; }
};

CommandLine parse_command_line(int argc, char** argv) {
  static const std::map<std::string, bool> kTakesValue = {
      {"--pass", true}, {"--no-backward", false}, {"--seed", true}, {"--scale", true}, {"--iters", true},
      {"--out", true}, {"--autotune", false}, {"--file", true}, {"--buckets", false}, {"--threads", true}};
  CommandLine line;
  if (argc < 2) throw UsageError{"missing command"};
  line.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      if (!line.spec.empty()) throw UsageError{"unexpected argument '" + arg + "' (quote the spec as one argument)"};
      line.spec = arg;
      continue;
    }
    auto known = kTakesValue.find(arg);
    if (known == kTakesValue.end()) throw UsageError{"unknown option " + arg};
    if (known->second && i + 1 >= argc) throw UsageError{arg + " needs a value"};
    line.options[arg] = known->second ? argv[++i] : "";
  }
  return line;
}

std::uint64_t parse_unsigned(const CommandLine& line, const std::string& name, std::uint64_t fallback) {
  if (!line.has(name)) return fallback;
  const std::string& text = line.options.at(name);
  char* end = nullptr;
  unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || text[0] == '-') throw UsageError{name + " needs a non-negative integer, got '" + text + "'"};
  return value;
}

double parse_double(const CommandLine& line, const std::string& name, double fallback) {
  if (!line.has(name)) return fallback;
  const std::string& text = line.options.at(name);
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0') throw UsageError{name + " needs a number, got '" + text + "'"};
  return value;
}

// Parse and validate: both throw InvalidArgument naming the field.
fa::ValidatedSpec parse_valid_spec(const CommandLine& line) {
  if (line.spec.empty()) throw UsageError{"'" + line.command + "' needs a spec string"};
  return fa::ValidatedSpec(fa::parse_spec(line.spec));
}

// Empty when a GPU can be used; otherwise why not.
std::string gpu_unavailable() {
  fa::BuildInfo info = fa::build_info();
  if (info.device_count > 0 && info.gpu_unavailable_reason.empty()) return "";
  return info.gpu_unavailable_reason.empty() ? "no CUDA device visible" : info.gpu_unavailable_reason;
}

std::string quoted(const fa::AttentionSpec& spec) { return "\"" + fa::to_string(spec) + "\""; }

fa::AttentionSpec causal_spec(const fa::ProblemShape& shape, fa::Alignment alignment) {
  fa::AttentionSpec spec = fa::spec_for_layout(fa::Layout::bshd, shape);
  spec.window = fa::kCausal;
  spec.alignment = alignment;
  return spec;
}

std::string cudnn_version(int version) { return version <= 0 ? "unknown" : fa::version_text(version); }

// --- info -------------------------------------------------------------------------------------

int cmd_info() {
  std::cout << fa::build_info().to_string() << "\n";
  return kOk;
}

// --- support ----------------------------------------------------------------------------------

std::vector<fa::Pass> passes_of(const CommandLine& line) {
  const std::string which = line.has("--pass") ? line.options.at("--pass") : "both";
  if (which == "forward") return {fa::Pass::forward};
  if (which == "backward") return {fa::Pass::backward};
  if (which == "both") return {fa::Pass::forward, fa::Pass::backward};
  throw UsageError{"--pass must be forward, backward or both, got '" + which + "'"};
}

void print_verdict(const std::string& label, const fa::Support& support, const fa::AttentionSpec& spec) {
  std::cout << label << ": " << (support.ok() ? "supported" : "not supported") << "  spec=" << quoted(spec) << "\n";
  for (const fa::Reason& reason : support.reasons) std::cout << "  - " << reason.to_string() << "\n";
}

int cmd_support(const CommandLine& line) {
  const std::vector<fa::Pass> passes = passes_of(line);
  const fa::ValidatedSpec valid = parse_valid_spec(line);
  const fa::AttentionSpec& spec = valid.spec();
  const std::string no_gpu = gpu_unavailable();
  bool all_ok = true;
  if (!no_gpu.empty()) {
    std::cout << "no GPU: showing the policy for SM 9.0 only, cuDNN's own check not run (" << no_gpu << ")\n";
    fa::Versions versions = fa::current_versions();
    // Without a loadable cuDNN the runtime version reads 0; ask the policy about the compiled one.
    if (versions.cudnn_runtime == 0) versions.cudnn_runtime = versions.cudnn_compiled;
    std::cout << "policy inputs: SM 9.0, cuDNN " << cudnn_version(versions.cudnn_runtime) << "\n";
    for (fa::Pass pass : passes) {
      fa::Support policy = fa::check_support_policy(spec, pass, fa::DeviceCaps{9, 0}, versions);
      print_verdict(fa::to_string(pass), policy, spec);
      all_ok = all_ok && policy.ok();
    }
    return all_ok ? kOk : kFailed;
  }
  const fa::DeviceCaps caps = fa::current_device_caps();
  const fa::Versions versions = fa::current_versions();
  std::cout << "device: SM " << caps.sm_major << "." << caps.sm_minor << ", cuDNN "
            << cudnn_version(versions.cudnn_runtime) << "\n";
  for (fa::Pass pass : passes) {
    const std::string name = fa::to_string(pass);
    print_verdict(name + " policy", fa::check_support_policy(spec, pass, caps, versions), spec);
    // The final word: the policy again plus cuDNN's own check (which builds and caches the plan).
    fa::Support full = fa::check_support(valid, pass);
    print_verdict(name, full, spec);
    all_ok = all_ok && full.ok();
  }
  return all_ok ? kOk : kFailed;
}

// The message lists every reason; the spec line makes the output a repro even if it does not.
void print_not_supported(const fa::NotSupported& error, const fa::AttentionSpec& spec) {
  std::cout << fa::to_string(error.kind()) << ": " << error.what() << "\n  spec=" << quoted(spec) << "\n";
}

// --- run --------------------------------------------------------------------------------------

int cmd_run(const CommandLine& line) {
  const fa::AttentionSpec spec = parse_valid_spec(line).spec();
  fa::check::CheckOptions options;
  options.backward = !line.has("--no-backward");
  options.seed = parse_unsigned(line, "--seed", 0);
  options.scale = parse_double(line, "--scale", options.scale);
  const std::string no_gpu = gpu_unavailable();
  if (!no_gpu.empty()) {
    std::cout << "no GPU: " << no_gpu << "  spec=" << quoted(spec) << "\n";
    return kNoGpu;
  }
  try {
    if (fa::is_fp8(spec.q.dtype)) {  // against the dequantized inputs' reference, and BF16's result
      const fa::check::Fp8CheckResult result = fa::check::check_fp8_against_reference(spec, options.backward, options.seed);
      std::cout << result.to_string() << "\n";
      return result.passed ? kOk : kFailed;
    }
    const fa::check::CheckResult result = fa::check::check_against_reference(spec, options);
    std::cout << result.to_string() << "\n";
    return result.passed ? kOk : kFailed;
  } catch (const fa::NotSupported& error) {
    print_not_supported(error, spec);
    return kNotSupported;
  }
}

// --- bench ------------------------------------------------------------------------------------

double host_ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

struct BenchResult {
  double build_forward_ms = 0.0, build_backward_ms = 0.0;
  double restore_forward_ms = -1.0, restore_backward_ms = -1.0;  // from the disk cache; < 0: off
  double forward_ms = 0.0, forward_backward_ms = 0.0, backward_ms = 0.0;
  double host_us_per_call = 0.0;
  fa::CacheStats cache;
  std::string backward_refused;  // the reasons, where the backward is not supported (forward timed alone)
};

// Builds both plans from a cold cache with the disk cache off, timing each on the host (the
// backward where supported); then, with the disk cache on, restores them from it as a new
// process would (their entries written first where missing), timed too.
void measure_builds(const fa::AttentionSpec& train, BenchResult* r) {
  const std::string folder = fa::plan_dir();
  fa::set_plan_dir("");
  fa::clear_plan_cache();
  auto start = std::chrono::steady_clock::now();
  fa::get_plan(train, fa::Pass::forward);
  r->build_forward_ms = host_ms_since(start);
  start = std::chrono::steady_clock::now();
  const fa::Support backward = fa::check_support(train, fa::Pass::backward);
  r->build_backward_ms = host_ms_since(start);
  if (!backward.ok()) r->backward_refused = backward.to_string();
  fa::set_plan_dir(folder);
  if (folder.empty()) return;
  for (int round = 0; round < 2; ++round) {  // the first writes what is missing, the second is timed
    fa::clear_plan_cache();
    start = std::chrono::steady_clock::now();
    fa::get_plan(train, fa::Pass::forward);
    r->restore_forward_ms = host_ms_since(start);
    if (!backward.ok()) continue;
    start = std::chrono::steady_clock::now();
    fa::get_plan(train, fa::Pass::backward);
    r->restore_backward_ms = host_ms_since(start);
  }
}

// `fwd` and `bwd`: the tensors of `spec` with statistics (the training forward's).
BenchResult run_bench(const fa::AttentionSpec& spec, int iters, const fa::ForwardTensors& fwd,
                      const fa::BackwardTensors& bwd) {
  fa::AttentionSpec train = spec;
  train.stats = true;  // backward needs the forward's statistics
  BenchResult r;
  measure_builds(train, &r);
  const bool with_backward = r.backward_refused.empty();
  const std::size_t ws_bytes =
      std::max(fa::get_plan(spec, fa::Pass::forward)->workspace_bytes(),
               with_backward ? fa::get_plan(train, fa::Pass::backward)->workspace_bytes() : std::size_t{0});
  fa::check::DeviceBuffer workspace_memory(ws_bytes);
  const fa::Workspace ws{workspace_memory.get(), ws_bytes};
  fa::ForwardTensors inference = fwd;
  if (!spec.stats) inference.stats = nullptr;
  const float scale = fa::default_scale(spec);

  r.forward_ms = fa::check::median_kernel_ms([&] { fa::forward(spec, inference, scale, nullptr, ws); }, 3, iters, nullptr);
  if (with_backward) {
    r.forward_backward_ms = fa::check::median_kernel_ms(
        [&] {
          fa::forward(train, fwd, scale, nullptr, ws);
          fa::backward(train, bwd, scale, nullptr, ws);
        },
        3, iters, nullptr);
    r.backward_ms = fa::check::median_kernel_ms([&] { fa::backward(train, bwd, scale, nullptr, ws); }, 3, iters, nullptr);
  }

  // Enqueue cost of a cached call. Fewer calls than the launch queue holds (about a thousand
  // pending launches), so that enqueueing never waits for a kernel to finish, whatever the shape.
  constexpr int kHostCalls = 200;
  fa::check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kHostCalls; ++i) fa::forward(spec, inference, scale, nullptr, ws);
  r.host_us_per_call = host_ms_since(start) * 1000.0 / kHostCalls;
  fa::check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  r.cache = fa::plan_cache_stats();
  return r;
}

void print_bench(const fa::AttentionSpec& spec, const BenchResult& r, int iters) {
  const double fwd_flops = spec.forward_flops();
  auto tflops = [](double flops, double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0; };
  std::printf("bench spec=%s  (median of %d calls, CUDA events)\n", quoted(spec).c_str(), iters);
  std::printf("  %-26s %12s %10s\n", "pass", "kernel ms", "TFLOP/s");
  std::printf("  %-26s %12.4f %10.1f\n", "forward", r.forward_ms, tflops(fwd_flops, r.forward_ms));
  if (r.backward_refused.empty()) {
    std::printf("  %-26s %12.4f %10.1f\n", "forward+backward", r.forward_backward_ms,
                tflops(3.5 * fwd_flops, r.forward_backward_ms));
    std::printf("  %-26s %12.4f %10.1f\n", "backward", r.backward_ms, tflops(2.5 * fwd_flops, r.backward_ms));
  } else {
    std::printf("  backward not supported: %s\n", r.backward_refused.substr(0, 300).c_str());
  }
  std::printf("  %-26s %12.2f us\n", "host time per cached call", r.host_us_per_call);
  std::printf("  %-26s %12.1f ms forward, %.1f ms backward\n", "plan build", r.build_forward_ms, r.build_backward_ms);
  if (r.restore_forward_ms >= 0) {
    std::printf("  %-26s %12.1f ms forward, %.1f ms backward (%s)\n", "plan restored from disk", r.restore_forward_ms,
                r.restore_backward_ms, fa::plan_dir().c_str());
  }
  std::printf("  %-26s builds=%llu build_ms=%.1f hits=%llu misses=%llu size=%zu\n", "plan cache",
              static_cast<unsigned long long>(r.cache.builds), r.cache.build_ms,
              static_cast<unsigned long long>(r.cache.hits), static_cast<unsigned long long>(r.cache.misses),
              r.cache.size);
}

int cmd_bench(const CommandLine& line) {
  const fa::AttentionSpec spec = parse_valid_spec(line).spec();
  const int iters = static_cast<int>(std::max<std::uint64_t>(1, parse_unsigned(line, "--iters", 20)));
  const std::string no_gpu = gpu_unavailable();
  if (!no_gpu.empty()) {
    std::cout << "no GPU: " << no_gpu << "  spec=" << quoted(spec) << "\n";
    return kNoGpu;
  }
  std::cout << fa::build_info().to_string() << "\n";
  try {
    fa::AttentionSpec train = spec;
    train.stats = true;
    if (fa::is_fp8(spec.q.dtype)) {  // FP8, then its BF16 twin on the same (unquantized) inputs
      fa::check::Fp8Problem problem(train, /*with_backward=*/true, std::random_device{}());
      problem.run_forward(fa::default_scale(spec));  // scales of S, O, dP and the gradients from their amaxes
      problem.run_backward(fa::default_scale(spec));
      const BenchResult fp8 = run_bench(spec, iters, problem.forward_tensors(), problem.backward_tensors());
      fa::AttentionSpec bf16 = problem.bf16_spec();
      bf16.stats = spec.stats;
      const BenchResult twin = run_bench(bf16, iters, problem.bf16_forward_tensors(), problem.bf16_backward_tensors());
      print_bench(spec, fp8, iters);
      print_bench(bf16, twin, iters);
      std::printf("FP8 / BF16 speed: forward %.3f, backward %.3f, forward+backward %.3f\n",
                  twin.forward_ms / fp8.forward_ms, twin.backward_ms / fp8.backward_ms,
                  twin.forward_backward_ms / fp8.forward_backward_ms);
      return kOk;
    }
    fa::check::AttentionBuffers buffers(train, /*with_backward=*/true);
    buffers.fill_inputs(std::random_device{}());
    print_bench(spec, run_bench(spec, iters, buffers.forward_tensors(), buffers.backward_tensors()), iters);
  } catch (const fa::NotSupported& error) {
    print_not_supported(error, spec);
    return kNotSupported;
  }
  return kOk;
}

// --- demo -------------------------------------------------------------------------------------

bool demo_check(const std::string& title, const fa::AttentionSpec& spec) {
  std::cout << title << "\n";
  const fa::check::CheckResult result = fa::check::check_against_reference(spec, {});
  std::cout << "  " << result.to_string() << "\n";
  return result.passed;
}

int demo_gpu() {
  std::cout << fa::build_info().to_string() << "\n\n";
  fa::ProblemShape standard;
  standard.dtype = fa::DType::bf16;
  standard.batch = 2;
  standard.seq_q = standard.seq_kv = 2048;
  standard.heads_q = standard.heads_kv = 16;
  standard.head_dim_qk = standard.head_dim_v = 128;
  const fa::AttentionSpec first = causal_spec(standard, fa::Alignment::top_left);
  bool ok = demo_check("1. standard problem (bf16, bshd, causal), forward + backward:", first);
  fa::AttentionSpec first_train = first;
  first_train.stats = true;
  fa::check::AttentionBuffers first_buffers(first_train, /*with_backward=*/true);
  first_buffers.fill_inputs(std::random_device{}());
  const BenchResult timing = run_bench(first, 10, first_buffers.forward_tensors(), first_buffers.backward_tensors());
  std::printf("  forward %.3f ms = %.0f TFLOP/s, forward+backward %.3f ms = %.0f TFLOP/s  spec=%s\n\n",
              timing.forward_ms, first.forward_flops() / (timing.forward_ms * 1e9), timing.forward_backward_ms,
              3.5 * first.forward_flops() / (timing.forward_backward_ms * 1e9), quoted(first).c_str());

  fa::ProblemShape odd = standard;
  odd.seq_q = 1000;
  odd.seq_kv = 1500;
  odd.heads_kv = 4;
  const fa::AttentionSpec second = causal_spec(odd, fa::Alignment::bottom_right);
  ok = demo_check("2. odd sizes (s_q=1000, s_kv=1500, GQA 16/4, causal bottom-right), forward + backward:", second) && ok;
  std::cout << (ok ? "demo: PASS" : "demo: FAIL") << "\n";
  return ok ? kOk : kFailed;
}

// Contiguous [b, h, s, d] doubles, uniform in [-1, 1].
std::vector<double> random_tensor(std::int64_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<double> values(static_cast<std::size_t>(n));
  for (double& value : values) value = uniform(rng);
  return values;
}

struct CpuTensors {
  std::vector<double> q, k, v, d_o, o, lse, dq, dk, dv;
};

void cpu_forward_backward(const fa::ReferenceProblem& p, CpuTensors& t) {
  t.o.assign(static_cast<std::size_t>(p.batch * p.heads_q * p.seq_q * p.head_dim_v), 0.0);
  t.lse.assign(static_cast<std::size_t>(p.batch * p.heads_q * p.seq_q), 0.0);
  t.dq.assign(t.q.size(), 0.0);
  t.dk.assign(t.k.size(), 0.0);
  t.dv.assign(t.v.size(), 0.0);
  fa::reference_forward_cpu(p, t.q.data(), t.k.data(), t.v.data(), t.o.data(), t.lse.data());
  fa::reference_backward_cpu(p, t.q.data(), t.k.data(), t.v.data(), t.d_o.data(), t.dq.data(), t.dk.data(),
                             t.dv.data());
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = a.size() == b.size() ? 0.0 : INFINITY;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return std::isnan(worst) ? INFINITY : worst;
}

// K or V of a GQA problem with each head repeated for the query heads that share it.
std::vector<double> repeat_heads(const std::vector<double>& x, const fa::ReferenceProblem& p, std::int64_t dim) {
  const std::int64_t group = p.heads_q / p.heads_kv, block = p.seq_kv * dim;
  std::vector<double> out(static_cast<std::size_t>(p.batch * p.heads_q * block));
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      std::copy_n(x.begin() + (b * p.heads_kv + h / group) * block, block, out.begin() + (b * p.heads_q + h) * block);
  return out;
}

// Gradient of a GQA K/V head: the sum over the query heads that share it.
std::vector<double> sum_groups(const std::vector<double>& x, const fa::ReferenceProblem& p, std::int64_t dim) {
  const std::int64_t group = p.heads_q / p.heads_kv, block = p.seq_kv * dim;
  std::vector<double> out(static_cast<std::size_t>(p.batch * p.heads_kv * block), 0.0);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < block; ++i)
        out[(b * p.heads_kv + h / group) * block + i] += x[(b * p.heads_q + h) * block + i];
  return out;
}

// GQA must equal MHA with repeated K/V heads (and summed K/V gradients).
double gqa_self_check(const fa::ReferenceProblem& p, const CpuTensors& gqa) {
  fa::ReferenceProblem mha_problem = p;
  mha_problem.heads_kv = p.heads_q;
  CpuTensors mha;
  mha.q = gqa.q;
  mha.k = repeat_heads(gqa.k, p, p.head_dim_qk);
  mha.v = repeat_heads(gqa.v, p, p.head_dim_v);
  mha.d_o = gqa.d_o;
  cpu_forward_backward(mha_problem, mha);
  return std::max({max_abs_diff(gqa.o, mha.o), max_abs_diff(gqa.dq, mha.dq),
                   max_abs_diff(gqa.dk, sum_groups(mha.dk, p, p.head_dim_qk)),
                   max_abs_diff(gqa.dv, sum_groups(mha.dv, p, p.head_dim_v))});
}

// sum(O * dO): the loss whose gradients reference_backward_cpu returns.
double loss(const fa::ReferenceProblem& p, const CpuTensors& t) {
  std::vector<double> o(t.o.size()), lse(t.lse.size());
  fa::reference_forward_cpu(p, t.q.data(), t.k.data(), t.v.data(), o.data(), lse.data());
  double sum = 0.0;
  for (std::size_t i = 0; i < o.size(); ++i) sum += o[i] * t.d_o[i];
  return sum;
}

// Central finite differences of the loss at a few elements of Q, K and V, against the analytic
// gradients; returns the worst relative difference.
double finite_difference_check(const fa::ReferenceProblem& p, const CpuTensors& t) {
  constexpr double kStep = 1e-5;
  double worst = 0.0;
  CpuTensors probe = t;
  auto check = [&](std::vector<double>& input, const std::vector<double>& grad, std::size_t index) {
    const double saved = input[index];
    input[index] = saved + kStep;
    const double up = loss(p, probe);
    input[index] = saved - kStep;
    const double down = loss(p, probe);
    input[index] = saved;
    const double numeric = (up - down) / (2 * kStep);
    worst = std::max(worst, std::fabs(numeric - grad[index]) / std::max(1e-3, std::fabs(grad[index])));
  };
  for (std::size_t index : {std::size_t{3}, t.q.size() / 2, t.q.size() - 5}) check(probe.q, t.dq, index);
  for (std::size_t index : {std::size_t{7}, t.k.size() - 9}) check(probe.k, t.dk, index);
  for (std::size_t index : {std::size_t{11}, t.v.size() / 3}) check(probe.v, t.dv, index);
  return worst;
}

// L2 norm of the finite values: a checksum that, unlike a plain sum, does not vanish for dK
// (whose sum over keys is zero, because each softmax row's gradient sums to zero).
double norm(const std::vector<double>& x) {
  double sum = 0.0;
  for (double value : x)
    if (std::isfinite(value)) sum += value * value;
  return std::sqrt(sum);
}

int demo_cpu(const std::string& reason) {
  std::cout << "no GPU found (" << reason << "): running the CPU float64 reference on a small problem instead\n";
  fa::ProblemShape shape;
  shape.batch = 2;
  shape.seq_q = 37;
  shape.seq_kv = 53;
  shape.heads_q = 4;
  shape.heads_kv = 2;
  shape.head_dim_qk = 32;
  shape.head_dim_v = 24;
  const fa::AttentionSpec spec = causal_spec(shape, fa::Alignment::bottom_right);
  const fa::ReferenceProblem p = fa::reference_problem(spec, fa::default_scale(spec));
  std::mt19937_64 rng(2024);
  CpuTensors t;
  t.q = random_tensor(spec.q.elements(), rng);
  t.k = random_tensor(spec.k.elements(), rng);
  t.v = random_tensor(spec.v.elements(), rng);
  t.d_o = random_tensor(spec.o.elements(), rng);
  cpu_forward_backward(p, t);
  std::printf("problem spec=%s scale=%.6f\n", quoted(spec).c_str(), p.scale);
  std::printf("  L2 norms: O %.9f  lse %.9f  dQ %.9f  dK %.9f  dV %.9f\n", norm(t.o), norm(t.lse), norm(t.dq),
              norm(t.dk), norm(t.dv));
  const double gqa = gqa_self_check(p, t);
  const double fd = finite_difference_check(p, t);
  const bool gqa_ok = gqa <= 1e-12, fd_ok = fd <= 1e-6;
  std::printf("  self-check: GQA 4/2 equals MHA with repeated K/V heads: max |diff| %.2e  %s\n", gqa,
              gqa_ok ? "PASS" : "FAIL");
  std::printf("  self-check: gradients match central finite differences: worst relative diff %.2e  %s\n", fd,
              fd_ok ? "PASS" : "FAIL");
  return gqa_ok && fd_ok ? kOk : kFailed;
}

int cmd_support_matrix(const CommandLine& line) {
  const std::string report = fa::tools::support_matrix_markdown(gpu_unavailable().empty());
  if (!line.has("--out")) {
    std::cout << report;
    return kOk;
  }
  std::ofstream file(line.options.at("--out"));
  file << report;
  if (!file) throw UsageError{"cannot write " + line.options.at("--out")};
  std::cout << "wrote " << line.options.at("--out") << "\n";
  return kOk;
}

int cmd_demo() {
  const std::string no_gpu = gpu_unavailable();
  return no_gpu.empty() ? demo_gpu() : demo_cpu(no_gpu);
}

// --- warmup -----------------------------------------------------------------------------------

std::vector<fa::AttentionSpec> warmup_specs(const CommandLine& line) {
  std::vector<std::string> texts;
  if (!line.spec.empty()) texts.push_back(line.spec);
  if (line.has("--file")) {
    const std::string& path = line.options.at("--file");
    std::ifstream file;
    if (path != "-") {
      file.open(path);
      if (!file) throw UsageError{"--file: cannot read '" + path + "'"};
    }
    std::istream& in = path == "-" ? std::cin : file;
    for (std::string text; std::getline(in, text);) {
      if (text.find_first_not_of(" \t") == std::string::npos || text[text.find_first_not_of(" \t")] == '#') continue;
      texts.push_back(text);
    }
  }
  if (texts.empty()) throw UsageError{"'warmup' needs a spec string or --file"};
  std::vector<fa::AttentionSpec> specs;
  for (const std::string& text : texts) {
    fa::AttentionSpec spec = fa::parse_spec(text);
    fa::validate(spec);
    if (!line.has("--buckets")) {
      specs.push_back(spec);
      continue;
    }
    for (const fa::AttentionSpec& bucket : fa::ragged_buckets(spec)) specs.push_back(bucket);
  }
  return specs;
}

int cmd_warmup(const CommandLine& line) {
  const std::vector<fa::Pass> passes = passes_of(line);
  const std::vector<fa::AttentionSpec> specs = warmup_specs(line);
  const std::string no_gpu = gpu_unavailable();
  if (!no_gpu.empty()) {
    std::cout << "no GPU (" << no_gpu << "): " << specs.size() << " specs parsed, nothing built\n";
    return kNoGpu;
  }
  fa::WarmupOptions options;
  options.threads = static_cast<int>(parse_unsigned(line, "--threads", 0));
  const auto start = std::chrono::steady_clock::now();
  const std::vector<fa::WarmupResult> results = fa::warm_up(specs, passes, options);
  const double total_ms = host_ms_since(start);
  int ready = 0;
  for (const fa::WarmupResult& r : results) {
    char head[64];
    std::snprintf(head, sizeof head, "%-13s %9.1f ms  %-8s ", r.ok ? "ready" : "not supported", r.ms,
                  fa::to_string(r.pass));
    std::cout << head << quoted(r.spec) << "\n";
    if (!r.ok) std::cout << "  " << r.message << "\n";
    ready += r.ok ? 1 : 0;
  }
  const fa::DiskCacheStats disk = fa::disk_cache_stats();
  const std::string folder = fa::plan_dir();
  std::cout << "warmup: " << ready << " of " << results.size() << " plans ready in " << total_ms << " ms"
            << (fa::autotune_default() ? " (autotuned)" : "") << "\n"
            << "disk cache " << (folder.empty() ? std::string("off") : folder) << ": loaded=" << disk.loaded
            << " (" << disk.load_ms << " ms) stored=" << disk.stored << " missing=" << disk.missing
            << " rejected=" << disk.rejected << " store_failures=" << disk.store_failures << "\n";
  return ready == static_cast<int>(results.size()) ? kOk : kFailed;
}

// --- main -------------------------------------------------------------------------------------

int dispatch(const CommandLine& line) {
  if (line.has("--autotune")) fa::set_autotune(true);
  if (line.command == "info") return cmd_info();
  if (line.command == "warmup") return cmd_warmup(line);
  if (line.command == "support") return cmd_support(line);
  if (line.command == "run") return cmd_run(line);
  if (line.command == "bench") return cmd_bench(line);
  if (line.command == "demo") return cmd_demo();
  if (line.command == "support-matrix") return cmd_support_matrix(line);
  throw UsageError{"unknown command '" + line.command + "'"};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
                    std::string(argv[1]) == "help")) {
    std::cout << kUsageLine << "\n" << kHelp;
    return kOk;
  }
  try {
    return dispatch(parse_command_line(argc, argv));
  } catch (const UsageError& error) {
    std::cerr << "fusedattn: " << error.message << "\n" << kUsageLine << "\n";
    return kUsage;
  } catch (const fa::InvalidArgument& error) {
    std::cerr << fa::to_string(error.kind()) << ": " << error.what() << "\n";
    return kUsage;
  } catch (const fa::NotSupported& error) {
    // The message lists every reason, and the spec.
    std::cout << fa::to_string(error.kind()) << ": " << error.what() << "\n";
    return kNotSupported;
  } catch (const fa::Error& error) {
    std::cerr << fa::to_string(error.kind()) << ": " << error.what() << "\n";
    return kError;
  } catch (const std::exception& error) {
    std::cerr << "error: " << error.what() << "\n";
    return kError;
  }
}
