// A call's tensor set against its spec, before any GPU work: every tensor the spec has is given
// (non-null, aligned as cuDNN reads it), none that it lacks is given (a bias pointer beside a spec
// without a bias means the caller built the call for another spec, and would silently get
// attention without it), and no output shares memory with an input or another output.
//
// Pure: pointers are only compared, never dereferenced, so the rules are tested on the CPU.
#pragma once

#include "fusedattn/attention.h"
#include "fusedattn/spec.h"
#include "fusedattn/tensor.h"

namespace fusedattn::detail {

/// Throws InvalidArgument naming the tensor ("tensors.bias"), the value seen (null, the address,
/// "given", "overlaps tensors.q at 0x...") and the requirement. Per-tensor FP8 scales beside a
/// 16-bit spec and the ragged arrays of a dense one are ignored, as attention.h documents; MXFP8's
/// tensors are refused beside any other spec, and per-tensor scales beside an MXFP8 one.
void check_tensor_set(const AttentionSpec& spec, const ForwardTensors& tensors);
void check_tensor_set(const AttentionSpec& spec, const BackwardTensors& tensors);

/// The attention scale of a call: InvalidArgument ("scale") unless it is finite (a NaN or infinite
/// scale would make every output NaN without a word).
void check_scale(float scale);

/// A pointer cuDNN reads with 16-byte vector accesses (a tensor, the workspace): InvalidArgument
/// naming `field` when it is null or misaligned.
void require_pointer(const char* field, const void* pointer);

/// Whether tensors `a` at `a_data` and `b` at `b_data` share an element. Two views of one packed
/// buffer (dQ, dK and dV of a bs3hd gradient: equal dims, strides and element type, starts apart by
/// an offset no index difference reaches) do not; anything else whose byte ranges meet does. A
/// ragged tensor (thd: its descriptor is its plan's bucket, its tokens placed at run time) counts
/// as its first element only.
bool tensors_overlap(const TensorDesc& a, const void* a_data, const TensorDesc& b, const void* b_data) noexcept;

}  // namespace fusedattn::detail
