// Internal: the FP8 backward's choice (fusedattn/fp8_backward_choice.h) as text: the spec it is
// measured against, its key, and the record kept in the disk cache. Pure, so tested on the CPU.
#pragma once

#include <optional>
#include <string>

#include "fusedattn/fp8_backward_choice.h"
#include "fusedattn/spec.h"

namespace fusedattn::detail {

/// Throws InvalidArgument, naming the field, where `spec` is not an FP8 spec with per-tensor
/// scaling whose backward runs on stand-in data alone, or `model_dtype` is not bf16 or f16.
void require_choosable(const AttentionSpec& spec, DType model_dtype);

/// `spec` in the model's precision: q, k, v and o in `model_dtype`, the FP8 gradients' format gone.
AttentionSpec model_precision_spec(const AttentionSpec& spec, DType model_dtype);

/// "fp8_backward model=bf16 <spec>": what the choice depends on besides the GPU and the versions.
std::string fp8_backward_key(const AttentionSpec& spec, DType model_dtype);

/// The faster of the two (the FP8 backward at a negative time did not run).
Fp8Backward faster(double fp8_ms, double model_ms) noexcept;

/// "fp8_ms=1.2340 model_ms=1.5000": the disk cache's payload of one choice.
std::string to_record(const Fp8BackwardChoice& choice);
/// Inverse of to_record, with `chosen` from the times; nullopt for any other text.
std::optional<Fp8BackwardChoice> parse_record(const std::string& text);

}  // namespace fusedattn::detail
