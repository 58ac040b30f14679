// fusedattn/mxfp8_scales.h — the block scales and FP8 copies of an MXFP8 attention call (specs
// with fp8_scaling=mxfp8), as cuDNN's MXFP8 attention takes them.
//
// Every scale tensor holds E8M0 bytes in the 128x4 swizzled layout of fusedattn/mxfp8.h: for a
// tensor of logical dims [b, h, s, d] blocked along `axis`, mxfp8_scale_shape(dims, axis)
// .swizzled_bytes() bytes, one padded matrix per (b, h), b outer. quantize_mxfp8 writes them.
// Which axis each is blocked along is cuDNN's choice: the axis its matrix product reduces over.
// Pointers are on the device, 16-byte aligned; every one is required for an MXFP8 spec and refused
// for any other. The per-tensor scales (fusedattn/fp8_scales.h) are refused for an MXFP8 spec.
//
// O and the gradients are 16-bit (the spec's o dtype): cuDNN writes them with plain matrix products
// and no scale, so the amaxes here are for the caller's next quantization, not for a scale of ours.
#pragma once

#include <cstdint>

namespace fusedattn {

/// The forward reads FP8 q, k and v (ForwardTensors) with their block scales.
struct Mxfp8ForwardTensors {
  const std::uint8_t* sf_q = nullptr;  ///< Q's, blocked along d (kDim)
  const std::uint8_t* sf_k = nullptr;  ///< K's, blocked along d (kDim)
  /// V's, blocked along s (kSeq): S V reduces over the keys, so the forward's V is quantized along
  /// s, unlike the backward's.
  const std::uint8_t* sf_v = nullptr;
  float* amax_o = nullptr;  ///< max |O|, float32
};

/// The backward needs each FP8 operand blocked along the axis each of its products reduces over,
/// so Q, K and dO come twice. BackwardTensors::q, ::k and ::v are FP8 blocked along d (so the
/// backward's v is another quantization of V than the forward's); BackwardTensors::o and ::d_o are
/// the 16-bit O and dO (the spec's o dtype), which cuDNN reads unquantized for the rows' dO . O.
/// The copies below have their originals' dims and strides (q_t is laid out as spec.q, k_t as
/// spec.k, d_o and d_o_t as spec.o) in q's FP8 dtype.
struct Mxfp8BackwardTensors {
  const void* q_t = nullptr;    ///< Q blocked along s (for dK = dS^T Q)
  const void* k_t = nullptr;    ///< K blocked along s (for dQ = dS K)
  const void* d_o = nullptr;    ///< dO in FP8, blocked along d (for dP = dO V^T)
  const void* d_o_t = nullptr;  ///< dO in FP8, blocked along s (for dV = P^T dO)
  const std::uint8_t* sf_q = nullptr;      ///< q's scales, blocked along d
  const std::uint8_t* sf_q_t = nullptr;    ///< q_t's, blocked along s
  const std::uint8_t* sf_k = nullptr;      ///< k's, blocked along d
  const std::uint8_t* sf_k_t = nullptr;    ///< k_t's, blocked along s
  const std::uint8_t* sf_v = nullptr;      ///< BackwardTensors::v's, blocked along d
  const std::uint8_t* sf_d_o = nullptr;    ///< d_o's, blocked along d
  const std::uint8_t* sf_d_o_t = nullptr;  ///< d_o_t's, blocked along s
  float* amax_d_q = nullptr;  ///< max |dQ|, float32
  float* amax_d_k = nullptr;
  float* amax_d_v = nullptr;
};

}  // namespace fusedattn
