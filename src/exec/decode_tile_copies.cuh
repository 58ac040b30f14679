// Internal: how fusedattn's decode kernel (decode_kernel_body.cuh) moves each 64-key tile of K and V
// into shared memory, and widens an FP8 tile for the tensor cores.
//
// A group of kCopiers threads (the block, or one warp that alone reads its rows of every tile) copies
// kRows rows of each tile from a first row on: each thread one 16-byte column of every kRowStep-th
// row (a warp covers whole rows). A thread's addresses are worked out once a tile and stepped from
// copy to copy: worked out for every copy, with the paged and contiguous cases and the page's shift
// or division chosen per copy, the copies took about 60 instructions each, as many as the tile's
// tensor-core products and online softmax together (sm_90 SASS of the d = 128 instance), on an SM
// whose 4 warps have no other warps to hide their latency behind.
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
template <class T, class KV, int D, int kCopiers, int kRows>
class TileCopies {
 public:
  static constexpr bool kFp8 = sizeof(KV) == 1;
  static constexpr int kTile = static_cast<int>(kDecodeTileKeys);
  static constexpr int kRawBytes = kTile * D * static_cast<int>(sizeof(KV));  // a K or V tile as stored
  static constexpr int kWideBytes = kTile * D * 2;                             // as 16-bit rows
  static constexpr int kChunks = D * 2 / 16;                                   // 16-byte chunks of a 16-bit row
  static constexpr int kRawChunks = D * static_cast<int>(sizeof(KV)) / 16;     // of a stored row
  static constexpr int kRowStep = kCopiers / kRawChunks;                       // rows between a thread's copies
  static constexpr int kCopies = kRows / kRowStep;                             // a thread's copies of a tile
  static_assert(kCopiers % kRawChunks == 0 && kRows % kRowStep == 0 && kCopies >= 1 && kRows <= kTile);
  static_assert(kChunks >= 8, "the swizzle spreads 8 rows over 8 chunks");

  // Sequence i's K/V head kv, its tiles from key tile0, its keys below kv_len; a paged call's pages
  // from first_page on in page_k and page_v (shared memory, filled before the first issue). This
  // thread is copier `copier` of the group that copies rows first_row .. first_row + kRows - 1.
  __device__ TileCopies(const Params& p, int i, int kv, int tile0, int kv_len, int first_page, const int* page_k,
                        const int* page_v, int first_row, int copier)
      : p_(p),
        k_head_(static_cast<const KV*>(p.k) + kv * p.k_stride[1]),
        v_head_(static_cast<const KV*>(p.v) + kv * p.v_stride[1]),
        page_k_(page_k),
        page_v_(page_v),
        tile0_(tile0),
        kv_len_(kv_len),
        first_page_(first_page),
        row0_(first_row + copier / kRawChunks),
        column_(copier % kRawChunks),
        paged_(p.table_k != nullptr),
        // Tiles start at multiples of 64: a tile lies in one page of a multiple of 64 keys, and a
        // page of 16 or 32 keys (tile0 a multiple of it, first_page its page) starts at the same row
        // of every tile.
        tile_in_one_page_(p.table_k != nullptr && p.page_size % kTile == 0),
        // Those small pages take 32-bit strides, where they fit (a pool's page of under 2^31 elements).
        small_pages_(p.table_k != nullptr && p.page_shift >= 0 && p.page_size < kTile && fits_int(p.k_stride[0]) &&
                     fits_int(p.v_stride[0]) && fits_int(p.k_stride[2] * kTile) && fits_int(p.v_stride[2] * kTile)),
        k_page_(static_cast<int>(p.k_stride[0])),
        v_page_(static_cast<int>(p.v_stride[0])),
        k_row_(static_cast<int>(p.k_stride[2])),
        v_row_(static_cast<int>(p.v_stride[2])),
        k_sequence_(static_cast<long long>(i) * p.k_stride[0]),
        v_sequence_(static_cast<long long>(i) * p.v_stride[0]),
        k_step_(static_cast<long long>(kRowStep) * p.k_stride[2]),
        v_step_(static_cast<long long>(kRowStep) * p.v_stride[2]) {}

  // Tile n's K and V into their stages: zeros past the sequence (its scores are masked, but 0 * NaN
  // would not be). 16-bit rows swizzled for ldmatrix; FP8 rows as they are, for widen.
  __device__ __forceinline__ void issue(int n, unsigned char* k_stage, unsigned char* v_stage) const {
    const int key0 = tile0_ + n * kTile + row0_;  // this thread's first row's key
    if (small_pages_) {  // pages of 16 or 32 keys: a row's page slot and place in it repeat every tile
      const int slot0 = n * (kTile >> p_.page_shift);
#pragma unroll
      for (int u = 0; u < kCopies; ++u) {
        const int row = row0_ + u * kRowStep, slot = slot0 + (row >> p_.page_shift);
        const int in_page = row & (p_.page_size - 1);
        const long long k_at = static_cast<long long>(page_k_[slot]) * k_page_ + in_page * k_row_;
        const long long v_at = static_cast<long long>(page_v_[slot]) * v_page_ + in_page * v_row_;
        copy(u, key0 + u * kRowStep < kv_len_, k_at, v_at, k_stage, v_stage);
      }
      return;
    }
    if (paged_ && !tile_in_one_page_) {  // page sizes of 48, 80, 96 ... keys: each copy finds its page
#pragma unroll
      for (int u = 0; u < kCopies; ++u) {
        const int key = key0 + u * kRowStep, page = key / p_.page_size, slot = page - first_page_;
        const long long in_page = key - page * p_.page_size;
        copy(u, key < kv_len_, page_k_[slot] * p_.k_stride[0] + in_page * p_.k_stride[2],
             page_v_[slot] * p_.v_stride[0] + in_page * p_.v_stride[2], k_stage, v_stage);
      }
      return;
    }
    long long k_at, v_at;  // this thread's first row, in elements from the head's start
    if (paged_) {          // the tile lies in one page
      const int page = page_of(key0), slot = page - first_page_;
      const long long in_page = key0 - page * p_.page_size;
      k_at = page_k_[slot] * p_.k_stride[0] + in_page * p_.k_stride[2];
      v_at = page_v_[slot] * p_.v_stride[0] + in_page * p_.v_stride[2];
    } else {
      k_at = k_sequence_ + key0 * p_.k_stride[2];
      v_at = v_sequence_ + key0 * p_.v_stride[2];
    }
#pragma unroll
    for (int u = 0; u < kCopies; ++u, k_at += k_step_, v_at += v_step_) {
      copy(u, key0 + u * kRowStep < kv_len_, k_at, v_at, k_stage, v_stage);
    }
  }

  // FP8: the group's rows of a stored tile widened into 16-bit swizzled rows, each thread the chunks
  // it copied.
  __device__ __forceinline__ void widen(const unsigned char* from, unsigned char* to) const {
    if constexpr (kFp8) {
#pragma unroll
      for (int u = 0; u < kCopies; ++u) {
        const int row = row0_ + u * kRowStep;
        uint4 low, high;
        e4m3_to_16bit<T>(*reinterpret_cast<const uint4*>(from + raw_offset(u)), low, high);
        *reinterpret_cast<uint4*>(to + swizzled<kChunks>(row, 2 * column_)) = low;
        *reinterpret_cast<uint4*>(to + swizzled<kChunks>(row, 2 * column_ + 1)) = high;
      }
    }
  }

 private:
  __device__ static constexpr bool fits_int(long long value) { return value >= 0 && value <= 0x7fffffff; }
  __device__ __forceinline__ int page_of(int key) const {  // a shift where the page size is a power of two
    return p_.page_shift >= 0 ? key >> p_.page_shift : key / p_.page_size;
  }
  // Where copy u of this thread lands in a stage: FP8 rows as stored, 16-bit rows swizzled.
  __device__ __forceinline__ int raw_offset(int u) const {
    return ((row0_ + u * kRowStep) * kRawChunks + column_) * 16;
  }
  __device__ __forceinline__ void copy(int u, bool valid, long long k_at, long long v_at, unsigned char* k_stage,
                                       unsigned char* v_stage) const {
    const int to = kFp8 ? raw_offset(u) : swizzled<kChunks>(row0_ + u * kRowStep, column_);
    const int element = column_ * (16 / static_cast<int>(sizeof(KV)));
    copy_16(k_stage + to, valid ? k_head_ + k_at + element : k_head_, valid);
    copy_16(v_stage + to, valid ? v_head_ + v_at + element : v_head_, valid);
  }

  const Params& p_;
  const KV* const k_head_;
  const KV* const v_head_;
  const int* const page_k_;
  const int* const page_v_;
  const int tile0_, kv_len_, first_page_, row0_, column_;
  const bool paged_, tile_in_one_page_, small_pages_;
  const int k_page_, v_page_, k_row_, v_row_;  // strides for small pages, where they fit in 32 bits
  const long long k_sequence_, v_sequence_, k_step_, v_step_;
};

}  // namespace fusedattn::detail::decode
