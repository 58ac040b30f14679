// The support report: every verdict is the library's own answer, with every reason, so a "no"
// is always a cuDNN rejection or a written policy rule, never a guess.
#include "support_matrix.h"

#include <functional>
#include <vector>

#include "fusedattn/attention.h"
#include "fusedattn/build_info.h"
#include "fusedattn/errors.h"

namespace fusedattn::tools {
namespace {

struct Variant {
  const char* name;
  std::function<void(AttentionSpec&)> apply;
};

const std::vector<Variant>& features() {
  static const std::vector<Variant> list = {
      {"plain", [](AttentionSpec&) {}},
      {"padding", [](AttentionSpec& s) { s.padding = true; }},
      {"deterministic", [](AttentionSpec& s) { s.deterministic = true; }},
      {"bias 1hss + dbias", [](AttentionSpec& s) { s.bias = Bias::one_hss; s.bias_grad = true; }},
      {"bias bhss + dbias", [](AttentionSpec& s) { s.bias = Bias::bhss; s.bias_grad = true; }},
      {"bias b1ss + dbias", [](AttentionSpec& s) { s.bias = Bias::b1ss; s.bias_grad = true; }},
      {"bias 11ss + dbias", [](AttentionSpec& s) { s.bias = Bias::one_1ss; s.bias_grad = true; }},
      {"bias 111s + dbias", [](AttentionSpec& s) { s.bias = Bias::one_11s; s.bias_grad = true; }},
      {"bias 111s", [](AttentionSpec& s) { s.bias = Bias::one_11s; }},
      {"alibi", [](AttentionSpec& s) { s.alibi = true; }},
      {"softmax off_by_one", [](AttentionSpec& s) { s.softmax = Softmax::off_by_one; }},
      {"softmax sink", [](AttentionSpec& s) { s.softmax = Softmax::sink; }},
      {"max logit per row", [](AttentionSpec& s) { s.max_logit = MaxLogit::row; }},
      {"max logit per head", [](AttentionSpec& s) { s.max_logit = MaxLogit::head; }},
      {"dropout 0.1", [](AttentionSpec& s) { s.dropout = 0.1; }},
  };
  return list;
}

const std::vector<Variant>& masks() {
  static const std::vector<Variant> list = {
      {"none", [](AttentionSpec&) {}},
      {"causal top-left", [](AttentionSpec& s) { s.window = kCausal; }},
      {"causal bottom-right", [](AttentionSpec& s) { s.window = kCausal; s.alignment = Alignment::bottom_right; }},
      {"window 256,0 bottom-right", [](AttentionSpec& s) { s.window = Window{256, 0}; s.alignment = Alignment::bottom_right; }},
      {"band 128,16 top-left", [](AttentionSpec& s) { s.window = Window{128, 16}; }},
  };
  return list;
}

struct HeadDims {
  const char* name;
  std::int64_t qk, v;
};
constexpr HeadDims kHeadDims[] = {{"64", 64, 64}, {"128", 128, 128}, {"256", 256, 256}, {"192/128", 192, 128}};

class Verdicts {
 public:
  explicit Verdicts(bool with_cudnn) : with_cudnn_(with_cudnn) {
    versions_ = current_versions();
    if (versions_.cudnn_runtime == 0) versions_.cudnn_runtime = versions_.cudnn_compiled;
  }
  Support ask(const AttentionSpec& spec, Pass pass) const {
    if (with_cudnn_) return check_support(spec, pass);
    return check_support_policy(spec, pass, DeviceCaps{9, 0}, versions_);
  }

 private:
  bool with_cudnn_;
  Versions versions_;
};

std::string cell(const Support& support) { return support.ok() ? "yes" : "**no**"; }

// Every reason once: a limit both passes share is listed as such, so rows stay short.
std::string reasons(const Support& forward, const Support& backward) {
  auto in = [](const Support& support, const std::string& text) {
    for (const Reason& reason : support.reasons) {
      if (reason.to_string() == text) return true;
    }
    return false;
  };
  std::string out;
  auto add = [&](const char* pass, const std::string& text) { out += (out.empty() ? "" : "<br>") + (pass + text); };
  for (const Reason& reason : forward.reasons) {
    add(in(backward, reason.to_string()) ? "both: " : "fwd: ", reason.to_string());
  }
  for (const Reason& reason : backward.reasons) {
    if (!in(forward, reason.to_string())) add("bwd: ", reason.to_string());
  }
  for (char& c : out) {
    if (c == '|') c = '/';
  }
  return out;
}

constexpr std::int64_t kPageSize = 64;

AttentionSpec base_spec(Layout layout, DType dtype, const HeadDims& dims, const MatrixSize& size) {
  ProblemShape shape;
  shape.dtype = dtype;
  shape.batch = size.batch;
  shape.seq_q = size.seq_q;
  shape.seq_kv = packs_qkv(layout) ? size.seq_q : size.seq_kv;
  shape.heads_q = size.heads_q;
  shape.heads_kv = packs_qkv(layout) ? size.heads_q : size.heads_kv;
  shape.head_dim_qk = dims.qk;
  shape.head_dim_v = dims.v;
  if (paged_kv(layout)) {  // pages of 64 tokens, s_kv rounded up to whole pages, a pool with spare pages
    shape.page_size = kPageSize;
    shape.seq_kv = (shape.seq_kv + kPageSize - 1) / kPageSize * kPageSize;
    shape.pages = shape.batch * (shape.seq_kv / kPageSize) + 7;
  }
  return spec_for_layout(layout, shape);
}

void row(std::string& out, const std::vector<std::string>& cells) {
  out += "|";
  for (const std::string& c : cells) out += " " + c + " |";
  out += "\n";
}

// The number of combinations done so far, for the progress callback.
struct Tally {
  const std::function<void(std::size_t, std::size_t)>& progress;
  std::size_t done, total;
};

// One table row per entry: its labels, then both verdicts and every reason.
void verdict_rows(std::string& out, const std::vector<MatrixEntry>& entries, const Verdicts& verdicts,
                  Tally& tally) {
  for (const MatrixEntry& entry : entries) {
    const Support forward = verdicts.ask(entry.spec, Pass::forward), backward = verdicts.ask(entry.spec, Pass::backward);
    std::vector<std::string> cells = entry.labels;
    cells.insert(cells.end(), {cell(forward), cell(backward), reasons(forward, backward)});
    row(out, cells);
    if (tally.progress) tally.progress(++tally.done, tally.total);
  }
}

}  // namespace

std::vector<MatrixEntry> feature_entries(const MatrixSize& size) {
  std::vector<MatrixEntry> out;
  for (const Variant& feature : features()) {
    for (const Variant& mask : masks()) {
      for (const HeadDims& dims : kHeadDims) {
        AttentionSpec spec = base_spec(Layout::bshd, DType::bf16, dims, size);
        mask.apply(spec);
        feature.apply(spec);
        out.push_back({{feature.name, mask.name, dims.name}, spec});
      }
    }
  }
  return out;
}

std::vector<MatrixEntry> layout_entries(const MatrixSize& size) {
  std::vector<MatrixEntry> out;
  for (Layout layout : all_layouts()) {
    for (DType dtype : {DType::bf16, DType::f16}) {
      AttentionSpec spec = base_spec(layout, dtype, kHeadDims[1], size);
      spec.window = kCausal;
      out.push_back({{to_string(layout), to_string(dtype)}, spec});
    }
  }
  return out;
}

std::string support_matrix_markdown(bool with_cudnn, const std::function<void(std::size_t, std::size_t)>& progress) {
  const Verdicts verdicts(with_cudnn);
  const std::vector<MatrixEntry> by_feature = feature_entries(kReportSize), by_layout = layout_entries(kReportSize);
  Tally tally{progress, 0, by_feature.size() + by_layout.size()};
  const BuildInfo info = build_info();
  auto size_text = [](const MatrixSize& s) {
    return "b=" + std::to_string(s.batch) + ", s_q=" + std::to_string(s.seq_q) + ", s_kv=" + std::to_string(s.seq_kv) +
           ", h_q=" + std::to_string(s.heads_q) + ", h_kv=" + std::to_string(s.heads_kv);
  };
  std::string out = "# Support matrix\n\n";
  out += "Generated by `fusedattn support-matrix`. ";
  if (with_cudnn) {
    out += "Every verdict is `check_support` on " + info.device_name + " (SM " + std::to_string(info.sm / 10) + "." +
           std::to_string(info.sm % 10) + "): the policy and then cuDNN's own answer, which built the plan.\n\n";
  } else {
    out += "**No GPU: these are the pure policy's verdicts for an SM 9.0 device, not cuDNN's.** The report "
           "committed as the record comes from the GPU machine.\n\n";
  }
  out += "Every \"yes\" is run against the reference (forward, and backward where it says yes) by the GPU test "
         "`Gpu/SupportMatrix.SupportedMeansCorrect/*` in `tests/gpu/test_support_matrix_gpu.cpp`: the same "
         "combinations, with the same graph structure, at " + size_text(kCheckSize) + ".\n\n";
  out += "```\n" + info.to_string() + "\n```\n\n";

  out += "## Features, masks and head dims\n\nBF16, bshd, " + size_text(kReportSize) + " (GQA).\n\n";
  row(out, {"feature", "mask", "d_qk/d_v", "forward", "backward", "reasons"});
  row(out, {"---", "---", "---", "---", "---", "---"});
  verdict_rows(out, by_feature, verdicts, tally);

  out += "\n## Layouts and dtypes\n\nCausal top-left, d=128, " + size_text(kReportSize) +
         " (s_kv = s_q and h_kv = h_q where the layout packs K/V with Q; paged caches in pages of 64 tokens, "
         "s_kv rounded up to whole pages).\n\n";
  row(out, {"layout", "dtype", "forward", "backward", "reasons"});
  row(out, {"---", "---", "---", "---", "---"});
  verdict_rows(out, by_layout, verdicts, tally);
  return out;
}

}  // namespace fusedattn::tools
