// A split paged decode (decode_split.h): the kernel that prepares the inner calls, the calls, and the
// merge of their partials (decode_merge.h).
#include "exec/decode_split.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "exec/cuda_check.h"
#include "exec/decode_launch.cuh"
#include "exec/device.h"
#include "exec/environment_switch.h"
#include "exec/element_conversions.cuh"
#include "exec/strided_elements.cuh"

namespace fusedattn::detail {
namespace {

constexpr std::size_t kAlign = 256;
constexpr int kThreads = 256;
// Query vectors a prepare thread loads before storing any: a whole row of the chunks' call wherever
// it has at most 4 * 256 (one query at h 32, d 128: 512 of 16 bytes).
constexpr int kPrepareAhead = 4;
std::size_t round_up(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

struct Cut {
  int chunks;           // chunks a sequence's keys take in the unmasked call
  int chunk_pages;      // pages of a chunk
  int masked_pages;     // pages of the masked call's table; 0: none
  int pages;            // entries of a row of the caller's page tables (kv_pages)
  int page_size;
  int group;            // query heads folded into one head's rows in the chunks' call
  int queries;          // s_q: every sequence's queries where the caller gives no seq_len_q
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

// What the inner calls read besides the caller's pools: the chunks' queries, lengths and tables,
// and the masked call's lengths and tables (and its queries, copied dense from ragged ones; else null).
struct InnerArrays {
  std::uint16_t *q_chunks, *q_masked;
  std::int32_t *len_q_chunks, *len_kv_chunks, *table_k_chunks, *table_v_chunks;
  std::int32_t *len_q_masked, *len_kv_masked, *table_k_masked, *table_v_masked;
};

// The inner calls' arrays, in one launch (the cut's launch of its own took 1.1-4.6 µs at b = 1,
// beside cuDNN's 11-124). One block per row of the chunks' call: entry e = i * chunks
// + c is sequence i's, folded (decode_chunks_spec): q_chunks' dense bshd [e, t * g + j, k, x] is
// q's logical (i, k * g + j, t, x), which the block's threads copy `Vector` at a time (16 bytes
// where q's rows are contiguous and aligned; a thread an element that divided its index into four
// axes twice took 35 µs with 16 queries). Row 0's block also writes entry e's length and table
// slice, and chunk 0's the masked call's for sequence i. Ragged queries are read from their
// sequence's tokens (rows past its queries are left as they are: no call reads them), and chunk 0's
// blocks also copy them dense, unfolded, for the masked call: q_masked [i, t, k * g + j, x].
template <class Vector>
__global__ void prepare_kernel(Cut cut, Strided q, std::int64_t heads, const std::uint16_t* from,
                               const std::int32_t* len_q, const std::int32_t* len_kv, RaggedRows ragged,
                               const std::int32_t* table_k, const std::int32_t* table_v, InnerArrays out) {
  wait_for_the_previous_kernel();
  constexpr int kPer = sizeof(Vector) / sizeof(std::uint16_t);
  const std::int64_t group = cut.group, s_q = q.dims[2], d = q.dims[3], rows = s_q * group;
  const std::int64_t e = blockIdx.x / rows, row = blockIdx.x % rows;
  const std::int64_t i = e / cut.chunks, c = e % cut.chunks, t = row / group, j = row % group;
  const std::int64_t vectors = d / kPer, count = heads * vectors;
  const bool is_ragged = ragged.cu_q != nullptr;
  // Sequence i's queries (a ragged one's first is token `first_row` of q; a dense batch stride places it).
  const std::int64_t first_row = is_ragged ? ragged.start[min(i, static_cast<std::int64_t>(ragged.sequences))] : 0;
  const int ragged_queries = is_ragged ? count_of(ragged.cu_q, i, ragged.sequences) : 0;
  const bool copy = !is_ragged || t < ragged_queries;
  const std::uint16_t* source = from + i * q.strides[0] + (first_row + t) * q.strides[2] + j * q.strides[1];
  std::uint16_t* target = out.q_chunks + static_cast<std::int64_t>(blockIdx.x) * heads * d;
  auto source_of = [&](std::int64_t n) {  // head k of the chunks' call is q's head k * g + j
    const std::int64_t head = n / vectors, x = n % vectors * kPer;
    return reinterpret_cast<const Vector*>(source + head * group * q.strides[1] + x * q.strides[3]);
  };
  auto target_of = [&](std::int64_t n) {
    return reinterpret_cast<Vector*>(target + n / vectors * d + n % vectors * kPer);
  };
  std::uint16_t* masked =
      out.q_masked != nullptr && c == 0 ? out.q_masked + (i * s_q + t) * heads * group * d : nullptr;
  auto masked_of = [&](std::int64_t n) {  // q_masked's [i, t, k * g + j, x]
    return reinterpret_cast<Vector*>(masked + (n / vectors * group + j) * d + n % vectors * kPer);
  };
  // Every load that depends on no other is issued here, before any store: the thread's first query
  // vectors, and in row 0 the lengths and the thread's first page of each table. (Loaded after the
  // stores before them, as written in order, they took three round trips to memory one after another.)
  Vector ahead[kPrepareAhead];
#pragma unroll
  for (int k = 0; k < kPrepareAhead; ++k) {
    const std::int64_t n = threadIdx.x + static_cast<std::int64_t>(k) * blockDim.x;
    if (copy && n < count) ahead[k] = *source_of(n);
  }
  const bool lengths_row = row == 0;
  const std::int64_t table_row = i * cut.pages;
  const int my_page = static_cast<int>(threadIdx.x);  // of chunk c's
  int queries = 0, keys = 0;
  std::int32_t page_k = 0, page_v = 0;
  if (lengths_row) {
    queries = is_ragged ? ragged_queries : queries_of(len_q, i, cut.queries);
    keys = is_ragged ? count_of(ragged.cu_kv, i, ragged.sequences) : len_kv[i];
    if (my_page < cut.chunk_pages) {
      page_k = page_of(table_k, table_row, static_cast<int>(c) * cut.chunk_pages + my_page, cut.pages);
      page_v = page_of(table_v, table_row, static_cast<int>(c) * cut.chunk_pages + my_page, cut.pages);
    }
  }
#pragma unroll
  for (int k = 0; k < kPrepareAhead; ++k) {
    const std::int64_t n = threadIdx.x + static_cast<std::int64_t>(k) * blockDim.x;
    if (!copy || n >= count) continue;
    *target_of(n) = ahead[k];
    if (masked != nullptr) *masked_of(n) = ahead[k];
  }
  const std::int64_t rest = threadIdx.x + static_cast<std::int64_t>(kPrepareAhead) * blockDim.x;
  for (std::int64_t n = rest; copy && n < count; n += blockDim.x) {
    const Vector v = *source_of(n);
    *target_of(n) = v;
    if (masked != nullptr) *masked_of(n) = v;
  }
  if (!lengths_row) return;
  const int unmasked = unmasked_keys(keys, queries, cut);
  if (my_page < cut.chunk_pages) {
    out.table_k_chunks[e * cut.chunk_pages + my_page] = page_k;
    out.table_v_chunks[e * cut.chunk_pages + my_page] = page_v;
  }
  for (int n = my_page + static_cast<int>(blockDim.x); n < cut.chunk_pages; n += blockDim.x) {  // the rest of them
    const int page = static_cast<int>(c) * cut.chunk_pages + n;
    out.table_k_chunks[e * cut.chunk_pages + n] = page_of(table_k, table_row, page, cut.pages);
    out.table_v_chunks[e * cut.chunk_pages + n] = page_of(table_v, table_row, page, cut.pages);
  }
  if (threadIdx.x == 0) {
    const int chunk_keys = cut.chunk_pages * cut.page_size;
    const int chunk = min(max(unmasked - static_cast<int>(c) * chunk_keys, 0), chunk_keys);
    out.len_kv_chunks[e] = chunk;
    out.len_q_chunks[e] = chunk > 0 ? queries * cut.group : 0;  // folded rows; an entry without keys computes nothing
  }
  if (cut.masked_pages == 0 || c != 0) return;
  const int first = unmasked / cut.page_size;  // the masked keys start at a page
  for (int n = static_cast<int>(threadIdx.x); n < cut.masked_pages; n += blockDim.x) {
    out.table_k_masked[i * cut.masked_pages + n] = page_of(table_k, table_row, first + n, cut.pages);
    out.table_v_masked[i * cut.masked_pages + n] = page_of(table_v, table_row, first + n, cut.pages);
  }
  if (threadIdx.x == 0) {
    out.len_kv_masked[i] = keys - unmasked;
    out.len_q_masked[i] = keys - unmasked > 0 ? queries : 0;
  }
}

template <class P>
P* at(char* base, std::size_t offset) {
  return reinterpret_cast<P*>(base + offset);
}

}  // namespace

DecodeSplit decode_split_in_use(const AttentionSpec& spec, Pass pass, int device) {
  static const bool enabled = switch_on_unless_zero("FUSEDATTN_SPLIT_DECODE");
  static const std::int64_t forced_chunks = count_in_environment("FUSEDATTN_SPLIT_DECODE");
  if (!enabled || pass != Pass::forward || !spec.paged_kv()) return {};
  const DecodeSplit rule = decode_split(spec, pass, multiprocessor_count(device));
  // Only where the rule splits: the inner calls, which it never splits, must stay whole.
  return rule.split() && forced_chunks >= 2 ? decode_split_in_chunks(spec, pass, forced_chunks) : rule;
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
  s.q_masked = take(spec.ragged_q() && has_masked_call(split) ? b * rows * d_qk * element : 0);
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
      scratch_(scratch_of(spec, split)), early_launch_(decode_early_launch()) {}

void DecodeSplitComposite::forward(const ForwardTensors& t, float scale, cudaStream_t stream, char* workspace) const {
  const Scratch& s = scratch_;
  char* ours = workspace + inner_workspace_;
  const std::int64_t b = spec_.batch();
  const std::int64_t group = decode_query_group(spec_);
  const Cut cut{static_cast<int>(split_.chunks), static_cast<int>(split_.chunk_pages),
                static_cast<int>(split_.final_pages), static_cast<int>(spec_.kv_pages),
                static_cast<int>(spec_.page_size()), static_cast<int>(group), static_cast<int>(spec_.seq_q())};
  // A row of the chunks' call a block; 16-byte vectors where q's rows allow (validation holds d to a
  // multiple of 8 and its stride to 1, and q's pointer to 16 bytes; a spec's own strides need not
  // keep every row start at a multiple of 8 elements).
  const std::int64_t heads = spec_.heads_q() / group;  // of the chunks' call
  const auto blocks = static_cast<unsigned int>(b * split_.chunks * spec_.seq_q() * group);
  const Strided q_desc = make_strided(spec_.q);
  const std::int64_t* q_strides = q_desc.strides;
  const bool vectors = q_strides[0] % 8 == 0 && q_strides[1] % 8 == 0 && q_strides[2] % 8 == 0;
  const auto* from = static_cast<const std::uint16_t*>(t.q);
  const bool copy_masked = spec_.ragged_q() && masked_ != nullptr;  // the masked call's dense queries
  const InnerArrays arrays{at<std::uint16_t>(ours, s.q_chunks),
                           copy_masked ? at<std::uint16_t>(ours, s.q_masked) : nullptr,
                           at<std::int32_t>(ours, s.len_q_chunks),
                           at<std::int32_t>(ours, s.len_kv_chunks),
                           at<std::int32_t>(ours, s.table_k_chunks),
                           at<std::int32_t>(ours, s.table_v_chunks),
                           at<std::int32_t>(ours, s.len_q_masked),
                           at<std::int32_t>(ours, s.len_kv_masked),
                           at<std::int32_t>(ours, s.table_k_masked),
                           at<std::int32_t>(ours, s.table_v_masked)};
  const RaggedTensors& r = t.ragged;  // ragged queries: their sequences (attention.h); else none
  const std::int32_t* starts = r.cu_seqlens_q_padded ? r.cu_seqlens_q_padded : r.cu_seqlens_q;
  const RaggedRows ragged = spec_.ragged_q()
                                ? RaggedRows{r.cu_seqlens_q, r.cu_seqlens_kv, starts, static_cast<int>(r.sequences)}
                                : RaggedRows{nullptr, nullptr, nullptr, 0};
  auto prepare = [&](auto kernel) {
    return launch(kernel, early_launch_, dim3(blocks), kThreads, 0, stream, cut, q_desc, heads, from, t.seq_len_q,
                  t.seq_len_kv, ragged, t.page_table_k, t.page_table_v, arrays);
  };
  check_cuda(vectors ? prepare(prepare_kernel<uint4>) : prepare(prepare_kernel<std::uint16_t>),
             "decode split: prepare the inner calls");

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
  const auto partials = Plan::RowsPastLengths::untouched;  // the merge reads the rows within the lengths only
  const auto executed = Plan::Recording::executed;          // never replayed (attention.h says why)
  chunks_->run(inner_call(ours + s.q_chunks, s.o_chunks, s.stats_chunks, s.len_q_chunks, s.len_kv_chunks,
                          s.table_k_chunks, s.table_v_chunks),
               scale, stream, inner, partials, executed);
  if (masked_) {  // on the caller's queries (ragged ones: their dense copy)
    const void* q = copy_masked ? ours + s.q_masked : t.q;
    masked_->run(inner_call(q, s.o_masked, s.stats_masked, s.len_q_masked, s.len_kv_masked, s.table_k_masked,
                            s.table_v_masked),
                 scale, stream, inner, partials, executed);
  }

  DecodePartials merged;
  merged.o = ours + s.o_chunks;
  merged.stats = at<const float>(ours, s.stats_chunks);
  merged.keys = at<const std::int32_t>(ours, s.len_kv_chunks);
  merged.chunks = split_.chunks;
  merged.group = group;
  if (masked_) {
    merged.o_masked = ours + s.o_masked;
    merged.stats_masked = at<const float>(ours, s.stats_masked);
    merged.keys_masked = at<const std::int32_t>(ours, s.len_kv_masked);
  }
  merge_decode_partials(spec_, merged, t.seq_len_q, ragged, t.o, spec_.stats ? t.stats : nullptr, early_launch_,
                        stream);
}

}  // namespace fusedattn::detail
