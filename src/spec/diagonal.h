// Internal: where a spec's diagonal sits, as the plans, the support policy and the graphs see it.
#pragma once

#include "fusedattn/spec.h"

namespace fusedattn::detail {

/// The alignment that places `spec`'s diagonal: top_left wherever bottom_right puts it in the same
/// place, that is at s_q == s_kv with the lengths fixed by the spec (no runtime lengths, which may
/// differ between Q and KV), and wherever the window has no bound (nothing to place). Such a spec
/// shares top-left's plans and its limits: cuDNN's kernels that take no bottom-right diagonal (FP8
/// on Hopper, a bias, dropout) take it as the top-left mask it is.
inline Alignment placed_alignment(const AttentionSpec& spec) {
  if (!spec.window.bounded()) return Alignment::top_left;
  if (spec.alignment == Alignment::bottom_right && spec.seq_q() == spec.seq_kv() && !spec.padding) {
    return Alignment::top_left;
  }
  return spec.alignment;
}

}  // namespace fusedattn::detail
