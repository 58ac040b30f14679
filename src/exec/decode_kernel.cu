// fusedattn's decode kernel as a plan runs it (decode_kernel.h): which instance, its parameters
// from the spec and the call, the launch and the merge.
#include "exec/decode_kernel.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "exec/cuda_check.h"
#include "exec/decode_kernel_body.cuh"
#include "exec/device.h"
#include "exec/environment_switch.h"
#include "exec/element_conversions.cuh"

namespace fusedattn::detail {
namespace {

using decode::Params;
using Kernel = void (*)(Params);

constexpr std::size_t kAlign = 256;
std::size_t round_up(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// FUSEDATTN_DECODE_KERNEL, read once: 0 never, 1 wherever the kernel takes the call, else the rule.
int forced_choice() {
  static const int forced = [] {
    const char* value = std::getenv("FUSEDATTN_DECODE_KERNEL");
    if (value == nullptr) return -1;
    if (std::strcmp(value, "0") == 0) return 0;
    return std::strcmp(value, "1") == 0 ? 1 : -1;
  }();
  return forced;
}

// The instance for the shape's rows: 8 or fewer with the keys as the products' M, else 1, 2, 4 or 8
// row tiles (with 4 warps' worth of key groups below 4 tiles).
template <class T, class KV, int D>
Kernel by_rows(const DecodeKernelShape& shape) {
  if (shape.keys_as_m) return shape.row_tiles == 1 ? decode::decode_kernel<T, KV, D, 1, 4, true> : nullptr;
  switch (shape.row_tiles) {
    case 1: return decode::decode_kernel<T, KV, D, 1, 4, false>;
    case 2: return decode::decode_kernel<T, KV, D, 2, 2, false>;
    case 4: return decode::decode_kernel<T, KV, D, 4, 1, false>;
    case 8: return decode::decode_kernel<T, KV, D, 8, 1, false>;
  }
  return nullptr;
}

template <class T, class KV>
Kernel by_head_dim(std::int64_t d, const DecodeKernelShape& shape) {
  if (d == 64) return by_rows<T, KV, 64>(shape);
  if (d == 128) return by_rows<T, KV, 128>(shape);
  if (d == 256) return by_rows<T, KV, 256>(shape);
  return nullptr;
}

template <class T>
Kernel by_cache(const AttentionSpec& spec, const DecodeKernelShape& shape) {
  if (spec.fp8_kv_cache()) return by_head_dim<T, E4M3>(spec.head_dim_v(), shape);
  return by_head_dim<T, T>(spec.head_dim_v(), shape);
}

Kernel kernel_for(const AttentionSpec& spec, const DecodeKernelShape& shape) {
  const Kernel kernel = spec.q.dtype == DType::bf16 ? by_cache<__nv_bfloat16>(spec, shape)
                        : spec.q.dtype == DType::f16 ? by_cache<__half>(spec, shape)
                                                      : nullptr;
  // decode_kernel_refusals keeps every other spec away; reaching this is a bug of ours.
  if (kernel == nullptr) throw std::logic_error("fusedattn: no decode kernel for " + to_string(spec));
  return kernel;
}

// Lets `kernel` take `bytes` of dynamic shared memory on the current device. The limit is the
// function's, shared by every plan that runs that instance, and a paged plan's bytes depend on its
// cut (its page slots): it only ever grows, so that a plan set up later with fewer bytes cannot
// leave an earlier plan's launch over the limit (cudaErrorInvalidValue at launch).
void allow_shared_bytes(Kernel kernel, std::int64_t bytes) {
  static std::mutex mutex;
  static std::map<std::pair<int, Kernel>, std::int64_t> allowed;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  const std::lock_guard<std::mutex> lock(mutex);
  std::int64_t& most = allowed[{device, kernel}];
  if (bytes <= most) return;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
             "cudaFuncSetAttribute(decode kernel, shared memory)");
  most = bytes;
}

// Whether `kernel` can run its chunks as clusters of `chunks` blocks (shape.cluster_merge) here: the
// code that runs is SM 9.0's (whose body merges in the cluster) and at least one cluster of that size
// fits beside the block's shared memory. Otherwise the plan keeps its partials for the merge kernel.
bool ask_clusters_fit(Kernel kernel, const DecodeKernelShape& shape) {
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess || attributes.binaryVersion < 90) return false;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(shape.chunks);
  cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(shape.chunks));
  config.blockDim = dim3(static_cast<unsigned>(shape.threads));
  config.dynamicSmemBytes = static_cast<std::size_t>(shape.shared_bytes);
  config.attrs = &cluster;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: leave no error for the next call to find
    return false;
  }
  return clusters > 0;
}

// ask_clusters_fit, asked once per device, instance and launch shape: a cache growing a token a step
// (transformers' DynamicCache in generate()) sets up a plan for every new length, and each would
// otherwise ask the driver for the function's attributes and its cluster occupancy again.
bool clusters_fit(Kernel kernel, const DecodeKernelShape& shape) {
  static std::mutex mutex;
  static std::map<std::tuple<int, Kernel, std::int64_t, int, std::int64_t>, bool> known;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  const auto key = std::make_tuple(device, kernel, shape.chunks, shape.threads, shape.shared_bytes);
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = known.find(key);
  if (found != known.end()) return found->second;
  return known[key] = ask_clusters_fit(kernel, shape);
}

void copy_strides(const TensorDesc& desc, long long (&out)[3]) {
  out[0] = desc.strides[kBatch];
  out[1] = desc.strides[kHead];
  out[2] = desc.strides[kSeq];
}

}  // namespace

std::optional<DecodeKernelShape> decode_kernel_in_use(const AttentionSpec& spec, Pass pass, int device) {
  if (pass != Pass::forward) return std::nullopt;
  const DecodeDevice gpu{device_caps(device), multiprocessor_count(device)};
  if (!decode_kernel_refusals(spec, pass, gpu.caps).empty()) return std::nullopt;
  // The only path for some (decode_kernel_only), whatever FUSEDATTN_DECODE_KERNEL says.
  const int forced = decode_kernel_only(spec) ? 1 : forced_choice();
  if (forced == 0 || (forced < 0 && !decode_kernel_preferred(spec, pass, gpu))) return std::nullopt;
  static const std::int64_t forced_chunks = count_in_environment("FUSEDATTN_DECODE_CHUNKS");
  std::optional<DecodeKernelShape> shape;
  if (forced_chunks > 0) shape = decode_kernel_cut(spec, gpu, forced_chunks);
  if (!shape) shape = decode_kernel_shape(spec, gpu);
  // FUSEDATTN_DECODE_KEYS_AS_M=0 keeps 8 rows or fewer in the 16-row products, for measuring the two.
  static const bool keys_as_m = switch_on_unless_zero("FUSEDATTN_DECODE_KEYS_AS_M");
  if (!keys_as_m) shape->keys_as_m = false;
  return shape;
}

DecodeKernelCall::DecodeKernelCall(const AttentionSpec& spec, const DecodeKernelShape& shape)
    : spec_(spec), shape_(shape), kernel_(kernel_for(spec, shape)), softcap_(decode_softcap(spec.score_mod)),
      early_launch_(decode_early_launch()) {
  allow_shared_bytes(kernel_, shape.shared_bytes);
  for (int shift = 0; shift < 31; ++shift) {
    if (spec.page_size() == std::int64_t{1} << shift) page_shift_ = shift;
  }
  if (shape_.cluster_merge && !clusters_fit(kernel_, shape_)) shape_.cluster_merge = false;
  if (shape_.merged() && !shape_.cluster_merge) {
    const auto rows = static_cast<std::size_t>(spec.batch() * shape.chunks * spec.heads_q() * spec.seq_q());
    partial_o_bytes_ = round_up(rows * static_cast<std::size_t>(spec.head_dim_v()) * sizeof(float));
    partial_stats_bytes_ = round_up(rows * sizeof(float));
  }
}

void DecodeKernelCall::forward(const ForwardTensors& t, float scale, cudaStream_t stream, char* workspace) const {
  const AttentionSpec& s = spec_;
  const std::int64_t group = s.heads_q() / s.heads_kv();
  Params p{};
  p.q = t.q;
  p.o = t.o;
  p.stats = s.stats ? t.stats : nullptr;
  p.k = t.k;
  p.v = t.v;
  p.table_k = s.paged_kv() ? t.page_table_k : nullptr;
  p.table_v = s.paged_kv() ? t.page_table_v : nullptr;
  p.page_slots = static_cast<int>(shape_.page_slots);
  p.len_q = s.padding ? t.seq_len_q : nullptr;  // null there too: s_q each (attention.h)
  p.len_kv = s.padding ? t.seq_len_kv : nullptr;
  if (s.fp8_kv_cache()) {
    p.descale_k = t.fp8.descale_k;
    p.descale_v = t.fp8.descale_v;
    p.descale_step = s.fp8_scaling == Fp8Scaling::head ? 1 : 0;
  }
  if (s.bias != Bias::none) {  // bias_desc's contiguous strides, 0 along its broadcast axes
    const TensorDesc bias = bias_desc(s);
    p.bias = t.bias;
    for (int axis = 0; axis < 3; ++axis) p.bias_stride[axis] = bias.dims[axis] == 1 ? 0 : bias.strides[axis];
  }
  p.sink = s.softmax == Softmax::sink ? t.sink : nullptr;
  p.off_by_one = s.softmax == Softmax::off_by_one;
  p.cluster_merge = shape_.cluster_merge;
  if (shape_.merged() && !shape_.cluster_merge) {
    p.o_part = reinterpret_cast<float*>(workspace);
    p.stats_part = reinterpret_cast<float*>(workspace + partial_o_bytes_);
  }
  copy_strides(s.q, p.q_stride);
  copy_strides(s.o, p.o_stride);
  copy_strides(s.k, p.k_stride);
  copy_strides(s.v, p.v_stride);
  p.s_q = static_cast<int>(s.seq_q());
  p.s_kv = static_cast<int>(s.seq_kv());
  p.group = static_cast<int>(group);
  p.h_kv = static_cast<int>(s.heads_kv());
  p.pages = static_cast<int>(s.kv_pages);
  p.page_size = static_cast<int>(s.page_size());
  p.page_shift = page_shift_;
  p.chunk_keys = static_cast<int>(shape_.chunk_keys);
  p.chunks = static_cast<int>(shape_.chunks);
  p.window_left = static_cast<int>(s.window.left);
  p.window_right = static_cast<int>(s.window.right);
  p.bottom_right = s.alignment == Alignment::bottom_right;
  p.scale_log2 = scale * 1.4426950408889634f;
  if (softcap_) {  // the cap as the call gives it: a scalar on the device, read when the kernel runs
    p.softcapped = true;
    p.softcap_scalar = softcap_->scalar_slot >= 0 ? t.score_mod.scalars + softcap_->scalar_slot : nullptr;
    p.softcap = softcap_->scalar_slot >= 0 ? 0.0f : static_cast<float>(softcap_->constant);
  }
  const dim3 blocks(static_cast<unsigned>(shape_.chunks), static_cast<unsigned>(s.heads_kv()),
                    static_cast<unsigned>(s.batch()));
  const auto threads = static_cast<unsigned>(shape_.threads);
  const auto shared = static_cast<std::size_t>(shape_.shared_bytes);
  // A cluster is a (K/V head, sequence)'s chunks, merged in the kernel (decode_cluster_merge.cuh).
  const unsigned cluster = shape_.cluster_merge ? blocks.x : 1;
  check_cuda(launch_in_clusters(kernel_, early_launch_, cluster, blocks, threads, shared, stream, p),
             "decode kernel: launch");
  if (!shape_.merged() || shape_.cluster_merge) return;
  DecodePartials partials;
  partials.o = p.o_part;
  partials.float32 = true;
  partials.stats = p.stats_part;
  partials.chunks = shape_.chunks;
  partials.group = group;
  partials.sink = p.sink;
  partials.off_by_one = p.off_by_one;
  merge_decode_partials(s, partials, p.len_q, RaggedRows{}, t.o, p.stats, early_launch_, stream);
}

}  // namespace fusedattn::detail
