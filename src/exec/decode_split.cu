// A split paged decode (decode_split.h): the kernels that cut, copy and merge, and the two calls.
#include "exec/decode_split.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "exec/cuda_check.h"
#include "exec/device.h"
#include "exec/element_conversions.cuh"
#include "exec/strided_elements.cuh"

namespace fusedattn::detail {
namespace {

constexpr std::size_t kAlign = 256;
constexpr int kThreads = 256;
std::size_t round_up(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Where each of our arrays lies after the inner plans' workspace, in bytes.
struct Scratch {
  std::size_t q_full, o_full, o_final, stats_full, stats_final;
  std::size_t table_k_full, table_v_full, table_k_final, table_v_final;
  std::size_t len_q_full, len_kv_full, len_q_final, len_kv_final, full_counts, bytes;
};

Scratch scratch_of(const AttentionSpec& spec, const DecodeSplit& split) {
  const auto b = static_cast<std::size_t>(spec.batch()), entries = b * static_cast<std::size_t>(split.chunks - 1);
  const auto rows = static_cast<std::size_t>(spec.heads_q() * spec.seq_q());
  const std::size_t element = size_of(spec.q.dtype);
  const auto d_qk = static_cast<std::size_t>(spec.head_dim_qk()), d_v = static_cast<std::size_t>(spec.head_dim_v());
  const auto pages = static_cast<std::size_t>(split.chunk_pages);
  Scratch s{};
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t here = at;
    at += round_up(bytes);
    return here;
  };
  s.q_full = take(entries * rows * d_qk * element);
  s.o_full = take(entries * rows * d_v * element);
  s.o_final = take(b * rows * d_v * element);
  s.stats_full = take(entries * rows * sizeof(float));
  s.stats_final = take(b * rows * sizeof(float));
  s.table_k_full = take(entries * pages * sizeof(std::int32_t));
  s.table_v_full = take(entries * pages * sizeof(std::int32_t));
  s.table_k_final = take(b * (pages + 1) * sizeof(std::int32_t));
  s.table_v_final = take(b * (pages + 1) * sizeof(std::int32_t));
  s.len_q_full = take(entries * sizeof(std::int32_t));
  s.len_kv_full = take(entries * sizeof(std::int32_t));
  s.len_q_final = take(b * sizeof(std::int32_t));
  s.len_kv_final = take(b * sizeof(std::int32_t));
  s.full_counts = take(b * sizeof(std::int32_t));
  s.bytes = at;
  return s;
}

struct Cut {
  int chunks;         // a sequence's chunks, the final one included
  int chunk_pages;    // pages of a full chunk
  int pages;          // entries of a row of the caller's page tables (kv_pages)
  int chunk_keys;     // chunk_pages * page size
  bool causal_queries;  // bottom-right causal with several queries (decode_chunks)
};

// decode_chunks (support/decode_split.cpp), on the device.
__device__ int full_chunks(int keys, int queries, const Cut& cut) {
  if (keys <= 0) return 0;
  int full = (keys - 1) / cut.chunk_keys;
  if (cut.causal_queries && full > 0 && keys - full * cut.chunk_keys < queries) --full;
  return full;
}

// One block per sequence: its chunks' lengths and page-table slices (full chunks: chunk c's
// pages c * chunk_pages ..; the final chunk: from full * chunk_pages on, one page more, entries past
// the row naming the row's first page, which no key reaches).
__global__ void cut_kernel(Cut cut, const std::int32_t* len_q, const std::int32_t* len_kv, const std::int32_t* table_k,
                           const std::int32_t* table_v, std::int32_t* table_k_full, std::int32_t* table_v_full,
                           std::int32_t* table_k_final, std::int32_t* table_v_final, std::int32_t* len_q_full,
                           std::int32_t* len_kv_full, std::int32_t* len_q_final, std::int32_t* len_kv_final,
                           std::int32_t* full_counts) {
  const int i = static_cast<int>(blockIdx.x);
  const int queries = len_q[i], keys = len_kv[i];
  const int full = full_chunks(keys, queries, cut);
  const int fulls = cut.chunks - 1;  // full-chunk entries a sequence has, used or not
  const std::int64_t row = static_cast<std::int64_t>(i) * cut.pages;
  for (int c = static_cast<int>(threadIdx.x); c < fulls; c += blockDim.x) {
    const std::int64_t e = static_cast<std::int64_t>(i) * fulls + c;
    len_q_full[e] = queries;
    len_kv_full[e] = c < full ? cut.chunk_keys : 0;
  }
  const int full_slots = fulls * cut.chunk_pages;
  for (int j = static_cast<int>(threadIdx.x); j < full_slots; j += blockDim.x) {
    const std::int64_t out = static_cast<std::int64_t>(i) * full_slots + j;  // entry i * fulls + j / chunk_pages
    table_k_full[out] = table_k[row + j];  // j < fulls * chunk_pages < pages
    table_v_full[out] = table_v[row + j];
  }
  const int final_slots = cut.chunk_pages + 1;
  for (int j = static_cast<int>(threadIdx.x); j < final_slots; j += blockDim.x) {
    const int page = full * cut.chunk_pages + j;
    const std::int64_t from = row + (page < cut.pages ? page : 0);
    table_k_final[static_cast<std::int64_t>(i) * final_slots + j] = table_k[from];
    table_v_final[static_cast<std::int64_t>(i) * final_slots + j] = table_v[from];
  }
  if (threadIdx.x == 0) {
    len_q_final[i] = queries;
    len_kv_final[i] = keys - full * cut.chunk_keys;
    full_counts[i] = full;
  }
}

// The queries of every full-chunk entry: entry e = i * fulls + c is sequence i's, dense bshd.
__global__ void copy_queries_kernel(Strided q, Strided out, std::int64_t fulls, const std::uint16_t* from,
                                    std::uint16_t* to, std::int64_t n) {
  const std::int64_t per_entry = out.dims[1] * out.dims[2] * out.dims[3];
  for (std::int64_t k = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t sequence = k / per_entry / fulls;
    to[strided_offset(out, k)] = from[strided_offset(q, sequence * per_entry + k % per_entry)];
  }
}

// Per element of the caller's O (logical [b, h, s, d] order): the chunks' partials merged by their
// log-sum-exp. Partials are dense bshd [entries, s_q, h, d_v]; statistics [entries, h, s_q].
template <class T>
__global__ void merge_kernel(Strided o, T* out, float* stats, const T* o_full, const T* o_final,
                             const float* stats_full, const float* stats_final, const std::int32_t* len_q,
                             const std::int32_t* len_kv_final, const std::int32_t* full_counts, std::int64_t fulls,
                             std::int64_t n) {
  const std::int64_t h = o.dims[1], s = o.dims[2], d = o.dims[3];
  for (std::int64_t k = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t col = k % d, r = (k / d) % s, head = (k / d / s) % h, i = k / d / s / h;
    const std::int64_t stats_row = head * s + r;
    if (r >= len_q[i]) {
      out[strided_offset(o, k)] = from_float<T>(0.0f);
      continue;
    }
    const int full = full_counts[i];
    const bool has_final = len_kv_final[i] > 0;
    // The largest log-sum-exp of the chunks that have keys (-inf, and so O = 0, where none do).
    float largest = -INFINITY;
    for (int c = 0; c < full; ++c) largest = fmaxf(largest, stats_full[(i * fulls + c) * h * s + stats_row]);
    const float lse_final = has_final ? stats_final[i * h * s + stats_row] : -INFINITY;
    largest = fmaxf(largest, lse_final);
    float weight_sum = 0.0f, acc = 0.0f;
    if (largest > -INFINITY) {
      for (int c = 0; c < full; ++c) {
        const std::int64_t e = i * fulls + c;
        const float w = __expf(stats_full[e * h * s + stats_row] - largest);
        weight_sum += w;
        acc += w * to_float(o_full[((e * s + r) * h + head) * d + col]);
      }
      if (has_final && lse_final > -INFINITY) {
        const float w = __expf(lse_final - largest);
        weight_sum += w;
        acc += w * to_float(o_final[((i * s + r) * h + head) * d + col]);
      }
    }
    out[strided_offset(o, k)] = from_float<T>(weight_sum > 0.0f ? acc / weight_sum : 0.0f);
    if (stats != nullptr && col == 0) {
      stats[i * h * s + stats_row] = weight_sum > 0.0f ? largest + __logf(weight_sum) : -INFINITY;
    }
  }
}

template <class P>
P* at(char* base, std::size_t offset) {
  return reinterpret_cast<P*>(base + offset);
}

}  // namespace

DecodeSplit decode_split_in_use(const AttentionSpec& spec, Pass pass, int device) {
  static const bool enabled = [] {
    const char* value = std::getenv("FUSEDATTN_SPLIT_DECODE");
    return !(value && std::string(value) == "0");
  }();
  if (!enabled || pass != Pass::forward || !spec.paged_kv()) return {};
  return decode_split(spec, pass, multiprocessor_count(device));
}

DecodeSplitComposite::DecodeSplitComposite(const AttentionSpec& spec, DecodeSplit split)
    : spec_(spec), split_(split),
      full_(get_plan(decode_full_chunks_spec(spec, split), Pass::forward)),
      final_(get_plan(decode_final_chunk_spec(spec, split), Pass::forward)),
      inner_workspace_(round_up(std::max(full_->workspace_bytes(), final_->workspace_bytes()))),
      scratch_bytes_(scratch_of(spec, split).bytes) {}

void DecodeSplitComposite::forward(const ForwardTensors& t, float scale, cudaStream_t stream, char* workspace) const {
  const Scratch s = scratch_of(spec_, split_);
  char* ours = workspace + inner_workspace_;
  const std::int64_t b = spec_.batch(), fulls = split_.chunks - 1;
  Cut cut;
  cut.chunks = static_cast<int>(split_.chunks);
  cut.chunk_pages = static_cast<int>(split_.chunk_pages);
  cut.pages = static_cast<int>(spec_.kv_pages);
  cut.chunk_keys = static_cast<int>(split_.chunk_pages * spec_.page_size());
  cut.causal_queries = spec_.window.causal() && spec_.alignment == Alignment::bottom_right && spec_.seq_q() > 1;
  cut_kernel<<<static_cast<unsigned int>(b), kThreads, 0, stream>>>(
      cut, t.seq_len_q, t.seq_len_kv, t.page_table_k, t.page_table_v, at<std::int32_t>(ours, s.table_k_full),
      at<std::int32_t>(ours, s.table_v_full), at<std::int32_t>(ours, s.table_k_final),
      at<std::int32_t>(ours, s.table_v_final), at<std::int32_t>(ours, s.len_q_full),
      at<std::int32_t>(ours, s.len_kv_full), at<std::int32_t>(ours, s.len_q_final),
      at<std::int32_t>(ours, s.len_kv_final), at<std::int32_t>(ours, s.full_counts));
  check_cuda(cudaGetLastError(), "decode split: cut");
  const AttentionSpec& full = full_->spec();
  const std::int64_t q_elements = full.q.elements();
  copy_queries_kernel<<<grid_stride_blocks(q_elements, kThreads), kThreads, 0, stream>>>(
      make_strided(spec_.q), make_strided(full.q), fulls, static_cast<const std::uint16_t*>(t.q),
      at<std::uint16_t>(ours, s.q_full), q_elements);
  check_cuda(cudaGetLastError(), "decode split: copy queries");

  const Workspace inner{workspace, inner_workspace_};
  ForwardTensors ft = t;  // the caller's pools
  ft.q = ours + s.q_full;
  ft.o = ours + s.o_full;
  ft.stats = at<float>(ours, s.stats_full);
  ft.seq_len_q = at<std::int32_t>(ours, s.len_q_full);
  ft.seq_len_kv = at<std::int32_t>(ours, s.len_kv_full);
  ft.page_table_k = at<std::int32_t>(ours, s.table_k_full);
  ft.page_table_v = at<std::int32_t>(ours, s.table_v_full);
  full_->run(ft, scale, stream, inner);
  ForwardTensors fin = t;  // the caller's queries and pools
  fin.o = ours + s.o_final;
  fin.stats = at<float>(ours, s.stats_final);
  fin.seq_len_q = at<std::int32_t>(ours, s.len_q_final);
  fin.seq_len_kv = at<std::int32_t>(ours, s.len_kv_final);
  fin.page_table_k = at<std::int32_t>(ours, s.table_k_final);
  fin.page_table_v = at<std::int32_t>(ours, s.table_v_final);
  final_->run(fin, scale, stream, inner);

  const std::int64_t n = spec_.o.elements();
  const unsigned int blocks = grid_stride_blocks(n, kThreads);
  float* stats = spec_.stats ? t.stats : nullptr;
  auto merge = [&](auto* out) {
    using T = std::remove_pointer_t<decltype(out)>;
    merge_kernel<T><<<blocks, kThreads, 0, stream>>>(
        make_strided(spec_.o), out, stats, at<const T>(ours, s.o_full), at<const T>(ours, s.o_final),
        at<const float>(ours, s.stats_full), at<const float>(ours, s.stats_final), t.seq_len_q,
        at<const std::int32_t>(ours, s.len_kv_final), at<const std::int32_t>(ours, s.full_counts), fulls, n);
  };
  if (spec_.o.dtype == DType::bf16) {
    merge(static_cast<__nv_bfloat16*>(t.o));
  } else {
    merge(static_cast<__half*>(t.o));
  }
  check_cuda(cudaGetLastError(), "decode split: merge");
}

}  // namespace fusedattn::detail
