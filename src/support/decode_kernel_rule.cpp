// The decode kernel's rule (decode_kernel_rule.h): what it takes, how it is cut, and whether it is
// expected faster than cuDNN's path, with the numbers the choice rests on.
#include "support/decode_kernel_rule.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "spec/text.h"

namespace fusedattn::detail {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// --- The cost model of the kernel's cut, in microseconds (an SM's share scales with the SM count) --
//
// It ranks the cuts of one spec against each other; it is not the kernel's speed, which the rule
// takes from measurements (decode_kernel_preferred). Its block rate and merge costs are fitted to
// the cuts measured on an H100 at 45f256c (bench/profile_decode_kernels.py --kernel-cuts; fusedattn.torch,
// contiguous, h 32/8, d 128, CUDA graphs, microseconds): b = 1 over 512 keys 10.4 in 2 chunks, 8.4
// in 8 of one tile (PyTorch's dense call 9.4); over 8k 22.0 in 8, 17.3 in 16, 17.6 in 19, 15.3 in
// 32 (PyTorch 14.1); over 32k 65.7 in 8, 53.6 in 16, 55.8 in 17, 60.9 in 19, 54.3 in 32 (PyTorch
// 52.6); b = 8 over 8k 96.7 in 3, 98.7 in 8, 100.4 in 16, 103.4 in 32 (PyTorch 93.9).
//
// Memory: an SM's share of the copy bandwidth, 4.22 TB/s measured on the H200 over 132 SMs.
constexpr double kSmBytesPerUs = 4.22e6 / 132;
// A block keeps stages - 1 tiles in flight and streams about one a kTileUs each: 23 KB/us of 16-bit
// K/V at d = 128, what one block an SM drew at b = 1 over 8k keys in 16 chunks (256 KB in about 11.8
// us: the call's 17.3 less its start and merge). Its warps, one a scheduler, wait out each
// instruction's latency alone; a second block on the SM adds its own rate, up to kSmMostShare.
constexpr double kTileUs = 2.8;
// An SM with several blocks draws at most 1.25 times its share when others draw less: SMs of two
// blocks streamed 28.6 to 29.6 KB/us on the H100 (23.0 its share of 3.03 TB/s), at b = 8 over 8k in 3
// chunks (192 blocks, 96.7 us) and at b = 1 over 8k in 19 (152 blocks).
constexpr double kSmMostShare = 1.25;
// Tensor cores through mma.sync: 1,024 multiply-adds a clock an SM at 1.755 GHz, of which the
// kernel is expected to keep half busy beside its softmax, loads and barriers. Only rows of many
// queries make this bind: 16 queries of a group of 8 take 256 multiply-adds per 16-bit K/V byte pair.
constexpr double kSmFmaPerUs = 0.5 * 1024 * 1755;
// The launch and the first round trip before anything streams, and the merge: the merge kernel
// (launched early, it waits for the kernel and then reads each row's partials once: it ended 3.9 us
// after the kernel at b = 1 over 8k, cuDNN's reduction of PyTorch's call 4.2), or, in the kernel,
// two cluster barriers and a read of the peers' rows from their shared memory.
constexpr double kStartUs = 1.5;
constexpr double kMergeUs = 3.5;
constexpr double kClusterMergeUs = 0.5;

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

// Blocks an SM holds. Registers: ptxas gives the kernel 134 to 255 a thread (sm_90; at d = 256 it
// keeps Q's fragments and O's accumulators in 192 and spills 48 to 104 bytes a thread), so count 256 of
// an SM's 65,536: two blocks of 128 threads, one of 256.
int blocks_per_sm(const DecodeKernelShape& shape, const DeviceCaps& caps) {
  const std::int64_t by_registers = 65536 / (256 * shape.threads);
  const std::int64_t by_shared = shared_per_sm(caps) / (shape.shared_bytes + kReservedPerBlock);
  return static_cast<int>(std::max<std::int64_t>(1, std::min(by_registers, by_shared)));
}

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
  shape.blocks_per_sm = blocks_per_sm(shape, caps);
  return shape;
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
  return shape.page_slots <= kDecodeKernelMaxChunkPages && shape.shared_bytes <= shared_per_block(caps);
}

// Whether nodes a and b are the same cap: one scalar slot, or one constant (bit for bit).
bool same_cap(const ScoreModNode& a, const ScoreModNode& b) {
  if (a.op != b.op) return false;
  if (a.op == ScoreOp::scalar) return a.slot == b.slot;
  return a.op == ScoreOp::constant && std::memcmp(&a.value, &b.value, sizeof a.value) == 0;
}

bool multiple_of(std::int64_t value, std::int64_t of) { return value % of == 0; }

// A paged cache whose pages cuDNN's paged attention refuses: sizes that are not powers of two.
bool pages_off_powers_of_two(const AttentionSpec& spec) {
  const std::int64_t size = spec.page_size();
  return spec.paged_kv() && (size <= 0 || (size & (size - 1)) != 0);
}
bool strides_multiple_of(const TensorDesc& desc, std::int64_t of) {
  return multiple_of(desc.strides[kBatch], of) && multiple_of(desc.strides[kHead], of) &&
         multiple_of(desc.strides[kSeq], of);
}

}  // namespace

std::optional<DecodeSoftcap> decode_softcap(const ScoreMod& mod) {
  // Post-order, the root last: mul's arguments are the cap and tanh(div(score, cap)), either way round.
  const std::vector<ScoreModNode>& n = mod.nodes();
  if (n.empty() || n.back().op != ScoreOp::mul) return std::nullopt;
  const ScoreModNode& root = n.back();
  for (int tanh_arg = 0; tanh_arg < 2; ++tanh_arg) {
    const ScoreModNode& cap = n[static_cast<std::size_t>(root.args[1 - tanh_arg])];
    const ScoreModNode& tanh = n[static_cast<std::size_t>(root.args[tanh_arg])];
    if (tanh.op != ScoreOp::tanh) continue;
    const ScoreModNode& div = n[static_cast<std::size_t>(tanh.args[0])];
    if (div.op != ScoreOp::div || n[static_cast<std::size_t>(div.args[0])].op != ScoreOp::score) continue;
    if (!same_cap(cap, n[static_cast<std::size_t>(div.args[1])])) continue;
    return cap.op == ScoreOp::scalar ? DecodeSoftcap{cap.slot, 0.0} : DecodeSoftcap{-1, cap.value};
  }
  return std::nullopt;
}

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
  const std::int64_t d = spec.head_dim_qk();
  if (d != spec.head_dim_v() || (d != 64 && d != 128 && d != 256)) {
    refuse("d_qk", std::to_string(d) + " (d_v " + std::to_string(spec.head_dim_v()) + ")",
           "d_qk = d_v = 64, 128 or 256");
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
  if (spec.alibi) refuse("alibi", "1", "no ALiBi");
  if (spec.dropout > 0.0) refuse("dropout", format_double(spec.dropout), "no dropout");
  if (!spec.score_mod.empty() && !decode_softcap(spec.score_mod)) {
    refuse("score_mod", to_string(spec.score_mod),
           "no score modifier but a softcap, mul($0,tanh(div(score,$0)))");
  }
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

namespace {

// A cut's expected time, its waves of blocks, and the time its busiest SM needs for its own blocks.
struct CutTimes {
  double total_us;
  double waves;
  double sm_us;
};

CutTimes cut_times(const AttentionSpec& spec, const DecodeKernelShape& shape, const DecodeDevice& device) {
  const double sms = std::max(device.multiprocessors, 1);
  const double b = static_cast<double>(spec.batch()), h_kv = static_cast<double>(spec.heads_kv());
  const double d = static_cast<double>(spec.head_dim_v()), kv = static_cast<double>(kv_bytes(spec));
  const double chunks = static_cast<double>(shape.chunks), keys = static_cast<double>(shape.chunk_keys);
  const double rows = static_cast<double>(rows_of(spec));
  // Partials: float32 O rows and a statistic, written by the kernel and read by the merge kernel
  // (a cluster's stay in its shared memory). A few MB at most, they stay in L2: only the blocks
  // that write them pay.
  const double partial_bytes = shape.merged() && !shape.cluster_merge ? rows * (d + 1) * 4 : 0.0;
  const double cache_bytes = static_cast<double>(spec.seq_kv()) * 2 * d * kv;
  // The GPU's rate counts the SMs that get a block (blocks are placed one an SM first): a call of
  // fewer blocks than SMs leaves the rest idle, whatever its blocks could draw alone.
  const double blocks = b * h_kv * chunks, slots = sms * shape.blocks_per_sm;
  const double memory_us = b * h_kv * cache_bytes / (std::min(blocks, sms) * kSmBytesPerUs);
  // The busiest SM: the most blocks a wave gives one SM, their bytes at what their pipelines keep in
  // flight (at most kSmMostShare of an SM's share), or their multiply-adds (16 rows a tile, padded)
  // at the SM's tensor cores; a wave after another.
  const double stage_bytes = static_cast<double>(kDecodeTileKeys) * 2 * d * kv;
  const double block_rate = (decode_kernel_stages(kv_bytes(spec)) - 1) * stage_bytes / kTileUs;
  const double per_sm = std::ceil(std::min(blocks, slots) / sms);
  const double sm_rate = std::min(per_sm * block_rate, kSmMostShare * kSmBytesPerUs);
  const double block_fma = 2.0 * 16 * shape.row_tiles * d * keys;
  const double waves = std::ceil(blocks / slots);
  const double sm_us = waves * std::max(per_sm * (keys * 2 * d * kv + partial_bytes) / sm_rate,
                                                            per_sm * block_fma / kSmFmaPerUs);
  const double merge_us = !shape.merged() ? 0.0 : shape.cluster_merge ? kClusterMergeUs : kMergeUs;
  return {kStartUs + std::max(memory_us, sm_us) + merge_us, waves, sm_us};
}

}  // namespace

double decode_kernel_expected_us(const AttentionSpec& spec, const DecodeKernelShape& shape, const DecodeDevice& device) {
  return cut_times(spec, shape, device).total_us;
}

DecodeKernelShape decode_kernel_shape(const AttentionSpec& spec, const DecodeDevice& device) {
  const DecodeKernelShape rows = rows_shape(spec, device.caps);
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
  CutTimes best_times{0.0, 0.0};
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
  DecodeKernelShape out = best ? *best : cut(spec, device.caps, rows, keys, ceil_div(keys, kDecodeTileKeys));
  out.cluster_merge = decode_cluster_merge(spec, out, device);
  return out;
}

std::optional<DecodeKernelShape> decode_kernel_cut(const AttentionSpec& spec, const DecodeDevice& device,
                                                   std::int64_t chunks) {
  const std::int64_t keys = std::max<std::int64_t>(spec.seq_kv(), 1);
  const std::int64_t asked = std::clamp<std::int64_t>(chunks, 1, ceil_div(keys, kDecodeTileKeys));
  DecodeKernelShape shape = cut(spec, device.caps, rows_shape(spec, device.caps), keys, asked);
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
  if (!shape.merged() || shape.chunks > kDecodeKernelClusterChunks || device.caps.sm_major < 9) return false;
  const std::int64_t blocks = spec.batch() * spec.heads_kv() * shape.chunks;
  const std::int64_t slots = static_cast<std::int64_t>(std::max(device.multiprocessors, 1)) * shape.blocks_per_sm;
  return 4 * blocks <= 3 * slots;
}

bool decode_kernel_only(const AttentionSpec& spec) {
  // A score modifier here is a softcap; cuDNN's path refuses it over paged caches (its paged
  // attention needs the padding mask, which a modifier's lowering turns off) and gets it wrong on
  // one query row with runtime lengths (decode_score_mod_rule).
  // A sink (gpt-oss) or off-by-one over a paged cache: cuDNN's paged attention with it has not been
  // checked on a GPU (policy.cpp's paged_rule), and it adds to every chunk's denominator, so cuDNN's
  // split decode could not cut the keys (decode_split.cpp's mergeable), leaving one unsplit call, one
  // block a (sequence, head) streaming every key: on contiguous caches such a call took 7 times the
  // kernel's time at 8k keys (decode_kernel_preferred). The kernel adds the term once, in its merge.
  // On one query row cuDNN refuses a sink or off-by-one itself ("decode only mode, i.e. s_q == 1, not
  // supported with sink_token", cuDNN 9.19 on the H200).
  const bool extra_term = spec.softmax != Softmax::vanilla && (spec.paged_kv() || spec.seq_q() == 1);
  return spec.fp8_kv_cache() || !spec.score_mod.empty() || extra_term || pages_off_powers_of_two(spec);
}

bool decode_kernel_preferred(const AttentionSpec& spec, Pass pass, const DecodeDevice& device) {
  if (!decode_kernel_refusals(spec, pass, device.caps).empty()) return false;
  if (decode_kernel_only(spec)) return true;
  // Measured through fusedattn.torch (results/bench-decode.md; h 32/8, d 128, bf16, each path forced
  // in turn), microseconds, the kernel against cuDNN's path:
  // - paged caches, on an H100 at 45f256c: with one row tile the kernel is faster at b = 1 (8 pairs
  //   of a sequence and a K/V head) at every length (11.0 against 18.1 over 512 keys, 12.1 against
  //   17.3 over 2k, 18.6 against 20.7 over 8k, 58.4 against 59.1 over 32k) and over 8k keys at every
  //   batch (b = 2: 35.1 against 38.1; 4: 57.6 against 59.2; 8: 98.1 against 102.0; 64: 688.1 against
  //   693.9); over 32k the split decode is ahead from 16 pairs (b = 2: 108.9 against 101.8; 4: 200.4
  //   against 186.7; 8: 364.4 against 355.8), and with several row tiles it is even or ahead (8
  //   queries at b = 4, two row tiles, 64.7 against 65.6; 16 queries 82.7 against 71.3). Lengths
  //   between 8k and 32k were not measured.
  // - contiguous caches, on the H200: cuDNN's one unsplit call leaves most SMs idle, and the kernel
  //   is faster from 2k keys on (b = 1: 13.3 against 36.2 at 2k, 18.9 against 135 at 8k, 52.8
  //   against 568 at 32k; b = 8 over 8k 73.1 against 153; 8 and 16 queries at b = 4 62.1 and 65.8
  //   against 103; b = 64 over 8k 487 against 490).
  // Shorter contiguous caches were not timed. Inference (no statistics) goes to the kernel there
  // too: cuDNN's call keeps one block a (sequence, head) streaming every key, so its time falls with
  // the keys as the kernel's does, and a cuDNN plan is built for each length (36 to 76 ms a build on
  // the H200), which a cache growing a token a step (transformers' DynamicCache in generate()) meets
  // at every step, where the kernel builds none; the kernel also gives a sequence without keys O 0,
  // where cuDNN's padded call writes non-finite rows (docs/reliability.md). A short call that writes
  // the statistics feeds a backward on cuDNN, whose treatment of the kernel's -inf for a row without
  // keys has not been checked: it stays on cuDNN's path.
  if (spec.paged_kv()) {
    return rows_of(spec) <= 16 &&
           (spec.seq_kv() <= kDecodeKernelPagedMostKeys || spec.batch() * spec.heads_kv() <= kDecodeKernelPagedMostPairs);
  }
  return !spec.stats || spec.seq_kv() >= kDecodeKernelContiguousMinKeys;
}

void fp8_kv_cache_rule(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, std::vector<Reason>& out) {
  if (!spec.fp8_kv_cache()) return;
  for (Reason reason : decode_kernel_refusals(spec, pass, caps)) {
    reason.requirement += " (an FP8 K/V cache beside " + std::string(to_string(spec.q.dtype)) +
                          " queries runs only there; cuDNN takes none)";
    out.push_back(std::move(reason));
  }
}

namespace {

// A call that runs only on the kernel, refused where the kernel does not take it: `field` and its
// value, the requirement, and the kernel's reasons ("d_qk = 96 (d_v 96); bias = ...").
void refuse_unless_on_the_kernel(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, const char* field,
                                 const std::string& value, const std::string& requirement, std::vector<Reason>& out) {
  const std::vector<Reason> kernel = decode_kernel_refusals(spec, pass, caps);
  if (kernel.empty()) return;  // the kernel runs it
  std::string why;
  for (const Reason& reason : kernel) why += (why.empty() ? "" : "; ") + reason.field + " = " + reason.value;
  out.push_back({field, value, requirement + ", but not this call: " + why + ")", ""});
}

}  // namespace

void decode_score_mod_rule(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, std::vector<Reason>& out) {
  if (spec.score_mod.empty() || pass != Pass::forward || spec.seq_q() != 1 || !spec.padding) return;
  refuse_unless_on_the_kernel(spec, pass, caps, "score_mod", to_string(spec.score_mod),
                              "no score modifier on one query row with runtime lengths (cuDNN 9.19 returns wrong rows "
                              "there, measured on the H200; fusedattn's decode kernel runs a softcap", out);
}

void decode_extra_term_rule(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, std::vector<Reason>& out) {
  if (spec.softmax == Softmax::vanilla || pass != Pass::forward || spec.seq_q() != 1) return;
  refuse_unless_on_the_kernel(spec, pass, caps, "softmax", to_string(spec.softmax),
                              "vanilla softmax on one query row (cuDNN 9.19 refuses a sink there: \"decode only mode, "
                              "i.e. s_q == 1, not supported with sink_token\"; fusedattn's decode kernel runs it", out);
}

void decode_page_size_rule(const AttentionSpec& spec, Pass pass, const DeviceCaps& caps, std::vector<Reason>& out) {
  if (!pages_off_powers_of_two(spec)) return;
  refuse_unless_on_the_kernel(spec, pass, caps, "page_size", std::to_string(spec.page_size()),
                              "a power of two (cuDNN's paged attention: \"block size needs to be non-zero and a power "
                              "of 2\"; fusedattn's decode kernel takes multiples of 16", out);
}

std::string decode_kernel_description(const DecodeKernelShape& shape) {
  std::string out = "fusedattn decode kernel, " + std::to_string(shape.chunks) + " chunk" +
                    (shape.chunks > 1 ? "s" : "") + " of " + std::to_string(shape.chunk_keys) + " keys";
  if (!shape.merged()) return out;
  return shape.cluster_merge ? out + " merged in the kernel" : out + " merged";
}

}  // namespace fusedattn::detail
