// The decode kernel's rule (decode_kernel_rule.h): what it takes, how it is cut, and whether it is
// expected faster than cuDNN's path, with the numbers the choice rests on.
#include "support/decode_kernel_rule.h"

#include <algorithm>
#include <cmath>

#include "spec/text.h"
#include "support/decode_split.h"

namespace fusedattn::detail {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// --- The cost model, in microseconds (H200 numbers; an SM's share scales with the SM count) -------
//
// Memory: an SM's share of the copy bandwidth, 4.22 TB/s measured on the H200 over 132 SMs. The
// kernel is expected to read K/V at that rate once enough blocks stream (a pure read stream, as
// cuDNN's reaches: below); that is its design target, which bench/decode_kernel_bandwidth.cpp
// measures.
constexpr double kSmBytesPerUs = 4.22e6 / 132;
// A block keeps stages - 1 tiles in flight; each takes about one round trip to memory, so a block
// alone streams (stages - 1) * tile bytes a round trip: 64 KB/us of 16-bit K/V at d = 128.
constexpr double kRoundTripUs = 1.0;
// Tensor cores through mma.sync: 1,024 multiply-adds a clock an SM at 1.755 GHz, of which the
// kernel is expected to keep half busy beside its softmax, loads and barriers. Only rows of many
// queries make this bind: 16 queries of a group of 8 take 256 multiply-adds per 16-bit K/V byte pair.
constexpr double kSmFmaPerUs = 0.5 * 1024 * 1755;
// The launch and the first round trip before anything streams, and the merge (launched early,
// it waits for the kernel and then reads each row's partials once): expected, not yet measured.
constexpr double kStartUs = 1.5;
constexpr double kMergeUs = 1.5;

// cuDNN's paths, measured on the H200 (h 32/8, d 128, 64-token pages; copy 4.22 TB/s):
// - the split decode (support/decode_split.h) at b = 1 over 8k keys: prepare 2.6 us, cuDNN's kernel
//   10.8 us for 7.95 us of bytes at the copy rate (2.85 more), merge 3.8 us: fixed 9.3 us. Its
//   whole call reads one query's K/V at 1.05 of the copy rate once long (b = 8 over 32k: 251 us
//   for 1,074 MB, 242 beyond the fixed cost); several queries at 0.75 (b = 8 with 16 queries at
//   8k: 84 us, 0.85 beyond the fixed cost; b = 1 with 16 at 32k: 57.2 us, 0.66).
// - unsplit paged calls (batches that fill the GPU): 0.86 of the copy rate at b = 64.
// - contiguous caches, PyTorch's cuDNN call on the same K/V: 11.5 us at 1 x 8k, 65.7 at 8 x 8k,
//   241 at 8 x 32k: about 4 us fixed and 1.07 of the copy rate.
constexpr double kCudnnSplitFixedUs = 9.3;
constexpr double kCudnnSplitOneQuery = 1.05;
constexpr double kCudnnSeveralQueries = 0.75;
constexpr double kCudnnPagedFixedUs = 2.85;
constexpr double kCudnnPagedOneQuery = 0.86;
constexpr double kCudnnDenseFixedUs = 4.0;
constexpr double kCudnnDenseOneQuery = 1.07;

// Shared memory an SM has, and the most a block may ask for, by SM version (CUDA's tables).
std::int64_t shared_per_sm(const DeviceCaps& caps) {
  if (caps.sm() == 80 || caps.sm() == 87) return 164 * 1024;
  if (caps.sm_major == 9 || caps.sm_major == 10) return 228 * 1024;
  return 100 * 1024;  // 8.6, 8.9, 12.x
}
std::int64_t shared_per_block(const DeviceCaps& caps) { return shared_per_sm(caps) - 1024; }
constexpr std::int64_t kReservedPerBlock = 1024;  // the system's share of each block's shared memory

std::int64_t kv_bytes(const AttentionSpec& spec) { return static_cast<std::int64_t>(size_of(spec.k.dtype)); }
std::int64_t group_of(const AttentionSpec& spec) { return spec.heads_q() / spec.heads_kv(); }
std::int64_t rows_of(const AttentionSpec& spec) { return spec.seq_q() * group_of(spec); }

// 1, 2, 4 or 8 tiles of 16 rows (a power of two, so the warps divide evenly), and the warps sharing a
// row tile: 4 warps a block at least, each of one row tile and 64 / key_groups keys of a tile.
DecodeKernelShape rows_shape(const AttentionSpec& spec, const DeviceCaps& caps) {
  DecodeKernelShape shape;
  const std::int64_t tiles = ceil_div(rows_of(spec), 16);
  shape.row_tiles = tiles <= 1 ? 1 : tiles <= 2 ? 2 : tiles <= 4 ? 4 : 8;
  shape.key_groups = std::max(1, 4 / shape.row_tiles);
  const int warps = shape.row_tiles * shape.key_groups;
  shape.threads = 32 * warps;
  shape.shared_bytes = decode_kernel_shared_bytes(spec.head_dim_v(), kv_bytes(spec), warps);
  // Registers: ptxas gives the kernel 134 to 250 a thread (sm_90), so count 256 of an SM's 65,536:
  // two blocks of 128 threads, one of 256.
  const std::int64_t by_registers = 65536 / (256 * shape.threads);
  const std::int64_t by_shared = shared_per_sm(caps) / (shape.shared_bytes + kReservedPerBlock);
  shape.blocks_per_sm = static_cast<int>(std::max<std::int64_t>(1, std::min(by_registers, by_shared)));
  return shape;
}

bool multiple_of(std::int64_t value, std::int64_t of) { return value % of == 0; }
bool strides_multiple_of(const TensorDesc& desc, std::int64_t of) {
  return multiple_of(desc.strides[kBatch], of) && multiple_of(desc.strides[kHead], of) &&
         multiple_of(desc.strides[kSeq], of);
}

}  // namespace

std::vector<Reason> decode_kernel_refusals(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps) {
  std::vector<Reason> out;
  auto refuse = [&](const char* field, const std::string& value, const std::string& requirement) {
    out.push_back({field, value, requirement + " in fusedattn's decode kernel", ""});
  };
  if (pass != Pass::forward) refuse("pass", to_string(pass), "the forward pass (decode is inference)");
  if (caps.sm() < 80) refuse("device", "SM " + std::to_string(caps.sm_major) + "." + std::to_string(caps.sm_minor), "SM 8.0 or newer");
  if (is_fp8(spec.q.dtype)) refuse("dtype", to_string(spec.q.dtype), "f16 or bf16 queries");
  if (spec.k.dtype != spec.q.dtype && spec.k.dtype != DType::e4m3) {
    refuse("k.dtype", to_string(spec.k.dtype), "K/V in q's dtype or e4m3");
  }
  if (spec.head_dim_qk() != spec.head_dim_v() || (spec.head_dim_qk() != 64 && spec.head_dim_qk() != 128)) {
    refuse("d_qk", std::to_string(spec.head_dim_qk()) + " (d_v " + std::to_string(spec.head_dim_v()) + ")",
           "d_qk = d_v = 64 or 128");
  }
  if (spec.seq_q() > kDecodeKernelMaxQueries) {
    refuse("s_q", std::to_string(spec.seq_q()), "at most " + std::to_string(kDecodeKernelMaxQueries) + " queries");
  } else if (rows_of(spec) > kDecodeKernelMaxRows) {
    refuse("s_q", std::to_string(spec.seq_q()) + " (h_q / h_kv = " + std::to_string(group_of(spec)) + ")",
           "at most " + std::to_string(kDecodeKernelMaxRows) + " rows of s_q * h_q / h_kv");
  }
  if (spec.ragged_q() || spec.ragged_kv()) refuse("layout", "ragged", "dense q, o, k and v (a batch stride)");
  if (spec.paged_kv() && !multiple_of(spec.page_size(), 16)) {
    refuse("page_size", std::to_string(spec.page_size()), "a multiple of 16");
  }
  if (spec.softmax != Softmax::vanilla) refuse("softmax", to_string(spec.softmax), "softmax=vanilla");
  if (spec.bias != Bias::none) refuse("bias", to_string(spec.bias), "no bias");
  if (spec.alibi) refuse("alibi", "1", "no ALiBi");
  if (spec.dropout > 0.0) refuse("dropout", format_double(spec.dropout), "no dropout");
  if (!spec.score_mod.empty()) refuse("score_mod", to_string(spec.score_mod), "no score modifier");
  if (spec.max_logit != MaxLogit::none) refuse("max_logit", to_string(spec.max_logit), "no max logit");
  if (!strides_multiple_of(spec.q, 8) || !strides_multiple_of(spec.o, 8)) {
    refuse("q.strides", "q " + to_string(spec.q) + ", o " + to_string(spec.o),
           "q and o strides multiples of 8 elements (rows of 16 bytes)");
  }
  const std::int64_t kv_vector = 16 / kv_bytes(spec);
  if (!strides_multiple_of(spec.k, kv_vector) || !strides_multiple_of(spec.v, kv_vector)) {
    refuse("k.strides", "k " + to_string(spec.k) + ", v " + to_string(spec.v), "K/V strides multiples of 16 bytes");
  }
  if (out.empty() && rows_shape(spec, caps).shared_bytes > shared_per_block(caps)) {
    refuse("device", "SM " + std::to_string(caps.sm()), "room for the kernel's shared memory");
  }
  return out;
}

double decode_kernel_expected_us(const AttentionSpec& spec, const DecodeKernelShape& shape, const DecodeDevice& device) {
  const double sms = std::max(device.multiprocessors, 1);
  const double b = static_cast<double>(spec.batch()), h_kv = static_cast<double>(spec.heads_kv());
  const double d = static_cast<double>(spec.head_dim_v()), kv = static_cast<double>(kv_bytes(spec));
  const double chunks = static_cast<double>(shape.chunks), keys = static_cast<double>(shape.chunk_keys);
  const double rows = static_cast<double>(rows_of(spec));
  // Partials: float32 O rows and a statistic, written by the kernel and read by the merge.
  const double partial_bytes = shape.merged() ? rows * (d + 1) * 4 : 0.0;
  const double cache_bytes = static_cast<double>(spec.seq_kv()) * 2 * d * kv;
  // The GPU's rate counts the SMs that get a block (blocks are placed one an SM first): a call of
  // fewer blocks than SMs leaves the rest idle, whatever its blocks could draw alone.
  const double blocks = b * h_kv * chunks, slots = sms * shape.blocks_per_sm;
  const double memory_us = b * h_kv * (cache_bytes + 2 * chunks * partial_bytes) / (std::min(blocks, sms) * kSmBytesPerUs);
  // A block's own time: its bytes at what its pipeline keeps in flight, or its multiply-adds (16
  // rows a tile, padded) at its share of the SM's tensor cores.
  const double stage_bytes = static_cast<double>(kDecodeTileKeys) * 2 * d * kv;
  const double block_rate = (decode_kernel_stages(kv_bytes(spec)) - 1) * stage_bytes / kRoundTripUs;
  const double block_fma = 2.0 * 16 * shape.row_tiles * d * keys;
  const double block_us = std::max((keys * 2 * d * kv + partial_bytes) / block_rate,
                                   block_fma * shape.blocks_per_sm / kSmFmaPerUs);
  const double waves = std::ceil(blocks / slots);
  return kStartUs + std::max(memory_us, waves * block_us) + (shape.merged() ? kMergeUs : 0.0);
}

DecodeKernelShape decode_kernel_shape(const AttentionSpec& spec, const DecodeDevice& device) {
  DecodeKernelShape best = rows_shape(spec, device.caps);
  const std::int64_t keys = std::max<std::int64_t>(spec.seq_kv(), 1);
  best.chunk_keys = ceil_div(keys, kDecodeTileKeys) * kDecodeTileKeys;
  double best_us = decode_kernel_expected_us(spec, best, device);
  // Every count of chunks of at least kDecodeKernelMinChunkKeys whole tiles; the first of equal
  // times (fewer chunks) wins.
  for (std::int64_t asked = 2; asked <= ceil_div(keys, kDecodeKernelMinChunkKeys); ++asked) {
    DecodeKernelShape shape = best;
    shape.chunk_keys = ceil_div(ceil_div(keys, asked), kDecodeTileKeys) * kDecodeTileKeys;
    shape.chunks = ceil_div(keys, shape.chunk_keys);
    if (shape.chunks != asked) continue;  // the same cut as a smaller count's
    const double us = decode_kernel_expected_us(spec, shape, device);
    if (us < best_us) {
      best = shape;
      best_us = us;
    }
  }
  return best;
}

double cudnn_decode_expected_us(const AttentionSpec& spec, const DecodeDevice& device) {
  const double bytes = static_cast<double>(spec.batch() * spec.heads_kv() * spec.seq_kv() *
                                           (spec.head_dim_qk() + spec.head_dim_v()) * kv_bytes(spec));
  const double copy_us = bytes / (std::max(device.multiprocessors, 1) * kSmBytesPerUs);
  const bool one_query = spec.seq_q() == 1;
  if (!spec.paged_kv()) return kCudnnDenseFixedUs + copy_us / (one_query ? kCudnnDenseOneQuery : kCudnnSeveralQueries);
  if (decode_split(spec, Pass::forward, device.multiprocessors).split()) {
    return kCudnnSplitFixedUs + copy_us / (one_query ? kCudnnSplitOneQuery : kCudnnSeveralQueries);
  }
  return kCudnnPagedFixedUs + copy_us / (one_query ? kCudnnPagedOneQuery : kCudnnSeveralQueries);
}

bool decode_kernel_preferred(const AttentionSpec& spec, Pass pass, const DecodeDevice& device) {
  if (!decode_kernel_refusals(spec, pass, device.caps).empty()) return false;
  if (spec.fp8_kv_cache()) return true;
  // Contiguous caches stay with cuDNN's one call: it reads them at 1.07 of the copy rate with 4 us
  // fixed, so the kernel's whole margin there is the model's 1.5 us start against 4, too thin to
  // rest on an expectation. Paged caches are where cuDNN's split decode pays 9.3 us fixed and 0.75
  // of the rate with several queries.
  if (!spec.paged_kv()) return false;
  return decode_kernel_expected_us(spec, decode_kernel_shape(spec, device), device) <
         cudnn_decode_expected_us(spec, device);
}

void fp8_kv_cache_rule(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, std::vector<Reason>& out) {
  if (!spec.fp8_kv_cache()) return;
  for (Reason reason : decode_kernel_refusals(spec, pass, caps)) {
    reason.requirement += " (an FP8 K/V cache beside " + std::string(to_string(spec.q.dtype)) +
                          " queries runs only there; cuDNN takes none)";
    out.push_back(std::move(reason));
  }
}

std::string decode_kernel_description(const DecodeKernelShape& shape) {
  std::string out = "fusedattn decode kernel, " + std::to_string(shape.chunks) + " chunk" +
                    (shape.chunks > 1 ? "s" : "") + " of " + std::to_string(shape.chunk_keys) + " keys";
  return shape.merged() ? out + " merged" : out;
}

}  // namespace fusedattn::detail
