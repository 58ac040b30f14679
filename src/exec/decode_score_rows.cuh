// Internal: the two query rows whose scores a thread of fusedattn's decode kernel holds, whichever
// way its tensor-core products lay them out (decode_rows_as_m.cuh, decode_keys_as_m.cuh): the keys
// each row sees, its bias, its score scale and the call's softcap, applied to a raw product q . k.
#pragma once

#include "exec/decode_mma.cuh"
#include "exec/decode_params.h"

namespace fusedattn::detail::decode {

constexpr float kLog2e = 1.4426950408889634f;

// Query t's visible keys [low, high) of a sequence of kv_len keys (reference.h's window: position
// p = t + shift, shift = kv_len - q_len bottom-right, key j seen when p - left < j <= p + right).
__device__ __forceinline__ int first_seen_key(const Params& p, int t, int shift) {
  return p.window_left >= 0 ? max(0, t + shift - p.window_left + 1) : 0;
}
__device__ __forceinline__ int end_of_seen_keys(const Params& p, int t, int shift, int kv_len) {
  return p.window_right >= 0 ? min(kv_len, t + shift + p.window_right + 1) : kv_len;
}

// Row r of the block's rows (query t = r / g of head kv * g + r % g) into registers kLow and kHigh of
// every k-step of a thread's Q fragments: columns 2 quad, + 1 and 8 + 2 quad, + 1 of each 16, in
// the A fragment (the rows as M) and the B fragment (the keys as M) alike; zeros for a row that does
// not exist or is past the sequence's q_len queries.
template <class T, int kLow, int kHigh, int kSteps, int kRegs>
__device__ __forceinline__ void load_query_row(const Params& p, int i, int kv, int r, int rows, int q_len, int quad,
                                               unsigned (&frag)[kSteps][kRegs]) {
  const int t = r / p.group, j = r % p.group;
  const bool valid = r < rows && t < q_len;
  const T* q_row = static_cast<const T*>(p.q) + i * p.q_stride[0] + (kv * p.group + j) * p.q_stride[1] +
                   static_cast<long long>(t) * p.q_stride[2];
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    frag[ks][kLow] = valid ? *reinterpret_cast<const unsigned*>(q_row + ks * 16 + 2 * quad) : 0u;
    frag[ks][kHigh] = valid ? *reinterpret_cast<const unsigned*>(q_row + ks * 16 + 8 + 2 * quad) : 0u;
  }
}

struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// x combined by `op` over the lanes that hold one row with it: those differing from this lane only
// in the bits of kLaneBits (a quad's, 1 | 2, with the rows as M; 4 | 8 | 16 with the keys as M).
template <int kLaneBits, class Op>
__device__ __forceinline__ float over_row_lanes(float x, Op op) {
#pragma unroll
  for (int bit = 1; bit < 32; bit <<= 1) {
    if (kLaneBits & bit) x = op(x, __shfl_xor_sync(0xffffffffu, x, bit));
  }
  return x;
}

template <class T>
class ScoreRows {
 public:
  // Rows r[0] and r[1] of the block (query t = r / g of head kv * g + r % g), of which `rows` exist
  // and the first q_len queries are real; scale[h]: row h's factor from a raw product to a base-2
  // logit (the softmax scale times log2(e), any FP8 descale, any unscale of its queries).
  __device__ ScoreRows(const Params& p, int i, int kv, const int (&r)[2], int rows, int q_len, int kv_len, int shift,
                       const float (&scale)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = r[h] / p.group, j = r[h] % p.group;
      const bool valid = r[h] < rows && t < q_len;
      low_[h] = valid ? first_seen_key(p, t, shift) : 0;
      high_[h] = valid ? end_of_seen_keys(p, t, shift, kv_len) : 0;
      bias_row_[h] = p.bias != nullptr && valid ? static_cast<const T*>(p.bias) + i * p.bias_stride[0] +
                                                      (kv * p.group + j) * p.bias_stride[1] + t * p.bias_stride[2]
                                                : nullptr;
      biased_[h] = bias_row_[h] != nullptr;
      scale_[h] = scale[h];
    }
    // A softcap in base 2: with x the scaled score times log2(e), cap * tanh(score / cap) times
    // log2(e) is c * tanh(x / c), c = cap * log2(e).
    capped_ = p.softcapped;
    const float cap = !capped_ ? 0.0f : p.softcap_scalar != nullptr ? *p.softcap_scalar : p.softcap;
    cap_log2_ = cap * kLog2e;
  }

  // Row h's base-2 logit of key `key` from its raw product, -inf where the row does not see the key
  // (a softcap bends the scaled score first; a bias is added after it, as the reference adds it).
  __device__ __forceinline__ float logit(float raw, int key, int h) const {
    const bool seen = key >= low_[h] && key < high_[h];
    float x = raw * scale_[h];
    if (capped_) x = cap_log2_ * tanhf(x / cap_log2_);
    if (seen && biased_[h]) x += widened(bias_row_[h][key]) * kLog2e;
    return seen ? x : -INFINITY;
  }

 private:
  int low_[2], high_[2];
  const T* bias_row_[2];  // the row's bias over the keys, or null
  bool biased_[2];
  float scale_[2];
  bool capped_;
  float cap_log2_;
};

// The online softmax's step for a thread's two rows, given each row's largest logit of the tile
// (already shared by the lanes of the row): m[h] becomes the running max, l[h] is rescaled to it;
// base[h] is what the tile's logits are taken from, alpha[h] what O's accumulators are multiplied by
// (1 where the max stayed: a row that still sees nothing, a padding row, included, whose sums are 0
// and stay 0, so that O's rescale can be skipped).
__device__ __forceinline__ void softmax_step(const float (&tile_max)[2], float (&m)[2], float (&l)[2], float (&base)[2],
                                             float (&alpha)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float top = fmaxf(m[h], tile_max[h]);
    base[h] = top == -INFINITY ? 0.0f : top;  // a row that has seen nothing stays at 0
    alpha[h] = top == m[h] ? 1.0f : exp2_approx(m[h] - base[h]);
    m[h] = top;
    l[h] *= alpha[h];
  }
}

}  // namespace fusedattn::detail::decode
