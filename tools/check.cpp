// tools/check.cpp — one implementation of "run a spec on the GPU and compare with the reference".
#include "check.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/reference.h"

namespace fusedattn::check {

// --- CUDA helpers -----------------------------------------------------------------------------

void check_cuda(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  // Reset the (non-sticky) last-error state so that a later cudaGetLastError does not report it again.
  cudaGetLastError();
  throw CudaError(std::string(call) + " failed: " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  check_cuda(cudaMalloc(&data_, bytes), ("cudaMalloc(" + std::to_string(bytes) + " bytes)").c_str());
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);  // a failing free in a destructor has nowhere to go
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

namespace {

// A CUDA event that destroys itself.
class Event {
 public:
  Event() { check_cuda(cudaEventCreate(&event_), "cudaEventCreate"); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const noexcept { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Holds the stream on the host for a while, so that the calls enqueued behind it pile up and then
// run back to back: events then measure GPU time even where launching is slower than running.
void CUDART_CB hold_stream(void* milliseconds) {
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(*static_cast<const double*>(milliseconds)));
}

}  // namespace

double median_kernel_ms(const std::function<void()>& call, int warmup, int iters, cudaStream_t stream) {
  if (iters < 1) iters = 1;
  for (int i = 0; i < warmup; ++i) call();
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(after warm-up)");
  std::vector<std::unique_ptr<Event>> start, stop;
  for (int i = 0; i < iters; ++i) {
    start.emplace_back(new Event);
    stop.emplace_back(new Event);
  }
  static double hold_ms = 20.0;  // far longer than enqueueing a few dozen calls takes
  check_cuda(cudaLaunchHostFunc(stream, hold_stream, &hold_ms), "cudaLaunchHostFunc(hold_stream)");
  for (int i = 0; i < iters; ++i) {
    check_cuda(cudaEventRecord(start[i]->get(), stream), "cudaEventRecord(start)");
    call();
    check_cuda(cudaEventRecord(stop[i]->get(), stream), "cudaEventRecord(stop)");
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(after timed calls)");
  std::vector<double> ms(static_cast<std::size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    float elapsed = 0.0f;
    check_cuda(cudaEventElapsedTime(&elapsed, start[i]->get(), stop[i]->get()), "cudaEventElapsedTime");
    ms[static_cast<std::size_t>(i)] = elapsed;
  }
  std::nth_element(ms.begin(), ms.begin() + iters / 2, ms.end());
  return ms[static_cast<std::size_t>(iters / 2)];
}

namespace {

std::string with_spec(const std::string& what, const AttentionSpec& spec) {
  return what + " [spec: " + to_string(spec) + "]";
}

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

std::int64_t stats_elements(const AttentionSpec& spec) { return spec.batch() * spec.heads_q() * spec.seq_q(); }

std::size_t mask_elements(const AttentionSpec& spec) {
  return static_cast<std::size_t>(spec.batch() * spec.heads_q() * spec.seq_q() * spec.seq_kv());
}

std::size_t max_logit_elements(const AttentionSpec& spec) {
  return static_cast<std::size_t>(spec.max_logit == MaxLogit::head ? spec.heads_q() : stats_elements(spec));
}

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

// --- AttentionBuffers -------------------------------------------------------------------------

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
const std::vector<float>& AttentionBuffers::sink() const noexcept { return state_->sink; }

void AttentionBuffers::set_dropout_state(std::int64_t seed, std::int64_t offset) {
  State& s = *state_;
  if (s.dropout_seed.bytes() == 0) throw InvalidArgument("dropout", "0", "a spec with dropout > 0");
  check_cuda(cudaMemcpy(s.dropout_seed.get(), &seed, sizeof seed, cudaMemcpyHostToDevice), "cudaMemcpy(dropout seed)");
  check_cuda(cudaMemcpy(s.dropout_offset.get(), &offset, sizeof offset, cudaMemcpyHostToDevice),
             "cudaMemcpy(dropout offset)");
}
const std::vector<std::int32_t>& AttentionBuffers::seq_len_kv() const noexcept { return state_->seq_len_kv; }

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

// --- Results ----------------------------------------------------------------------------------

AttentionSpec ragged_twin(AttentionSpec spec) {
  for (TensorDesc* desc : {&spec.q, &spec.k, &spec.v, &spec.o}) {
    if (desc->ragged()) desc->strides[kBatch] = desc->dims[kSeq] * desc->strides[kSeq];
  }
  return spec;
}

AttentionSpec paged_twin(AttentionSpec spec) {
  if (!spec.paged_kv()) return spec;
  const std::int64_t batch = spec.batch(), seq = spec.seq_kv();
  for (TensorDesc* desc : {&spec.k, &spec.v}) {
    const std::int64_t row = desc->heads() * desc->head_dim();
    const bool token_major = desc->strides[kSeq] > desc->strides[kBatch];  // sbhd pages: tokens outermost
    desc->dims = {batch, desc->heads(), seq, desc->head_dim()};
    desc->strides = token_major ? std::array<std::int64_t, 4>{row, desc->head_dim(), batch * row, 1}
                                : std::array<std::int64_t, 4>{seq * row, desc->head_dim(), row, 1};
  }
  spec.kv_pages = 0;
  return spec;
}

double tolerance_for(DType dtype) {
  // Relative L2 error reachable by a correct kernel that rounds its outputs to 16 bits (8 and 11
  // significant bits): bf16 1e-2, f16 2e-3 (DESIGN.md §8).
  return dtype == DType::f16 ? 2e-3 : 1e-2;
}

std::string CheckResult::to_string() const {
  auto err = [](const char* name, double value) {
    if (std::isnan(value)) return std::string();
    char text[48];
    std::snprintf(text, sizeof text, " %s=%.3e", name, value);
    return std::string(text);
  };
  char tol[32];
  std::snprintf(tol, sizeof tol, "%.0e", tolerance);
  return std::string(passed ? "PASS" : "FAIL") + " \"" + spec + "\" ref=" + reference + " seed=" + std::to_string(seed) +
         err("o", err_o) + err("stats", err_stats) + err("max_logit", err_max_logit) + err("dq", err_dq) +
         err("dk", err_dk) + err("dv", err_dv) + err("dbias", err_dbias) + err("dsink", err_dsink) +
         (std::isnan(keep_rate) ? std::string() : " keep_rate=" + std::to_string(keep_rate)) + " tol=" + tol +
         (backward ? "" : " (forward only)");
}

namespace {

// Everything one check needs, computed once.
struct Problem {
  AttentionSpec spec;  // as checked: stats on when the backward is checked; dense (see ragged_twin)
  AttentionSpec run_spec;  // what fusedattn runs: spec, or the ragged spec it stands for
  CheckOptions options;
  double scale = 0.0;
  ReferenceProblem ref;
};

// The reference's outputs, in contiguous [b, h, s, d] order, in whichever precision it ran.
template <class T>
struct Outputs {
  std::vector<T> o, lse, dq, dk, dv;
  std::vector<T> max_logit, dbias, dsink;  // only what the spec asks for
  std::vector<T> dropout_mask;             // the keep mask fusedattn's forward drew (dropout)
};

// The per-head max logit from row maxima [b, h, s_q]: padded rows are -inf there, so a plain
// max over the batch and rows leaves them out.
template <class T>
std::vector<T> max_per_head(const std::vector<T>& rows, const AttentionSpec& spec) {
  std::vector<T> out(static_cast<std::size_t>(spec.heads_q()), -std::numeric_limits<T>::infinity());
  for (std::int64_t b = 0; b < spec.batch(); ++b) {
    for (std::int64_t h = 0; h < spec.heads_q(); ++h) {
      for (std::int64_t i = 0; i < spec.seq_q(); ++i) {
        const T value = rows[static_cast<std::size_t>((b * spec.heads_q() + h) * spec.seq_q() + i)];
        out[static_cast<std::size_t>(h)] = std::max(out[static_cast<std::size_t>(h)], value);
      }
    }
  }
  return out;
}

std::vector<float> download_floats(const float* device, std::int64_t n, const char* what) {
  std::vector<float> host(static_cast<std::size_t>(n));
  check_cuda(cudaMemcpy(host.data(), device, host.size() * sizeof(float), cudaMemcpyDeviceToHost), what);
  return host;
}

// A fusedattn output tensor as contiguous float32: exact for 16-bit values, and NaN stays NaN.
std::vector<float> gather_output(const TensorDesc& desc, const void* device) {
  DeviceBuffer contiguous(static_cast<std::size_t>(desc.elements()) * sizeof(float));
  gather_to_float_gpu(desc, device, contiguous.as<float>(), nullptr);
  check_cuda(cudaGetLastError(), "gather_to_float_gpu");
  return download_floats(contiguous.as<float>(), desc.elements(), "cudaMemcpy(gathered output, device to host)");
}

// int32 values copied to a new device buffer (synchronous).
DeviceBuffer upload_ints(const std::vector<std::int32_t>& host, const char* what) {
  DeviceBuffer device(host.size() * sizeof(std::int32_t));
  check_cuda(cudaMemcpy(device.get(), host.data(), device.bytes(), cudaMemcpyHostToDevice), what);
  return device;
}

// A ragged call over the dense twin's buffers: sequence b has the drawn lengths and starts at
// b * s, its slot in the twin, so the rows past its length are the gaps between sequences.
struct RaggedCall {
  DeviceBuffer cu_q, cu_kv, start_q, start_kv;
  RaggedTensors tensors;

  RaggedCall(const AttentionSpec& twin, const AttentionBuffers& buffers) {
    auto upload = [](const std::vector<std::int32_t>& host, DeviceBuffer& device) {
      device = upload_ints(host, "cudaMemcpy(ragged offsets)");
      return device.as<std::int32_t>();
    };
    auto cumulative = [](const std::vector<std::int32_t>& lengths) {
      std::vector<std::int32_t> out{0};
      for (std::int32_t n : lengths) out.push_back(out.back() + n);
      return out;
    };
    auto slots = [&](std::int64_t seq) {
      std::vector<std::int32_t> out;
      for (std::int64_t b = 0; b <= twin.batch(); ++b) out.push_back(static_cast<std::int32_t>(b * seq));
      return out;
    };
    tensors.sequences = twin.batch();
    tensors.cu_seqlens_q = upload(cumulative(buffers.seq_len_q()), cu_q);
    tensors.cu_seqlens_kv = upload(cumulative(buffers.seq_len_kv()), cu_kv);
    tensors.cu_seqlens_q_padded = upload(slots(twin.seq_q()), start_q);
    tensors.cu_seqlens_kv_padded = upload(slots(twin.seq_kv()), start_kv);
  }
};

// A paged call over the dense twin's K and V: each sequence's pages are copied into pools at
// random pages (a shuffled page table, spare pages left unused), so the paged run reads exactly
// the values the dense reference sees.
struct PagedCall {
  DeviceBuffer k_pool, v_pool, table_k, table_v;

  PagedCall(const AttentionSpec& paged, const AttentionSpec& twin, const ForwardTensors& dense, std::uint64_t seed) {
    const std::int64_t batch = paged.batch(), per_seq = paged.kv_pages, page = paged.page_size();
    if (paged.k.batch() < batch * per_seq) {
      throw InvalidArgument("pages", std::to_string(paged.k.batch()),
                            "at least b * kv_pages = " + std::to_string(batch * per_seq) +
                                " for the check, which gives every sequence pages of its own");
    }
    std::vector<std::int32_t> pages(static_cast<std::size_t>(paged.k.batch()));
    for (std::size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<std::int32_t>(i);
    std::mt19937_64 rng(seed);
    std::shuffle(pages.begin(), pages.end(), rng);
    std::vector<std::int32_t> table_for_k(pages.begin(), pages.begin() + batch * per_seq);
    std::shuffle(pages.begin(), pages.end(), rng);  // V's table differs from K's (each has its own pool)
    std::vector<std::int32_t> table_for_v(pages.begin(), pages.begin() + batch * per_seq);
    k_pool = fill_pool(paged.k, twin.k, dense.k, table_for_k, batch, per_seq, page);
    v_pool = fill_pool(paged.v, twin.v, dense.v, table_for_v, batch, per_seq, page);
    table_k = upload_ints(table_for_k, "cudaMemcpy(page table)");
    table_v = upload_ints(table_for_v, "cudaMemcpy(page table)");
  }

 private:

  // Page j of sequence b (tokens j * page ..) goes to pool page table[b * per_seq + j]: one 2-D copy
  // of `page` token rows of h * d elements, each side with its own token stride.
  static DeviceBuffer fill_pool(const TensorDesc& pool, const TensorDesc& dense, const void* source,
                                const std::vector<std::int32_t>& table, std::int64_t batch, std::int64_t per_seq,
                                std::int64_t page) {
    const std::size_t element = size_of(pool.dtype);
    DeviceBuffer out(static_cast<std::size_t>(pool.extent()) * element);
    check_cuda(cudaMemset(out.get(), 0, out.bytes()), "cudaMemset(page pool)");
    const std::size_t row = static_cast<std::size_t>(pool.heads() * pool.head_dim()) * element;
    for (std::int64_t b = 0; b < batch; ++b) {
      for (std::int64_t j = 0; j < per_seq; ++j) {
        const char* from = static_cast<const char*>(source) + (b * dense.strides[kBatch] + j * page * dense.strides[kSeq]) * element;
        char* to = static_cast<char*>(out.get()) + table[static_cast<std::size_t>(b * per_seq + j)] * pool.strides[kBatch] * element;
        check_cuda(cudaMemcpy2D(to, static_cast<std::size_t>(pool.strides[kSeq]) * element, from,
                                static_cast<std::size_t>(dense.strides[kSeq]) * element, row, static_cast<std::size_t>(page),
                                cudaMemcpyDeviceToDevice),
                   "cudaMemcpy2D(page)");
      }
    }
    return out;
  }
};

// Ragged statistics are token-major, [b, s_q, h_q] in the twin's slots: to [b, h_q, s_q].
std::vector<float> statistics_by_head(const std::vector<float>& by_token, const AttentionSpec& spec) {
  std::vector<float> out(by_token.size());
  const std::int64_t h = spec.heads_q(), s = spec.seq_q();
  for (std::int64_t b = 0; b < spec.batch(); ++b) {
    for (std::int64_t i = 0; i < s; ++i) {
      for (std::int64_t j = 0; j < h; ++j) out[static_cast<std::size_t>((b * h + j) * s + i)] = by_token[static_cast<std::size_t>((b * s + i) * h + j)];
    }
  }
  return out;
}

// Runs through the one-call API a user calls (plan lookup included), with a workspace of the
// size the cached plan asks for.
Outputs<float> run_fusedattn(const Problem& p, AttentionBuffers& buffers) {
  const float scale = static_cast<float>(p.scale);
  const bool ragged = p.run_spec.ragged_q() || p.run_spec.ragged_kv();
  std::unique_ptr<RaggedCall> ragged_call(ragged ? new RaggedCall(p.spec, buffers) : nullptr);
  std::unique_ptr<PagedCall> paged_call(
      p.run_spec.paged_kv() ? new PagedCall(p.run_spec, p.spec, buffers.forward_tensors(), p.options.seed) : nullptr);
  {
    DeviceBuffer workspace(get_plan(p.run_spec, Pass::forward)->workspace_bytes());
    ForwardTensors tensors = buffers.forward_tensors();
    if (ragged) tensors.ragged = ragged_call->tensors;
    if (paged_call) {
      tensors.k = paged_call->k_pool.get();
      tensors.v = paged_call->v_pool.get();
      tensors.page_table_k = paged_call->table_k.as<std::int32_t>();
      tensors.page_table_v = paged_call->table_v.as<std::int32_t>();
    }
    forward(p.run_spec, tensors, scale, nullptr, Workspace{workspace.get(), workspace.bytes()});
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(after fusedattn forward)");
  }
  if (p.options.backward) {
    DeviceBuffer workspace(get_plan(p.run_spec, Pass::backward)->workspace_bytes());
    BackwardTensors tensors = buffers.backward_tensors();
    if (ragged) tensors.ragged = ragged_call->tensors;
    backward(p.run_spec, tensors, scale, nullptr, Workspace{workspace.get(), workspace.bytes()});
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(after fusedattn backward)");
  }
  Outputs<float> out;
  const ForwardTensors f = buffers.forward_tensors();
  out.o = gather_output(p.spec.o, f.o);
  if (p.spec.stats) out.lse = download_floats(f.stats, stats_elements(p.spec), "cudaMemcpy(stats, device to host)");
  if (p.spec.stats && p.run_spec.ragged_q()) out.lse = statistics_by_head(out.lse, p.spec);
  if (p.spec.max_logit != MaxLogit::none) {
    out.max_logit = download_floats(f.max_logit, static_cast<std::int64_t>(max_logit_elements(p.spec)),
                                    "cudaMemcpy(max logit, device to host)");
  }
  if (p.spec.dropout_mask_out) {
    out.dropout_mask = download_floats(f.dropout_mask, static_cast<std::int64_t>(mask_elements(p.spec)),
                                       "cudaMemcpy(dropout mask, device to host)");
  }
  if (p.options.backward) {
    const BackwardTensors b = buffers.backward_tensors();
    out.dq = gather_output(p.spec.q, b.d_q);
    out.dk = gather_output(p.spec.k, b.d_k);
    out.dv = gather_output(p.spec.v, b.d_v);
    if (p.spec.bias_grad) out.dbias = gather_output(bias_desc(p.spec), b.d_bias);
    if (p.spec.softmax == Softmax::sink) out.dsink = download_floats(b.d_sink, p.spec.heads_q(), "cudaMemcpy(dSink)");
  }
  return out;
}

Outputs<double> reference_cpu(const Problem& p, const AttentionBuffers& buffers, const std::vector<float>& mask) {
  const auto q = gather_to_double(p.spec.q, buffers.host_input("q"));
  const auto k = gather_to_double(p.spec.k, buffers.host_input("k"));
  const auto v = gather_to_double(p.spec.v, buffers.host_input("v"));
  Outputs<double> ref;
  ref.o.resize(static_cast<std::size_t>(p.spec.o.elements()));
  ref.lse.resize(static_cast<std::size_t>(stats_elements(p.spec)));
  std::vector<double> bias, sink(buffers.sink().begin(), buffers.sink().end());
  if (p.spec.bias != Bias::none) bias = gather_to_double(bias_desc(p.spec), buffers.host_input("bias"));
  ReferenceExtras<double> extras;
  extras.bias = bias.empty() ? nullptr : bias.data();
  extras.sink = sink.empty() ? nullptr : sink.data();
  const std::vector<double> keep(mask.begin(), mask.end());
  extras.dropout_mask = keep.empty() ? nullptr : keep.data();
  if (p.spec.max_logit != MaxLogit::none) {
    ref.max_logit.resize(static_cast<std::size_t>(stats_elements(p.spec)));
    extras.max_logit = ref.max_logit.data();
  }
  reference_forward_cpu(p.ref, q.data(), k.data(), v.data(), ref.o.data(), ref.lse.data(), extras);
  if (p.spec.max_logit == MaxLogit::head) ref.max_logit = max_per_head(ref.max_logit, p.spec);
  if (p.options.backward) {
    const auto d_o = gather_to_double(p.spec.o, buffers.host_input("do"));
    ref.dq.resize(q.size());
    ref.dk.resize(k.size());
    ref.dv.resize(v.size());
    ReferenceExtras<double> grads;
    grads.bias = extras.bias;
    grads.sink = extras.sink;
    grads.dropout_mask = extras.dropout_mask;
    if (p.spec.bias_grad) {
      ref.dbias.resize(bias.size());
      grads.d_bias = ref.dbias.data();
    }
    if (p.spec.softmax == Softmax::sink) {
      ref.dsink.resize(sink.size());
      grads.d_sink = ref.dsink.data();
    }
    reference_backward_cpu(p.ref, q.data(), k.data(), v.data(), d_o.data(), ref.dq.data(), ref.dk.data(),
                           ref.dv.data(), grads);
  }
  return ref;
}

Outputs<float> reference_gpu(const Problem& p, const AttentionBuffers& buffers) {
  // With dropout the keep mask fusedattn drew is still on the device, where the reference reads it.
  const AttentionSpec& spec = p.spec;
  auto floats = [](const TensorDesc& desc) {
    return DeviceBuffer(static_cast<std::size_t>(desc.elements()) * sizeof(float));
  };
  const ForwardTensors in = buffers.forward_tensors();
  DeviceBuffer q = floats(spec.q), k = floats(spec.k), v = floats(spec.v), o = floats(spec.o);
  DeviceBuffer lse(static_cast<std::size_t>(stats_elements(spec)) * sizeof(float));
  gather_to_float_gpu(spec.q, in.q, q.as<float>(), nullptr);
  gather_to_float_gpu(spec.k, in.k, k.as<float>(), nullptr);
  gather_to_float_gpu(spec.v, in.v, v.as<float>(), nullptr);
  ReferenceExtras<float> extras;
  DeviceBuffer bias, max_logit;
  if (spec.bias != Bias::none) {
    bias = floats(bias_desc(spec));
    gather_to_float_gpu(bias_desc(spec), in.bias, bias.as<float>(), nullptr);
    extras.bias = bias.as<float>();
  }
  extras.sink = in.sink;  // already float32 on the device
  extras.dropout_mask = in.dropout_mask;
  if (spec.max_logit != MaxLogit::none) {
    max_logit = DeviceBuffer(static_cast<std::size_t>(stats_elements(spec)) * sizeof(float));
    extras.max_logit = max_logit.as<float>();
  }
  reference_forward_gpu(p.ref, q.as<float>(), k.as<float>(), v.as<float>(), o.as<float>(), lse.as<float>(), nullptr,
                        extras);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(after reference_forward_gpu)");
  Outputs<float> ref;
  ref.o = download_floats(o.as<float>(), spec.o.elements(), "cudaMemcpy(reference O)");
  ref.lse = download_floats(lse.as<float>(), stats_elements(spec), "cudaMemcpy(reference lse)");
  if (spec.max_logit != MaxLogit::none) {
    ref.max_logit = download_floats(max_logit.as<float>(), stats_elements(spec), "cudaMemcpy(reference max logit)");
    if (spec.max_logit == MaxLogit::head) ref.max_logit = max_per_head(ref.max_logit, spec);
  }
  if (p.options.backward) {
    DeviceBuffer d_o = floats(spec.o), dq = floats(spec.q), dk = floats(spec.k), dv = floats(spec.v);
    gather_to_float_gpu(spec.o, buffers.backward_tensors().d_o, d_o.as<float>(), nullptr);
    ReferenceExtras<float> grads;
    grads.bias = extras.bias;
    grads.sink = extras.sink;
    grads.dropout_mask = extras.dropout_mask;
    DeviceBuffer d_bias, d_sink;
    if (spec.bias_grad) {
      d_bias = floats(bias_desc(spec));
      grads.d_bias = d_bias.as<float>();
    }
    if (spec.softmax == Softmax::sink) {
      d_sink = DeviceBuffer(static_cast<std::size_t>(spec.heads_q()) * sizeof(float));
      grads.d_sink = d_sink.as<float>();
    }
    reference_backward_gpu(p.ref, q.as<float>(), k.as<float>(), v.as<float>(), o.as<float>(), lse.as<float>(),
                           d_o.as<float>(), dq.as<float>(), dk.as<float>(), dv.as<float>(), nullptr, grads);
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(after reference_backward_gpu)");
    if (spec.bias_grad) ref.dbias = download_floats(d_bias.as<float>(), bias_desc(spec).elements(), "cudaMemcpy(dBias)");
    if (spec.softmax == Softmax::sink) ref.dsink = download_floats(d_sink.as<float>(), spec.heads_q(), "cudaMemcpy(dSink)");
    ref.dq = download_floats(dq.as<float>(), spec.q.elements(), "cudaMemcpy(reference dQ)");
    ref.dk = download_floats(dk.as<float>(), spec.k.elements(), "cudaMemcpy(reference dK)");
    ref.dv = download_floats(dv.as<float>(), spec.v.elements(), "cudaMemcpy(reference dV)");
  }
  return ref;
}

template <class R>
double error_of(const std::vector<float>& out, const std::vector<R>& ref) {
  if (out.size() != ref.size()) return std::numeric_limits<double>::infinity();
  return relative_error<float, R>(out.data(), ref.data(), static_cast<std::int64_t>(out.size()));
}

// Rows that see no key have lse = -inf in the reference; what a kernel writes there is not
// defined by the math, so only rows with a finite reference are compared. A non-finite value
// where the reference is finite still counts (relative_error makes it infinite).
template <class R>
double stats_error(const std::vector<float>& out, const std::vector<R>& ref) {
  if (out.size() != ref.size()) return std::numeric_limits<double>::infinity();
  std::vector<float> kept_out;
  std::vector<R> kept_ref;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(static_cast<double>(ref[i]))) continue;
    kept_out.push_back(out[i]);
    kept_ref.push_back(ref[i]);
  }
  if (kept_ref.empty()) return 0.0;
  return error_of(kept_out, kept_ref);
}

template <class R>
void compare(const Problem& p, const Outputs<float>& out, const Outputs<R>& ref, CheckResult* result) {
  result->err_o = error_of(out.o, ref.o);
  if (p.spec.stats) result->err_stats = stats_error(out.lse, ref.lse);
  if (p.spec.max_logit != MaxLogit::none) result->err_max_logit = error_of(out.max_logit, ref.max_logit);
  if (p.options.backward) {
    result->err_dq = error_of(out.dq, ref.dq);
    result->err_dk = error_of(out.dk, ref.dk);
    result->err_dv = error_of(out.dv, ref.dv);
    if (p.spec.bias_grad) result->err_dbias = error_of(out.dbias, ref.dbias);
    if (p.spec.softmax == Softmax::sink) result->err_dsink = error_of(out.dsink, ref.dsink);
  }
}

// The kept fraction over the entries that were drawn for a probability that exists: visible keys
// of valid rows (elsewhere the mask's value does not matter and is not counted).
void keep_rate(const Problem& p, const std::vector<float>& mask, CheckResult* result) {
  const AttentionSpec& s = p.spec;
  double kept = 0.0, drawn = 0.0;
  for (std::int64_t b = 0; b < s.batch(); ++b) {
    for (std::int64_t h = 0; h < s.heads_q(); ++h) {
      for (std::int64_t i = 0; i < s.seq_q(); ++i) {
        for (std::int64_t j = 0; j < s.seq_kv(); ++j) {
          if (!reference_visible(p.ref, b, i, j)) continue;
          kept += mask[static_cast<std::size_t>(((b * s.heads_q() + h) * s.seq_q() + i) * s.seq_kv() + j)];
          drawn += 1.0;
        }
      }
    }
  }
  result->keep_rate = drawn > 0 ? kept / drawn : std::numeric_limits<double>::quiet_NaN();
  result->keep_rate_sigma = drawn > 0 ? std::sqrt(s.dropout * (1.0 - s.dropout) / drawn) : 0.0;
}

std::uint64_t fresh_seed() {
  std::random_device device;
  std::uint64_t seed = (static_cast<std::uint64_t>(device()) << 32) ^ device();
  return seed == 0 ? 1 : seed;  // 0 means "draw one", so never report it as the seed used
}

// CPU float64 up to ~3e8 multiply-adds per forward (a second or two with the backward);
// beyond that the float32 GPU reference.
// Ragged lengths on top of the drawn ones: packed Q/K/V tokens (t3hd, th3d) make each sequence's
// Q and KV lengths one, and from three sequences on, the second one is empty (0 and 0).
void ragged_lengths(const AttentionSpec& ragged, AttentionBuffers& buffers) {
  std::vector<std::int32_t> q = buffers.seq_len_q(), kv = buffers.seq_len_kv();
  const std::optional<Layout> layout = named_layout(ragged);
  if (layout && packs_qkv(*layout)) kv = q;
  if (q.size() >= 3) q[1] = kv[1] = 0;
  buffers.set_lengths(q, kv);
}

bool use_cpu_reference(const AttentionSpec& spec) {
  const double work = static_cast<double>(spec.batch()) * spec.heads_q() * spec.seq_q() * spec.seq_kv() *
                      static_cast<double>(spec.head_dim_qk() + spec.head_dim_v());
  return work <= 3e8;
}

}  // namespace

CheckResult check_against_reference(const AttentionSpec& spec, const CheckOptions& options) {
  validate(spec);
  Problem p;
  p.spec = spec;
  if (options.backward) p.spec.stats = true;  // the backward consumes the forward's statistics
  // With dropout the forward also hands back the mask it drew, so the reference applies exactly
  // that one; the backward must regenerate the same mask from the same seed and offset.
  if (spec.dropout > 0.0) p.spec.dropout_mask_out = true;
  p.run_spec = p.spec;
  const bool ragged = spec.ragged_q() || spec.ragged_kv();
  p.spec = paged_twin(ragged_twin(p.spec));
  p.options = options;
  if (p.options.seed == 0) p.options.seed = fresh_seed();
  p.scale = std::isnan(options.scale) ? static_cast<double>(default_scale(spec)) : options.scale;
  p.ref = reference_problem(p.spec, p.scale);
  p.ref.dropout = p.spec.dropout;

  CheckResult result;
  result.spec = to_string(p.run_spec);
  result.seed = p.options.seed;
  result.backward = options.backward;
  result.tolerance = tolerance_for(spec.q.dtype);
  result.reference = use_cpu_reference(spec) ? "cpu-f64" : "gpu-f32";

  try {
    AttentionBuffers buffers(p.spec, options.backward);
    buffers.fill_inputs(p.options.seed);
    if (ragged) ragged_lengths(p.run_spec, buffers);
    p.ref.seq_len_q.assign(buffers.seq_len_q().begin(), buffers.seq_len_q().end());
    p.ref.seq_len_kv.assign(buffers.seq_len_kv().begin(), buffers.seq_len_kv().end());
    buffers.poison_outputs();
    const Outputs<float> out = run_fusedattn(p, buffers);
    if (p.spec.dropout > 0.0) keep_rate(p, out.dropout_mask, &result);
    if (result.reference == "cpu-f64") {
      compare(p, out, reference_cpu(p, buffers, out.dropout_mask), &result);
    } else {
      compare(p, out, reference_gpu(p, buffers), &result);
    }
  } catch (const CudaError& error) {
    throw CudaError(with_spec(error.what(), p.spec));
  }

  // An error that was computed must be <= tolerance; NaN compares false, so it never passes.
  auto ok = [&](double err, bool computed) { return !computed || err <= result.tolerance; };
  const bool sink_grad = options.backward && p.spec.softmax == Softmax::sink;
  // The kept fraction is binomial around 1 - p: within 5 standard deviations, or the RNG is off.
  const bool keep_rate_ok = p.spec.dropout == 0.0 ||
                            std::abs(result.keep_rate - (1.0 - p.spec.dropout)) <= 5.0 * result.keep_rate_sigma;
  result.passed = ok(result.err_o, true) && ok(result.err_stats, p.spec.stats) &&
                  ok(result.err_max_logit, p.spec.max_logit != MaxLogit::none) &&
                  ok(result.err_dq, options.backward) && ok(result.err_dk, options.backward) &&
                  ok(result.err_dv, options.backward) && ok(result.err_dbias, options.backward && p.spec.bias_grad) &&
                  ok(result.err_dsink, sink_grad) && keep_rate_ok;
  return result;
}

}  // namespace fusedattn::check
