// fusedattn/output_shapes.h — the shape of each output of a call as the adapters allocate it, in
// the caller's own axis order: the one answer fusedattn.torch, fusedattn.jax and the PyTorch fast
// path take, so a layout added to call.h reaches every adapter's allocation at once.
//
// The answer comes first as picks, each output axis naming the input axis whose size it has: they
// depend on the config alone, and an adapter applies them to whatever sizes it holds (torch.compile's
// symbolic sizes included, which no C++ function can take).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fusedattn/call.h"
#include "fusedattn/support.h"

namespace fusedattn {

/// An output axis's size: that of `axis` of the call's q, k or v (in the tensor's own axis order).
struct AxisPick {
  enum class Input : std::uint8_t { q, k, v } input;
  int axis;
};

/// One output of a pass: its name as the tensor sets spell it, and where each of its axes' sizes
/// comes from (float32 where the name says statistics or max logit, q's or its input's type otherwise).
struct OutputAxes {
  std::string name;
  std::vector<AxisPick> axes;
};

/// The outputs of `pass` for calls of `config`, in the tensor set's order:
///   forward:  o (q's sizes with v's head dim), [stats: float32 [b, h_q, s_q], or [t, h_q] for thd],
///             [max_logit: as stats per row (MaxLogit::row), [h_q] per head (MaxLogit::head)]
///   backward: d_q, d_k, d_v (their inputs' sizes: packed or paged inputs keep their own),
///             [d_sink: [h_q] with Softmax::sink]
/// dBias (bias_grad) has the caller's bias's sizes, which are not among q, k, v.
std::vector<OutputAxes> output_axes(const CallConfig& config, Pass pass);

/// One output's sizes on a call's tensors.
struct OutputShape {
  std::string name;
  std::vector<std::int64_t> sizes;
};

/// output_axes applied to `shape`'s q, k and v. Throws InvalidArgument ("q.shape", ...) where a
/// tensor's rank is not its layout's.
std::vector<OutputShape> output_shapes(const CallConfig& config, const CallShape& shape, Pass pass);

}  // namespace fusedattn
