// Causal blocks of a score-modified call (causal_composite.h).
#include "exec/causal_composite.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "exec/cuda_check.h"
#include "exec/row_sums.h"

namespace fusedattn::detail {
namespace {

constexpr std::size_t kAlign = 256;
std::size_t round_up(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The tensor `desc` describes at `base`, from position `row` of its sequence axis on.
template <class P>
P* at_row(P* base, const TensorDesc& desc, std::int64_t row) {
  using Byte = std::conditional_t<std::is_const_v<P>, const char, char>;
  return reinterpret_cast<P*>(reinterpret_cast<Byte*>(base) +
                              static_cast<std::ptrdiff_t>(row * desc.strides[kSeq] * size_of(desc.dtype)));
}

// The modifier's tensors for a block whose queries start at `row` and keys at `key`: one along the
// queries (or the keys) alone starts there; the others are the caller's (causal_blocks admits no other).
ScoreModTensors block_tensors(const ScoreMod& mod, ScoreModTensors t, std::int64_t row, std::int64_t key) {
  for (int i = 0; i < mod.tensors(); ++i) {
    auto& p = t.tensors[static_cast<std::size_t>(i)];
    if (mod.tensor_axes(i) == kAxisQ) p += row;
    if (mod.tensor_axes(i) == kAxisKv) p += key;
  }
  return t;
}

// Rows first .. first + rows of each [b, h] row of the statistics ([b, h, s_q] floats), to or from
// a contiguous [b, h, rows] buffer.
void copy_stats_rows(float* dst, std::int64_t dst_pitch, const float* src, std::int64_t src_pitch, std::int64_t rows,
                     std::int64_t heads_rows, cudaStream_t stream) {
  check_cuda(cudaMemcpy2DAsync(dst, static_cast<std::size_t>(dst_pitch) * sizeof(float), src,
                               static_cast<std::size_t>(src_pitch) * sizeof(float),
                               static_cast<std::size_t>(rows) * sizeof(float), static_cast<std::size_t>(heads_rows),
                               cudaMemcpyDeviceToDevice, stream),
             "cudaMemcpy2DAsync(statistics rows)");
}

}  // namespace

CausalBlocks causal_blocks_in_use(const AttentionSpec& spec) {
  static const bool enabled = [] {
    const char* value = std::getenv("FUSEDATTN_CAUSAL_BLOCKS");
    return !(value && std::string(value) == "0");
  }();
  return enabled ? causal_blocks(spec) : CausalBlocks{};
}

CausalComposite::CausalComposite(const AttentionSpec& spec, Pass pass, CausalBlocks blocks)
    : spec_(spec), blocks_(blocks) {
  const std::int64_t count = pass == Pass::forward ? blocks.count : backward_count(spec, blocks);
  for (std::int64_t i = 0; i < count; ++i) {
    plans_.push_back(get_plan(pass == Pass::forward ? forward_block(spec, blocks, i) : backward_block(spec, blocks, i), pass));
    block_workspace_ = std::max(block_workspace_, round_up(plans_.back()->workspace_bytes()));
  }
  const auto heads_rows = static_cast<std::size_t>(spec.batch() * spec.heads_q());
  if (pass == Pass::forward) {
    scratch_bytes_ = round_up(heads_rows * static_cast<std::size_t>(blocks.size) * sizeof(float));
  } else {
    const auto q_elements = static_cast<std::size_t>(spec.q.extent());
    scratch_bytes_ = round_up(heads_rows * static_cast<std::size_t>(spec.seq_q()) * sizeof(float)) +
                     round_up(q_elements * size_of(spec.q.dtype)) +
                     round_up(heads_rows * static_cast<std::size_t>(spec.seq_q() * spec.head_dim_qk()) * sizeof(float));
  }
}

void CausalComposite::forward(const ForwardTensors& t, float scale, cudaStream_t stream, char* workspace) const {
  float* stats_rows = reinterpret_cast<float*>(workspace + block_workspace_);
  const Workspace block_workspace{workspace, block_workspace_};
  for (std::size_t i = 0; i < plans_.size(); ++i) {
    const std::int64_t first = forward_first_row(blocks_, static_cast<std::int64_t>(i));
    const AttentionSpec& block = plans_[i]->spec();
    ForwardTensors bt = t;
    bt.q = at_row(t.q, spec_.q, first);
    bt.o = at_row(t.o, spec_.o, first);
    bt.stats = spec_.stats ? stats_rows : nullptr;
    bt.score_mod = block_tensors(spec_.score_mod, t.score_mod, first, 0);
    plans_[i]->run(bt, scale, stream, block_workspace);
    if (spec_.stats) {
      copy_stats_rows(t.stats + first, spec_.seq_q(), stats_rows, block.seq_q(), block.seq_q(),
                      spec_.batch() * spec_.heads_q(), stream);
    }
  }
}

void CausalComposite::backward(const BackwardTensors& t, float scale, cudaStream_t stream, char* workspace) const {
  char* ours = workspace + block_workspace_;
  const auto heads_rows = static_cast<std::size_t>(spec_.batch() * spec_.heads_q());
  float* stats_rows = reinterpret_cast<float*>(ours);
  ours += round_up(heads_rows * static_cast<std::size_t>(spec_.seq_q()) * sizeof(float));
  void* d_q_part = ours;  // laid out as Q, so that a block writes its rows of it with Q's strides
  ours += round_up(static_cast<std::size_t>(spec_.q.extent()) * size_of(spec_.q.dtype));
  float* d_q_sum = reinterpret_cast<float*>(ours);
  const Workspace block_workspace{workspace, block_workspace_};
  for (std::size_t j = 0; j < plans_.size(); ++j) {
    const auto jj = static_cast<std::int64_t>(j);
    const std::int64_t row = backward_first_row(spec_, blocks_, jj), key = backward_first_key(blocks_, jj);
    const AttentionSpec& block = plans_[j]->spec();
    copy_stats_rows(stats_rows, block.seq_q(), t.stats + row, spec_.seq_q(), block.seq_q(),
                    static_cast<std::int64_t>(heads_rows), stream);
    BackwardTensors bt = t;
    bt.q = at_row(t.q, spec_.q, row);
    bt.o = at_row(t.o, spec_.o, row);
    bt.d_o = at_row(t.d_o, spec_.o, row);
    bt.stats = stats_rows;
    bt.k = at_row(t.k, spec_.k, key);
    bt.v = at_row(t.v, spec_.v, key);
    bt.d_k = at_row(t.d_k, spec_.k, key);
    bt.d_v = at_row(t.d_v, spec_.v, key);
    bt.d_q = at_row(d_q_part, spec_.q, row);
    bt.score_mod = block_tensors(spec_.score_mod, t.score_mod, row, key);
    plans_[j]->run(bt, scale, stream, block_workspace);
    // Block 0's queries are all of them (its keys start at 0): it writes the sum, the others add.
    accumulate_rows(block.q, bt.d_q, d_q_sum, spec_.seq_q(), row, /*assign=*/j == 0, stream);
  }
  store_rows(d_q_sum, spec_.q, t.d_q, stream);
}

}  // namespace fusedattn::detail
