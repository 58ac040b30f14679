// Internal: fusedattn's decode kernel (decode_kernel.h says what a call computes, and
// support/decode_kernel_rule.h when it runs). One block per (chunk of keys, K/V head, sequence):
// its rows are the s_q * g queries of the g query heads that share the K/V head, in tiles of 16
// rows; each warp holds one row tile and 64 / kKeyGroups keys of every 64-key tile. The K and V
// tiles stream through shared memory in a pipeline of 16-byte asynchronous copies
// (decode_tile_copies.cuh; stages - 1 tiles in flight while one is used; a paged call's pages of
// the chunk read into shared memory first, so no table load waits between one tile's copies and the
// next), read back by ldmatrix from rows whose 16-byte chunks are XOR-swizzled by the row (so the 8
// rows an ldmatrix reads lie on distinct banks), into tensor-core products with float32
// accumulation and an online softmax in base 2, with the rows as the products' M
// (decode_rows_as_m.cuh) or, for 8 rows or fewer, the keys (decode_keys_as_m.cuh). FP8
// tiles are widened to f16 in shared memory first (exactly: every E4M3 value is a half), and the
// products run in f16, bfloat16 queries scaled into its range (decode_mma.cuh); their descales fold
// into the score scale (K) and the output (V). At the end the warps of a row tile merge their keys
// in shared memory and the block writes O and the log-sum-exp, or a chunk's partials for the merge
// kernel, or (cluster_merge) keeps them in its shared memory, where the cluster of the (K/V head,
// sequence)'s chunks merges them (decode_cluster_merge.cuh).
#pragma once

#include <cstdint>
#include <type_traits>

#include "exec/decode_cluster_merge.cuh"
#include "exec/decode_keys_as_m.cuh"
#include "exec/decode_launch.cuh"
#include "exec/decode_mma.cuh"
#include "exec/decode_params.h"
#include "exec/decode_rows_as_m.cuh"
#include "exec/decode_score_rows.cuh"
#include "exec/decode_tile_copies.cuh"
#include "support/decode_kernel_rule.h"

namespace fusedattn::detail::decode {

template <class T, class KV, int D, int kRowTiles, int kKeyGroups, bool kKeysAsM>
__global__ void __launch_bounds__(32 * kRowTiles * kKeyGroups) decode_kernel(const Params p) {
#ifdef FUSEDATTN_DECODE_MMA
  constexpr int kThreads = 32 * kRowTiles * kKeyGroups;
  constexpr int kTile = static_cast<int>(kDecodeTileKeys);
  constexpr int kWarpKeys = kTile / kKeyGroups;     // of every tile
  // With one row tile, each warp alone reads its keys of every tile: it copies (and widens) them
  // itself, and its pipeline needs no block barrier, so the warps drift apart and one computes while
  // another waits for memory. Warps of several row tiles share their keys: the block copies them.
  constexpr bool kOwnKeys = kRowTiles == 1;
  constexpr bool kFp8 = sizeof(KV) == 1;
  using Mma = MmaType<T, kFp8>;  // the tensor cores' type: f16 beside an FP8 cache
  // Each warp copies a slab of every tile: its own keys, or its share of the block's.
  constexpr int kSlabRows = kOwnKeys ? kWarpKeys : kTile / (kThreads / 32);
  using Copies = TileCopies<Mma, KV, D, kSlabRows>;
  constexpr int kStages = decode_kernel_stages(sizeof(KV));
  // The products' layout: the rows as M (tiles of 16), or, for 8 rows or fewer, the keys.
  static_assert(!kKeysAsM || (kOwnKeys && kWarpKeys == 16));
  using Math = std::conditional_t<kKeysAsM, KeysAsM<T, Mma, D, kWarpKeys>, RowsAsM<T, Mma, D, kWarpKeys>>;
  constexpr int kRawBytes = Copies::kRawBytes, kWideBytes = Copies::kWideBytes;
  extern __shared__ __align__(128) unsigned char shared[];
  unsigned char* const stages = shared;                          // [kStages][K, V][kRawBytes]
  unsigned char* const wide = shared + kStages * 2 * kRawBytes;  // FP8: [K, V][kWideBytes]
  // A paged call's pages of this chunk, K's then V's, past what the pipeline and the closing merge use.
  int* const page_k = reinterpret_cast<int*>(shared + decode_kernel_shared_bytes(D, sizeof(KV), kThreads / 32));
  int* const page_v = page_k + p.page_slots;

  const int chunk = blockIdx.x, kv = blockIdx.y, i = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_tile = warp / kKeyGroups, key_group = warp % kKeyGroups;
  wait_for_the_previous_kernel();

  // A paged call's pages of the tiles from key `from` on, `keys` of them, read once into shared
  // memory (the slots after the last table entry repeat it: the keys there are past the sequence,
  // never loaded).
  const bool paged = p.table_k != nullptr;
  auto read_pages = [&](int from, int keys) {
    const long long table_row = static_cast<long long>(i) * p.pages;
    const int first_page = from / p.page_size, spanned = (from + keys - 1) / p.page_size - first_page + 1;
    for (int slot = threadIdx.x; slot < spanned; slot += kThreads) {
      const int page = min(first_page + slot, p.pages - 1);
      page_k[slot] = p.table_k[table_row + page];
      page_v[slot] = p.table_v[table_row + page];
    }
  };
  // Without a left window the chunk's tiles start at its first key whatever the lengths say, so its
  // pages are read beside the lengths rather than after them (one round trip to memory fewer before
  // the first copies); a window's first tile waits for the lengths.
  const int begin = chunk * p.chunk_keys;
  const bool tiles_from_begin = p.window_left < 0;
  if (paged && tiles_from_begin) read_pages(begin, p.chunk_keys);

  // This sequence's lengths.
  const int q_len = p.len_q ? min(max(p.len_q[i], 0), p.s_q) : p.s_q;
  const int kv_len = p.len_kv ? min(max(p.len_kv[i], 0), p.s_kv) : p.s_kv;
  const int rows = p.s_q * p.group, shift = p.bottom_right ? kv_len - q_len : 0;
  // The chunk's keys that some row sees (the first row sees the lowest, the last the highest),
  // in whole tiles from a multiple of 64.
  const int end = min(begin + p.chunk_keys, kv_len);
  const int first = q_len > 0 ? max(begin, first_seen_key(p, 0, shift)) : begin;
  const int last = q_len > 0 ? min(end, end_of_seen_keys(p, q_len - 1, shift, kv_len)) : begin;
  const int tile0 = first / kTile * kTile, tiles = last > first ? (last - tile0 + kTile - 1) / kTile : 0;
  const long long entry = static_cast<long long>(i) * p.chunks + chunk;
  if (p.o_part != nullptr && tiles == 0) {  // a chunk no row sees: weight 0 in the merge
    for (int r = threadIdx.x; r < rows; r += kThreads) p.stats_part[(entry * p.h_kv + kv) * rows + r] = -INFINITY;
    let_the_next_kernel_launch();
    return;
  }

  const int first_page = paged ? tile0 / p.page_size : 0;  // tile0 is begin where tiles_from_begin
  if (paged && !tiles_from_begin && tiles > 0) read_pages(tile0, tiles * kTile);
  const Copies copies(p, i, kv, tile0, kv_len, first_page, page_k, page_v,
                      kOwnKeys ? key_group * kWarpKeys : warp * kSlabRows, lane);
  auto sync_copiers = [] {  // the copies of the group that reads them are visible to all of it
    if constexpr (kOwnKeys) {
      __syncwarp();
    } else {
      __syncthreads();
    }
  };
  auto issue = [&](int n) {
    unsigned char* const k_stage = stages + (n % kStages) * 2 * kRawBytes;
    copies.issue(n, k_stage, k_stage + kRawBytes);
  };

  // The queries (loads independent of the pages'), then the first copies once the pages are in.
  float scale = p.scale_log2, out_scale = 1.0f;
  if constexpr (kFp8) {
    scale *= p.descale_k[kv * p.descale_step];
    out_scale = p.descale_v[kv * p.descale_step];
  }
  Math math(p, i, kv, row_tile * 16, rows, q_len, kv_len, shift, scale, lane);
  if (paged) __syncthreads();  // the chunk's pages are in shared memory
#pragma unroll
  for (int n = 0; n < kStages - 1; ++n) {
    if (n < tiles) issue(n);
    commit_copies();
  }

  for (int n = 0; n < tiles; ++n) {
    wait_copies<kStages - 2>();  // tile n has landed (this thread's copies)
    sync_copiers();              // the group's; and its rows of tile n - 1's stage are free
    if (n + kStages - 1 < tiles) issue(n + kStages - 1);
    commit_copies();
    const unsigned char* k_tile = stages + (n % kStages) * 2 * kRawBytes;
    const unsigned char* v_tile = k_tile + kRawBytes;
    if constexpr (kFp8) {
      copies.widen(k_tile, v_tile, wide, wide + kWideBytes);
      sync_copiers();
      k_tile = wide;
      v_tile = wide + kWideBytes;
    }
    const int warp_row0 = key_group * kWarpKeys, key_base = tile0 + n * kTile + warp_row0;
    math.tile(k_tile, v_tile, warp_row0, key_base);
  }
  let_the_next_kernel_launch();

  // The warps of a row tile merge their keys: each writes its O rows, max and sum to shared memory.
  wait_copies<0>();
  __syncthreads();  // the tiles' memory takes the rows now
  constexpr int kPitch = D + 8;
  float* const o_rows = reinterpret_cast<float*>(shared);                        // [warps][16][kPitch]
  float* const maxima = o_rows + kRowTiles * kKeyGroups * 16 * kPitch;           // [warps][16][max, sum]
  float* const row_lse = maxima + kRowTiles * kKeyGroups * 16 * 2;              // [rows] (cluster_merge)
  math.store(o_rows + warp * 16 * kPitch, maxima + warp * 16 * 2, kPitch);
  __syncthreads();
  constexpr int kColumns = D / 4;  // 4 columns a thread at a time
  for (int n = threadIdx.x; n < kRowTiles * 16 * kColumns; n += kThreads) {
    const int row = n / kColumns, column = n % kColumns * 4, tile = row / 16, in_tile = row % 16;
    if (row >= rows) break;  // rows only grow with n
    const int t = row / p.group, head = kv * p.group + row % p.group;
    // The softmax's extra logit joins the row's own denominator here; a chunk's partials leave it to
    // the merge, which adds it once.
    const bool partial = p.o_part != nullptr || p.cluster_merge;
    const float extra = partial ? -INFINITY : extra_logit(p, head) * kLog2e;
    float top = extra;
#pragma unroll
    for (int g = 0; g < kKeyGroups; ++g) top = fmaxf(top, maxima[2 * ((tile * kKeyGroups + g) * 16 + in_tile)]);
    const float base = top == -INFINITY ? 0.0f : top;
    float sum = 0.0f;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int g = 0; g < kKeyGroups; ++g) {
      const int r = (tile * kKeyGroups + g) * 16 + in_tile;
      const float w = exp2_approx(maxima[2 * r] - base);
      sum += w * maxima[2 * r + 1];
      const float4 part = *reinterpret_cast<const float4*>(o_rows + r * kPitch + column);
      o.x += w * part.x;
      o.y += w * part.y;
      o.z += w * part.z;
      o.w += w * part.w;
    }
    if (extra > -INFINITY) sum += exp2_approx(extra - base);
    const bool seen = t < q_len && sum > 0.0f;
    const float f = seen ? out_scale / sum : 0.0f;
    o = seen ? make_float4(o.x * f, o.y * f, o.z * f, o.w * f) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float lse = seen ? top * 0.69314718f + __logf(sum) : -INFINITY;  // natural: top is in base 2
    if (p.cluster_merge) {  // in place of the row's first key group's columns: only this thread reads them
      *reinterpret_cast<float4*>(o_rows + (tile * kKeyGroups * 16 + in_tile) * kPitch + column) = o;
      if (column == 0) row_lse[row] = lse;
    } else if (p.o_part != nullptr) {
      *reinterpret_cast<float4*>(p.o_part + ((entry * rows + row) * p.h_kv + kv) * D + column) = o;
      if (column == 0) p.stats_part[(entry * p.h_kv + kv) * rows + row] = lse;
    } else {
      T* out = static_cast<T*>(p.o) + i * p.o_stride[0] + head * p.o_stride[1] + static_cast<long long>(t) * p.o_stride[2];
      *reinterpret_cast<uint2*>(out + column) = make_uint2(pack<T>(o.x, o.y), pack<T>(o.z, o.w));
      if (column == 0 && p.stats != nullptr) {
        p.stats[(static_cast<long long>(i) * p.h_kv * p.group + head) * p.s_q + t] = lse;
      }
    }
  }
  if (p.cluster_merge) {
    merge_in_cluster<T, D, kThreads>(p, o_rows, kKeyGroups * 16 * kPitch, kPitch, row_lse, rows, q_len, kv, i);
  }
#endif
}

}  // namespace fusedattn::detail::decode
