// Internal: one warp's attention over its 16 keys of every tile in fusedattn's decode kernel, with
// the keys as the tensor-core products' M and the block's query rows (8 or fewer) as their N: S^T =
// K Q^T (K's 16 keys by 16 columns of d are the A fragment, Q's 8 rows the B fragment), then O^T =
// V^T P^T (V's 16 columns of d by the 16 keys are A, the probabilities P^T B). A decode step's rows
// are its GQA group (4 or 8 heads a K/V head at one query token): of decode_rows_as_m.cuh's 16 rows 8
// to 15 are padding, here 0 to 7 of 8, so a tile takes half the products and exponentials and O half
// the registers, for a warp whose time goes to waiting on the products before it (on an H100 at
// b7777ee up to 1.2 us off a one-query decode: 14.4 against 15.6 us at b = 1 over 8k keys).
#pragma once

#include "exec/decode_mma.cuh"
#include "exec/decode_params.h"
#include "exec/decode_score_rows.cuh"
#include "exec/decode_tile_copies.cuh"

namespace fusedattn::detail::decode {

template <class T, class Mma, int D, int kWarpKeys>
class KeysAsM {
 public:
  static_assert(kWarpKeys == 16, "a warp's keys of a tile are one M of 16");
  static constexpr int kSteps = D / 16;       // k-steps of K Q^T
  static constexpr int kOutTiles = D / 16;    // m-tiles of O^T (16 columns of d each)
  static constexpr int kChunks = D * 2 / 16;  // 16-byte chunks of a 16-bit row
  static constexpr int kRowLanes = 4 | 8 | 16;  // a row's lanes: one quad position in each group

  // Rows row0 .. row0 + 7 of the block (query t of head kv * g + j is row t * g + j). This thread
  // holds Q's row row0 + gid as B fragments, and the scores and O of rows row0 + 2 quad and + 1.
  __device__ KeysAsM(const Params& p, int i, int kv, int row0, int rows, int q_len, int kv_len, int shift, float scale,
                     int lane)
      : gid_(lane / 4), quad_(lane % 4), lane_(lane), rows_(make_rows(p, i, kv, row0, rows, q_len, kv_len, shift, scale)) {
#pragma unroll
    for (int mt = 0; mt < kOutTiles; ++mt) acc_[mt][0] = acc_[mt][1] = acc_[mt][2] = acc_[mt][3] = 0.0f;
  }

  // The warp's 16 keys of one tile: warp_row0 their first row in the tile's shared memory, key_base
  // their first key.
  __device__ __forceinline__ void tile(const unsigned char* k_tile, const unsigned char* v_tile, int warp_row0,
                                       int key_base) {
    // S^T = K Q^T, even and odd k-steps in two chains up to d = 128 (as decode_rows_as_m.cuh). The
    // A matrices of k-step ks: keys 0-7 and 8-15 by d chunk 2 ks, then by 2 ks + 1.
    constexpr bool kTwoChains = D <= 128;
    const int which = lane_ >> 3;
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}, odd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      unsigned a[4];
      load_matrices<false>(a, k_tile + swizzled<kChunks>(warp_row0 + (lane_ & 7) + 8 * (which & 1), 2 * ks + (which >> 1)));
      mma<Mma>(kTwoChains && ks % 2 == 1 ? odd : s, a, q_frag_[ks][0], q_frag_[ks][1]);
    }
    // Online softmax in base 2: element e is row h = e % 2's score of key gid + 8 (e / 2).
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (kTwoChains) s[e] += odd[e];
      s[e] = rows_.logit(s[e], key_base + gid_ + 8 * (e / 2), e % 2);
      tile_max[e % 2] = fmaxf(tile_max[e % 2], s[e]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) tile_max[h] = over_row_lanes<kRowLanes>(tile_max[h], Max{});
    float base[2], alpha[2];
    softmax_step(tile_max, m_, l_, base, alpha);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[e] = exp2_approx(s[e] - base[e % 2]);
      l_[e % 2] += s[e];
    }
    // O^T rescaled where a row's max rose (as decode_rows_as_m.cuh); element e of an m-tile is row e % 2's.
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int mt = 0; mt < kOutTiles; ++mt) {
        acc_[mt][0] *= alpha[0];
        acc_[mt][1] *= alpha[1];
        acc_[mt][2] *= alpha[0];
        acc_[mt][3] *= alpha[1];
      }
    }
    // O^T += V^T P^T. The scores' C fragment, keys 0-7 and 8-15 by the rows, transposed, is P^T's B
    // fragment (keys 2 quad, + 1 and + 8, + 9 of row gid). V^T's A matrices of m-tile mt: d chunk 2 mt
    // and 2 mt + 1 by keys 0-7, then by keys 8-15, each read transposed from V's rows of keys.
    const unsigned p_low = transposed(pack<Mma>(s[0], s[1])), p_high = transposed(pack<Mma>(s[2], s[3]));
#pragma unroll
    for (int mt = 0; mt < kOutTiles; ++mt) {
      unsigned a[4];
      load_matrices<true>(a, v_tile + swizzled<kChunks>(warp_row0 + (lane_ & 7) + 8 * (which >> 1), 2 * mt + (which & 1)));
      mma<Mma>(acc_[mt], a, p_low, p_high);
    }
  }

  // The warp's rows of O (rows of `pitch` floats; 8 of its 16 row slots), and each row's max and
  // sum (base 2) in `maxima`.
  __device__ __forceinline__ void store(float* o_rows, float* maxima, int pitch) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_[h] = over_row_lanes<kRowLanes>(l_[h], Sum{});
      const int r = 2 * quad_ + h;
#pragma unroll
      for (int mt = 0; mt < kOutTiles; ++mt) {  // column gid, then gid + 8, of m-tile mt
        o_rows[r * pitch + mt * 16 + gid_] = acc_[mt][h];
        o_rows[r * pitch + mt * 16 + gid_ + 8] = acc_[mt][2 + h];
      }
      if (gid_ == 0) {
        maxima[2 * r] = m_[h];
        maxima[2 * r + 1] = l_[h];
      }
    }
  }

 private:
  // Q's B fragments (row row0 + gid, columns 2 quad (+ 8) of each k-step) and the state of the
  // thread's score rows, row0 + 2 quad and + 1, whose queries' scaling the lanes holding them give.
  __device__ ScoreRows<T> make_rows(const Params& p, int i, int kv, int row0, int rows, int q_len, int kv_len,
                                    int shift, float scale) {
    load_query_row<T, 0, 1>(p, i, kv, row0 + gid_, rows, q_len, quad_, q_frag_);
    const float unscale = query_row_in_mma_type<T, Mma, 0, 1>(q_frag_);
    const int score_rows[2] = {row0 + 2 * quad_, row0 + 2 * quad_ + 1};
    const float row_scale[2] = {scale * __shfl_sync(0xffffffffu, unscale, 4 * (2 * quad_)),
                                scale * __shfl_sync(0xffffffffu, unscale, 4 * (2 * quad_ + 1))};
    return ScoreRows<T>(p, i, kv, score_rows, rows, q_len, kv_len, shift, row_scale);
  }

  int gid_, quad_, lane_;
  unsigned q_frag_[kSteps][2];
  ScoreRows<T> rows_;
  float m_[2] = {-INFINITY, -INFINITY}, l_[2] = {0.0f, 0.0f};  // a row's max (base 2) and this thread's sum
  float acc_[kOutTiles][4];  // O^T: element e of m-tile mt is column mt * 16 + gid + 8 (e / 2) of row e % 2
};

}  // namespace fusedattn::detail::decode
