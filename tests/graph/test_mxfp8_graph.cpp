// The MXFP8 graphs without a GPU: fusedattn's MXFP8 forward and backward graphs (src/graph/
// mxfp8_graph.h), built for a made-up SM 10.0 and put through the frontend's own validation, which
// is where cuDNN's frontend checks MXFP8's scale tensors (their type, reordering and dims). cuDNN
// 9.19, installed here, is refused by the version check that comes first; this executable's own
// cudnnGetVersion can answer 9.21 instead, so the checks behind it run too. What validation cannot
// see (the operation graph, heuristics, plans: they need a cuDNN handle, and so a GPU) is the GPU
// tier's on a Blackwell GPU.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <cudnn_frontend.h>

#include "fusedattn/layout.h"
#include "fusedattn/mxfp8.h"
#include "fusedattn/spec.h"
#include "graph/frontend_graph.h"
#include "graph/mxfp8_graph.h"

namespace {

std::atomic<bool> g_cudnn_9_21{false};
std::atomic<long> g_version_calls{0};

using VersionFunction = std::size_t (*)(void);

VersionFunction real_cudnn_get_version() {
  static const auto real = reinterpret_cast<VersionFunction>(dlsym(RTLD_NEXT, "cudnnGetVersion"));
  return real;
}

}  // namespace

// The frontend's version checks call cudnnGetVersion directly (cudnn_frontend_shim.h's
// get_backend_version, without dynamic loading), and an executable's own definition comes before
// libcudnn's. It answers cuDNN's value unless a test has switched 9.21 on.
extern "C" std::size_t cudnnGetVersion(void) {
  g_version_calls.fetch_add(1);
  if (g_cudnn_9_21.load()) return 92100;
  const VersionFunction real = real_cudnn_get_version();
  return real ? real() : 0;
}

namespace fusedattn::graph {
namespace {

namespace fe = cudnn_frontend;
using detail::TensorPtr;

constexpr int kSm100 = 100;  // a Blackwell data-center GPU, which MXFP8's forward needs

// While alive, cudnnGetVersion answers 9.21.0; fails the test where the answer would not be ours.
class Cudnn9_21 {
 public:
  Cudnn9_21() {
    EXPECT_EQ(dlsym(RTLD_DEFAULT, "cudnnGetVersion"), reinterpret_cast<void*>(&cudnnGetVersion))
        << "cudnnGetVersion resolves past the test's own, so 9.21 would not be seen";
    g_cudnn_9_21 = true;
  }
  ~Cudnn9_21() { g_cudnn_9_21 = false; }
};

struct Shape {
  const char* name;
  Layout layout;
  std::int64_t b, s_q, s_kv, h_q, h_kv, d;
  bool causal;
};

// Lengths that are no multiple of 32 or 128, s_q != s_kv, grouped heads, packed QKV, d 128 and
// smaller (a partial block group: 96 is 3 blocks, padded to 4).
const Shape kShapes[] = {
    {"gqa_cross_128", Layout::bshd, 2, 200, 333, 8, 2, 128, true},
    {"sbhd_64", Layout::sbhd, 1, 1000, 1000, 4, 4, 64, false},
    {"bhsd_short_96", Layout::bhsd, 3, 77, 129, 6, 3, 96, false},
    {"packed_qkv_128", Layout::bs3hd, 2, 300, 300, 4, 4, 128, true},
};

AttentionSpec mxfp8_spec(const Shape& s) {
  ProblemShape shape;
  shape.dtype = DType::e4m3;
  shape.batch = s.b;
  shape.seq_q = s.s_q;
  shape.seq_kv = s.s_kv;
  shape.heads_q = s.h_q;
  shape.heads_kv = s.h_kv;
  shape.head_dim_qk = shape.head_dim_v = s.d;
  AttentionSpec spec = spec_for_layout(s.layout, shape);
  if (s.causal) spec.window = kCausal;
  spec.fp8_scaling = Fp8Scaling::mxfp8;
  spec.o.dtype = DType::bf16;
  validate(spec);
  return spec;
}

struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  std::vector<std::int64_t> uids;
};

Built build(const AttentionSpec& spec, Pass pass) {
  Built built;
  built.graph = detail::frontend_graph(spec, pass, fe::AttentionImplementation_t::AUTO, built.uids, kSm100);
  return built;
}

std::string where(const Shape& shape, Pass pass) { return std::string(shape.name) + " " + to_string(pass); }

std::vector<std::int64_t> as_vector(const std::array<std::int64_t, 4>& values) { return {values.begin(), values.end()}; }

TEST(Mxfp8Graph, CudnnGetVersionIsTheTests) {
  ASSERT_NE(real_cudnn_get_version(), nullptr) << "libcudnn's cudnnGetVersion not found";
  EXPECT_EQ(dlsym(RTLD_DEFAULT, "cudnnGetVersion"), reinterpret_cast<void*>(&cudnnGetVersion));
  const long before = g_version_calls.load();
  EXPECT_EQ(cudnn_frontend::detail::get_backend_version(), real_cudnn_get_version()());
  {
    Cudnn9_21 fake;
    EXPECT_EQ(cudnn_frontend::detail::get_backend_version(), 92100u);
  }
  EXPECT_EQ(g_version_calls.load() - before, 2);  // the frontend's question reached the test's answer
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  std::printf("  cuDNN loaded: %zu; CUDA devices: %s\n", real_cudnn_get_version()(),
              status == cudaSuccess ? std::to_string(devices).c_str() : cudaGetErrorString(status));
}

TEST(Mxfp8Graph, TheLoadedCudnnIsRefusedWithTheFrontendsVersionMessage) {
  const std::size_t loaded = real_cudnn_get_version()();
  for (const Shape& shape : kShapes) {
    for (Pass pass : {Pass::forward, Pass::backward}) {
      fe::error_t status = build(mxfp8_spec(shape), pass).graph->validate();
      if (loaded >= 92100) {
        EXPECT_TRUE(status.is_good()) << where(shape, pass) << ": " << status.get_message();
      } else {
        ASSERT_TRUE(status.is_bad()) << where(shape, pass) << " validated with cuDNN " << loaded;
        EXPECT_EQ(status.get_code(), fe::error_code_t::GRAPH_NOT_SUPPORTED) << where(shape, pass);
        EXPECT_EQ(status.get_message(), "MXFP8 SDPA requires cuDNN 9.21.0 or later") << where(shape, pass);
      }
    }
  }
}

// Validation alone would also pass scales that the frontend failed to take for MXFP8 (without the
// F8_128x4 reordering it validates the graph as per-tensor FP8): the refusal above, which only the
// MXFP8 checks give, and the tensors' inspection below are what tie this to the MXFP8 path.
TEST(Mxfp8Graph, WithCudnn9_21TheFrontendValidatesEveryShape) {
  Cudnn9_21 fake;
  for (const Shape& shape : kShapes) {
    for (Pass pass : {Pass::forward, Pass::backward}) {
      const long before = g_version_calls.load();
      fe::error_t status = build(mxfp8_spec(shape), pass).graph->validate();
      EXPECT_TRUE(status.is_good()) << where(shape, pass) << ": " << status.get_message();
      EXPECT_GT(g_version_calls.load(), before) << where(shape, pass) << ": no version check reached the test's";
    }
  }
}

// One expected scale tensor: its UID, the tensor it scales and the axis it is blocked along.
struct Expected {
  Uid uid;
  const TensorDesc* of;
  Axis blocked;
};

void expect_scales(const fe::graph::Graph& graph, const Expected& e, const std::string& at) {
  fe::graph::Tensor_attributes t;
  ASSERT_TRUE(graph.query_tensor_attributes_of_uid(e.uid, t).is_good()) << at << ": no tensor " << e.uid;
  const Mxfp8ScaleShape shape = mxfp8_scale_shape(e.of->dims, e.blocked);
  EXPECT_EQ(t.get_data_type(), fe::DataType_t::FP8_E8M0) << at << " " << t.get_name();
  EXPECT_EQ(t.get_reordering_type(), fe::TensorReordering_t::F8_128x4) << at << " " << t.get_name();
  EXPECT_EQ(t.get_dim(), as_vector(shape.swizzled_dims())) << at << " " << t.get_name();
  // One padded matrix per (b, h), b outer, a row's blocks side by side.
  const std::int64_t matrix = shape.padded_rows * shape.padded_blocks;
  const std::vector<std::int64_t> strides =
      e.blocked == kDim ? std::vector<std::int64_t>{e.of->heads() * matrix, matrix, shape.padded_blocks, 1}
                        : std::vector<std::int64_t>{e.of->heads() * matrix, matrix, 1, shape.padded_blocks};
  EXPECT_EQ(t.get_stride(), strides) << at << " " << t.get_name();
  // The byte count the call's buffer has (fusedattn/mxfp8_scales.h) is what the strides reach.
  EXPECT_EQ(shape.swizzled_bytes(), t.get_dim()[0] * t.get_stride()[0]) << at << " " << t.get_name();
}

void expect_tensor(const fe::graph::Graph& graph, Uid uid, const TensorDesc& desc, fe::DataType_t type,
                   const std::string& at) {
  fe::graph::Tensor_attributes t;
  ASSERT_TRUE(graph.query_tensor_attributes_of_uid(uid, t).is_good()) << at << ": no tensor " << uid;
  EXPECT_EQ(t.get_dim(), as_vector(desc.dims)) << at << " " << t.get_name();
  EXPECT_EQ(t.get_stride(), as_vector(desc.strides)) << at << " " << t.get_name();
  EXPECT_EQ(t.get_data_type(), type) << at << " " << t.get_name();
  EXPECT_EQ(t.get_reordering_type(), fe::TensorReordering_t::NONE) << at << " " << t.get_name();
}

TEST(Mxfp8Graph, TheScaleTensorsAreMxfp8ScaleShapesAndTheCopiesTheirOriginals) {
  for (const Shape& shape : kShapes) {
    const AttentionSpec spec = mxfp8_spec(shape);
    const Built forward = build(spec, Pass::forward);
    const std::string f = where(shape, Pass::forward);
    for (const Expected& e : {Expected{kUidSfQ, &spec.q, kDim}, Expected{kUidSfK, &spec.k, kDim},
                              Expected{kUidSfV, &spec.v, kSeq}}) {
      expect_scales(*forward.graph, e, f);
    }
    expect_tensor(*forward.graph, kUidQ, spec.q, fe::DataType_t::FP8_E4M3, f);
    EXPECT_EQ(forward.uids, (std::vector<std::int64_t>{kUidQ, kUidK, kUidV, kUidO, kUidStats, kUidScale, kUidSfQ,
                                                       kUidSfK, kUidSfV, kUidMxfp8AmaxO}))
        << f;

    const Built backward = build(spec, Pass::backward);
    const std::string b = where(shape, Pass::backward);
    for (const Expected& e :
         {Expected{kUidSfQ, &spec.q, kDim}, Expected{kUidSfQT, &spec.q, kSeq}, Expected{kUidSfK, &spec.k, kDim},
          Expected{kUidSfKT, &spec.k, kSeq}, Expected{kUidSfV, &spec.v, kDim}, Expected{kUidSfDO, &spec.o, kDim},
          Expected{kUidSfDOT, &spec.o, kSeq}}) {
      expect_scales(*backward.graph, e, b);
    }
    expect_tensor(*backward.graph, kUidQT, spec.q, fe::DataType_t::FP8_E4M3, b);
    expect_tensor(*backward.graph, kUidKT, spec.k, fe::DataType_t::FP8_E4M3, b);
    expect_tensor(*backward.graph, kUidDOFp8, spec.o, fe::DataType_t::FP8_E4M3, b);
    expect_tensor(*backward.graph, kUidDOT, spec.o, fe::DataType_t::FP8_E4M3, b);
    expect_tensor(*backward.graph, kUidO, spec.o, fe::DataType_t::BFLOAT16, b);   // 16-bit, for dO . O
    expect_tensor(*backward.graph, kUidDO, spec.o, fe::DataType_t::BFLOAT16, b);  // likewise
    EXPECT_EQ(backward.uids,
              (std::vector<std::int64_t>{kUidQ, kUidK, kUidV, kUidO, kUidStats, kUidScale, kUidDO, kUidDQ, kUidDK,
                                         kUidDV, kUidSfQ, kUidSfK, kUidSfV, kUidSfQT, kUidSfKT, kUidSfDO, kUidSfDOT,
                                         kUidQT, kUidKT, kUidDOFp8, kUidDOT, kUidMxfp8AmaxDQ, kUidMxfp8AmaxDK,
                                         kUidMxfp8AmaxDV}))
        << b;
  }
}

// --- negative controls: scale tensors the frontend must refuse, so the tests above can fail ------

// A forward written out by hand, with the scale tensors given (`adjust` may spoil one first).
fe::error_t validate_forward_by_hand(const AttentionSpec& spec,
                                     const std::function<void(fe::graph::Tensor_attributes& sf_q,
                                                              fe::graph::Tensor_attributes& sf_k,
                                                              fe::graph::Tensor_attributes& sf_v)>& adjust) {
  fe::graph::Graph graph;
  graph.set_io_data_type(fe::DataType_t::FP8_E4M3)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT)
      .set_sm_version(kSm100);
  auto q = graph.tensor(detail::describe("q", kUidQ, spec.q));
  auto k = graph.tensor(detail::describe("k", kUidK, spec.k));
  auto v = graph.tensor(detail::describe("v", kUidV, spec.v));
  fe::graph::Tensor_attributes sf_q = detail::mxfp8_scale_desc("sf_q", kUidSfQ, spec.q.dims, kDim);
  fe::graph::Tensor_attributes sf_k = detail::mxfp8_scale_desc("sf_k", kUidSfK, spec.k.dims, kDim);
  fe::graph::Tensor_attributes sf_v = detail::mxfp8_scale_desc("sf_v", kUidSfV, spec.v.dims, kSeq);
  adjust(sf_q, sf_k, sf_v);
  auto attributes = fe::graph::SDPA_fp8_attributes().set_name("by_hand").set_generate_stats(true).set_attn_scale(0.1f);
  auto out = graph.sdpa_fp8(q, k, v, graph.tensor(sf_q), graph.tensor(sf_k), graph.tensor(sf_v), attributes);
  TensorDesc o = spec.o;
  out[0]->set_output(true).set_dim(as_vector(o.dims)).set_stride(as_vector(o.strides)).set_data_type(
      fe::DataType_t::BFLOAT16);
  out[1]->set_output(true).set_data_type(fe::DataType_t::FLOAT);
  out[2]->set_output(true).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(fe::DataType_t::FLOAT);
  return graph.validate();
}

void expect_refused(fe::error_t status, const std::string& message) {
  ASSERT_TRUE(status.is_bad()) << "validated; expected: " << message;
  EXPECT_NE(status.get_message().find(message), std::string::npos) << status.get_message();
}

TEST(Mxfp8Graph, TheFrontendRefusesWrongForwardScales) {
  Cudnn9_21 fake;
  const AttentionSpec spec = mxfp8_spec(kShapes[0]);
  using T = fe::graph::Tensor_attributes;
  fe::error_t as_built = validate_forward_by_hand(spec, [](T&, T&, T&) {});
  EXPECT_TRUE(as_built.is_good()) << as_built.get_message();  // the hand-built graph itself is sound
  expect_refused(validate_forward_by_hand(
                     spec, [](T&, T& sf_k, T&) { sf_k.set_reordering_type(fe::TensorReordering_t::NONE); }),
                 "MXFP8 SDPA requires Descale_K to have F8_128x4 reordering");
  expect_refused(validate_forward_by_hand(
                     spec, [](T&, T&, T& sf_v) { sf_v.set_data_type(fe::DataType_t::FP8_E4M3); }),
                 "MXFP8 SDPA requires Descale_V to have FP8_E8M0 data type");
  // V's scales for half its keys: 6 blocks of 32, padded to 8, where 333 keys need 11.
  AttentionSpec half = spec;
  half.v.dims[kSeq] = spec.seq_kv() / 2;
  const std::vector<std::int64_t> short_dims = as_vector(mxfp8_scale_shape(half.v.dims, kSeq).swizzled_dims());
  expect_refused(validate_forward_by_hand(spec, [&](T&, T&, T& sf_v) { sf_v.set_dim(short_dims); }),
                 "MXFP8 SDPA: Descale_V s_scale dimension too small (expected >= 11)");
  // Q's scales laid out as if blocked along s: their d-blocks axis is no longer the contiguous one.
  const fe::graph::Tensor_attributes along_s = detail::mxfp8_scale_desc("sf_q", kUidSfQ, spec.q.dims, kSeq);
  expect_refused(validate_forward_by_hand(spec, [&](T& sf_q, T&, T&) { sf_q.set_stride(along_s.get_stride()); }),
                 "MXFP8 SDPA requires Descale_Q to have contiguous d_scale dimension (stride[3] == 1)");
}

TEST(Mxfp8Graph, TheFrontendRefusesBackwardScalesOfAnotherShape) {
  // The backward's tensors as fusedattn describes them, with the MXFP8 part made for `scales_of`.
  Cudnn9_21 fake;
  const AttentionSpec spec = mxfp8_spec(kShapes[0]);
  auto validate_with_scales_of = [&](const AttentionSpec& scales_of) {
    fe::graph::Graph graph;
    graph.set_io_data_type(fe::DataType_t::FP8_E4M3)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT)
        .set_sm_version(kSm100);
    const std::int64_t h = spec.heads_q(), s = spec.seq_q();
    const auto stats_desc = fe::graph::Tensor_attributes().set_name("stats").set_uid(kUidStats).set_dim(
        {spec.batch(), h, s, 1}).set_stride({h * s, s, 1, 1}).set_data_type(fe::DataType_t::FLOAT);
    const std::array<TensorPtr, 6> in = {graph.tensor(detail::describe("q", kUidQ, spec.q)),
                                         graph.tensor(detail::describe("k", kUidK, spec.k)),
                                         graph.tensor(detail::describe("v", kUidV, spec.v)),
                                         graph.tensor(detail::describe("o", kUidO, spec.o)),
                                         graph.tensor(detail::describe("d_o", kUidDO, spec.o)),
                                         graph.tensor(stats_desc)};
    auto attributes = fe::graph::SDPA_fp8_backward_attributes().set_name("by_hand").set_attn_scale(0.1f);
    std::vector<std::int64_t> uids;
    const std::array<TensorPtr, 3> grads = detail::mxfp8_gradients(graph, scales_of, in, attributes, uids);
    for (int i = 0; i < 3; ++i) {
      const TensorDesc& like = i == 0 ? spec.q : i == 1 ? spec.k : spec.v;
      grads[static_cast<std::size_t>(i)]->set_output(true).set_dim(as_vector(like.dims)).set_stride(
          as_vector(like.strides)).set_data_type(fe::DataType_t::BFLOAT16);
    }
    return graph.validate();
  };
  fe::error_t as_built = validate_with_scales_of(spec);
  EXPECT_TRUE(as_built.is_good()) << as_built.get_message();
  AttentionSpec fewer_heads = spec;  // scales for one head group less than Q has
  fewer_heads.q.dims[kHead] = spec.heads_q() - spec.heads_kv();
  expect_refused(validate_with_scales_of(fewer_heads), "MXFP8 SDPA: Descale_Q batch/head dimensions must match Q");
  AttentionSpec shorter = spec;  // dO's scales blocked along s for half the queries
  shorter.o.dims[kSeq] = spec.seq_q() / 4;
  expect_refused(validate_with_scales_of(shorter),
                 "MXFP8 SDPA: Descale_dO_T s_scale dimension too small (expected >= 7)");
}

}  // namespace
}  // namespace fusedattn::graph
