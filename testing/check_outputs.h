// testing/check_outputs.h — the outputs a reference check compares: fusedattn's, and those of the
// CPU float64 and GPU float32 references, each on the host in contiguous [b, h, s, d] order.
// Internal to the testing library: reference_check.cpp is its one user.
#pragma once

#include <vector>

#include "fusedattn/attention.h"
#include "fusedattn/reference.h"
#include "testing/attention_buffers.h"
#include "testing/check_result.h"

namespace fusedattn::check {

/// Everything one check needs, computed once.
struct CheckProblem {
  AttentionSpec spec;      ///< as checked: stats on when the backward is checked; dense (see twins.h)
  AttentionSpec run_spec;  ///< what fusedattn runs: spec, or the ragged / paged spec it stands for
  CheckOptions options;    ///< with the seed actually used
  double scale = 0.0;
  ReferenceProblem ref;
};

/// One side's outputs, in whichever precision it ran; only what the spec asks for is filled.
template <class T>
struct Outputs {
  std::vector<T> o, lse, dq, dk, dv;
  std::vector<T> max_logit, dbias, dsink;
  std::vector<T> dropout_mask;  ///< the keep mask fusedattn's forward drew (dropout)
};

/// Runs `p` through the one-call API a user calls (plan lookup included), forward and, when
/// checked, backward, with workspaces of the size the cached plans ask for; synchronous.
Outputs<float> run_fusedattn(const CheckProblem& p, AttentionBuffers& buffers);

/// The CPU float64 reference on the host copies of the inputs; `mask` is the keep mask fusedattn
/// drew (empty without dropout), applied exactly.
Outputs<double> reference_cpu(const CheckProblem& p, const AttentionBuffers& buffers, const std::vector<float>& mask);

/// The float32 GPU reference on the device inputs (and the keep mask still on the device).
Outputs<float> reference_gpu(const CheckProblem& p, const AttentionBuffers& buffers);

}  // namespace fusedattn::check
