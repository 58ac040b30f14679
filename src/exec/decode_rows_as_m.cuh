// Internal: one warp's attention over its keys of every tile in fusedattn's decode kernel, with the
// block's query rows as the tensor-core products' M: a tile of 16 rows (the A fragments of Q) against
// the warp's kWarpKeys keys (N), then O's 16 rows by d (N) over those keys (K). Any row count takes
// it, in tiles of 16; decode_keys_as_m.cuh is the layout for 8 rows or fewer.
#pragma once

#include "exec/decode_mma.cuh"
#include "exec/decode_params.h"
#include "exec/decode_score_rows.cuh"
#include "exec/decode_tile_copies.cuh"

namespace fusedattn::detail::decode {

template <class T, class Mma, int D, int kWarpKeys>
class RowsAsM {
 public:
  static constexpr int kKeyTiles = kWarpKeys / 8;  // n-tiles of the warp's scores
  static constexpr int kSteps = D / 16;            // k-steps of Q K^T
  static constexpr int kOutTiles = D / 8;          // n-tiles of O
  static constexpr int kChunks = D * 2 / 16;       // 16-byte chunks of a 16-bit row
  static_assert(kSteps % 2 == 0 && kKeyTiles % 2 == 0);
  static constexpr int kRowLanes = 1 | 2;          // a row's lanes: a quad

  // This thread's rows of the tile from block row row0 (gid and gid + 8): query t of head kv * g + j,
  // row t * g + j; scale: the raw product's factor to a base-2 logit.
  __device__ RowsAsM(const Params& p, int i, int kv, int row0, int rows, int q_len, int kv_len, int shift, float scale,
                     int lane)
      : gid_(lane / 4), quad_(lane % 4), lane_(lane), rows_(make_rows(p, i, kv, row0, rows, q_len, kv_len, shift, scale)) {
#pragma unroll
    for (int ot = 0; ot < kOutTiles; ++ot) acc_[ot][0] = acc_[ot][1] = acc_[ot][2] = acc_[ot][3] = 0.0f;
  }

  // The warp's keys of one tile: warp_row0 its first row in the tile's shared memory, key_base its key.
  __device__ __forceinline__ void tile(const unsigned char* k_tile, const unsigned char* v_tile, int warp_row0,
                                       int key_base) {
    // Q K^T, the even and odd k-steps summed apart up to d = 128: two chains of kSteps / 2 dependent
    // products an n-tile instead of one of kSteps, whose latency a warp alone on its scheduler would
    // wait out (at d = 256 the second accumulators would spill, as its registers are all taken).
    constexpr bool kTwoChains = D <= 128;
    float s[kKeyTiles][4], odd[kKeyTiles][4];
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
      odd[nt][0] = odd[nt][1] = odd[nt][2] = odd[nt][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < kSteps; ks += 2) {  // matrices: keys of n-tile nt, d chunks 2 ks .. 2 ks + 3
        unsigned b[4];
        const int row = warp_row0 + nt * 8 + (lane_ & 7);
        load_matrices<false>(b, k_tile + swizzled<kChunks>(row, 2 * ks + (lane_ >> 3)));
        mma<Mma>(s[nt], q_frag_[ks], b[0], b[1]);
        mma<Mma>(kTwoChains ? odd[nt] : s[nt], q_frag_[ks + 1], b[2], b[3]);
      }
      if constexpr (kTwoChains) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] += odd[nt][e];
      }
    }
    // Online softmax in base 2: element e of n-tile nt is row h = e / 2's score of key nt * 8 + 2 quad + e % 2.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = rows_.logit(s[nt][e], key_base + nt * 8 + 2 * quad_ + (e & 1), e / 2);
        tile_max[e / 2] = fmaxf(tile_max[e / 2], s[nt][e]);
      }
    }
    float base[2], alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) tile_max[h] = over_row_lanes<kRowLanes>(tile_max[h], Max{});
    softmax_step(tile_max, m_, l_, base, alpha);
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2_approx(s[nt][e] - base[e / 2]);
        l_[e / 2] += s[nt][e];
      }
    }
    // O rescaled where a row's max rose: once the maxima settle, most tiles skip the warp's d / 2
    // multiplies a thread.
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int ot = 0; ot < kOutTiles; ++ot) {
        acc_[ot][0] *= alpha[0];
        acc_[ot][1] *= alpha[0];
        acc_[ot][2] *= alpha[1];
        acc_[ot][3] *= alpha[1];
      }
    }
    // O += P V: the scores' C fragments of two key n-tiles are the A fragment of 16 keys.
#pragma unroll
    for (int kk = 0; kk < kKeyTiles / 2; ++kk) {
      const unsigned a[4] = {pack<Mma>(s[2 * kk][0], s[2 * kk][1]), pack<Mma>(s[2 * kk][2], s[2 * kk][3]),
                             pack<Mma>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack<Mma>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int ot = 0; ot < kOutTiles; ot += 2) {  // matrices: keys 0-7 / 8-15 by d chunks ot, ot + 1
        unsigned b[4];
        const int which = lane_ >> 3, row = warp_row0 + kk * 16 + (lane_ & 7) + 8 * (which & 1);
        load_matrices<true>(b, v_tile + swizzled<kChunks>(row, ot + (which >> 1)));
        mma<Mma>(acc_[ot], a, b[0], b[1]);
        mma<Mma>(acc_[ot + 1], a, b[2], b[3]);
      }
    }
  }

  // The warp's 16 rows of O (rows of `pitch` floats), and each row's max and sum (base 2) in `maxima`.
  __device__ __forceinline__ void store(float* o_rows, float* maxima, int pitch) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_[h] = over_row_lanes<kRowLanes>(l_[h], Sum{});
      const int r = gid_ + 8 * h;
#pragma unroll
      for (int ot = 0; ot < kOutTiles; ++ot) {
        *reinterpret_cast<float2*>(o_rows + r * pitch + ot * 8 + 2 * quad_) = make_float2(acc_[ot][2 * h], acc_[ot][2 * h + 1]);
      }
      if (quad_ == 0) {
        maxima[2 * r] = m_[h];
        maxima[2 * r + 1] = l_[h];
      }
    }
  }

 private:
  // Q's A fragments (rows gid and gid + 8, columns 2 quad (+ 8) of each k-step) and the rows' state.
  __device__ ScoreRows<T> make_rows(const Params& p, int i, int kv, int row0, int rows, int q_len, int kv_len,
                                    int shift, float scale) {
    const int r[2] = {row0 + gid_, row0 + gid_ + 8};
    load_query_row<T, 0, 2>(p, i, kv, r[0], rows, q_len, quad_, q_frag_);
    load_query_row<T, 1, 3>(p, i, kv, r[1], rows, q_len, quad_, q_frag_);
    const float row_scale[2] = {scale * query_row_in_mma_type<T, Mma, 0, 2>(q_frag_),
                                scale * query_row_in_mma_type<T, Mma, 1, 3>(q_frag_)};
    return ScoreRows<T>(p, i, kv, r, rows, q_len, kv_len, shift, row_scale);
  }

  int gid_, quad_, lane_;
  unsigned q_frag_[kSteps][4];
  ScoreRows<T> rows_;
  float m_[2] = {-INFINITY, -INFINITY}, l_[2] = {0.0f, 0.0f};  // a row's max (base 2) and this thread's sum
  float acc_[kOutTiles][4];
};

}  // namespace fusedattn::detail::decode
