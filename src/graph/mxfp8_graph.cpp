// The MXFP8 tensors of the SDPA graphs (mxfp8_graph.h).
#include "graph/mxfp8_graph.h"

#include "fusedattn/mxfp8.h"

namespace fusedattn::graph::detail {
namespace {

// The scales of a tensor described by `of`, blocked along `blocked`, joining `uids`.
TensorPtr scales(fe::graph::Graph& graph, const char* name, Uid uid, const TensorDesc& of, Axis blocked,
                 std::vector<std::int64_t>& uids) {
  uids.push_back(uid);
  return graph.tensor(mxfp8_scale_desc(name, uid, of.dims, blocked));
}

// An FP8 copy of `like` (its dims and strides) in `dtype`, joining `uids`.
TensorPtr fp8_copy(fe::graph::Graph& graph, const char* name, Uid uid, TensorDesc like, DType dtype,
                   std::vector<std::int64_t>& uids) {
  like.dtype = dtype;
  uids.push_back(uid);
  return graph.tensor(describe(name, uid, like));
}

}  // namespace

// The strides are those of the plain matrix before the swizzle, which the frontend's validation
// reads no further than "stride[3] == 1 blocked along d" (scaled_dot_product_flash_attention.h,
// SF_Q and SF_K): blocked along s, the blocks axis is dims[2], and it stays the fastest. Where the
// backward needs other strides for SF_Q_T and SF_K_T, the frontend sets its own (sdpa_fp8_bwd.h).
fe::graph::Tensor_attributes mxfp8_scale_desc(const char* name, Uid uid, const std::array<std::int64_t, 4>& dims,
                                              Axis blocked) {
  const Mxfp8ScaleShape shape = mxfp8_scale_shape(dims, blocked);
  const std::array<std::int64_t, 4> swizzled = shape.swizzled_dims();
  const std::int64_t matrix = shape.matrix_bytes();
  const std::int64_t row = shape.padded_blocks;  // a row holds its (padded) blocks side by side
  const std::vector<std::int64_t> strides = blocked == kDim
                                                ? std::vector<std::int64_t>{shape.heads * matrix, matrix, row, 1}
                                                : std::vector<std::int64_t>{shape.heads * matrix, matrix, 1, row};
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim({swizzled.begin(), swizzled.end()})
      .set_stride(strides)
      .set_data_type(fe::DataType_t::FP8_E8M0)
      .set_reordering_type(fe::TensorReordering_t::F8_128x4);
}

std::array<TensorPtr, 2> mxfp8_outputs(fe::graph::Graph& graph, const AttentionSpec& spec,
                                       const std::array<TensorPtr, 3>& qkv, fe::graph::SDPA_fp8_attributes& attributes,
                                       std::vector<std::int64_t>& uids) {
  // S = Q K^T reduces over d, O = P V over the keys: V is blocked along s here.
  auto out = graph.sdpa_fp8(qkv[0], qkv[1], qkv[2], scales(graph, "sf_q", kUidSfQ, spec.q, kDim, uids),
                            scales(graph, "sf_k", kUidSfK, spec.k, kDim, uids),
                            scales(graph, "sf_v", kUidSfV, spec.v, kSeq, uids), attributes);
  mark_scalar_output(out[2], "amax_o", kUidMxfp8AmaxO, uids);
  return {out[0], out[1]};
}

std::array<TensorPtr, 3> mxfp8_gradients(fe::graph::Graph& graph, const AttentionSpec& spec,
                                         const std::array<TensorPtr, 6>& in,
                                         fe::graph::SDPA_fp8_backward_attributes& attributes,
                                         std::vector<std::int64_t>& uids) {
  // dP = dO V^T reduces over d; dV = P^T dO and dK = dS^T Q over the queries, dQ = dS K over the
  // keys: Q, K and dO come blocked both ways, V along d only.
  const DType fp8 = spec.q.dtype;
  auto q_t = fp8_copy(graph, "q_t", kUidQT, spec.q, fp8, uids);
  auto k_t = fp8_copy(graph, "k_t", kUidKT, spec.k, fp8, uids);
  auto d_o = fp8_copy(graph, "d_o_fp8", kUidDOFp8, spec.o, fp8, uids);
  auto d_o_t = fp8_copy(graph, "d_o_t", kUidDOT, spec.o, fp8, uids);
  auto out = graph.sdpa_fp8_backward(
      in[0], q_t, in[1], k_t, in[2], in[3], in[4], d_o, d_o_t, in[5],
      scales(graph, "sf_q", kUidSfQ, spec.q, kDim, uids), scales(graph, "sf_q_t", kUidSfQT, spec.q, kSeq, uids),
      scales(graph, "sf_k", kUidSfK, spec.k, kDim, uids), scales(graph, "sf_k_t", kUidSfKT, spec.k, kSeq, uids),
      scales(graph, "sf_v", kUidSfV, spec.v, kDim, uids), scales(graph, "sf_d_o", kUidSfDO, spec.o, kDim, uids),
      scales(graph, "sf_d_o_t", kUidSfDOT, spec.o, kSeq, uids), attributes);
  mark_scalar_output(out[3], "amax_d_q", kUidMxfp8AmaxDQ, uids);
  mark_scalar_output(out[4], "amax_d_k", kUidMxfp8AmaxDK, uids);
  mark_scalar_output(out[5], "amax_d_v", kUidMxfp8AmaxDV, uids);
  return {out[0], out[1], out[2]};
}

}  // namespace fusedattn::graph::detail
