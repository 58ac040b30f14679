// A split paged decode (decode_split.h): the kernels that cut, copy and merge, and the calls.
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

struct Cut {
  int chunks;           // chunks a sequence's keys take in the unmasked call
  int chunk_pages;      // pages of a chunk
  int masked_pages;     // pages of the masked call's table; 0: none
  int pages;            // entries of a row of the caller's page tables (kv_pages)
  int page_size;
  int group;            // query heads folded into one head's rows in the chunks' call
};

// decode_cut (support/decode_split.cpp), on the device: the keys every query sees.
__device__ int unmasked_keys(int keys, int queries, const Cut& cut) {
  if (keys <= 0) return 0;
  if (cut.masked_pages == 0) return keys;
  return max(keys - queries, 0) / cut.page_size * cut.page_size;
}

// The page-table entry `page` of sequence i's row; entries past the row name the row's first page,
// which no key of theirs reaches (a chunk's length stops before).
__device__ std::int32_t page_of(const std::int32_t* table, std::int64_t row, int page, int pages) {
  return table[row + (page < pages ? page : 0)];
}

// One block per sequence: its chunks' lengths and tables, and its masked call's.
__global__ void cut_kernel(Cut cut, const std::int32_t* len_q, const std::int32_t* len_kv, const std::int32_t* table_k,
                           const std::int32_t* table_v, std::int32_t* table_k_chunks, std::int32_t* table_v_chunks,
                           std::int32_t* table_k_masked, std::int32_t* table_v_masked, std::int32_t* len_q_chunks,
                           std::int32_t* len_kv_chunks, std::int32_t* len_q_masked, std::int32_t* len_kv_masked) {
  const int i = static_cast<int>(blockIdx.x);
  const int queries = len_q[i], keys = len_kv[i];
  const int unmasked = unmasked_keys(keys, queries, cut);
  const int chunk_keys = cut.chunk_pages * cut.page_size;
  const std::int64_t row = static_cast<std::int64_t>(i) * cut.pages;
  for (int c = static_cast<int>(threadIdx.x); c < cut.chunks; c += blockDim.x) {
    const std::int64_t e = static_cast<std::int64_t>(i) * cut.chunks + c;
    const int chunk = min(max(unmasked - c * chunk_keys, 0), chunk_keys);
    len_kv_chunks[e] = chunk;
    len_q_chunks[e] = chunk > 0 ? queries * cut.group : 0;  // folded rows; an entry without keys computes nothing
  }
  const int slots = cut.chunks * cut.chunk_pages;  // chunk c's pages: c * chunk_pages ..
  for (int j = static_cast<int>(threadIdx.x); j < slots; j += blockDim.x) {
    const std::int64_t out = static_cast<std::int64_t>(i) * slots + j;
    table_k_chunks[out] = page_of(table_k, row, j, cut.pages);
    table_v_chunks[out] = page_of(table_v, row, j, cut.pages);
  }
  if (cut.masked_pages == 0) return;
  const int first = unmasked / cut.page_size;  // the masked keys start at a page
  for (int j = static_cast<int>(threadIdx.x); j < cut.masked_pages; j += blockDim.x) {
    const std::int64_t out = static_cast<std::int64_t>(i) * cut.masked_pages + j;
    table_k_masked[out] = page_of(table_k, row, first + j, cut.pages);
    table_v_masked[out] = page_of(table_v, row, first + j, cut.pages);
  }
  if (threadIdx.x == 0) {
    len_kv_masked[i] = keys - unmasked;
    len_q_masked[i] = keys - unmasked > 0 ? queries : 0;
  }
}

// The queries of every chunk: entry e = i * chunks + c is sequence i's, folded (decode_chunks_spec):
// out's logical [e, h_kv, s_q * g, d] element (e, k, t * g + j, x) is q's (i, k * g + j, t, x).
__global__ void copy_queries_kernel(Strided q, Strided out, std::int64_t chunks, std::int64_t group,
                                    const std::uint16_t* from, std::uint16_t* to, std::int64_t n) {
  const std::int64_t h_kv = out.dims[1], rows = out.dims[2], d = out.dims[3], s_q = rows / group;
  for (std::int64_t k = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t x = k % d, row = (k / d) % rows, kv_head = (k / d / rows) % h_kv, e = k / d / rows / h_kv;
    const std::int64_t head = kv_head * group + row % group, t = row / group, sequence = e / chunks;
    const std::int64_t source = ((sequence * h_kv * group + head) * s_q + t) * d + x;  // q's logical order
    to[strided_offset(out, k)] = from[strided_offset(q, source)];
  }
}

// Per element of the caller's O (logical [b, h, s, d] order): the partials of the chunks with keys
// merged by their log-sum-exp. The chunks' partials are folded (decode_chunks_spec): dense bshd
// [entries, s_q * g, h / g, d_v], statistics [entries, h / g, s_q * g], query r of head k * g + j
// at row r * g + j of head k; the masked call's are dense bshd [b, s_q, h, d_v] and [b, h, s_q]. A
// row whose chunks have no keys (or a statistic that is not finite) gets 0 and a log-sum-exp of
// -inf, as the references give a row that sees no key.
template <class T>
__global__ void merge_kernel(Strided o, T* out, float* stats, const T* o_chunks, const T* o_masked,
                             const float* stats_chunks, const float* stats_masked, const std::int32_t* len_q,
                             const std::int32_t* len_kv_chunks, const std::int32_t* len_kv_masked,
                             std::int64_t chunks, std::int64_t group, std::int64_t n) {
  const std::int64_t h = o.dims[1], s = o.dims[2], d = o.dims[3];
  for (std::int64_t k = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t col = k % d, r = (k / d) % s, head = (k / d / s) % h, i = k / d / s / h;
    const std::int64_t stats_row = head * s + r;
    // The same row in the chunks' folded partials: head head / g, row r * g + head % g.
    const std::int64_t folded_row = r * group + head % group, kv_head = head / group;
    const std::int64_t chunk_stats_row = kv_head * s * group + folded_row;
    if (r >= len_q[i]) {
      out[strided_offset(o, k)] = from_float<T>(0.0f);
      continue;
    }
    auto lse_of = [&](const float* table, std::int64_t e, std::int64_t row, bool has_keys) {
      const float lse = has_keys ? table[e * h * s + row] : -INFINITY;
      return isfinite(lse) ? lse : -INFINITY;
    };
    const bool masked = o_masked != nullptr && len_kv_masked[i] > 0;
    float largest = masked ? lse_of(stats_masked, i, stats_row, true) : -INFINITY;
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t e = i * chunks + c;
      largest = fmaxf(largest, lse_of(stats_chunks, e, chunk_stats_row, len_kv_chunks[e] > 0));
    }
    float weight_sum = 0.0f, acc = 0.0f;
    if (largest > -INFINITY) {
      for (std::int64_t c = 0; c < chunks; ++c) {
        const std::int64_t e = i * chunks + c;
        const float lse = lse_of(stats_chunks, e, chunk_stats_row, len_kv_chunks[e] > 0);
        if (lse == -INFINITY) continue;
        const float w = __expf(lse - largest);
        weight_sum += w;
        acc += w * to_float(o_chunks[((e * s * group + folded_row) * (h / group) + kv_head) * d + col]);
      }
      const float lse = masked ? lse_of(stats_masked, i, stats_row, true) : -INFINITY;
      if (lse > -INFINITY) {
        const float w = __expf(lse - largest);
        weight_sum += w;
        acc += w * to_float(o_masked[((i * s + r) * h + head) * d + col]);
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

DecodeSplitComposite::Scratch DecodeSplitComposite::scratch_of(const AttentionSpec& spec, const DecodeSplit& split) {
  const auto b = static_cast<std::size_t>(spec.batch()), entries = b * static_cast<std::size_t>(split.chunks);
  const auto rows = static_cast<std::size_t>(spec.heads_q() * spec.seq_q());
  const std::size_t element = size_of(spec.q.dtype);
  const auto d_qk = static_cast<std::size_t>(spec.head_dim_qk()), d_v = static_cast<std::size_t>(spec.head_dim_v());
  const auto pages = static_cast<std::size_t>(split.chunk_pages), masked = static_cast<std::size_t>(split.final_pages);
  Scratch s{};
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t here = at;
    at += round_up(bytes);
    return here;
  };
  s.q_chunks = take(entries * rows * d_qk * element);
  s.o_chunks = take(entries * rows * d_v * element);
  s.o_masked = take(b * rows * d_v * element);
  s.stats_chunks = take(entries * rows * sizeof(float));
  s.stats_masked = take(b * rows * sizeof(float));
  s.table_k_chunks = take(entries * pages * sizeof(std::int32_t));
  s.table_v_chunks = take(entries * pages * sizeof(std::int32_t));
  s.table_k_masked = take(b * masked * sizeof(std::int32_t));
  s.table_v_masked = take(b * masked * sizeof(std::int32_t));
  s.len_q_chunks = take(entries * sizeof(std::int32_t));
  s.len_kv_chunks = take(entries * sizeof(std::int32_t));
  s.len_q_masked = take(b * sizeof(std::int32_t));
  s.len_kv_masked = take(b * sizeof(std::int32_t));
  s.bytes = at;
  return s;
}

DecodeSplitComposite::DecodeSplitComposite(const AttentionSpec& spec, DecodeSplit split)
    : spec_(spec), split_(split), chunks_(get_plan(decode_chunks_spec(spec, split), Pass::forward)),
      masked_(has_masked_call(split) ? get_plan(decode_masked_spec(spec, split), Pass::forward) : nullptr),
      inner_workspace_(round_up(std::max(chunks_->workspace_bytes(), masked_ ? masked_->workspace_bytes() : 0))),
      scratch_(scratch_of(spec, split)) {}

void DecodeSplitComposite::forward(const ForwardTensors& t, float scale, cudaStream_t stream, char* workspace) const {
  const Scratch& s = scratch_;
  char* ours = workspace + inner_workspace_;
  const std::int64_t b = spec_.batch();
  const std::int64_t group = decode_query_group(spec_);
  const Cut cut{static_cast<int>(split_.chunks), static_cast<int>(split_.chunk_pages),
                static_cast<int>(split_.final_pages), static_cast<int>(spec_.kv_pages),
                static_cast<int>(spec_.page_size()), static_cast<int>(group)};
  cut_kernel<<<static_cast<unsigned int>(b), kThreads, 0, stream>>>(
      cut, t.seq_len_q, t.seq_len_kv, t.page_table_k, t.page_table_v, at<std::int32_t>(ours, s.table_k_chunks),
      at<std::int32_t>(ours, s.table_v_chunks), at<std::int32_t>(ours, s.table_k_masked),
      at<std::int32_t>(ours, s.table_v_masked), at<std::int32_t>(ours, s.len_q_chunks),
      at<std::int32_t>(ours, s.len_kv_chunks), at<std::int32_t>(ours, s.len_q_masked),
      at<std::int32_t>(ours, s.len_kv_masked));
  check_cuda(cudaGetLastError(), "decode split: cut");
  const AttentionSpec& chunked = chunks_->spec();
  const std::int64_t q_elements = chunked.q.elements();
  copy_queries_kernel<<<grid_stride_blocks(q_elements, kThreads), kThreads, 0, stream>>>(
      make_strided(spec_.q), make_strided(chunked.q), split_.chunks, group, static_cast<const std::uint16_t*>(t.q),
      at<std::uint16_t>(ours, s.q_chunks), q_elements);
  check_cuda(cudaGetLastError(), "decode split: copy queries");

  // An inner call: the caller's pools, our partials, lengths and tables (offsets into `ours`).
  auto inner_call = [&](const void* q, std::size_t o, std::size_t stats, std::size_t len_q, std::size_t len_kv,
                        std::size_t table_k, std::size_t table_v) {
    ForwardTensors call = t;
    call.q = q;
    call.o = ours + o;
    call.stats = at<float>(ours, stats);
    call.seq_len_q = at<std::int32_t>(ours, len_q);
    call.seq_len_kv = at<std::int32_t>(ours, len_kv);
    call.page_table_k = at<std::int32_t>(ours, table_k);
    call.page_table_v = at<std::int32_t>(ours, table_v);
    return call;
  };
  const Workspace inner{workspace, inner_workspace_};
  chunks_->run(inner_call(ours + s.q_chunks, s.o_chunks, s.stats_chunks, s.len_q_chunks, s.len_kv_chunks,
                          s.table_k_chunks, s.table_v_chunks),
               scale, stream, inner);
  if (masked_) {  // on the caller's queries
    masked_->run(inner_call(t.q, s.o_masked, s.stats_masked, s.len_q_masked, s.len_kv_masked, s.table_k_masked,
                            s.table_v_masked),
                 scale, stream, inner);
  }

  const std::int64_t n = spec_.o.elements();
  const unsigned int blocks = grid_stride_blocks(n, kThreads);
  float* stats = spec_.stats ? t.stats : nullptr;
  auto merge = [&](auto* out) {
    using T = std::remove_pointer_t<decltype(out)>;
    merge_kernel<T><<<blocks, kThreads, 0, stream>>>(
        make_strided(spec_.o), out, stats, at<const T>(ours, s.o_chunks),
        masked_ ? at<const T>(ours, s.o_masked) : nullptr, at<const float>(ours, s.stats_chunks),
        at<const float>(ours, s.stats_masked), t.seq_len_q, at<const std::int32_t>(ours, s.len_kv_chunks),
        at<const std::int32_t>(ours, s.len_kv_masked), split_.chunks, group, n);
  };
  if (spec_.o.dtype == DType::bf16) {
    merge(static_cast<__nv_bfloat16*>(t.o));
  } else {
    merge(static_cast<__half*>(t.o));
  }
  check_cuda(cudaGetLastError(), "decode split: merge");
}

}  // namespace fusedattn::detail
