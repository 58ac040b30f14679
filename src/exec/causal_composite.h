// Internal: a causal call with a score modifier run as blocks (support/causal_blocks.h), each a
// cached plan of its own, on views of the caller's tensors: forward blocks of queries write O and
// the statistics complete; backward blocks of keys write dK and dV complete and their dQ parts into
// the workspace, summed in float32. The workspace holds the largest block's, then ours.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include <cuda_runtime_api.h>

#include "fusedattn/attention.h"
#include "support/causal_blocks.h"

namespace fusedattn::detail {

/// causal_blocks(spec), unless FUSEDATTN_CAUSAL_BLOCKS=0 (read once) asks for one call each time.
CausalBlocks causal_blocks_in_use(const AttentionSpec& spec);

class CausalComposite {
 public:
  /// Builds (or finds) each block's plan; throws what get_plan throws for a block.
  CausalComposite(const AttentionSpec& spec, Pass pass, CausalBlocks blocks);
  std::size_t workspace_bytes() const noexcept { return block_workspace_ + scratch_bytes_; }

  void forward(const ForwardTensors& t, float scale, cudaStream_t stream, char* workspace) const;
  void backward(const BackwardTensors& t, float scale, cudaStream_t stream, char* workspace) const;

 private:
  AttentionSpec spec_;
  CausalBlocks blocks_;
  std::vector<std::shared_ptr<const Plan>> plans_;  // one per block of this pass
  std::size_t block_workspace_ = 0;                 // the largest block plan's, rounded up
  std::size_t scratch_bytes_ = 0;                   // statistics rows, and the backward's dQ part and sum
};

}  // namespace fusedattn::detail
