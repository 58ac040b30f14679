// testing/attention_buffers.cpp — device memory for one spec's tensors, random inputs, poisoned outputs.
#include "testing/attention_buffers.h"

#include <algorithm>
#include <optional>
#include <random>

#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/reference.h"
#include "testing/cuda_check.h"

namespace fusedattn::check {

std::int64_t stats_elements(const AttentionSpec& spec) { return spec.batch() * spec.heads_q() * spec.seq_q(); }

std::size_t mask_elements(const AttentionSpec& spec) {
  return static_cast<std::size_t>(spec.batch() * spec.heads_q() * spec.seq_q() * spec.seq_kv());
}

std::size_t max_logit_elements(const AttentionSpec& spec) {
  return static_cast<std::size_t>(spec.max_logit == MaxLogit::head ? spec.heads_q() : stats_elements(spec));
}

namespace {

// Host buffer of 16-bit values plus its device twin; a tensor lives at `offset` elements inside.
struct Buffer16 {
  std::vector<std::uint16_t> host;
  DeviceBuffer device;
  std::int64_t elements = 0;
};

// Where one tensor lives: which buffer, and its first element's offset in it.
struct Placement {
  Buffer16* buffer = nullptr;
  std::int64_t offset = 0;
  void* device() const { return static_cast<std::uint16_t*>(buffer->device.get()) + offset; }
  const std::uint16_t* host() const { return buffer->host.data() + offset; }
};

struct Lengths {
  std::vector<std::int32_t> q, kv;
};

// Random per-entry lengths for a padded spec: entry 0 uses the full lengths where the mask allows
// it, the others are uniform. Bottom-right diagonals and sliding windows need every query of an
// entry to reach a key (seq_len_q <= seq_len_kv + right, and <= seq_len_kv with a left bound), so
// those cases draw the KV length at least that large.
Lengths draw_lengths(const AttentionSpec& spec, std::mt19937_64& rng) {
  const std::int64_t right = spec.window.right;
  const bool bottom_right = spec.alignment == Alignment::bottom_right && right >= 0;
  const bool windowed = spec.window.left >= 0;
  Lengths out;
  for (std::int64_t b = 0; b < spec.batch(); ++b) {
    std::int64_t q_max = spec.seq_q();
    if (bottom_right) q_max = std::min(q_max, spec.seq_kv() + right);
    if (windowed) q_max = std::min(q_max, spec.seq_kv());
    const std::int64_t q = b == 0 ? q_max : std::uniform_int_distribution<std::int64_t>(1, q_max)(rng);
    std::int64_t kv_min = 1;
    if (bottom_right) kv_min = std::max<std::int64_t>(kv_min, q - right);
    if (windowed) kv_min = std::max(kv_min, q);
    const std::int64_t kv =
        b == 0 ? spec.seq_kv() : std::uniform_int_distribution<std::int64_t>(kv_min, spec.seq_kv())(rng);
    out.q.push_back(static_cast<std::int32_t>(q));
    out.kv.push_back(static_cast<std::int32_t>(kv));
  }
  return out;
}

}  // namespace

struct AttentionBuffers::State {
  AttentionSpec spec;
  bool with_backward = false;
  DType dtype = DType::bf16;
  // Inputs: up to three buffers (QKV packed uses one, KV packed two). Outputs mirror the inputs'
  // packing for the gradients; O and dO are always separate.
  Buffer16 in[3], grad[3], o, d_o;
  DeviceBuffer stats;
  Placement q, k, v, dq, dk, dv;
  std::vector<std::int32_t> seq_len_q, seq_len_kv;  // host copies of the device lengths
  DeviceBuffer seq_len_q_device, seq_len_kv_device;
  Buffer16 bias, d_bias;                 // spec.bias / spec.bias_grad
  DeviceBuffer dropout_seed, dropout_offset, dropout_mask;
  std::vector<float> sink;               // Softmax::sink logits, host copy
  DeviceBuffer sink_device, d_sink, max_logit;
  std::vector<float> mod_scalars;               // spec.score_mod's values, host copies
  std::vector<std::vector<float>> mod_tensors;
  DeviceBuffer mod_scalars_device;
  std::vector<DeviceBuffer> mod_tensors_device;

  void allocate16(Buffer16& buffer, std::int64_t elements) {
    buffer.elements = elements;
    buffer.device = DeviceBuffer(static_cast<std::size_t>(elements) * size_of(dtype));
  }
};

AttentionBuffers::AttentionBuffers(const AttentionSpec& spec, bool with_backward) : state_(new State) {
  State& s = *state_;
  s.spec = spec;
  s.with_backward = with_backward;
  s.dtype = spec.q.dtype;

  const std::optional<Layout> named_as = named_layout(spec);
  const bool named = named_as.has_value();
  const Layout layout = named_as.value_or(Layout::bshd);
  const LayoutTensors lt = named ? make_layout(layout, problem_shape(spec)) : LayoutTensors{};
  // Each tensor's buffer slot (0..2) and offset. Buffer sizes cover every tensor placed in them,
  // whatever the layout reports, so a disagreement there cannot make us write out of bounds.
  int slot_q = 0, slot_k = 1, slot_v = 2;
  std::int64_t off_q = 0, off_k = 0, off_v = 0;
  if (named) {
    off_q = lt.q_offset;
    off_k = lt.k_offset;
    off_v = lt.v_offset;
    if (packs_qkv(layout)) {
      slot_k = slot_v = 0;
    } else if (packs_kv(layout)) {
      slot_v = 1;
    }
  }
  std::int64_t size[3] = {0, 0, 0};
  auto need = [&](int slot, std::int64_t offset, const TensorDesc& desc) {
    size[slot] = std::max(size[slot], offset + desc.extent());
  };
  need(slot_q, off_q, spec.q);
  need(slot_k, off_k, spec.k);
  need(slot_v, off_v, spec.v);
  if (named) {
    size[slot_q] = std::max(size[slot_q], lt.q_buffer);
    size[slot_k] = std::max(size[slot_k], lt.k_buffer);
  }
  for (int i = 0; i < 3; ++i) {
    if (size[i] == 0) continue;
    s.allocate16(s.in[i], size[i]);
    if (with_backward) s.allocate16(s.grad[i], size[i]);
  }
  s.q = {&s.in[slot_q], off_q};
  s.k = {&s.in[slot_k], off_k};
  s.v = {&s.in[slot_v], off_v};
  s.dq = {&s.grad[slot_q], off_q};
  s.dk = {&s.grad[slot_k], off_k};
  s.dv = {&s.grad[slot_v], off_v};

  s.allocate16(s.o, spec.o.extent());
  if (with_backward) s.allocate16(s.d_o, spec.o.extent());
  if (spec.stats || with_backward) {
    s.stats = DeviceBuffer(static_cast<std::size_t>(stats_elements(spec)) * sizeof(float));
  }
  if (spec.bias != Bias::none) {
    s.allocate16(s.bias, bias_desc(spec).elements());
    if (with_backward && spec.bias_grad) s.allocate16(s.d_bias, bias_desc(spec).elements());
  }
  if (spec.softmax == Softmax::sink) {
    s.sink_device = DeviceBuffer(static_cast<std::size_t>(spec.heads_q()) * sizeof(float));
    if (with_backward) s.d_sink = DeviceBuffer(static_cast<std::size_t>(spec.heads_q()) * sizeof(float));
  }
  if (spec.max_logit != MaxLogit::none) s.max_logit = DeviceBuffer(max_logit_elements(spec) * sizeof(float));
  if (spec.dropout > 0.0) {
    s.dropout_seed = DeviceBuffer(sizeof(std::int64_t));
    s.dropout_offset = DeviceBuffer(sizeof(std::int64_t));
  }
  if (spec.dropout_mask_out) s.dropout_mask = DeviceBuffer(mask_elements(spec) * sizeof(float));
  const ScoreMod& mod = spec.score_mod;
  if (mod.scalars() > 0) s.mod_scalars_device = DeviceBuffer(static_cast<std::size_t>(mod.scalars()) * sizeof(float));
  const std::array<std::int64_t, 4> sizes = {spec.batch(), spec.heads_q(), spec.seq_q(), spec.seq_kv()};
  for (int i = 0; i < mod.tensors(); ++i) {
    const std::array<std::int64_t, 4> dims = tensor_dims(mod, i, sizes);
    const std::int64_t elements = dims[0] * dims[1] * dims[2] * dims[3];
    s.mod_tensors.emplace_back(static_cast<std::size_t>(elements));
    s.mod_tensors_device.emplace_back(static_cast<std::size_t>(elements) * sizeof(float));
  }
}

AttentionBuffers::~AttentionBuffers() = default;

void AttentionBuffers::fill_inputs(std::uint64_t seed) {
  State& s = *state_;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto fill = [&](Buffer16& buffer) {
    if (buffer.elements == 0) return;
    buffer.host.resize(static_cast<std::size_t>(buffer.elements));
    for (auto& value : buffer.host) value = float_to_half_bits(uniform(rng), s.dtype);
    check_cuda(cudaMemcpy(buffer.device.get(), buffer.host.data(), buffer.device.bytes(), cudaMemcpyHostToDevice),
               "cudaMemcpy(input, host to device)");
  };
  for (Buffer16& buffer : s.in) fill(buffer);
  fill(s.d_o);
  fill(s.bias);
  if (s.spec.softmax == Softmax::sink) {
    s.sink.resize(static_cast<std::size_t>(s.spec.heads_q()));
    for (float& x : s.sink) x = uniform(rng);
    check_cuda(cudaMemcpy(s.sink_device.get(), s.sink.data(), s.sink.size() * sizeof(float), cudaMemcpyHostToDevice),
               "cudaMemcpy(sink, host to device)");
  }
  if (s.spec.score_mod.scalars() > 0) {
    std::uniform_real_distribution<float> positive(0.5f, 2.0f);
    std::vector<float> scalars(static_cast<std::size_t>(s.spec.score_mod.scalars()));
    for (float& x : scalars) x = positive(rng);
    set_score_mod_scalars(scalars);
  }
  for (std::size_t i = 0; i < s.mod_tensors.size(); ++i) {
    for (float& x : s.mod_tensors[i]) x = uniform(rng);
    check_cuda(cudaMemcpy(s.mod_tensors_device[i].get(), s.mod_tensors[i].data(), s.mod_tensors_device[i].bytes(),
                          cudaMemcpyHostToDevice),
               "cudaMemcpy(score_mod tensor, host to device)");
  }
  if (s.spec.dropout > 0.0) {
    // A fresh seed and offset per check: the same seed then gives the same mask (replay tests).
    const std::int64_t seed_offset[2] = {static_cast<std::int64_t>(rng() >> 1), static_cast<std::int64_t>(rng() >> 40)};
    set_dropout_state(seed_offset[0], seed_offset[1]);
  }
  if (s.spec.padding) {
    const Lengths lengths = draw_lengths(s.spec, rng);
    set_lengths(lengths.q, lengths.kv);
  }
}

void AttentionBuffers::set_lengths(const std::vector<std::int32_t>& seq_len_q, const std::vector<std::int32_t>& seq_len_kv) {
  State& s = *state_;
  const auto batch = static_cast<std::size_t>(s.spec.batch());
  if (seq_len_q.size() != batch || seq_len_kv.size() != batch) {
    throw InvalidArgument("lengths", std::to_string(seq_len_q.size()) + " and " + std::to_string(seq_len_kv.size()),
                          "one per batch entry (" + std::to_string(batch) + ")");
  }
  s.seq_len_q = seq_len_q;
  s.seq_len_kv = seq_len_kv;
  auto upload = [&](const std::vector<std::int32_t>& host, DeviceBuffer& device) {
    if (device.bytes() == 0) device = DeviceBuffer(batch * sizeof(std::int32_t));
    check_cuda(cudaMemcpy(device.get(), host.data(), batch * sizeof(std::int32_t), cudaMemcpyHostToDevice),
               "cudaMemcpy(lengths, host to device)");
  };
  upload(s.seq_len_q, s.seq_len_q_device);
  upload(s.seq_len_kv, s.seq_len_kv_device);
}

const std::vector<std::int32_t>& AttentionBuffers::seq_len_q() const noexcept { return state_->seq_len_q; }
const std::vector<std::int32_t>& AttentionBuffers::seq_len_kv() const noexcept { return state_->seq_len_kv; }
const std::vector<float>& AttentionBuffers::sink() const noexcept { return state_->sink; }

void AttentionBuffers::set_dropout_state(std::int64_t seed, std::int64_t offset) {
  State& s = *state_;
  if (s.dropout_seed.bytes() == 0) throw InvalidArgument("dropout", "0", "a spec with dropout > 0");
  check_cuda(cudaMemcpy(s.dropout_seed.get(), &seed, sizeof seed, cudaMemcpyHostToDevice), "cudaMemcpy(dropout seed)");
  check_cuda(cudaMemcpy(s.dropout_offset.get(), &offset, sizeof offset, cudaMemcpyHostToDevice),
             "cudaMemcpy(dropout offset)");
}

void AttentionBuffers::poison_outputs() {
  State& s = *state_;
  auto poison = [](const DeviceBuffer& buffer) {
    if (buffer.bytes() == 0) return;
    check_cuda(cudaMemset(buffer.get(), 0xFF, buffer.bytes()), "cudaMemset(output poison 0xFF)");
  };
  poison(s.o.device);
  poison(s.stats);
  poison(s.d_bias.device);
  poison(s.d_sink);
  poison(s.max_logit);
  poison(s.dropout_mask);
  for (const Buffer16& buffer : s.grad) poison(buffer.device);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(after poisoning outputs)");
}

void AttentionBuffers::set_score_mod_scalars(const std::vector<float>& scalars) {
  State& s = *state_;
  if (scalars.size() != static_cast<std::size_t>(s.spec.score_mod.scalars())) {
    throw InvalidArgument("score_mod_scalars", "size " + std::to_string(scalars.size()),
                          "one value per scalar of the modifier (" + std::to_string(s.spec.score_mod.scalars()) + ")");
  }
  s.mod_scalars = scalars;
  if (scalars.empty()) return;
  check_cuda(cudaMemcpy(s.mod_scalars_device.get(), scalars.data(), scalars.size() * sizeof(float), cudaMemcpyHostToDevice),
             "cudaMemcpy(score_mod scalars, host to device)");
}

const std::vector<float>& AttentionBuffers::score_mod_scalars() const noexcept { return state_->mod_scalars; }
const std::vector<std::vector<float>>& AttentionBuffers::score_mod_tensors() const noexcept {
  return state_->mod_tensors;
}

namespace {
// The modifier's device values as a call takes them.
ScoreModTensors score_mod_pointers(const std::vector<DeviceBuffer>& tensors, const DeviceBuffer& scalars) {
  ScoreModTensors t;
  t.scalars = scalars.as<float>();
  for (std::size_t i = 0; i < tensors.size(); ++i) t.tensors[i] = tensors[i].as<float>();
  return t;
}
}  // namespace

ForwardTensors AttentionBuffers::forward_tensors() const {
  const State& s = *state_;
  ForwardTensors t;
  t.q = s.q.device();
  t.k = s.k.device();
  t.v = s.v.device();
  t.o = s.o.device.get();
  t.stats = s.stats.as<float>();
  t.seq_len_q = s.seq_len_q_device.as<std::int32_t>();
  t.seq_len_kv = s.seq_len_kv_device.as<std::int32_t>();
  t.bias = s.bias.device.get();
  t.sink = s.sink_device.as<float>();
  t.max_logit = s.max_logit.as<float>();
  t.dropout_seed = s.dropout_seed.as<std::int64_t>();
  t.dropout_offset = s.dropout_offset.as<std::int64_t>();
  t.dropout_mask = s.dropout_mask.as<float>();
  t.score_mod = score_mod_pointers(s.mod_tensors_device, s.mod_scalars_device);
  return t;
}

BackwardTensors AttentionBuffers::backward_tensors() const {
  const State& s = *state_;
  BackwardTensors t;
  t.q = s.q.device();
  t.k = s.k.device();
  t.v = s.v.device();
  t.o = s.o.device.get();
  t.d_o = s.d_o.device.get();
  t.stats = s.stats.as<float>();
  t.seq_len_q = s.seq_len_q_device.as<std::int32_t>();
  t.seq_len_kv = s.seq_len_kv_device.as<std::int32_t>();
  t.bias = s.bias.device.get();
  t.sink = s.sink_device.as<float>();
  t.d_bias = s.d_bias.device.get();
  t.d_sink = s.d_sink.as<float>();
  t.dropout_seed = s.dropout_seed.as<std::int64_t>();
  t.dropout_offset = s.dropout_offset.as<std::int64_t>();
  t.score_mod = score_mod_pointers(s.mod_tensors_device, s.mod_scalars_device);
  if (s.with_backward) {
    t.d_q = s.dq.device();
    t.d_k = s.dk.device();
    t.d_v = s.dv.device();
  }
  return t;
}

const std::uint16_t* AttentionBuffers::host_input(const std::string& which) const {
  const State& s = *state_;
  if (which == "q") return s.q.host();
  if (which == "k") return s.k.host();
  if (which == "v") return s.v.host();
  if (which == "do") return s.d_o.host.data();
  if (which == "bias") return s.bias.host.data();
  throw InvalidArgument("host_input", which, "one of q, k, v, do, bias");
}

}  // namespace fusedattn::check
