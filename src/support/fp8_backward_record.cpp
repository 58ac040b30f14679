// The FP8 backward's choice as text (support/fp8_backward_record.h).
#include "support/fp8_backward_record.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "fusedattn/errors.h"

namespace fusedattn {

const char* to_string(Fp8Backward backward) noexcept { return backward == Fp8Backward::fp8 ? "fp8" : "model"; }

namespace detail {
namespace {

void require(bool holds, const std::string& field, const std::string& value, const std::string& requirement) {
  if (!holds) throw InvalidArgument(field, value, requirement);
}

}  // namespace

void require_choosable(const AttentionSpec& spec, DType model_dtype) {
  const std::string why = ": the FP8 backward's choice is measured on stand-in data of dense tensors";
  require(model_dtype == DType::bf16 || model_dtype == DType::f16, "model_dtype", to_string(model_dtype),
          "bf16 or f16 (the precision of the model around the FP8 attention)");
  require(is_fp8(spec.q.dtype) && is_fp8(spec.k.dtype) && is_fp8(spec.v.dtype), "q", to_string(spec.q),
          "q, k and v in E4M3 or E5M2 (an FP8 spec)");
  require(spec.fp8_scaling == Fp8Scaling::tensor, "fp8_scaling", to_string(spec.fp8_scaling),
          "tensor (per-tensor scales, as the adapters' FP8 recipes use)");
  require(!spec.ragged_q() && !spec.ragged_kv(), "layout", "ragged", "dense q, k and v" + why);
  require(!spec.paged_kv(), "kv_pages", std::to_string(spec.kv_pages), "0" + why);
  require(!spec.padding, "padding", "true", "false" + why);
  require(spec.bias == Bias::none, "bias", to_string(spec.bias), "none" + why);
  require(!spec.alibi, "alibi", "true", "false" + why);
  require(spec.dropout == 0.0, "dropout", std::to_string(spec.dropout), "0" + why);
  require(spec.softmax == Softmax::vanilla, "softmax", to_string(spec.softmax), "vanilla" + why);
  require(spec.score_mod.empty(), "score_mod", "set", "none" + why);
}

AttentionSpec model_precision_spec(const AttentionSpec& spec, DType model_dtype) {
  AttentionSpec model = spec;
  for (TensorDesc* desc : {&model.q, &model.k, &model.v, &model.o}) desc->dtype = model_dtype;
  model.fp8_gradients = Fp8Gradients::as_inputs;
  return model;
}

std::string fp8_backward_key(const AttentionSpec& spec, DType model_dtype) {
  return std::string("fp8_backward model=") + to_string(model_dtype) + " " + to_string(spec);
}

Fp8Backward faster(double fp8_ms, double model_ms) noexcept {
  return fp8_ms >= 0.0 && fp8_ms < model_ms ? Fp8Backward::fp8 : Fp8Backward::model;
}

std::string to_record(const Fp8BackwardChoice& choice) {
  char text[96];
  std::snprintf(text, sizeof text, "fp8_ms=%.4f model_ms=%.4f", choice.fp8_ms, choice.model_ms);
  return text;
}

std::optional<Fp8BackwardChoice> parse_record(const std::string& text) {
  double fp8_ms = 0.0, model_ms = 0.0;
  int end = 0;
  if (std::sscanf(text.c_str(), "fp8_ms=%lf model_ms=%lf%n", &fp8_ms, &model_ms, &end) != 2) return std::nullopt;
  if (static_cast<std::size_t>(end) != text.size() || !std::isfinite(fp8_ms) || !std::isfinite(model_ms) ||
      model_ms <= 0.0) {
    return std::nullopt;
  }
  return Fp8BackwardChoice{faster(fp8_ms, model_ms), fp8_ms, model_ms};
}

}  // namespace detail
}  // namespace fusedattn
