// The support policy's FP8 rules: per-tensor FP8 (E4M3, E5M2) and MXFP8 block scaling, each limit
// with the GPU or cuDNN version that lifts it.
#include <string>

#include "spec/text.h"
#include "support/rules.h"

namespace fusedattn::detail {

// FP8 (q, k, v in E4M3 or E5M2), as cuDNN 9's FP8 attention nodes take it (the frontend's
// sdpa_support_surface.h and sdpa_fp8_bwd.h): Hopper or newer, from cuDNN 9.1 and never 9.10.0;
// no bias; head dims multiples of 16 (on Hopper up to 256 forward, exactly 128 for the backward);
// on Hopper no bottom-right diagonal, O and the gradients only in FP8, and no ragged backward (each
// lifted by Blackwell: SM 10.x, with cuDNN 9.13 for 16-bit outputs). The other score and softmax
// features, dropout, ragged inputs, paged caches and the deterministic backward are not offered
// with FP8 yet: none has been checked on a GPU with it.
void fp8_rule(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, const Versions& versions, Reasons& out) {
  if (!is_fp8(spec.q.dtype)) return;
  const std::string dtype = to_string(spec.q.dtype);
  constexpr const char* kBlackwell = "a Blackwell (SM 10.0) GPU";
  if (caps.sm() < 90) out.push_back({"dtype", dtype, "a Hopper (SM 9.0) or newer GPU for FP8 attention", kHopper});
  if (versions.cudnn_runtime < 90100) {
    out.push_back({"dtype", dtype, "cuDNN 9.1 or newer for FP8 attention", "cuDNN 9.1"});
  } else if (versions.cudnn_runtime == 91000) {
    // A fault of the loaded library, not of the call: the field names it, as the broken-backward rule does.
    out.push_back({"cudnn", version_text(versions.cudnn_runtime),
                   "a cuDNN other than 9.10.0 for FP8 attention (its FP8 kernels are broken)", "cuDNN 9.10.1"});
  }
  if (spec.bias != Bias::none) {
    out.push_back({"bias", to_string(spec.bias), "no bias with FP8 (cuDNN's FP8 kernels take none)", ""});
  }
  for (int which = 0; which < 2; ++which) {
    auto [field, dim] = head_dims(spec, which);
    if (dim % 16 != 0) out.push_back({field, std::to_string(dim), "a multiple of 16 with FP8", ""});
  }
  const bool hopper = caps.sm_major == 9;
  if (hopper && pass == Pass::backward && (spec.head_dim_qk() != 128 || spec.head_dim_v() != 128)) {
    for (int which = 0; which < 2; ++which) {
      auto [field, dim] = head_dims(spec, which);
      if (dim != 128) {
        out.push_back({field, std::to_string(dim), "128 for the FP8 backward on SM 9.x (d_qk = d_v = 128)",
                       dim <= 128 && dim % 16 == 0 ? kBlackwell : ""});
      }
    }
  }
  if (hopper && spec.window.right >= 0 && spec.alignment == Alignment::bottom_right) {
    out.push_back({"align", "bottom_right", "top_left with FP8 on SM 9.x (its FP8 kernels take no bottom-right diagonal)",
                   kBlackwell});
  }
  // (An MXFP8 O is 16-bit by validation; the MXFP8 rule names the GPU its 16-bit outputs need.)
  if (hopper && !is_fp8(spec.o.dtype) && spec.fp8_scaling == Fp8Scaling::tensor) {
    out.push_back({"o.dtype", to_string(spec.o.dtype), "an FP8 O with FP8 inputs on SM 9.x",
                   "a Blackwell (SM 10.0) GPU with cuDNN 9.13"});
  }
  const bool ragged = spec.ragged_q() || spec.ragged_kv();
  const bool ragged_backward_on_hopper = hopper && pass == Pass::backward && ragged;
  if (ragged_backward_on_hopper) {
    out.push_back({"layout", "ragged", "dense tensors for the FP8 backward on SM 9.x", kBlackwell});
  }
  // cuDNN 9.26.0 on an H100 (b7777ee, again at ff5ad09; Gpu/Fp8Numerics padding_cross_gqa: b = 2,
  // s_q 256, s_kv 320, runtime lengths): its FP8 forward's amax of O came out 0.141 against the
  // reference's 0.126, past the check's 6.25%. O itself was within tolerance; the amax feeds the next
  // step's scale; the backward's amaxes were within it. 9.19 and 9.28.1 pass the same cases (ff5ad09);
  // 9.27 has not run them. A fault of the loaded library, so the reason names it (field "cudnn").
  if (pass == Pass::forward && spec.padding && versions.cudnn_runtime >= 92600 && versions.cudnn_runtime < 92700) {
    out.push_back({"cudnn", version_text(versions.cudnn_runtime),
                   "a cuDNN other than 9.26 for an FP8 forward with runtime lengths (padding = 1): 9.26's amax of O "
                   "comes out up to 12% above the reference's, a known wrong result",
                   "cuDNN 9.28"});
  }
  auto not_yet = [&](bool used, const char* field, const std::string& value) {
    if (used) out.push_back({field, value, "no " + std::string(field) + " with FP8 (not offered yet)", ""});
  };
  not_yet(spec.alibi, "alibi", "1");
  not_yet(spec.softmax != Softmax::vanilla, "softmax", to_string(spec.softmax));
  not_yet(spec.dropout > 0.0, "dropout", detail::format_double(spec.dropout));
  not_yet(spec.max_logit != MaxLogit::none, "max_logit", to_string(spec.max_logit));
  not_yet(ragged && !ragged_backward_on_hopper, "layout", "ragged");
  not_yet(spec.paged_kv(), "kv_pages", std::to_string(spec.kv_pages));
  not_yet(pass == Pass::backward && spec.deterministic, "deterministic", "1");
}

// MXFP8 block scaling (fusedattn/mxfp8.h's notes on the frontend 1.32 headers): cuDNN 9.21 (92100)
// or newer both ways, and for the forward a Blackwell data-center GPU, SM 10.x (the frontend
// checks the major version, so SM 12.x is out too). The backward's MXFP8 check names no GPU, but
// its dQ, dK and dV are 16-bit (O's dtype), which cuDNN's FP8 backward writes on SM 10.0 or newer
// only (sdpa_fp8_bwd.h's HALF/BFLOAT16 output check, from cuDNN 9.13). What the per-tensor FP8 rule
// above refuses (bias, dropout, paged caches, ...) holds for MXFP8 as well.
void mxfp8_rule(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, const Versions& versions, Reasons& out) {
  if (spec.fp8_scaling != Fp8Scaling::mxfp8) return;
  const char* value = to_string(spec.fp8_scaling);
  if (versions.cudnn_runtime < 92100) {
    out.push_back({"fp8_scaling", value,
                   "cuDNN 9.21 or newer for MXFP8 block scaling (loaded: " + version_text(versions.cudnn_runtime) + ")",
                   "cuDNN 9.21"});
  }
  if (pass == Pass::forward && caps.sm_major != 10) {
    out.push_back({"fp8_scaling", value,
                   "an SM 10.x (Blackwell data-center) GPU for the MXFP8 forward, not " + sm_text(caps),
                   "a Blackwell (SM 10.0) GPU"});
  }
  if (pass == Pass::backward && caps.sm_major < 10) {
    out.push_back({"fp8_scaling", value,
                   "an SM 10.0 or newer GPU for the MXFP8 backward (its 16-bit dQ, dK, dV), not " + sm_text(caps),
                   "a Blackwell (SM 10.0) GPU"});
  }
}

}  // namespace fusedattn::detail
