// How fusedattn's decode kernel is cut (decode_kernel_rule.h): its shape before any cut, the cost
// model that ranks the cuts of one spec, and whether a cut's chunks merge inside the kernel. Pure
// functions of the spec and the GPU, tested on the CPU with worked numbers
// (tests/cpu/test_decode_kernel_rule.cpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

#include "support/decode_kernel_rule.h"

namespace fusedattn::detail {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// --- The cost model of the kernel's cut, in microseconds (an SM's share scales with the SM count) --
//
// It ranks the cuts of one spec against each other; it is not the kernel's speed, which the rule
// takes from measurements (decode_kernel_preferred). Its block rates and merge costs are fitted to
// the cuts measured on an H100 at b7777ee (bench/profile_decode_kernels.py --kernel-cuts; fusedattn.torch,
// contiguous, h 32/8, d 128, one query: 4 rows, the keys as M; CUDA graphs, microseconds, "cl" merged
// in clusters, the rest by the merge kernel): b = 1 over 2k 12.3 in 4 cl, 10.2 in 8 cl, 10.7 in 16,
// 10.8 in 32 (PyTorch's dense call 9.6); over 8k 28.0 in 4 cl, 18.1 in 8 cl, 15.0 in 16, 14.4 in 32
// (14.0); over 32k 91.2 in 4 cl, 52.3 in 8 cl, 52.9 in 16, 54.5 in 32 (53.0); b = 2 over 8k 31.8 in 4
// cl, 31.7 in 8 cl, 32.3 in 16, 33.7 in 32 (31.3); b = 8 over 8k 97.7 in 4, 99.4 in 8, 100.6 in 16,
// 103.1 in 32 (96.2). The 16-row layout's rate is from 45f256c (b = 1 over 8k: 22.0 in 8, 17.3 in 16).
//
// Memory: the copy bandwidth, 4.22 TB/s measured on the H200, and an SM's share of it over 132 SMs.
constexpr double kGpuBytesPerUs = 4.22e6;
constexpr double kSmBytesPerUs = kGpuBytesPerUs / 132;
// A block keeps stages - 1 tiles in flight and streams about one a kTileUs each. With the keys as M
// (8 rows or fewer) 1.36 us: 47 KB/us of 16-bit K/V at d = 128, what each of 32 blocks, one an SM,
// drew alone at b = 1 over 32k keys in 4 chunks (4 MB each in about 89 us of the call's 91.2), and
// what the steps from 256 to 1,024 and 4,096 keys a block gave in 8 chunks (7.9 us for 384 KB, 34.2
// for 1.5 MB). With the rows as M, 2.8 us: 23 KB/us, what one block an SM drew at b = 1 over 8k in
// 16 chunks at 45f256c (256 KB in about 11.8 us). Its warps, one a scheduler, wait out each
// instruction's latency alone; a second block on the SM adds its own rate, up to kSmMostShare.
constexpr double kKeysAsMTileUs = 1.36;
constexpr double kRowsAsMTileUs = 2.8;
// An FP8 cache's block widens each tile to f16 in shared memory before its products, and that, not
// the copies in flight, sets its pace: about 10.4 KB/us of E4M3 K/V (H100, keys as M, ff5ad09: b = 2
// over 32k in 8 chunks, one block an SM, 1 MB a block in about 101 us of the call's 108.8), where two
// blocks on an SM each keep nearly that pace (b7777ee's 16 chunks: 512 KB a block in about 55 us of
// 62.3). So an FP8 call wants every SM's two slots filled: the cuts chosen at the 16-bit rate
// (fewer, longer chunks) ran 1.2 to 1.75 times slower (b = 2 over 8k: 33.6 against 22.9 us).
constexpr double kFp8BlockBytesPerUs = 10.4e3;
// An SM draws at most twice its share: a lone block's 47 KB/us is twice an H100 SM's share of its
// 3.01 TB/s, and 64 blocks, one an SM, drew the whole of it (b = 1 over 32k in 8 chunks: 134 MB in
// about 45 us of the call's 52.3).
constexpr double kSmMostShare = 2.0;
// Tensor cores through mma.sync: 1,024 multiply-adds a clock an SM at 1.755 GHz, of which the
// kernel is expected to keep half busy beside its softmax, loads and barriers. Only rows of many
// queries make this bind: 16 queries of a group of 8 take 256 multiply-adds per 16-bit K/V byte pair.
constexpr double kSmFmaPerUs = 0.5 * 1024 * 1755;
// The launch and the first round trip before anything streams (what every cut pays alike: the
// calls above are about 7 us longer than their streaming), and the merge: the merge kernel
// (launched early, it waits for the kernel and then reads each row's partials once: 16 and 32 chunks
// took 1.6 to 1.9 us longer than their streaming and a cluster's merge, b = 1 over 2k and 8k), or, in
// the kernel, two cluster barriers and a read of the peers' rows from their shared memory.
constexpr double kStartUs = 1.5;
// A block's first tile waits a round trip to memory (a paged chunk's pages, then its copies) before
// its products start, and each wave after the first pays it again: about 0.6 us, an HBM round trip
// under load (an estimate, not a fit). It keeps the cut of one wave where many waves' finer tail
// would win by less (FP8 at b = 4 over 32k: 57 chunks in 7 waves came out 0.4 us ahead of 8 in one).
constexpr double kWaveStartUs = 0.6;
constexpr double kMergeUs = 1.8;
constexpr double kClusterMergeUs = 0.5;

// Shared memory an SM has, and the most a block may ask for, by SM version (CUDA's tables).
std::int64_t shared_per_sm(const DeviceCaps& caps) {
  if (caps.sm() == 80 || caps.sm() == 87) return 164 * 1024;
  if (caps.sm_major == 9 || caps.sm_major == 10) return 228 * 1024;
  return 100 * 1024;  // 8.6, 8.9, 12.x
}
constexpr std::int64_t kReservedPerBlock = 1024;  // the system's share of each block's shared memory


// Blocks an SM holds. Registers: ptxas gives the kernel 134 to 255 a thread (sm_90; at d = 256 it
// keeps Q's fragments and O's accumulators in 192 and spills 48 to 104 bytes a thread), so count 256 of
// an SM's 65,536: two blocks of 128 threads, one of 256.
int blocks_per_sm(const DecodeKernelShape& shape, const DeviceCaps& caps) {
  const std::int64_t by_registers = 65536 / (256 * shape.threads);
  const std::int64_t by_shared = shared_per_sm(caps) / (shape.shared_bytes + kReservedPerBlock);
  return static_cast<int>(std::max<std::int64_t>(1, std::min(by_registers, by_shared)));
}

// `rows` with the keys cut into `asked` chunks of whole tiles (fewer where the tiles run out), and a
// paged call's page slots in its shared memory.
DecodeKernelShape cut(const AttentionSpec& spec, const DeviceCaps& caps, DecodeKernelShape rows, std::int64_t keys,
                      std::int64_t asked) {
  rows.chunk_keys = ceil_div(ceil_div(keys, asked), kDecodeTileKeys) * kDecodeTileKeys;
  rows.chunks = ceil_div(keys, rows.chunk_keys);
  if (spec.paged_kv()) {
    rows.page_slots = decode_kernel_chunk_pages(rows.chunk_keys, spec.page_size());
    rows.shared_bytes += 2 * rows.page_slots * static_cast<std::int64_t>(sizeof(std::int32_t));
    rows.blocks_per_sm = blocks_per_sm(rows, caps);
  }
  return rows;
}

// Whether a cut's chunks keep their pages within kDecodeKernelMaxChunkPages and its block's shared
// memory within the device's.
bool fits(const DecodeKernelShape& shape, const DeviceCaps& caps) {
  return shape.page_slots <= kDecodeKernelMaxChunkPages && shape.shared_bytes <= decode_kernel_shared_limit(caps);
}

// A cut's expected time, its waves of blocks, and the time its busiest SM needs for its own blocks.
struct CutTimes {
  double total_us;
  double waves;
  double sm_us;
};

CutTimes cut_times(const AttentionSpec& spec, const DecodeKernelShape& shape, const DecodeDevice& device) {
  const double sms = std::max(device.multiprocessors, 1);
  const double b = static_cast<double>(spec.batch()), h_kv = static_cast<double>(spec.heads_kv());
  const double d = static_cast<double>(spec.head_dim_v()), kv = static_cast<double>(decode_kv_bytes(spec));
  const double chunks = static_cast<double>(shape.chunks), keys = static_cast<double>(shape.chunk_keys);
  const double rows = static_cast<double>(decode_kernel_rows(spec));
  // Partials: float32 O rows and a statistic, written by the kernel and read by the merge kernel
  // (a cluster's stay in its shared memory). A few MB at most, they stay in L2: only the blocks
  // that write them pay.
  const double partial_bytes = shape.merged() && !shape.cluster_merge ? rows * (d + 1) * 4 : 0.0;
  const double cache_bytes = static_cast<double>(spec.seq_kv()) * 2 * d * kv;
  // The GPU's rate counts the SMs that get a block (blocks are placed one an SM first), each at most
  // kSmMostShare of its share: a call of few blocks leaves the rest idle.
  const double blocks = b * h_kv * chunks, slots = sms * shape.blocks_per_sm;
  const double gpu_rate = std::min(sms, kSmMostShare * std::min(blocks, sms)) * kSmBytesPerUs;
  const double memory_us = b * h_kv * cache_bytes / gpu_rate;
  // The busiest SM: the most blocks a wave gives one SM, their bytes at what their pipelines keep in
  // flight (at most kSmMostShare of an SM's share), or their multiply-adds (8 or 16 rows a tile,
  // padded) at the SM's tensor cores; a wave after another.
  const double stage_bytes = static_cast<double>(kDecodeTileKeys) * 2 * d * kv;
  const double tile_us = shape.keys_as_m ? kKeysAsMTileUs : kRowsAsMTileUs;
  const double block_rate = spec.fp8_kv_cache() ? kFp8BlockBytesPerUs
                                                : (decode_kernel_stages(decode_kv_bytes(spec)) - 1) * stage_bytes / tile_us;
  const double per_sm = std::ceil(std::min(blocks, slots) / sms);
  const double sm_rate = std::min(per_sm * block_rate, kSmMostShare * kSmBytesPerUs);
  const double block_fma = 2.0 * (shape.keys_as_m ? 8 : 16 * shape.row_tiles) * d * keys;
  const double waves = std::ceil(blocks / slots);
  const double sm_us =
      waves * std::max(per_sm * (keys * 2 * d * kv + partial_bytes) / sm_rate, per_sm * block_fma / kSmFmaPerUs);
  const double merge_us = !shape.merged() ? 0.0 : shape.cluster_merge ? kClusterMergeUs : kMergeUs;
  return {kStartUs + (waves - 1) * kWaveStartUs + std::max(memory_us, sm_us) + merge_us, waves, sm_us};
}

}  // namespace

std::int64_t decode_kernel_shared_limit(const DeviceCaps& caps) { return shared_per_sm(caps) - kReservedPerBlock; }

// 1, 2, 4 or 8 tiles of 16 rows (a power of two, so the warps divide evenly), and the warps sharing a
// row tile: 4 warps a block at least, each of one row tile and 64 / key_groups keys of a tile.
DecodeKernelShape decode_kernel_rows_shape(const AttentionSpec& spec, const DeviceCaps& caps) {
  DecodeKernelShape shape;
  const std::int64_t tiles = ceil_div(decode_kernel_rows(spec), 16);
  shape.row_tiles = tiles <= 1 ? 1 : tiles <= 2 ? 2 : tiles <= 4 ? 4 : 8;
  shape.keys_as_m = decode_kernel_rows(spec) <= 8;
  shape.key_groups = std::max(1, 4 / shape.row_tiles);
  const int warps = shape.row_tiles * shape.key_groups;
  shape.threads = 32 * warps;
  shape.shared_bytes = decode_kernel_shared_bytes(spec.head_dim_v(), decode_kv_bytes(spec), warps);
  shape.blocks_per_sm = blocks_per_sm(shape, caps);
  return shape;
}

double decode_kernel_expected_us(const AttentionSpec& spec, const DecodeKernelShape& shape, const DecodeDevice& device) {
  return cut_times(spec, shape, device).total_us;
}

DecodeKernelShape decode_kernel_shape(const AttentionSpec& spec, const DecodeDevice& device) {
  const DecodeKernelShape rows = decode_kernel_rows_shape(spec, device.caps);
  const std::int64_t keys = std::max<std::int64_t>(spec.seq_kv(), 1);
  // Every count of chunks of whole tiles, a paged call's chunks each within kDecodeKernelMaxChunkPages
  // pages and the block's shared memory, each merged as decode_cluster_merge says. The fastest wins;
  // among equal times (memory binding them alike) the one of fewest waves, then the one whose
  // busiest SM finishes its own blocks soonest, since a cache in L2 (a short one, or one read again)
  // comes faster than the memory's share and the SMs bind instead; then the fewest chunks (waves
  // beyond the first are where the model is coarsest). One tile a chunk fits wherever the tiles
  // do (the refusals checked their room) but for its few page slots; should even those not fit, the
  // finest cut is returned.
  std::optional<DecodeKernelShape> best;
  CutTimes best_times{0.0, 0.0, 0.0};
  for (std::int64_t asked = 1; asked <= ceil_div(keys, kDecodeTileKeys); ++asked) {
    DecodeKernelShape shape = cut(spec, device.caps, rows, keys, asked);
    if (shape.chunks != asked) continue;  // the same cut as a smaller count's
    if (!fits(shape, device.caps)) continue;
    shape.cluster_merge = decode_cluster_merge(spec, shape, device);
    const CutTimes times = cut_times(spec, shape, device);
    const bool tie = times.total_us == best_times.total_us;
    if (!best || times.total_us < best_times.total_us || (tie && times.waves < best_times.waves) ||
        (tie && times.waves == best_times.waves && times.sm_us < best_times.sm_us)) {
      best = shape;
      best_times = times;
    }
  }
  if (best) return *best;  // merged as decode_cluster_merge said in the loop
  DecodeKernelShape finest = cut(spec, device.caps, rows, keys, ceil_div(keys, kDecodeTileKeys));
  finest.cluster_merge = decode_cluster_merge(spec, finest, device);
  return finest;
}

std::optional<DecodeKernelShape> decode_kernel_cut(const AttentionSpec& spec, const DecodeDevice& device,
                                                   std::int64_t chunks) {
  const std::int64_t keys = std::max<std::int64_t>(spec.seq_kv(), 1);
  const std::int64_t asked = std::clamp<std::int64_t>(chunks, 1, ceil_div(keys, kDecodeTileKeys));
  DecodeKernelShape shape = cut(spec, device.caps, decode_kernel_rows_shape(spec, device.caps), keys, asked);
  if (!fits(shape, device.caps)) return std::nullopt;
  shape.cluster_merge = decode_cluster_merge(spec, shape, device);
  return shape;
}

bool decode_cluster_merge(const AttentionSpec& spec, const DecodeKernelShape& shape, const DecodeDevice& device) {
  // Measured through fusedattn.torch on an H100 (results/bench-decode.md; h 32/8, d 128, bf16, the
  // kernel forced; CUDA graphs, microseconds, the merge kernel's time first): faster merged in the
  // cluster at b = 1 over 512 keys (2 chunks: 15.2 -> 13.0) and 2k (8 chunks: 15.1 -> 14.4), b = 8
  // over 8k and 32k (3 chunks, 192 of 264 slots: 107.7 -> 101.1, 398.7 -> 375.5), 8 queries at b = 4
  // (5 chunks, 160 slots: 75.8 -> 71.9). Slower with 16 queries at b = 4 (8 chunks, 256 of 264
  // slots: 98.3 -> 150.1, clusters spilling into a second wave) and with 16 chunks at b = 1 over 8k
  // (128 blocks packed two an SM in their GPCs: 21.1 with 19 chunks through the merge kernel, 23.4).
  // And slower with 4 row tiles: 16 queries over an FP8 cache at b = 4 over 8k took 147.3 in 4 chunks
  // merged in clusters (b7777ee) against 91.3 through the merge kernel (45f256c's cut).
  // Then (9e6505e, paged, rule's cut, graph / eager; b7777ee's 2-blocks-an-SM cuts through the merge
  // kernel in brackets): clusters of 128 blocks, one an SM, ran 1-4% faster in graphs but 2-12%
  // slower called eagerly, where the next call launches early beside the last: b = 2 over 8k 31.2 /
  // 33.3 (32.7 / 31.2), over 32k 94.8 / 101.8 (99.4 / 99.1), b = 8 over 8k 93.5 / 100.4 (98.7 /
  // 96.9), over 32k 347.2 / 389.4 (360.0 / 360.5). The few blocks of b = 1 (64) were as fast either
  // way (over 2k 11.1 / 9.4). So clusters only for calls of at most half as many blocks as SMs.
  if (!shape.merged() || shape.chunks > kDecodeKernelClusterChunks || shape.row_tiles > 2 || device.caps.sm_major < 9) {
    return false;
  }
  const std::int64_t blocks = spec.batch() * spec.heads_kv() * shape.chunks;
  return 2 * blocks <= static_cast<std::int64_t>(std::max(device.multiprocessors, 1));
}

}  // namespace fusedattn::detail
