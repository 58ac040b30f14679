// Internal to src/graph/: the MXFP8 parts of the SDPA graphs (fusedattn/mxfp8_scales.h), the block
// scale tensors and the backward's FP8 copies, given to the frontend's MXFP8 overloads of sdpa_fp8
// and sdpa_fp8_backward. The frontend tells MXFP8 from per-tensor FP8 by Descale_Q's type and
// reordering (E8M0, F8_128x4), so every scale here has both.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "graph/frontend_graph.h"

namespace fusedattn::graph::detail {

/// The block scales of a tensor of logical `dims` [b, h, s, d] blocked along `blocked` (kDim or
/// kSeq), as fusedattn/mxfp8.h lays them out: E8M0, reordered F8_128x4, dims
/// mxfp8_scale_shape(dims, blocked).swizzled_dims() in the frontend's [b, h, s-axis, d-axis] order,
/// and the strides of one padded [rows, blocks] matrix per (b, h), b outer, its blocks axis fastest.
fe::graph::Tensor_attributes mxfp8_scale_desc(const char* name, Uid uid, const std::array<std::int64_t, 4>& dims,
                                              Axis blocked);

/// O and the statistics of the MXFP8 forward of `qkv` (FP8, described as the spec's q, k, v): their
/// scales join the graph, and max |O| comes out.
std::array<TensorPtr, 2> mxfp8_outputs(fe::graph::Graph& graph, const AttentionSpec& spec,
                                       const std::array<TensorPtr, 3>& qkv, fe::graph::SDPA_fp8_attributes& attributes,
                                       std::vector<std::int64_t>& uids);

/// dQ, dK, dV of the MXFP8 backward of `in` = {q, k, v (FP8, blocked along d), o, d_o (16-bit),
/// stats}: the FP8 copies and every scale join the graph, and the gradients' amaxes come out.
std::array<TensorPtr, 3> mxfp8_gradients(fe::graph::Graph& graph, const AttentionSpec& spec,
                                         const std::array<TensorPtr, 6>& in,
                                         fe::graph::SDPA_fp8_backward_attributes& attributes,
                                         std::vector<std::int64_t>& uids);

}  // namespace fusedattn::graph::detail
