// The pure support policy for cuDNN 9 fused flash attention: every rule, every reason (the FP8
// and MXFP8 rules are in fp8_rules.cpp).
//
// Each rule is a small function that appends the reasons it finds; check_support_policy runs them
// all, so a caller sees every limit at once rather than fixing them one by one. Versions are
// cuDNN's encoding (9.10.2 -> 91002; cuDNN 8 used major*1000: 8.9.7 -> 8907).
#include "fusedattn/support.h"

#include <cstdint>
#include <utility>

#include "spec/diagonal.h"
#include "spec/text.h"
#include "support/decode_kernel_rule.h"
#include "support/rules.h"

namespace fusedattn {
namespace {

using detail::head_dims;
using detail::kHopper;
using detail::Reasons;
using detail::sm_text;

int cudnn_major(int version) noexcept { return version >= 10000 ? version / 10000 : version / 1000; }

// cuDNN's fused flash-attention kernels start at Ampere: they rely on SM 8.0's asynchronous copies
// and bf16 tensor cores, so SM 7.5 (Turing) and older are out whatever the cuDNN version.
void device_rule(const DeviceCaps& caps, Reasons& out) {
  if (caps.sm() >= 80) return;
  out.push_back({"device", sm_text(caps), "compute capability 8.0 or newer (cuDNN fused flash attention)",
                 "an Ampere (SM 8.0) or newer GPU"});
}

// The graph layer is compiled against cuDNN 9 headers; a loaded library of another major version
// (8.9.7 is 8907, a different ABI and graph API) cannot serve it.
void cudnn_version_rule(const Versions& versions, Reasons& out) {
  bool same_major = cudnn_major(versions.cudnn_runtime) == cudnn_major(versions.cudnn_compiled);
  if (same_major && versions.cudnn_runtime >= 90000) return;
  out.push_back({"cudnn", version_text(versions.cudnn_runtime) + " at run time, headers " + version_text(versions.cudnn_compiled),
                 "cuDNN 9.x at run time matching the 9.x headers", "a cuDNN 9 runtime (9.0 or newer) matching the headers"});
}

// 9.10.0 (91000) and 9.10.1 (91001) shipped a broken SDPA backward; 9.10.2 (91002) fixed it.
void broken_backward_rule(Pass pass, const Versions& versions, Reasons& out) {
  if (pass != Pass::backward) return;
  if (versions.cudnn_runtime != 91000 && versions.cudnn_runtime != 91001) return;
  out.push_back({"cudnn", version_text(versions.cudnn_runtime),
                 "a cuDNN without the known broken SDPA backward of 9.10.0 and 9.10.1", "cuDNN 9.10.2"});
}

// Forward: 256 is the widest head dim of the SM 8.x-12.x forward kernels in cuDNN 9; on SM 8.x the
// kernels wider than 128 arrived with 9.10 (91000), so 9.9 and older stop at 128 there.
void forward_head_dim_rule(const AttentionSpec& spec, const DeviceCaps& caps, const Versions& versions, Reasons& out) {
  for (int which = 0; which < 2; ++which) {
    auto [field, dim] = head_dims(spec, which);
    if (dim > 256) {
      out.push_back({field, std::to_string(dim),
                     "at most 256 in the forward pass (head dims above 256 need SM 10.x with a newer cuDNN)", ""});
    } else if (caps.sm_major == 8 && versions.cudnn_runtime < 91000 && dim > 128) {
      out.push_back({field, std::to_string(dim), "at most 128 in the forward pass on SM 8.x before cuDNN 9.10",
                     "cuDNN 9.10"});
    }
  }
}

// What lifts a backward head-dim limit on a GPU that is not Hopper: Hopper's kernels go to 256;
// on SM 10.x cuDNN 9.11 added 192/128 and 9.23 added 256/256.
std::string backward_lifted_by(const AttentionSpec& spec, const DeviceCaps& caps, std::int64_t dim) {
  if (dim > 256) return "";
  if (caps.sm_major == 10 && spec.head_dim_qk() == 192 && spec.head_dim_v() == 128) return "cuDNN 9.11 (or a Hopper GPU)";
  if (caps.sm_major == 10 && spec.head_dim_qk() == 256 && spec.head_dim_v() == 256) return "cuDNN 9.23 (or a Hopper GPU)";
  return kHopper;
}

void backward_at_most(const AttentionSpec& spec, const DeviceCaps& caps, std::int64_t limit, const std::string& requirement,
                      Reasons& out) {
  for (int which = 0; which < 2; ++which) {
    auto [field, dim] = head_dims(spec, which);
    if (dim > limit) out.push_back({field, std::to_string(dim), requirement, backward_lifted_by(spec, caps, dim)});
  }
}

// SM 10.x from cuDNN 9.11 (91100): 128 and below, plus two wide pairs: d_qk = 192 with d_v = 128
// (the MLA shape), and from 9.23 (92300) d_qk = d_v = 256.
void sm100_backward_head_dim_rule(const AttentionSpec& spec, const DeviceCaps& caps, const Versions& versions,
                                  Reasons& out) {
  std::int64_t qk = spec.head_dim_qk(), v = spec.head_dim_v();
  if (qk == 192) {
    if (v != 128) {
      out.push_back({"d_v", std::to_string(v), "128 when d_qk = 192 in the backward pass on SM 10.x",
                     v <= 256 ? kHopper : ""});
    }
    return;
  }
  if (qk == 256 && v == 256) {
    if (versions.cudnn_runtime < 92300) {
      out.push_back({"d_qk", "256", "d_qk = d_v = 256 in the backward pass on SM 10.x needs cuDNN 9.23 or newer",
                     "cuDNN 9.23 (or a Hopper GPU)"});
    }
    return;
  }
  backward_at_most(spec, caps, 128,
                   "at most 128 in the backward pass on SM 10.x (besides d_qk = 192 with d_v = 128, and d_qk = d_v = "
                   "256 from cuDNN 9.23)",
                   out);
}

// Backward: Hopper's kernels go to 256; SM 10.x has its own list; every other GPU (SM 8.x, 12.x,
// and SM 10.x before 9.11) stops at 128.
void backward_head_dim_rule(const AttentionSpec& spec, const DeviceCaps& caps, const Versions& versions, Reasons& out) {
  if (caps.sm_major == 9) {
    backward_at_most(spec, caps, 256, "at most 256 in the backward pass on SM 9.x", out);
  } else if (caps.sm_major == 10 && versions.cudnn_runtime >= 91100) {
    sm100_backward_head_dim_rule(spec, caps, versions, out);
  } else {
    backward_at_most(spec, caps, 128, "at most 128 in the backward pass on " + sm_text(caps), out);
  }
}

// Bottom-right diagonals arrived in cuDNN 9.6 (90600); on Hopper their backward was fixed in 9.10
// (91000). With a right bound and s_q > s_kv + right, the diagonal ends at the last key before the
// first rows reach any: those rows' softmax is 0/0, and no version can make that meaningful.
void bottom_right_rule(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, const Versions& versions,
                       Reasons& out) {
  if (spec.window.right < 0 || spec.alignment != Alignment::bottom_right) return;
  const std::string value = to_string(spec.alignment);
  if (versions.cudnn_runtime < 90600) {
    out.push_back({"align", value, "cuDNN 9.6 or newer for a bottom-right causal mask", "cuDNN 9.6"});
  }
  if (pass == Pass::backward && caps.sm_major == 9 && versions.cudnn_runtime < 91000) {
    out.push_back({"align", value, "cuDNN 9.10 or newer for the bottom-right causal backward pass on SM 9.x", "cuDNN 9.10"});
  }
  // With padding the lengths that matter arrive at run time; each entry then needs
  // seq_len_q[b] <= seq_len_kv[b] + right (README), which no spec-level rule can see.
  const std::int64_t blind = spec.seq_q() - spec.seq_kv() - spec.window.right;
  if (blind > 0 && !spec.padding) {
    out.push_back({"align", value,
                   "s_q <= s_kv + right bound for a bottom-right mask: with s_q = " + std::to_string(spec.seq_q()) +
                       " and s_kv = " + std::to_string(spec.seq_kv()) + " the first " + std::to_string(blind) +
                       " query rows see no key at all (use top_left, or s_q <= s_kv)",
                   ""});
  }
}

// Sliding windows (a left bound). cuDNN's kernels take them only where every query's window lies
// inside the keys (s_q <= s_kv); before 9.10.2 (91002) only together with a right bound; before
// 9.6 with a bottom-right diagonal only for s_q == s_kv; and on Hopper up to 9.9 not with a
// bottom-right diagonal at s_q == s_kv, the case 9.10 fixed.
void window_rule(const AttentionSpec& spec, const DeviceCaps& caps, const Versions& versions, Reasons& out) {
  if (spec.window.left < 0) return;
  const std::string value = to_string(spec.window);
  const bool bottom_right = spec.alignment == Alignment::bottom_right;
  if (spec.seq_q() > spec.seq_kv() && !spec.padding) {  // cuDNN checks only unpadded shapes
    out.push_back({"window", value,
                   "s_q <= s_kv for a sliding window (left bound): s_q = " + std::to_string(spec.seq_q()) +
                       ", s_kv = " + std::to_string(spec.seq_kv()),
                   ""});
  }
  if (spec.window.right < 0 && versions.cudnn_runtime < 91002) {
    out.push_back({"window", value, "a right bound with the left bound before cuDNN 9.10.2", "cuDNN 9.10.2"});
  }
  if (bottom_right && spec.seq_q() != spec.seq_kv() && versions.cudnn_runtime < 90600) {
    out.push_back({"window", value, "s_q == s_kv for a bottom-right sliding window before cuDNN 9.6", "cuDNN 9.6"});
  }
  if (bottom_right && spec.seq_q() == spec.seq_kv() && caps.sm_major == 9 && versions.cudnn_runtime < 91000) {
    out.push_back({"window", value, "cuDNN 9.10 or newer for a bottom-right sliding window at s_q == s_kv on SM 9.x",
                   "cuDNN 9.10"});
  }
}

}  // namespace

std::string version_text(int version) {
  int major = cudnn_major(version);
  int rest = version >= 10000 ? version % 10000 : version % 1000;
  return std::to_string(major) + "." + std::to_string(rest / 100) + "." + std::to_string(rest % 100);
}

const char* to_string(Pass pass) noexcept {
  switch (pass) {
    case Pass::forward: return "forward";
    case Pass::backward: return "backward";
  }
  return "unknown";
}

std::string Reason::to_string() const {
  std::string out = field + " = " + value + ": needs " + requirement;
  if (!lifted_by.empty()) out += " (lifted by " + lifted_by + ")";
  return out;
}

std::string Support::to_string() const {
  std::string out = ok() ? "supported" : "";
  for (const Reason& reason : reasons) {
    if (!out.empty()) out += '\n';
    out += reason.to_string();
  }
  if (!policy_only.empty()) out += "\n(" + policy_only + ")";
  return out;
}

// cuDNN 9.19's backward validation refuses the degenerate single-query, single-key problem
// (seen on the H200: "s_q = s_kv = 1 is not supported"); its gradient is zero anyway, since a
// softmax over one key is constant. Any other length pair is accepted.
void single_element_backward_rule(const AttentionSpec& spec, Pass pass, Reasons& out) {
  if (pass != Pass::backward || spec.seq_q() != 1 || spec.seq_kv() != 1) return;
  out.push_back({"s_q", "1 (and s_kv = 1)", "s_q > 1 or s_kv > 1 for the backward pass", ""});
}

// Scores changed by a bias or ALiBi: cuDNN's bottom-right diagonals take neither (every version);
// cuDNN takes ALiBi only with a right bound of 0 on a top-left diagonal (its slope term is j - i),
// and fusedattn also leaves out a left bound with it, a pairing no GPU run has checked; before 9.10.2
// a sliding window takes no bias; dBias arrived for padded and odd-length problems in 9.5. The
// backward with a bias broadcast over the query rows (111s) is wrong in cuDNN 9.19: it builds and
// runs, but on the H200 dQ/dK/dV came back with relative errors 0.47-1.3 and a 111s dBias with
// 1.0 (GPU runs at c0f819e and dc0faae), so fusedattn refuses that backward. The forward is
// right (errors ~2e-3); a 1 x 1 x s_q x s_kv (11ss) bias trains correctly.
void score_terms_rule(const AttentionSpec& spec, Pass pass, const Versions& versions, Reasons& out) {
  const bool bottom_right = spec.window.right >= 0 && spec.alignment == Alignment::bottom_right;
  if (spec.bias != Bias::none && bottom_right) {
    out.push_back({"bias", to_string(spec.bias), "no bottom-right diagonal with a bias (cuDNN's kernels take none)", ""});
  }
  if (spec.alibi && (!spec.window.causal() || spec.alignment != Alignment::top_left)) {
    out.push_back({"alibi", "1", "a causal top-left window (window=-1,0 align=top_left) with ALiBi", ""});
  }
  if (spec.bias != Bias::none && spec.window.left >= 0 && versions.cudnn_runtime < 91002) {
    out.push_back({"bias", to_string(spec.bias), "no sliding window with a bias before cuDNN 9.10.2", "cuDNN 9.10.2"});
  }
  if (pass == Pass::backward && spec.bias_grad && versions.cudnn_runtime < 90500 &&
      (spec.padding || spec.seq_q() % 64 != 0 || spec.seq_kv() % 64 != 0)) {
    out.push_back({"bias_grad", "1", "unpadded s_q and s_kv multiples of 64 for dBias before cuDNN 9.5", "cuDNN 9.5"});
  }
  if (pass == Pass::backward && spec.bias == Bias::one_11s) {
    out.push_back({"bias", "111s", "bhss, b1ss, 1hss or 11ss for the backward (cuDNN's gradients with 111s are wrong)", ""});
  }
}

// Dropout: like a bias, cuDNN's bottom-right diagonals do not take it; before 9.10.2 a sliding window
// does not either; and Blackwell's deterministic backward has no dropout.
void dropout_rule(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, const Versions& versions,
                  Reasons& out) {
  if (spec.dropout == 0.0) return;
  const std::string value = detail::format_double(spec.dropout);  // as the spec string writes it
  if (spec.window.right >= 0 && spec.alignment == Alignment::bottom_right) {
    out.push_back({"dropout", value, "no bottom-right diagonal with dropout (cuDNN's kernels take none)", ""});
  }
  if (spec.window.left >= 0 && versions.cudnn_runtime < 91002) {
    out.push_back({"dropout", value, "no sliding window with dropout before cuDNN 9.10.2", "cuDNN 9.10.2"});
  }
  if (pass == Pass::backward && spec.deterministic && caps.sm_major == 10) {
    out.push_back({"dropout", value, "no dropout with a deterministic backward on " + sm_text(caps), ""});
  }
}

// Sinks (off_by_one is a sink of logit 0) arrived in cuDNN 9.13 (91300). cuDNN's row maximum is
// the softmax's own, which takes the sink logit into the max (the frontend's softmax node): with a
// sink it is no longer the largest score, so fusedattn does not offer the two together.
void softmax_rule(const AttentionSpec& spec, const Versions& versions, Reasons& out) {
  if (spec.softmax == Softmax::vanilla) return;
  if (versions.cudnn_runtime < 91300) {
    out.push_back({"softmax", to_string(spec.softmax), "cuDNN 9.13 or newer for a softmax with a sink", "cuDNN 9.13"});
  }
  if (spec.max_logit != MaxLogit::none) {
    out.push_back({"max_logit", to_string(spec.max_logit),
                   "softmax=vanilla: cuDNN's row maximum includes the sink logit, so it is not the max logit", ""});
  }
}

// The deterministic backward reached Blackwell (SM 10.x) in cuDNN 9.18 (91800).
void deterministic_rule(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, const Versions& versions,
                        Reasons& out) {
  if (pass != Pass::backward || !spec.deterministic) return;
  if (caps.sm_major == 10 && versions.cudnn_runtime < 91800) {
    out.push_back({"deterministic", "1", "cuDNN 9.18 or newer for a deterministic backward on " + sm_text(caps),
                   "cuDNN 9.18"});
  }
  if (caps.sm_major == 10 && (spec.bias_grad || spec.alibi)) {
    out.push_back({"deterministic", "1", "no dBias or ALiBi with a deterministic backward on " + sm_text(caps), ""});
  }
}

// The score and softmax features not yet checked on a GPU together with `what` (ragged inputs,
// paged caches): one reason each that is in use.
void score_features_not_offered_with(const AttentionSpec& spec, const char* what, Reasons& out,
                                     bool softmax_offered = false) {
  auto not_yet = [&](bool used, const char* field, const std::string& value) {
    if (used) out.push_back({field, value, "no " + std::string(field) + " with " + what + " (not offered yet)", ""});
  };
  not_yet(spec.bias != Bias::none, "bias", to_string(spec.bias));
  not_yet(spec.alibi, "alibi", "1");
  not_yet(spec.softmax != Softmax::vanilla && !softmax_offered, "softmax", to_string(spec.softmax));
  not_yet(spec.dropout > 0.0, "dropout", detail::format_double(spec.dropout));
  not_yet(spec.max_logit != MaxLogit::none, "max_logit", to_string(spec.max_logit));
}

// Ragged (thd) tensors: cuDNN takes them from Hopper on (the frontend's rule), and fusedattn
// writes ragged statistics ([T, h_q], by token), which cuDNN offers from 9.6 (90600) and not on
// SM 12.x (no ragged statistics in its backward). A sink in a ragged backward needs 9.26 (92600).
// Dense Q with ragged K/V, and ragged inputs with a bias, ALiBi, a sink or
// off-by-one softmax, dropout or a max logit, are not offered yet: none has been checked on a GPU.
void ragged_rule(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, const Versions& versions, Reasons& out) {
  if (!spec.ragged_q() && !spec.ragged_kv()) return;
  const char* value = "ragged";
  if (caps.sm() < 90) {
    out.push_back({"layout", value, "a Hopper (SM 9.0) or newer GPU for ragged (thd) tensors", kHopper});
  }
  if (caps.sm_major == 12) {
    out.push_back({"layout", value, "ragged statistics, which cuDNN does not offer on " + sm_text(caps), ""});
  }
  if (versions.cudnn_runtime < 90600) {
    out.push_back({"layout", value, "cuDNN 9.6 or newer for ragged statistics", "cuDNN 9.6"});
  }
  if (spec.ragged_kv() && !spec.ragged_q()) {
    out.push_back({"layout", "dense q, ragged k/v", "a ragged q with ragged k/v (dense q with them is not offered)", ""});
  }
  if (pass == Pass::backward && spec.softmax == Softmax::sink && versions.cudnn_runtime < 92600) {
    out.push_back({"softmax", "sink", "cuDNN 9.26 or newer for a ragged backward with a sink", "cuDNN 9.26"});
  }
  score_features_not_offered_with(spec, "ragged inputs", out);
}

// Paged K/V caches (inference): cuDNN reads them from 9.5 (90500) and, up to 9.9, only with head
// dims up to 128, and with ragged Q from 9.7 (90700); its backward takes no page tables. Paged
// caches with a bias, ALiBi, dropout or a max logit are not offered yet: none has been checked on a
// GPU; a sink or off-by-one softmax runs on fusedattn's decode kernel alone, where it takes the call
// (decode_kernel_only).
void paged_rule(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, const Versions& versions, Reasons& out) {
  if (!spec.paged_kv()) return;
  const std::string value = std::to_string(spec.kv_pages);
  if (versions.cudnn_runtime < 90500) {
    out.push_back({"kv_pages", value, "cuDNN 9.5 or newer for paged caches", "cuDNN 9.5"});
  }
  if (versions.cudnn_runtime < 91000 && (spec.head_dim_qk() > 128 || spec.head_dim_v() > 128)) {
    out.push_back({"kv_pages", value, "d_qk, d_v <= 128 with paged caches before cuDNN 9.10", "cuDNN 9.10"});
  }
  if (spec.ragged_q() && versions.cudnn_runtime < 90700) {
    out.push_back({"kv_pages", value, "cuDNN 9.7 or newer for ragged Q with paged caches", "cuDNN 9.7"});
  }
  if (pass == Pass::backward) {
    out.push_back({"kv_pages", value, "no backward through paged caches (inference only: cuDNN's backward takes no page tables)", ""});
  }
  const bool softmax_on_the_kernel = spec.softmax != Softmax::vanilla && pass == Pass::forward &&
                                     detail::decode_kernel_refusals(spec, pass, caps).empty();
  score_features_not_offered_with(spec, "paged caches", out, softmax_on_the_kernel);
}

// Score modifiers (score_mod.h) go into cuDNN's flexible graphs, which arrived in 9.6 (90600).
// Beside a modifier cuDNN switches off its own masks and ALiBi: the graph layer writes the window
// and padding into the modifier, and ALiBi, whose slopes cuDNN makes itself, is the user's to
// write in. The FP8 graphs take none. A bias's gradient beside a modifier came back wrong on the
// H200 (cuDNN 9.19): a learned relative-position table under a softcap got a gradient 0.85 off in
// relative L2, in PyTorch and JAX alike, while O, dQ, dK and dV matched autograd. The backward is
// refused there; the forward, and a bias without a gradient, stay.
void score_mod_rule(const AttentionSpec& spec, Pass pass, const Versions& versions, Reasons& out) {
  if (spec.score_mod.empty()) return;
  const std::string mod = to_string(spec.score_mod);
  if (versions.cudnn_runtime < 90600) {
    out.push_back({"score_mod", mod, "cuDNN 9.6 or newer (cuDNN's flexible attention graphs)", "cuDNN 9.6"});
  }
  if (is_fp8(spec.q.dtype)) {
    out.push_back({"score_mod", mod, "f16 or bf16 inputs (fusedattn's FP8 graphs take no score modifier)", ""});
  }
  if (spec.alibi) {
    out.push_back({"alibi", "1",
                   "no alibi beside a score modifier (cuDNN turns ALiBi off there): write it into the modifier, "
                   "add(score,mul(t0[h],sub(kv,q))) with the slopes as t0",
                   ""});
  }
  if (pass == Pass::backward && spec.bias_grad) {
    out.push_back({"bias_grad", "1",
                   "no bias gradient beside a score modifier: cuDNN 9.19 returns a wrong dBias there (measured on "
                   "the H200); the forward runs, and so does a bias without a gradient",
                   ""});
  }
}

Support check_support_policy(const AttentionSpec& given, Pass pass, const DeviceCaps& caps, const Versions& versions) {
  // A bottom-right diagonal that sits where the top-left one does is judged as top-left, as it is built.
  AttentionSpec spec = given;
  spec.alignment = detail::placed_alignment(given);
  Support support;
  Reasons& out = support.reasons;
  device_rule(caps, out);
  cudnn_version_rule(versions, out);
  broken_backward_rule(pass, versions, out);
  if (pass == Pass::forward) {
    forward_head_dim_rule(spec, caps, versions, out);
  } else {
    backward_head_dim_rule(spec, caps, versions, out);
  }
  bottom_right_rule(spec, pass, caps, versions, out);
  window_rule(spec, caps, versions, out);
  single_element_backward_rule(spec, pass, out);
  deterministic_rule(spec, pass, caps, versions, out);
  score_terms_rule(spec, pass, versions, out);
  softmax_rule(spec, versions, out);
  dropout_rule(spec, pass, caps, versions, out);
  ragged_rule(spec, pass, caps, versions, out);
  paged_rule(spec, pass, caps, versions, out);
  detail::fp8_rule(spec, pass, caps, versions, out);
  detail::mxfp8_rule(spec, pass, caps, versions, out);
  detail::fp8_kv_cache_rule(given, pass, caps, out);
  detail::decode_score_mod_rule(given, pass, caps, out);
  detail::decode_extra_term_rule(given, pass, caps, out);
  detail::decode_page_size_rule(given, pass, caps, out);
  score_mod_rule(spec, pass, versions, out);
  return support;
}

}  // namespace fusedattn
