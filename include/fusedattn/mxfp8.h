// fusedattn/mxfp8.h — MXFP8 block scaling: E8M0 scales shared by blocks of 32 elements, their
// 128x4 swizzled layout, host references, and the device kernels that quantize 16-bit tensors.
//
// An MXFP8 tensor is FP8 data (E4M3 or E5M2) plus one E8M0 scale per 32 consecutive elements along
// one axis, the "blocked" axis: x ~ fp8_value * 2^(e - 127). Unlike per-tensor FP8 (fusedattn/fp8.h)
// the scales are data the kernels write, one byte per block, in the layout cuDNN reads.
//
// What cuDNN's frontend (1.32, .deps/cudnn_frontend/include/cudnn_frontend) says, and where:
// - MXFP8 is recognised by Descale_Q having data type FP8_E8M0 and reordering F8_128x4
//   (node/scaled_dot_product_flash_attention.h:181-193, node/sdpa_fp8_bwd.h:78-90); those enums are
//   cudnn_frontend_utils.h:337 (TensorReordering_t::F8_128x4) and :706 (DataType_t::FP8_E8M0).
//   It needs cuDNN 9.21 (scaled_dot_product_flash_attention.h:343-346, sdpa_fp8_bwd.h:358-361) and,
//   forward, a Blackwell data-center GPU, SM 10.x (scaled_dot_product_flash_attention.h:353-355).
// - Block size 32, fixed: scaled_dot_product_flash_attention.h:374-377, sdpa_fp8_bwd.h:364-369;
//   every dequantize node is built with set_block_size({1, 32}) (e.g. :787-789, :850-852, :1155-1157).
// - Forward (scaled_dot_product_flash_attention.h:419-447, :1149-1152): Q and K are blocked along d,
//   scales SF_Q [b, h_q, s_q padded, ceil(d/32) padded] and SF_K [b, h_k, s_kv padded, ceil(d/32)
//   padded], each with stride[3] == 1 (:386-390, :399-403); V is blocked along s (it is S @ V's
//   reduction axis): SF_V [b, h_v, ceil(s_kv/32) padded, d padded]. The frontend transposes K and
//   SF_K together before dequantizing (:763-797), so SF_K is given in K's own [.., s, d] order.
// - Backward (sdpa_fp8_bwd.h:434-505, graph_interface.h:4257-4312): Q, K, dO and V are blocked along
//   d (SF_dO [b, h_q, s_q padded, ceil(d_v/32) padded]; V is "ROWWISE (along-d)" here, :474-477,
//   unlike the forward), and the transposed copies Q_T, K_T, dO_T (same logical [b, h, s, d] dims,
//   used as the B operand of dS^T Q, dS K and P^T dO) are blocked along s: SF_Q_T [b, h_q,
//   ceil(s_q/32) padded, d padded], likewise SF_K_T and SF_dO_T (:444-452, :464-472, :497-505,
//   :958-966, :1063-1077, :1122-1134). O and a 16-bit dO enter unquantized, for dO . O (:665).
//   The frontend's own MXFP8 backward sample describes Q_T, K_T and dO_T with their originals'
//   dims and strides; only their scales' axis differs.
// - O and the gradients come out of plain matrix products with no output scale, so they are 16-bit:
//   HALF/BFLOAT16 outputs of the FP8 nodes need SM 10.0 or newer and cuDNN 9.13
//   (sdpa_support_surface.h:276-282, sdpa_fp8_bwd.h:345-354). On SM 10.x the MXFP8 backward is
//   always the deterministic algorithm (sdpa_fp8_bwd.h:317-342: cuDNN 9.19, no dropout).
// - The detection is all there is: scales of type E8M0 without the F8_128x4 reordering make a graph
//   that validates as per-tensor FP8 (seen in tests/graph/test_mxfp8_graph.cpp), never an error.
// - The padding: the frontend sets SF_K_T's strides to {h_k * P * 128, P * 128, ..., 1} with
//   P = ((s_kv + 127) / 128) * 4 (sdpa_fp8_bwd.h:1073-1075, and SF_Q_T at :1132-1134): the block
//   count padded to a multiple of 4, the other axis to a multiple of 128, one padded matrix per
//   (b, h), b outer. The validation only checks dims >= the unpadded counts.
// - The 128x4 interleave itself is not written anywhere in the frontend headers or in cuDNN 9.19's
//   cudnn_graph.h (:983 only names CUDNN_TENSOR_REORDERING_F8_128x4). It is the block-scaled tensor
//   core layout of Blackwell (cuBLAS's "1D block scaling factors layout", the cuDNN frontend's page
//   nvidia.github.io/cudnn-frontend/mxfp8-scale-factor-128x4-layout/, Transformer Engine's
//   nvte_swizzle_scaling_factors): see mxfp8_swizzled_offset below.
// - Scale rounding: cuDNN's own MXFP8 quantizer in these headers (the RMSNorm+SiLU engine,
//   generated/rms_norm_silu/sm100/ln_headers.h:1638-1643 and :297-315) takes amax / fp8_max,
//   clamped to FLT_MIN, rounded *up* to a power of two. fusedattn implements the OCP rule instead
//   (mxfp8_scale_bits); both give valid inputs, since dequantizing is x * 2^(e - 127) either way.
//
// So, for a [b, h, s, d] tensor blocked along one axis, each (b, h) has a scale matrix of
// rows = the other axis, blocks = ceil(blocked axis / 32); swizzled, rows are padded to 128 and
// blocks to 4 (padding bytes are 0), and the matrices follow each other, b outer, h inner.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "fusedattn/tensor.h"

namespace fusedattn {

/// Elements per MXFP8 block.
constexpr std::int64_t kMxfp8BlockSize = 32;

// --- E8M0 -----------------------------------------------------------------------------------

/// E8M0 (OCP MX): 8 exponent bits, bias 127, no sign, no mantissa, no zero. Bits 0..254 are
/// 2^(bits - 127) (0 is 2^-127, a float subnormal); 0xFF is NaN.
float e8m0_bits_to_float(std::uint8_t bits) noexcept;
/// The E8M0 at or below `value` (truncation to a power of two, exact for powers of two):
/// NaN, +infinity and negative values give 0xFF (E8M0 has no sign); values below 2^-127, zero
/// included, give 0x00 and values at or past 2^127 give 0xFE (saturation: E8M0 has no zero).
std::uint8_t float_to_e8m0_bits(float value) noexcept;

/// emax_elem of the OCP MX spec: the exponent of the largest power of two an element holds, 8 for
/// E4M3 (448 = 1.75 * 2^8) and 15 for E5M2 (57344 = 1.75 * 2^15); 0 for other types.
constexpr int mxfp8_element_emax(DType element) noexcept {
  return element == DType::e4m3 ? 8 : element == DType::e5m2 ? 15 : 0;
}

/// The scale of a block whose largest magnitude is `amax` (>= 0), as E8M0 bits: the OCP MX rule
/// (OCP Microscaling Formats v1.0, 6.3) 2^(floor(log2 amax) - emax_elem), so the block's largest
/// element lands in the element type's top binade, [2^emax, 2^(emax + 1)), and keeps every
/// mantissa bit there. Why this and not rounding amax / fp8_max up (cuDNN's own quantizer, above):
/// it is the standard, it never wastes a binade, and the price is stated rather than hidden: an
/// element whose scaled magnitude lies in (fp8_max, 2^(emax + 1)) = (448, 512) for E4M3 saturates to
/// fp8_max, a relative error of up to 1/8. Exponents below -127 (tiny blocks, and amax 0) are raised
/// to -127; a block holding a NaN or an infinity gets the NaN scale 0xFF (floor(log2 inf) is past
/// E8M0's range, and an MX block cannot hold an infinity beside finite values), so it reads back NaN.
/// `element` must be E4M3 or E5M2 (InvalidArgument otherwise).
std::uint8_t mxfp8_scale_bits(float amax, DType element);

// --- scale layout ---------------------------------------------------------------------------

/// The scales of a [b, h, s, d] tensor blocked along `blocked` (kDim or kSeq): one matrix per
/// (b, h) of `rows` (the other axis) x `blocks` (ceil(blocked axis / 32)). Plain, a matrix is
/// [rows, blocks] row-major; swizzled, it is padded to [padded_rows, padded_blocks] in the 128x4
/// layout. Either way the (b, h) matrices are contiguous, b outer.
struct Mxfp8ScaleShape {
  Axis blocked = kDim;
  std::int64_t batch = 0, heads = 0;
  std::int64_t rows = 0, blocks = 0;
  std::int64_t padded_rows = 0;    ///< rows rounded up to a multiple of 128
  std::int64_t padded_blocks = 0;  ///< blocks rounded up to a multiple of 4

  std::int64_t plain_bytes() const noexcept { return batch * heads * rows * blocks; }
  std::int64_t matrix_bytes() const noexcept { return padded_rows * padded_blocks; }
  std::int64_t swizzled_bytes() const noexcept { return batch * heads * matrix_bytes(); }
  /// The swizzled tensor's dims in the frontend's [b, h, s-axis, d-axis] order, as its validation
  /// reads them: [b, h, padded_rows, padded_blocks] blocked along d, [b, h, padded_blocks,
  /// padded_rows] blocked along s.
  std::array<std::int64_t, 4> swizzled_dims() const noexcept {
    if (blocked == kDim) return {batch, heads, padded_rows, padded_blocks};
    return {batch, heads, padded_blocks, padded_rows};
  }
};

/// The scale shape of a tensor of logical `dims` [b, h, s, d] blocked along `blocked`; throws
/// InvalidArgument unless `blocked` is kDim or kSeq and every dim is >= 0.
Mxfp8ScaleShape mxfp8_scale_shape(const std::array<std::int64_t, 4>& dims, Axis blocked);

/// Byte offset of scale (row, block) in one swizzled matrix whose blocks are padded to
/// `padded_blocks` (a multiple of 4). The matrix is cut into 512-byte tiles of 128 rows x 4 blocks,
/// stored row band by row band, and within a band block group by block group:
///   tile   = (row / 128) * (padded_blocks / 4) + block / 4,
///   offset = tile * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4 + block % 4.
/// Inside a tile, 16 consecutive bytes hold rows r, r + 32, r + 64, r + 96 (4 blocks each), which
/// is how the tensor cores read a 128-row tile's scales in one 512-byte load.
std::int64_t mxfp8_swizzled_offset(std::int64_t row, std::int64_t block, std::int64_t padded_blocks) noexcept;

// --- host references ------------------------------------------------------------------------

/// A host MXFP8 matrix: `data` row-major [rows, cols] FP8 bytes of `element`, `scales` plain
/// [rows, ceil(cols / 32)] E8M0 bytes, block j of a row covering columns 32j .. 32j + 31 (the last
/// block of a row may be short).
struct Mxfp8HostMatrix {
  std::int64_t rows = 0, cols = 0;
  DType element = DType::e4m3;
  std::vector<std::uint8_t> data;
  std::vector<std::uint8_t> scales;
};

/// Quantizes row-major float `values` [rows, cols], blocked along cols: each block's scale by
/// mxfp8_scale_bits, each element float_to_fp8_bits(x * 2^-(e - 127), element) (fusedattn/fp8.h:
/// to nearest even, saturating). What the device kernels compute, bit for bit. Throws
/// InvalidArgument on a size mismatch, negative sizes or a non-FP8 `element`.
Mxfp8HostMatrix mxfp8_quantize_host(const std::vector<float>& values, std::int64_t rows, std::int64_t cols,
                                    DType element);
/// Each element fp8_bits_to_float(data) * 2^(e - 127); NaN throughout a block with the NaN scale.
std::vector<float> mxfp8_dequantize_host(const Mxfp8HostMatrix& matrix);

/// Plain [rows, blocks] scales to one swizzled matrix of padded rows x padded blocks bytes
/// (mxfp8_swizzled_offset), padding 0; and back, ignoring the padding. Throw InvalidArgument when
/// the input's size does not match.
std::vector<std::uint8_t> mxfp8_swizzle_scales(const std::vector<std::uint8_t>& plain, std::int64_t rows,
                                               std::int64_t blocks);
std::vector<std::uint8_t> mxfp8_unswizzle_scales(const std::vector<std::uint8_t>& swizzled, std::int64_t rows,
                                                 std::int64_t blocks);

// --- device kernels (enqueued on `stream`; pointers on the device) ---------------------------

/// dst = the MXFP8 data of src blocked along `blocked` (kDim for Q, K, dO and the backward's V;
/// kSeq for the forward's V and for Q_T, K_T, dO_T), and `scales` = its swizzled scales
/// (mxfp8_scale_shape(src_desc.dims, blocked).swizzled_bytes() bytes, padding written as 0).
/// src is f16 or bf16 and dst E4M3 or E5M2, of the same dims and any strides each (an attention
/// call's Q_T, K_T and dO_T keep their originals' strides: fusedattn/mxfp8_scales.h; only the
/// axis differs). Conversions saturate as in fusedattn/fp8.h. Bit for bit what
/// mxfp8_quantize_host gives for each (b, h) matrix. Throws InvalidArgument before any GPU work for
/// other dtypes, differing dims, a ragged tensor or another axis; CudaError if the launch fails.
void quantize_mxfp8(const TensorDesc& src_desc, const void* src, const TensorDesc& dst_desc, void* dst, Axis blocked,
                    std::uint8_t* scales, cudaStream_t stream);

/// dst = src's MXFP8 values (with `scales` swizzled, blocked along `blocked`) as f16 or bf16,
/// rounded to nearest even: fp8 * 2^(e - 127). Same checks as quantize_mxfp8.
void dequantize_mxfp8(const TensorDesc& src_desc, const void* src, const std::uint8_t* scales, Axis blocked,
                      const TensorDesc& dst_desc, void* dst, cudaStream_t stream);

}  // namespace fusedattn
