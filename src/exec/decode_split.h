// Internal: a paged decode split into key chunks (support/decode_split.h), run as one or two cached
// plans and three small kernels, all on the caller's stream and without a host synchronization
// (lengths stay on the device, so a captured decode step replays with new lengths):
//   1. per sequence, from its lengths: how its keys are cut (decode_cut), the chunks' page tables
//      (cut from both of the caller's) and lengths; and the queries copied once per chunk;
//   2. every sequence's chunks, one entry each, without a mask;
//   3. with several bottom-right causal queries, every sequence's masked keys, with the mask;
//   4. the merge: per query row, the partial O of each chunk with keys, weighted by exp(its
//      log-sum-exp - the largest), into the caller's O (and statistics).
// The workspace holds the larger inner plan's, then the partials, tables and lengths.
#pragma once

#include <cstddef>
#include <memory>

#include <cuda_runtime_api.h>

#include "fusedattn/attention.h"
#include "support/decode_split.h"

namespace fusedattn::detail {

/// decode_split(spec, pass, SMs of `device`), unless FUSEDATTN_SPLIT_DECODE (read once) says
/// otherwise: 0 keeps every decode in one call (the benchmark times both ways with it); a count
/// n >= 2 cuts the calls the rule splits into n chunks instead (decode_split_in_chunks; the
/// diagnostic's sweep of chunk counts).
DecodeSplit decode_split_in_use(const AttentionSpec& spec, Pass pass, int device);

class DecodeSplitComposite {
 public:
  /// Builds (or finds) both inner plans; throws what get_plan throws for them.
  DecodeSplitComposite(const AttentionSpec& spec, DecodeSplit split);
  std::size_t workspace_bytes() const noexcept { return inner_workspace_ + scratch_.bytes; }

  void forward(const ForwardTensors& t, float scale, cudaStream_t stream, char* workspace) const;

 private:
  // Where each of our arrays lies after the inner plans' workspace, in bytes (fixed by the spec).
  struct Scratch {
    std::size_t q_chunks, q_masked, o_chunks, o_masked, stats_chunks, stats_masked;
    std::size_t table_k_chunks, table_v_chunks, table_k_masked, table_v_masked;
    std::size_t len_q_chunks, len_kv_chunks, len_q_masked, len_kv_masked, bytes;
  };
  static Scratch scratch_of(const AttentionSpec& spec, const DecodeSplit& split);

  AttentionSpec spec_;
  DecodeSplit split_;
  std::shared_ptr<const Plan> chunks_, masked_;  // masked_: null without a masked call
  std::size_t inner_workspace_ = 0;  // the larger inner plan's, rounded up
  Scratch scratch_;                  // partials, tables, lengths
  bool early_launch_ = false;        // our kernels launched while the previous one finishes (SM 9.0)
};

}  // namespace fusedattn::detail
