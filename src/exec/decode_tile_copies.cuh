// Internal: how fusedattn's decode kernel (decode_kernel_body.cuh) moves each 64-key tile of K and V
// into shared memory, and widens an FP8 tile for the tensor cores.
//
// Each warp copies one slab of kSlabRows consecutive rows of every tile (its own 16 keys, where each
// warp alone reads its keys, or its share of the block's 64). A slab starts at a multiple of its
// size and pages hold multiples of 16 keys, so a slab lies in one page: a tile costs a warp one
// look-up of its page, whatever the page size, and each thread's rows are one row pointer stepped
// by a stride. Lane l copies 16-byte chunk l % 8 (+ 8, 16, ...) of rows l / 8 (+ 4, 8, ...) of the
// slab, so that in 16-bit rows, whose chunks are XOR-swizzled by the row's low three bits, its rows
// take two swizzles only and every copy's place is one of two registers plus a constant. (Worked out
// for every copy, with the page's shift or division and the zero fill's select per copy, the copies
// took 17 to 38 instructions each, a third of the tile's instructions, in sm_90 SASS of the d = 128
// instance, on an SM whose 4 warps have no other warps to hide their latency behind.)
#pragma once

#include "exec/decode_mma.cuh"
#include "exec/decode_params.h"
#include "support/decode_kernel_rule.h"

namespace fusedattn::detail::decode {

// Byte offset of 16-byte chunk `chunk` of `row` in a tile of 16-bit rows of `kChunks` chunks.
template <int kChunks>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return (row * kChunks + (chunk ^ (row & 7))) * 16;
}

// T: the 16-bit type an FP8 tile is widened to (the kernel's tensor-core type, f16); KV: the cache's.
template <class T, class KV, int D, int kSlabRows>
class TileCopies {
 public:
  static constexpr bool kFp8 = sizeof(KV) == 1;
  static constexpr int kTile = static_cast<int>(kDecodeTileKeys);
  static constexpr int kRawBytes = kTile * D * static_cast<int>(sizeof(KV));  // a K or V tile as stored
  static constexpr int kWideBytes = kTile * D * 2;                             // as 16-bit rows
  static constexpr int kChunks = D * 2 / 16;                                   // 16-byte chunks of a 16-bit row
  static constexpr int kRawChunks = D * static_cast<int>(sizeof(KV)) / 16;     // of a stored row
  static constexpr int kLaneChunks = kRawChunks < 8 ? kRawChunks : 8;          // lanes across a row
  static constexpr int kLaneRows = 32 / kLaneChunks;                           // rows a warp copy covers
  static constexpr int kRowCopies = kSlabRows / kLaneRows;                     // a lane's rows of a slab
  static constexpr int kChunkCopies = kRawChunks / kLaneChunks;                // its chunks of a row
  static constexpr int kElements = 16 / static_cast<int>(sizeof(KV));          // a chunk's
  static_assert(kSlabRows % kLaneRows == 0 && kRowCopies >= 1 && kTile % kSlabRows == 0 && kSlabRows % 8 == 0);
  static_assert(kChunks >= 8, "the swizzle spreads 8 rows over 8 chunks");
  static_assert(kFp8 || kLaneRows == 4, "16-bit rows: a lane's rows a, a + 4, ... take two swizzles");

  // Sequence i's K/V head kv, its tiles from key tile0, its keys below kv_len; a paged call's pages
  // from first_page on in page_k and page_v (shared memory, filled before the first issue). This
  // lane copies its share of the slab of rows slab .. slab + kSlabRows - 1 of every tile.
  __device__ TileCopies(const Params& p, int i, int kv, int tile0, int kv_len, int first_page, const int* page_k,
                        const int* page_v, int slab, int lane)
      : p_(p),
        k_head_(static_cast<const KV*>(p.k) + kv * p.k_stride[1]),
        v_head_(static_cast<const KV*>(p.v) + kv * p.v_stride[1]),
        page_k_(page_k),
        page_v_(page_v),
        slab_key0_(tile0 + slab),
        kv_len_(kv_len),
        first_page_(first_page),
        row_(lane / kLaneChunks),
        element_(lane % kLaneChunks * kElements),
        paged_(p.table_k != nullptr),
        k_sequence_(static_cast<long long>(i) * p.k_stride[0]),
        v_sequence_(static_cast<long long>(i) * p.v_stride[0]) {
    const int row = slab + row_, chunk = lane % kLaneChunks;
    if constexpr (kFp8) {  // stored rows as they are, for widen
      to_[0] = to_[1] = (row * kRawChunks + chunk) * 16;
    } else {  // rows row + 4j: row & 7 and (row & 7) ^ 4 (slab a multiple of 8, row_ below 4)
      to_[0] = swizzled<kChunks>(row, chunk);
      to_[1] = swizzled<kChunks>(row + 4, chunk) - 4 * kChunks * 16;
    }
  }

  // Tile n's K and V into their stages: zeros past the sequence (its scores are masked, but 0 * NaN
  // would not be). 16-bit rows swizzled for ldmatrix; FP8 rows as they are, for widen.
  __device__ __forceinline__ void issue(int n, unsigned char* k_stage, unsigned char* v_stage) const {
    const int key = slab_key0_ + n * kTile;  // the slab's first
    long long k_at, v_at;                    // this lane's first row, in elements from the head's start
    if (paged_) {
      const int page = p_.page_shift >= 0 ? key >> p_.page_shift : key / p_.page_size, slot = page - first_page_;
      const long long in_page = key - page * p_.page_size + row_;
      k_at = page_k_[slot] * p_.k_stride[0] + in_page * p_.k_stride[2];
      v_at = page_v_[slot] * p_.v_stride[0] + in_page * p_.v_stride[2];
    } else {
      k_at = k_sequence_ + static_cast<long long>(key + row_) * p_.k_stride[2];
      v_at = v_sequence_ + static_cast<long long>(key + row_) * p_.v_stride[2];
    }
    const KV* k_row = k_head_ + k_at + element_;
    const KV* v_row = v_head_ + v_at + element_;
    const long long k_step = kLaneRows * p_.k_stride[2], v_step = kLaneRows * p_.v_stride[2];
#pragma unroll
    for (int j = 0; j < kRowCopies; ++j, k_row += k_step, v_row += v_step) {
      const bool valid = key + row_ + kLaneRows * j < kv_len_;
      const KV* k_from = valid ? k_row : k_head_;  // a mapped address, nothing read
      const KV* v_from = valid ? v_row : v_head_;
      const int to = to_[j & 1] + j * kLaneRows * kRowBytes;
#pragma unroll
      for (int h = 0; h < kChunkCopies; ++h) {
        copy_16(k_stage + to + h * kLaneChunks * 16, k_from + h * kLaneChunks * kElements, valid);
        copy_16(v_stage + to + h * kLaneChunks * 16, v_from + h * kLaneChunks * kElements, valid);
      }
    }
  }

  // FP8: this lane's chunks of a stored K and V tile widened into 16-bit swizzled rows. The chunks
  // are read a batch of K's and V's at a time before any of them is converted, so those reads wait
  // out shared memory's latency together: read, converted and stored one after another, they made a
  // chain of a read's latency a chunk, on an SM of as few as four warps (the compiler keeps a read
  // after an earlier store to shared memory). Up to d = 128 a batch is all of this lane's chunks
  // (four of each: 8 more registers, 128 at d = 128 with the keys as M); at d = 256 one of each, as
  // before, where two spilled the 9-16-row instance further (32 bytes a thread, from 16).
  __device__ __forceinline__ void widen(const unsigned char* k_from, const unsigned char* v_from, unsigned char* k_to,
                                        unsigned char* v_to) const {
    if constexpr (kFp8) {
      constexpr int kCopies = kRowCopies * kChunkCopies, kMostBatch = D <= 128 ? 4 : 1;
      constexpr int kBatch = kCopies < kMostBatch ? kCopies : kMostBatch;
      static_assert(kCopies % kBatch == 0);
#pragma unroll
      for (int first = 0; first < kCopies; first += kBatch) {
        uint4 k_raw[kBatch], v_raw[kBatch];
#pragma unroll
        for (int c = 0; c < kBatch; ++c) {
          k_raw[c] = *reinterpret_cast<const uint4*>(k_from + raw_offset(first + c));
          v_raw[c] = *reinterpret_cast<const uint4*>(v_from + raw_offset(first + c));
        }
#pragma unroll
        for (int c = 0; c < kBatch; ++c) {
          store_wide(k_raw[c], k_to, raw_offset(first + c));
          store_wide(v_raw[c], v_to, raw_offset(first + c));
        }
      }
    }
  }

 private:
  static constexpr int kRowBytes = (kFp8 ? kRawChunks : kChunks) * 16;  // a row in a stage

  // FP8: where this lane's copy c (row copy c / kChunkCopies, chunk copy c % kChunkCopies) lies in a
  // stored tile.
  __device__ __forceinline__ int raw_offset(int c) const {
    return to_[0] + (c / kChunkCopies * kLaneRows * kRawChunks + c % kChunkCopies * kLaneChunks) * 16;
  }

  // FP8: the 16 E4M3 values of the stored chunk at `raw` as two 16-bit chunks of its swizzled row.
  __device__ __forceinline__ static void store_wide(const uint4& chunk, unsigned char* to, int raw) {
    const int row = raw / 16 / kRawChunks, column = raw / 16 % kRawChunks;
    uint4 low, high;
    e4m3_to_16bit<T>(chunk, low, high);
    *reinterpret_cast<uint4*>(to + swizzled<kChunks>(row, 2 * column)) = low;
    *reinterpret_cast<uint4*>(to + swizzled<kChunks>(row, 2 * column + 1)) = high;
  }

  const Params& p_;
  const KV* const k_head_;
  const KV* const v_head_;
  const int* const page_k_;
  const int* const page_v_;
  const int slab_key0_, kv_len_, first_page_, row_, element_;
  const bool paged_;
  const long long k_sequence_, v_sequence_;
  int to_[2];  // this lane's place in a stage of its even and odd rows (less the odd rows' 4)
};

}  // namespace fusedattn::detail::decode
