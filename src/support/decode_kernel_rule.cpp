// The decode kernel's rule (decode_kernel_rule.h): what it takes, and whether it is expected faster
// than cuDNN's path, with the numbers the choice rests on (how it is cut: decode_kernel_cut.cpp).
#include "support/decode_kernel_rule.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "spec/text.h"

namespace fusedattn::detail {
namespace {

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
  } else if (decode_kernel_rows(spec) > kDecodeKernelMaxRows) {
    refuse("s_q", std::to_string(spec.seq_q()) + " (h_q / h_kv = " + std::to_string(spec.heads_q() / spec.heads_kv()) + ")",
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
  const std::int64_t kv_vector = 16 / decode_kv_bytes(spec);
  if (!strides_multiple_of(spec.k, kv_vector) || !strides_multiple_of(spec.v, kv_vector)) {
    refuse("k.strides", "k " + to_string(spec.k) + ", v " + to_string(spec.v), "K/V strides multiples of 16 bytes");
  }
  if (out.empty() && decode_kernel_rows_shape(spec, caps).shared_bytes > decode_kernel_shared_limit(caps)) {
    refuse("device", "SM " + std::to_string(caps.sm()), "room for the kernel's shared memory");
  }
  return out;
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
  // - paged caches of 8 rows or fewer (the keys as M), on an H100 at b7777ee: the kernel is faster at
  //   every measured point, b = 1 over 512, 2k, 8k and 32k keys (8.7 against 18.3, 11.3 against 17.4,
  //   14.7 against 21.1, 55.2 against 61.1), over 8k and 32k at b = 2 (33.1 against 38.5, 99.4 against
  //   104.4), 4 (54.7 against 60.5, 186.0 against 191.2) and 8 (99.0 against 104.6, 360.0 against
  //   366.2), and b = 64 over 8k (703.7 against 716.5).
  // - paged caches of more rows, on an H100 at 45f256c: with one row tile the kernel is faster at b = 1 (8 pairs
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
    const std::int64_t rows = decode_kernel_rows(spec);
    return rows <= 8 || (rows <= 16 && (spec.seq_kv() <= kDecodeKernelPagedMostKeys ||
                                        spec.batch() * spec.heads_kv() <= kDecodeKernelPagedMostPairs));
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
