// A split paged decode (decode_split.h): the kernels that prepare the inner calls and merge, and the calls.
#include "exec/decode_split.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "exec/cuda_check.h"
#include "exec/device.h"
#include "exec/environment_switch.h"
#include "exec/element_conversions.cuh"
#include "exec/strided_elements.cuh"

namespace fusedattn::detail {
namespace {

constexpr std::size_t kAlign = 256;
constexpr int kThreads = 256;
constexpr int kMergeThreads = 256;  // a row's d_v / 8 column packs (d_v <= 256) times the chunk groups
// Columns of a partial O a merge thread loads at once: 16 bytes. The partials are our own dense
// buffers, 256-byte aligned, and validation holds d_v to a multiple of 8.
constexpr int kMergePack = 8;
// Partial packs a merge thread loads before the chunks' weights are known: every partial of a row
// wherever a row has at most 4 chunks per group of threads (on an H200 every split of
// decode_split.h: b = 1 takes 32 chunks, 2 for each of 16 groups of 16 threads at d_v = 128).
constexpr int kMergeAhead = 4;
// Query vectors a prepare thread loads before storing any: a whole row of the chunks' call wherever
// it has at most 4 * 256 (one query at h 32, d 128: 512 of 16 bytes).
constexpr int kPrepareAhead = 4;
std::size_t round_up(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Programmatic dependent launch (SM 9.0): our kernels are launched while the kernel before them on
// the stream is still running, and wait here, at their first instruction, until it has finished
// and its writes are visible; what is saved is the launch's latency between the two. Before any
// read or write of theirs, so they overlap nothing of the previous kernel's work.
__device__ __forceinline__ void wait_for_the_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

struct Cut {
  int chunks;           // chunks a sequence's keys take in the unmasked call
  int chunk_pages;      // pages of a chunk
  int masked_pages;     // pages of the masked call's table; 0: none
  int pages;            // entries of a row of the caller's page tables (kv_pages)
  int page_size;
  int group;            // query heads folded into one head's rows in the chunks' call
  int queries;          // s_q: every sequence's queries where the caller gives no seq_len_q
};

// Sequence i's queries: the caller's seq_len_q[i], or every one of s_q without it (attention.h).
__device__ __forceinline__ int queries_of(const std::int32_t* len_q, std::int64_t i, int all) {
  return len_q != nullptr ? len_q[i] : all;
}

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

// A ragged call's sequences (attention.h's RaggedTensors), cu_q null for dense queries: sequence i
// has cu_q[i + 1] - cu_q[i] queries and cu_kv[i + 1] - cu_kv[i] keys, its first query row (of q, O
// and the statistics) is token start[i], and its room runs to start[i + 1] (a gap past its queries
// only with padded starts). Entries from `sequences` on are empty.
struct RaggedRows {
  const std::int32_t *cu_q, *cu_kv, *start;
  int sequences;
};

__device__ int count_of(const std::int32_t* cumulative, std::int64_t i, int sequences) {
  return i < sequences ? cumulative[i + 1] - cumulative[i] : 0;
}

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

// `x` reduced by `op` over the warp, in every lane.
template <class Op>
__device__ float warp_reduce(float x, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) x = op(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// kMergePack elements of a partial O, loaded at once.
template <class T>
struct alignas(sizeof(T) * kMergePack) Pack {
  T x[kMergePack];
};

// One block per row (i, head, r) of the caller's O: the partials of the chunks with keys merged by
// their log-sum-exp. Each chunk's weight is computed once, in shared memory; then the block's
// threads are groups of d_v / 8, each group summing every groups-th chunk 8 columns at a time,
// and the groups' sums are added in shared memory. (A thread a column walking all chunks took 4.7-7.5
// µs at b = 1 and 32-35 chunks, one a thread an element 17-25 µs.) The chunks' partials are folded
// (decode_chunks_spec): dense bshd [entries, s_q * g, h / g, d_v], statistics [entries, h / g,
// s_q * g], query r of head k * g + j at row r * g + j of head k; the masked call's are dense bshd
// [b, s_q, h, d_v] and [b, h, s_q]. A row whose chunks have no keys (or a statistic that is not
// finite) gets 0 and a log-sum-exp of -inf, as the references give a row that sees no key; a dense
// row past its sequence's queries gets 0, and so does a ragged sequence's padded gap. Ragged O and
// statistics are by token: row r of sequence i is token start[i] + r.
template <class T>
__global__ void merge_kernel(Strided o, T* out, float* stats, const T* o_chunks, const T* o_masked,
                             const float* stats_chunks, const float* stats_masked, const std::int32_t* len_q,
                             RaggedRows ragged, const std::int32_t* len_kv_chunks,
                             const std::int32_t* len_kv_masked, std::int64_t chunks, std::int64_t group) {
  wait_for_the_previous_kernel();
  extern __shared__ float shared[];
  float* weights = shared;               // chunks + 1 (the masked call's last)
  float* totals = weights + chunks + 1;  // the largest log-sum-exp, the sum of the weights
  float* sums = totals + 2;              // groups * d_v
  using P = Pack<T>;
  constexpr int kPer = kMergePack;
  const std::int64_t h = o.dims[1], s = o.dims[2], d = o.dims[3];
  const std::int64_t row_id = blockIdx.x, r = row_id % s, head = row_id / s % h, i = row_id / s / h;
  const std::int64_t folded_row = r * group + head % group, kv_head = head / group;
  const std::int64_t chunk_stats_row = kv_head * s * group + folded_row, stats_row = head * s + r;
  const std::int64_t packs = d / kPer, groups = blockDim.x / packs;  // d / kPer <= blockDim.x (host)
  const std::int64_t pack = threadIdx.x % packs, my_group = threadIdx.x / packs;
  const T* first = o_chunks + ((i * chunks * s * group + folded_row) * (h / group) + kv_head) * d + pack * kPer;
  const std::int64_t chunk_stride = s * h * d;  // one entry's partial O
  // Every load that depends on no other is issued first, before any is used: the row's length and
  // this thread's first partials here, the chunks' lengths and statistics by the first warp right
  // after. A chunk without keys has a statistic and a partial that were never written: read, then
  // given the weight 0 and skipped. (Loaded one after another, each waiting on the last, they made
  // most of the merge's time.)
  const bool is_ragged = ragged.cu_q != nullptr;
  const int queries =
      is_ragged ? count_of(ragged.cu_q, i, ragged.sequences) : queries_of(len_q, i, static_cast<int>(s));
  const std::int64_t used = min(i, static_cast<std::int64_t>(ragged.sequences));
  const std::int64_t first_row = is_ragged ? ragged.start[used] : 0;  // a ragged sequence's, in tokens
  const std::int64_t room = is_ragged && i < ragged.sequences ? ragged.start[i + 1] - first_row : 0;
  const bool has_masked = o_masked != nullptr;
  P ahead[kMergeAhead];
#pragma unroll
  for (int k = 0; k < kMergeAhead; ++k) {
    const std::int64_t c = my_group + k * groups;
    if (my_group < groups && c < chunks) ahead[k] = *reinterpret_cast<const P*>(first + c * chunk_stride);
  }
  auto row_of = [&](std::int64_t row) {
    return out + i * o.strides[0] + head * o.strides[1] + (first_row + row) * o.strides[2];
  };
  auto zero = [&](T* row) {
    for (std::int64_t col = threadIdx.x; col < d; col += blockDim.x) row[col * o.strides[3]] = from_float<T>(0.0f);
  };
  // A ragged sequence's rows past its queries are the next one's, but for a padded start's gap,
  // zero as the unsplit call leaves it: this block takes gap rows r, r + s_q, r + 2 s_q, ...
  auto zero_gap = [&] {
    for (std::int64_t row = r; row < room; row += s) {
      if (row >= queries) zero(row_of(row));
    }
  };
  T* target = row_of(r);
  if (r >= queries) {  // the whole block leaves, before any barrier
    if (is_ragged) {
      zero_gap();
    } else {
      zero(target);
    }
    return;
  }
  // The first warp weighs the chunks, reducing by shuffles; the block then meets at one barrier (two
  // block-wide reductions took four).
  if (threadIdx.x < 32) {
    float largest = -INFINITY;
    for (std::int64_t c = threadIdx.x; c <= chunks; c += 32) {
      const bool chunk = c < chunks;
      float lse = -INFINITY;
      if (chunk || has_masked) {
        const int keys = chunk ? len_kv_chunks[i * chunks + c] : len_kv_masked[i];
        const float stat =
            chunk ? stats_chunks[(i * chunks + c) * h * s + chunk_stats_row] : stats_masked[i * h * s + stats_row];
        lse = keys > 0 && isfinite(stat) ? stat : -INFINITY;
      }
      weights[c] = lse;
      largest = fmaxf(largest, lse);
    }
    largest = warp_reduce(largest, [](float a, float b) { return fmaxf(a, b); });
    float sum = 0.0f;
    for (std::int64_t c = threadIdx.x; c <= chunks; c += 32) {
      const float w = largest > -INFINITY && weights[c] > -INFINITY ? __expf(weights[c] - largest) : 0.0f;
      weights[c] = w;
      sum += w;
    }
    sum = warp_reduce(sum, [](float a, float b) { return a + b; });
    if (threadIdx.x == 0) {
      totals[0] = largest;
      totals[1] = sum;
    }
  }
  __syncthreads();
  const float largest = totals[0], sum = totals[1];

  if (my_group < groups) {
    float acc[kPer] = {};
    auto add = [&](float w, const P& v) {
#pragma unroll
      for (int k = 0; k < kPer; ++k) acc[k] += w * to_float(v.x[k]);
    };
#pragma unroll
    for (int k = 0; k < kMergeAhead; ++k) {
      const std::int64_t c = my_group + k * groups;
      if (c < chunks && weights[c] != 0.0f) add(weights[c], ahead[k]);
    }
    for (std::int64_t c = my_group + kMergeAhead * groups; c < chunks; c += groups) {
      const float w = weights[c];
      if (w != 0.0f) add(w, *reinterpret_cast<const P*>(first + c * chunk_stride));
    }
    if (has_masked && my_group == 0 && weights[chunks] != 0.0f) {
      add(weights[chunks], *reinterpret_cast<const P*>(o_masked + ((i * s + r) * h + head) * d + pack * kPer));
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) sums[my_group * d + pack * kPer + k] = acc[k];
  }
  __syncthreads();
  for (std::int64_t col = threadIdx.x; col < d; col += blockDim.x) {
    float acc = 0.0f;
    for (std::int64_t g = 0; g < groups; ++g) acc += sums[g * d + col];
    target[col * o.strides[3]] = from_float<T>(sum > 0.0f ? acc / sum : 0.0f);
  }
  if (stats != nullptr && threadIdx.x == 0) {  // dense [b, h, s_q]; ragged by token, [T, h]
    const std::int64_t at = is_ragged ? (first_row + r) * h + head : i * h * s + stats_row;
    stats[at] = sum > 0.0f ? largest + __logf(sum) : -INFINITY;
  }
  if (is_ragged) zero_gap();
}

template <class P>
P* at(char* base, std::size_t offset) {
  return reinterpret_cast<P*>(base + offset);
}

// Whether this file's kernels may be launched early (wait_for_the_previous_kernel) on the current
// device: only where the code that runs is SM 9.0's, which waits; on older GPUs, or from PTX built
// for them, they serialize as usual. FUSEDATTN_DECODE_EARLY_LAUNCH=0 (read once) serializes always,
// for the diagnostic's comparison.
bool early_launch_here() {
  static const bool enabled = switch_on_unless_zero("FUSEDATTN_DECODE_EARLY_LAUNCH");
  cudaFuncAttributes attributes{};  // every kernel of this file is built for the same architectures
  return enabled && cudaFuncGetAttributes(&attributes, merge_kernel<__nv_bfloat16>) == cudaSuccess &&
         attributes.binaryVersion >= 90;
}

// kernel<<<blocks, threads, shared, stream>>>(args...), launched early where `early` (early_launch_here).
template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), bool early, unsigned int blocks, unsigned int threads,
                   std::size_t shared, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  config.attrs = early ? &attribute : nullptr;
  config.numAttrs = early ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
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
      scratch_(scratch_of(spec, split)), early_launch_(early_launch_here()) {}

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
    return launch(kernel, early_launch_, blocks, kThreads, 0, stream, cut, q_desc, heads, from, t.seq_len_q,
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

  const auto rows = static_cast<unsigned int>(spec_.o.elements() / spec_.head_dim_v());  // one block each
  // Groups of d_v / 8 threads, no more groups than chunks: with few chunks and many rows (b = 4,
  // 8 queries on an H200: 4 chunks, 1024 rows) idle groups would cost their share of the sums.
  const std::int64_t d_v = spec_.head_dim_v(), packs = d_v / kMergePack;
  const std::int64_t wanted = std::min<std::int64_t>(kMergeThreads / packs, split_.chunks) * packs;
  const auto threads = static_cast<unsigned int>(std::min<std::int64_t>((wanted + 31) / 32 * 32, kMergeThreads));
  const std::int64_t groups = threads / packs;  // as the kernel counts them
  const std::size_t shared = (static_cast<std::size_t>(split_.chunks) + 1 + 2 + groups * d_v) * sizeof(float);
  float* stats = spec_.stats ? t.stats : nullptr;
  auto merge = [&](auto* out) {
    using T = std::remove_pointer_t<decltype(out)>;
    return launch(merge_kernel<T>, early_launch_, rows, threads, shared, stream, make_strided(spec_.o), out, stats,
                  at<const T>(ours, s.o_chunks), masked_ ? at<const T>(ours, s.o_masked) : nullptr,
                  at<const float>(ours, s.stats_chunks), at<const float>(ours, s.stats_masked), t.seq_len_q, ragged,
                  at<const std::int32_t>(ours, s.len_kv_chunks), at<const std::int32_t>(ours, s.len_kv_masked),
                  split_.chunks, group);
  };
  check_cuda(spec_.o.dtype == DType::bf16 ? merge(static_cast<__nv_bfloat16*>(t.o)) : merge(static_cast<__half*>(t.o)),
             "decode split: merge");
}

}  // namespace fusedattn::detail
