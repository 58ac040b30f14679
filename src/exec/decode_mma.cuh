// Internal: the SM 8.0 instructions fusedattn's decode kernel is built from (decode_kernel_body.cuh):
// asynchronous 16-byte copies into shared memory, ldmatrix, the 16x8x16 tensor-core product with
// float32 accumulation, and the conversions around them (each wrapper one instruction, but the
// queries' move into f16 beside an FP8 cache). The fragment layouts are PTX's (mma.m16n8k16: lane =
// 4 * group + quad).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace fusedattn::detail::decode {

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define FUSEDATTN_DECODE_MMA 1  // the kernel's body exists (it is refused below SM 8.0)
#endif

__device__ __forceinline__ unsigned shared_address(const void* pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

/// 16 bytes from global to shared memory, bypassing L1 (the cache is streamed once); zeros where
/// !valid (nothing is read then, but `from` must still be a mapped address).
__device__ __forceinline__ void copy_16(void* to, const void* from, bool valid) {
#ifdef FUSEDATTN_DECODE_MMA
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(to)), "l"(from),
               "r"(valid ? 16 : 0)
               : "memory");
#endif
}
__device__ __forceinline__ void commit_copies() {
#ifdef FUSEDATTN_DECODE_MMA
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
/// Waits until at most `kPending` of this thread's committed groups of copies are in flight.
template <int kPending>
__device__ __forceinline__ void wait_copies() {
#ifdef FUSEDATTN_DECODE_MMA
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

/// Four 8x8 matrices of 16-bit elements: lane l names row l % 8 of matrix l / 8; each lane gets,
/// of each matrix, row lane / 4's elements 2 (lane % 4) and 2 (lane % 4) + 1 (the B fragment of a
/// k-major tile), or with `kTransposed` column lane / 4's elements at rows 2 (lane % 4) and + 1.
template <bool kTransposed>
__device__ __forceinline__ void load_matrices(unsigned (&r)[4], const void* row) {
#ifdef FUSEDATTN_DECODE_MMA
  if constexpr (kTransposed) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
  }
#endif
}

/// c += a b: a 16x16 (row major, 4 registers), b 16x8 (column major, 2), c 16x8 float32 (4).
template <class T>
__device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#ifdef FUSEDATTN_DECODE_MMA
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#endif
}

/// Two floats as a pair of T in one register, the first in the low half (round to nearest).
template <class T>
__device__ __forceinline__ unsigned pack(float low, float high) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    return *reinterpret_cast<const unsigned*>(&pair);
  } else {
    const __half2 pair = __floats2half2_rn(low, high);
    return *reinterpret_cast<const unsigned*>(&pair);
  }
}

/// One T as a float (exact).
template <class T>
__device__ __forceinline__ float widened(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(x);
  } else {
    return __half2float(x);
  }
}

/// 2^x, with 2^-inf = 0 (the softmax's masked scores).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// Two E4M3 bytes (the low byte first) as a pair of T, exactly: every E4M3 value is a half and a
/// bfloat16 (3 mantissa bits, exponents 2^-9 .. 2^8).
template <class T>
__device__ __forceinline__ unsigned e4m3_pair(unsigned short bits) {
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(bits), __NV_E4M3);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const float2 wide = __half22float2(*reinterpret_cast<const __half2*>(&raw));
    return pack<T>(wide.x, wide.y);
  } else {
    return *reinterpret_cast<const unsigned*>(&raw);
  }
}

/// 16 E4M3 values (one 16-byte chunk) as 16 T (two chunks), in order.
template <class T>
__device__ __forceinline__ void e4m3_to_16bit(const uint4& from, uint4& low, uint4& high) {
  auto pairs = [](unsigned word, unsigned& a, unsigned& b) {
    a = e4m3_pair<T>(static_cast<unsigned short>(word & 0xffffu));
    b = e4m3_pair<T>(static_cast<unsigned short>(word >> 16));
  };
  pairs(from.x, low.x, low.y);
  pairs(from.y, low.z, low.w);
  pairs(from.z, high.x, high.y);
  pairs(from.w, high.z, high.w);
}

/// The tensor cores' type beside an FP8 (E4M3) cache: f16, to which E4M3 widens in one conversion a
/// pair (exactly, as to bfloat16, which takes four through float); otherwise q's own.
template <class T, bool kFp8Cache>
using MmaType = std::conditional_t<kFp8Cache, __half, T>;

/// One query row of a thread's fragments of Q (registers kLow and kHigh of every k-step, loaded in
/// T) in the tensor cores' type Mma; returns the factor that undoes its scaling in the score scale.
/// Where Mma is f16 beside bfloat16 queries, the row is scaled by the power of two that puts its
/// largest magnitude in [2^14, 2^15), inside f16's range whatever bfloat16's exponent (elements below
/// 2^-28 of the largest lose bits in f16's subnormals: nothing a dot product of bfloat16 rounding
/// sees). The 4 lanes of a quad hold the row (in both fragment layouts) and agree on it.
template <class T, class Mma, int kLow, int kHigh, int kSteps, int kRegs>
__device__ __forceinline__ float query_row_in_mma_type(unsigned (&frag)[kSteps][kRegs]) {
  if constexpr (std::is_same_v<T, Mma>) {
    return 1.0f;
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16> && std::is_same_v<Mma, __half>);
    auto pair = [](unsigned bits) { return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits)); };
    float top = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      const float2 low = pair(frag[ks][kLow]), high = pair(frag[ks][kHigh]);
      top = fmaxf(top, fmaxf(fmaxf(fabsf(low.x), fabsf(low.y)), fmaxf(fabsf(high.x), fabsf(high.y))));
    }
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
    // top's binary exponent, from -112 (zero, subnormals and the tiniest rows: the factor stays a
    // float) to 128 (inf or NaN, which the row's scores then are anyway).
    const int exponent = max(static_cast<int>((__float_as_uint(top) >> 23) & 0xffu) - 127, -112);
    const float factor = __uint_as_float(static_cast<unsigned>(127 + 14 - exponent) << 23);
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      const float2 low = pair(frag[ks][kLow]), high = pair(frag[ks][kHigh]);
      frag[ks][kLow] = pack<__half>(low.x * factor, low.y * factor);
      frag[ks][kHigh] = pack<__half>(high.x * factor, high.y * factor);
    }
    return __uint_as_float(static_cast<unsigned>(127 - 14 + exponent) << 23);
  }
}

/// An 8x8 matrix of 16-bit elements held as the tensor cores' fragments hold one (lane 4 r + c: row r's
/// elements 2 c and 2 c + 1, the low half first), transposed across the warp into the same layout.
__device__ __forceinline__ unsigned transposed(unsigned x) {
  unsigned y = x;
#ifdef FUSEDATTN_DECODE_MMA
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
#endif
  return y;
}

}  // namespace fusedattn::detail::decode
