// Internal: a paged decode split into key chunks (support/decode_split.h), run as two cached plans
// and three small kernels, all on the caller's stream and without a host synchronization (lengths
// stay on the device, so a captured decode step replays with new lengths):
//   1. per sequence, from its lengths: how its keys are cut (decode_chunks), the chunks' slices of
//      both page tables and the chunks' lengths; and the queries copied once per full chunk;
//   2. the full chunks of every sequence, one entry each, without a mask;
//   3. the final chunk of every sequence, with the caller's mask, on the caller's queries;
//   4. the merge: per query row, the chunks' partial O weighted by exp(their log-sum-exp - the
//      largest), into the caller's O (and statistics); chunks without keys take no part.
// The workspace holds the larger inner plan's, then the partials, tables and lengths.
#pragma once

#include <cstddef>
#include <memory>

#include <cuda_runtime_api.h>

#include "fusedattn/attention.h"
#include "support/decode_split.h"

namespace fusedattn::detail {

/// decode_split(spec, pass, SMs of `device`), unless FUSEDATTN_SPLIT_DECODE=0 (read once) keeps
/// every decode in one call (the benchmark times both ways with it).
DecodeSplit decode_split_in_use(const AttentionSpec& spec, Pass pass, int device);

class DecodeSplitComposite {
 public:
  /// Builds (or finds) both inner plans; throws what get_plan throws for them.
  DecodeSplitComposite(const AttentionSpec& spec, DecodeSplit split);
  std::size_t workspace_bytes() const noexcept { return inner_workspace_ + scratch_bytes_; }

  void forward(const ForwardTensors& t, float scale, cudaStream_t stream, char* workspace) const;

 private:
  AttentionSpec spec_;
  DecodeSplit split_;
  std::shared_ptr<const Plan> full_, final_;
  std::size_t inner_workspace_ = 0;  // the larger inner plan's, rounded up
  std::size_t scratch_bytes_ = 0;    // partials, tables, lengths
};

}  // namespace fusedattn::detail
