// fusedattn/layout.h — layout names users know (bshd, sbhd, bs3hd, ...) turned into strides.
//
// Layout names exist only at the edge: the core sees TensorDesc strides. A packed layout puts
// several tensors in one buffer; `LayoutTensors` then says where each starts in that buffer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fusedattn/tensor.h"

namespace fusedattn {

/// Memory layouts of Q, K and V (and O, which follows Q's format, unpacked, with d_v).
/// Letters name the memory order from slowest to fastest: b batch, s sequence, h heads, d head dim;
/// "3" packs Q, K and V in one buffer, "2" packs K and V. "t" is the token axis of a ragged
/// (variable-length) batch: sequences stored one after another, each starting where its
/// cumulative offset says (attention.h, RaggedTensors), so the batch has no stride of its own.
enum class Layout {
  bshd, sbhd, bhsd,                                // separate Q, K, V
  bs3hd, bsh3d, sb3hd, sbh3d,                      // Q, K and V packed together
  bshd_bs2hd, bshd_bsh2d, sbhd_sb2hd, sbhd_sbh2d,  // Q separate, K and V packed
  thd_thd_thd, t3hd, th3d, thd_t2hd, thd_th2d,     // ragged: the same, token after token
  sbhd_bshd_bshd, bshd_sbhd_sbhd,                  // mixed: Q (and O) in one format, K and V in another
  thd_bshd_bshd, thd_sbhd_sbhd,                    // mixed: ragged Q, dense K and V
  bshd_paged_bshd, bshd_paged_sbhd, sbhd_paged_bshd, sbhd_paged_sbhd,  // Q, and a paged K/V cache whose
  thd_paged_bshd, thd_paged_sbhd,                  // pages are laid out as bshd / sbhd (see paged_kv())
};

/// Every layout, in declaration order.
const std::vector<Layout>& all_layouts();
const char* to_string(Layout layout) noexcept;
/// Throws InvalidArgument naming `field` and listing the known names.
Layout parse_layout(const std::string& text, const std::string& field);

/// Problem sizes that, with a layout, fix every stride.
struct ProblemShape {
  DType dtype = DType::bf16;
  std::int64_t batch = 1;
  std::int64_t seq_q = 1, seq_kv = 1;
  std::int64_t heads_q = 1, heads_kv = 1;
  std::int64_t head_dim_qk = 64, head_dim_v = 64;
  /// Paged layouts only: tokens per page (seq_kv must be a multiple) and pages in the pool.
  std::int64_t page_size = 0, pages = 0;
};

/// Descriptors of Q, K, V and O in one layout, and each tensor's first element as an element
/// offset into its buffer (non-zero only for K and V in packed layouts). A ragged buffer's size
/// is that of b full sequences of s tokens, the most a call of these sizes can hold.
struct LayoutTensors {
  TensorDesc q, k, v, o;
  std::int64_t q_offset = 0, k_offset = 0, v_offset = 0;
  /// Elements each buffer needs: Q's (the QKV buffer when packed), K's (the KV buffer), V's, O's.
  std::int64_t q_buffer = 0, k_buffer = 0, v_buffer = 0, o_buffer = 0;
};

/// True when Q, K and V share one buffer / K and V share one buffer.
bool packs_qkv(Layout layout) noexcept;
bool packs_kv(Layout layout) noexcept;
/// True when Q (and O) / K and V are ragged: token-major, placed by runtime offsets, with a batch
/// stride of 0 in their descriptors.
bool ragged_q(Layout layout) noexcept;
bool ragged_kv(Layout layout) noexcept;
/// True when K and V are paged caches: each is a pool of pages [pages, h_kv, page_size, d] laid
/// out like one batch of the named format (a page where bshd has a batch entry), and each
/// sequence's pages are found through a page table at run time (attention.h).
bool paged_kv(Layout layout) noexcept;

/// Descriptors for `shape` in `layout`. Packed layouts need the sizes they pack to agree
/// (QKV: s_q == s_kv, h_q == h_kv, d_qk == d_v; KV: d_qk == d_v); otherwise InvalidArgument.
LayoutTensors make_layout(Layout layout, const ProblemShape& shape);

/// Checks that `desc` has exactly the strides `layout` gives its dims for `tensor` ("q", "k",
/// "v" or "o"); throws InvalidArgument naming the tensor's strides otherwise.
void check_layout_strides(Layout layout, const std::string& tensor, const TensorDesc& desc);

}  // namespace fusedattn
