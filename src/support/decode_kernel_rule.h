// Internal: when a decode runs on fusedattn's own kernel (exec/decode_kernel.h) instead of cuDNN's,
// and how the kernel is cut. Pure functions of the spec and the GPU, tested on the CPU.
//
// The kernel takes few query tokens a sequence (1 to 16), folds the g query heads that share a K/V
// head into the rows of one block (so each K/V element is read once per group), and splits each
// sequence's keys into chunks, one block per (chunk, K/V head, sequence), so that every SM
// streams. Each chunk writes a partial O and log-sum-exp that the library's one merge
// (exec/decode_merge.h) combines, or, where decode_cluster_merge says so, keeps them in shared memory
// for its cluster to merge inside the kernel; a call cut into one chunk writes O itself. It is the only path
// for FP8 (E4M3) K/V caches beside 16-bit queries.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fusedattn/score_mod.h"
#include "fusedattn/spec.h"
#include "fusedattn/support.h"

// The two sizes below are the kernel's too: compiled for the device where CUDA compiles them.
#ifdef __CUDACC__
#define FUSEDATTN_DECODE_SIZE __host__ __device__ constexpr
#else
#define FUSEDATTN_DECODE_SIZE constexpr
#endif

namespace fusedattn::detail {

/// Keys of one pipeline stage: a tile of K and one of V, 64 rows each.
constexpr std::int64_t kDecodeTileKeys = 64;
/// The most query tokens a sequence, and query rows a block (s_q * g, in tiles of 16 rows, up to 8
/// tiles of 8 warps): speculative decoding's 2 .. 16 tokens at a GQA group of up to 8.
constexpr std::int64_t kDecodeKernelMaxQueries = 16;
constexpr std::int64_t kDecodeKernelMaxRows = 128;

/// The most chunks a call merges inside the kernel (SM 9.0 and newer): the blocks of one (K/V head,
/// sequence) form a thread block cluster (8 blocks, the portable size), and after their keys each
/// block reads its share of the rows' partials from its peers' shared memory and writes O: no
/// partials in global memory and no second kernel. decode_cluster_merge says when.
constexpr std::int64_t kDecodeKernelClusterChunks = 8;

/// Pipeline stages in shared memory: 3 tiles of 16-bit K and V (2 in flight while one is used:
/// 64 KB at d = 128), 4 of FP8 ones (3 in flight, 48 KB; a 16-bit copy of the tile in use is made
/// for the tensor cores).
FUSEDATTN_DECODE_SIZE int decode_kernel_stages(std::int64_t kv_bytes) { return kv_bytes == 1 ? 4 : 3; }

/// The kernel's dynamic shared memory: the pipeline's stages (K and V tiles of 64 keys, plus the
/// 16-bit copies of FP8 tiles), or, at the end, each warp's O rows (16 rows of d + 8 floats: 8
/// floats of padding keep a half-warp's 8-byte stores on distinct banks), each row's max and sum, and
/// each row's log-sum-exp for a merge in the kernel, whichever is larger. The kernel lays it out from
/// the same numbers.
FUSEDATTN_DECODE_SIZE std::int64_t decode_kernel_shared_bytes(std::int64_t d, std::int64_t kv_bytes, std::int64_t warps) {
  const std::int64_t tile = kDecodeTileKeys * d;
  const std::int64_t pipeline = decode_kernel_stages(kv_bytes) * 2 * tile * kv_bytes + (kv_bytes == 1 ? 2 * tile * 2 : 0);
  const std::int64_t rows = warps * 16 * (d + 8) * 4 + warps * 16 * 3 * 4;
  return pipeline > rows ? pipeline : rows;
}

/// A paged call's page-table entries in shared memory, K's and V's, each chunk's read once when its
/// block starts (int32 each): a tile's copies then find their pages there, and no load of the table
/// stands between one tile's copies and the next. A chunk spans at most chunk_keys / page_size + 1
/// pages; paged chunks are cut to fit kDecodeKernelMaxChunkPages (8 KB of entries: two blocks of
/// 16-bit tiles at d = 128 still share an SM).
constexpr std::int64_t kDecodeKernelMaxChunkPages = 1024;
FUSEDATTN_DECODE_SIZE std::int64_t decode_kernel_chunk_pages(std::int64_t chunk_keys, std::int64_t page_size) {
  return (chunk_keys + page_size - 1) / page_size + 1;
}

/// The GPU as the rule sees it: its SM version and its SM count.
struct DecodeDevice {
  DeviceCaps caps;
  int multiprocessors = 132;
};

/// How the kernel runs a spec it takes.
struct DecodeKernelShape {
  int row_tiles = 1;   ///< tiles of 16 query rows (s_q * g rows), rounded up to 1, 2, 4 or 8
  /// 8 rows or fewer: the keys are the tensor-core products' M and the rows their N (8), which halves
  /// the products of the 16-row layout, mostly padding at a decode step's GQA group
  bool keys_as_m = false;
  int key_groups = 4;  ///< warps sharing a row tile, each taking 64 / key_groups keys of every tile
  int threads = 128;   ///< 32 * row_tiles * key_groups
  std::int64_t shared_bytes = 0;  ///< decode_kernel_shared_bytes, plus a paged call's page slots
  std::int64_t page_slots = 0;    ///< a paged call's entries of K's (and of V's) table a block keeps
  int blocks_per_sm = 1;
  std::int64_t chunks = 1;      ///< chunks of every sequence's keys; 1: the kernel writes O itself
  std::int64_t chunk_keys = 0;  ///< keys of a chunk, a multiple of kDecodeTileKeys
  /// The chunks merged inside the kernel, one cluster of blocks a (K/V head, sequence)
  /// (decode_cluster_merge); otherwise, with several chunks, by the merge kernel.
  bool cluster_merge = false;
  bool merged() const noexcept { return chunks > 1; }
};

/// A softcap, cap * tanh(score / cap) of the scaled score (Gemma 2's attention softcap), the one
/// score modifier the kernel applies: its cap is runtime scalar `scalar_slot`, or `constant` where
/// the slot is -1 (beside a bias the adapters write a modifier's numbers into its text).
struct DecodeSoftcap {
  int scalar_slot = -1;
  double constant = 0.0;
};

/// The softcap `mod` is: mul(c, tanh(div(score, c))) or mul(tanh(div(score, c)), c), with c the
/// same scalar slot or the same constant both times; nothing for any other modifier.
std::optional<DecodeSoftcap> decode_softcap(const ScoreMod& mod);

/// Why the kernel does not take `spec` (empty: it does). It takes a forward of 1 to 16 queries a
/// sequence (s_q * h_q / h_kv <= 128 rows) over paged (page sizes multiples of 16) or contiguous
/// K/V, dense q and o, d_qk = d_v of 64, 128 or 256, f16 or bf16 q with K/V in q's dtype or E4M3, any
/// window and alignment, padding or none, a softcap or no score modifier, a bias of any broadcast
/// shape (added after the softcap: a transformers decode step's padding mask) or none, any softmax (a
/// sink's or off-by-one's term added once to each row's denominator); no ALiBi, dropout or max logit;
/// rows of 16 bytes (q and o strides multiples of 8 elements, K/V ones of 16 bytes); an SM 8.0 or
/// newer GPU with room for its shared memory.
std::vector<Reason> decode_kernel_refusals(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps);

/// The rows of one block (s_q times the GQA group) and the bytes of one K/V element.
inline std::int64_t decode_kernel_rows(const AttentionSpec& spec) {
  return spec.seq_q() * (spec.heads_q() / spec.heads_kv());
}
inline std::int64_t decode_kv_bytes(const AttentionSpec& spec) {
  return static_cast<std::int64_t>(size_of(spec.k.dtype));
}

/// The kernel's shape before any cut: its row tiles, warps, shared memory and blocks an SM
/// (decode_kernel_cut.cpp, as the rest of the cut); the most shared memory a block may ask for.
DecodeKernelShape decode_kernel_rows_shape(const AttentionSpec& spec, const DeviceCaps& caps);
std::int64_t decode_kernel_shared_limit(const DeviceCaps& caps);

/// Whether the chunks of `shape` (cut for the merge kernel) are merged inside the kernel instead: on
/// SM 9.0 and newer, 2 to kDecodeKernelClusterChunks chunks of at most 2 row tiles, and the call's
/// blocks at most half the GPU's SMs. A cluster's blocks must share one GPC (a group of 16 to 18 SMs
/// on an H100), and the scheduler packs them there: a call that fills the GPU's slots spills clusters
/// into a second wave, and one of a block an SM ran slower called eagerly (the next call launched
/// early beside the last) than its merge kernel saved in CUDA graphs. Measured on an H100
/// (results/bench-decode.md; decode_kernel_cut.cpp has the numbers).
bool decode_cluster_merge(const AttentionSpec& spec, const DecodeKernelShape& shape, const DecodeDevice& device);

/// The shape and cut that decode_kernel_expected_us finds fastest, for a spec the kernel takes.
DecodeKernelShape decode_kernel_shape(const AttentionSpec& spec, const DecodeDevice& device);

/// `spec` cut into `chunks` chunks (fewer where the tiles run out), merged as decode_cluster_merge
/// says: the cut FUSEDATTN_DECODE_CHUNKS forces (exec/decode_kernel.h), for measuring the cuts that
/// decode_kernel_shape ranks. Nothing where the chunks' pages or the block's shared memory do not fit.
std::optional<DecodeKernelShape> decode_kernel_cut(const AttentionSpec& spec, const DecodeDevice& device,
                                                   std::int64_t chunks);

/// Expected microseconds of the kernel's call cut into `chunks` (decode_kernel_shape's cost model,
/// which ranks the cuts of one spec; decode_kernel_cut.cpp has the measured cuts it is fitted to),
/// from the spec's longest sequences (s_kv keys every one).
double decode_kernel_expected_us(const AttentionSpec& spec, const DecodeKernelShape& shape, const DecodeDevice& device);

/// The fewest keys of a contiguous cache that the kernel runs by default in a call that writes the
/// statistics (for a backward): the shortest measured where it beat cuDNN's call
/// (decode_kernel_rule.cpp has the numbers).
constexpr std::int64_t kDecodeKernelContiguousMinKeys = 2048;

/// A paged call of 8 rows or fewer (s_q * g, the keys as M) runs on the kernel by default; one of 9 to
/// 16 rows (one row tile) over at most kDecodeKernelPagedMostKeys keys a sequence, whatever the batch,
/// or with at most kDecodeKernelPagedMostPairs (sequence, K/V head) pairs over any length: where it
/// beat cuDNN's split decode (decode_kernel_rule.cpp has the numbers).
constexpr std::int64_t kDecodeKernelPagedMostKeys = 8192;
constexpr std::int64_t kDecodeKernelPagedMostPairs = 8;

/// Whether the kernel is the only path for `spec`, FUSEDATTN_DECODE_KERNEL=0 or not: an FP8 K/V
/// cache (cuDNN takes none), a score modifier (a softcap; see decode_score_mod_rule), a sink or
/// off-by-one softmax over a paged cache or on one query row (decode_kernel_rule.cpp says why), a
/// page size that is not a power of two (decode_page_size_rule).
bool decode_kernel_only(const AttentionSpec& spec);

/// Whether the kernel runs `spec` by default: it takes it, and it is an FP8 K/V cache or has a
/// score modifier (a softcap: the only path for either, see decode_score_mod_rule), or a
/// contiguous cache that is inference (no statistics: no plan to build for each new
/// length of a cache that grows a token a step) or of kDecodeKernelContiguousMinKeys keys or more,
/// where it was measured faster than cuDNN's path, or a paged cache of 8 rows or fewer, or of one row
/// tile over at most kDecodeKernelPagedMostKeys keys or of at most kDecodeKernelPagedMostPairs
/// (sequence, K/V head) pairs, where it was too; other paged caches stay with cuDNN's split decode, except with a sink
/// or off-by-one, which that split cannot cut.
/// FUSEDATTN_DECODE_KERNEL forces either way (exec/decode_kernel.h).
bool decode_kernel_preferred(const AttentionSpec& spec, Pass pass, const DecodeDevice& device);

/// The support policy's rule for FP8 K/V caches: every reason the kernel does not take the spec,
/// each saying that such a cache runs only there.
void fp8_kv_cache_rule(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, std::vector<Reason>& out);

/// The support policy's rule for a score modifier on one query row with runtime lengths, which
/// cuDNN's path gets wrong: refused where the kernel does not take the call (a softcap it takes
/// runs there only). Measured on the H200 with cuDNN 9.19 (DecodeKernel.Softcaps forced onto
/// cuDNN): a softcapped decode over 3000 keys came back 0.94 off in relative L2.
void decode_score_mod_rule(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, std::vector<Reason>& out);

/// The support policy's rule for a sink or off-by-one softmax on one query row, which cuDNN refuses
/// ("decode only mode"): refused where the kernel does not take the call, with the kernel's reasons.
void decode_extra_term_rule(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, std::vector<Reason>& out);

/// The support policy's rule for a paged cache whose page size is not a power of two, which cuDNN's
/// paged attention refuses ("block size needs to be non-zero and a power of 2", cuDNN 9.19 on an
/// H100): refused where the kernel does not take the call, with the kernel's reasons.
void decode_page_size_rule(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, std::vector<Reason>& out);

/// "fusedattn decode kernel, 32 chunks of 256 keys merged" (by the merge kernel; "... merged in the
/// kernel" by a cluster; Support::kernel).
std::string decode_kernel_description(const DecodeKernelShape& shape);

}  // namespace fusedattn::detail
