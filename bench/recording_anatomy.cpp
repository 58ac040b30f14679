// bench/recording_anatomy.cpp — what a replayed call launches, and what launching it costs.
//
// A replayed forward (src/exec/replay.h) costs several microseconds more on the host than the
// launch of a CUDA graph of one memset. This takes the recording cuDNN makes for a call apart:
// its nodes (kind, grid, block, shared memory, cluster, parameter bytes) and edges; then it times,
// in interleaved rounds, the graph's launch against launching the same nodes one by one on the
// stream with the recorded arguments, after checking that both write the same O, bit for bit,
// as cuDNN's execute. Benchmark only: nothing here is part of the library.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "testing/cuda_check.h"
#include "c_abi.h"
#include "forward_call.h"
#include "host_timing.h"
#include "exec/device.h"
#include "exec/raw_call.h"
#include "fusedattn/attention.h"
#include "fusedattn/errors.h"
#include "fusedattn/spec.h"

namespace fa = fusedattn;

namespace {

void check_driver(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return;
  const char* text = nullptr;
  cuGetErrorString(result, &text);
  throw fa::CudaError(std::string(what) + " failed: " + (text ? text : "unknown error"));
}

std::string format(const char* form, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* form, ...) {
  char text[512];
  va_list args;
  va_start(args, form);
  std::vsnprintf(text, sizeof text, form, args);
  va_end(args);
  return text;
}

// One node of the recording, ready to be enqueued on its own.
struct Step {
  CUgraphNodeType type{};
  CUDA_KERNEL_NODE_PARAMS kernel{};
  CUlaunchAttribute attributes[3]{};
  unsigned attribute_count = 0;
  CUDA_MEMSET_NODE_PARAMS memset{};
};

std::size_t parameter_bytes(CUfunction function, std::size_t* count) {
  std::size_t end = 0, offset = 0, size = 0;
  *count = 0;
  while (cuFuncGetParamInfo(function, *count, &offset, &size) == CUDA_SUCCESS) {
    end = std::max(end, offset + size);
    ++*count;
  }
  return end;
}

std::string describe_kernel(CUgraphNode node, Step& step) {
  check_driver(cuGraphKernelNodeGetParams(node, &step.kernel), "cuGraphKernelNodeGetParams");
  CUfunction function = step.kernel.func ? step.kernel.func : reinterpret_cast<CUfunction>(step.kernel.kern);
  std::size_t count = 0;
  const std::size_t bytes = parameter_bytes(function, &count);
  CUlaunchAttributeValue cluster{}, cooperative{}, policy{};
  cuGraphKernelNodeGetAttribute(node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &cluster);
  cuGraphKernelNodeGetAttribute(node, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &cooperative);
  cuGraphKernelNodeGetAttribute(node, CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, &policy);
  if (cluster.clusterDim.x > 0) {
    step.attributes[step.attribute_count].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    step.attributes[step.attribute_count++].value = cluster;
  }
  if (cooperative.cooperative) {
    step.attributes[step.attribute_count].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    step.attributes[step.attribute_count++].value = cooperative;
  }
  if (policy.clusterSchedulingPolicyPreference != CU_CLUSTER_SCHEDULING_POLICY_DEFAULT) {
    step.attributes[step.attribute_count].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    step.attributes[step.attribute_count++].value = policy;
  }
  const char* name = nullptr;
  if (step.kernel.func) cuFuncGetName(&name, step.kernel.func);
  return format("kernel grid %ux%ux%u block %ux%ux%u smem %u cluster %ux%ux%u cooperative %u; %zu parameters, "
                "%zu bytes; arguments via %s; %s",
                step.kernel.gridDimX, step.kernel.gridDimY, step.kernel.gridDimZ, step.kernel.blockDimX,
                step.kernel.blockDimY, step.kernel.blockDimZ, step.kernel.sharedMemBytes, cluster.clusterDim.x,
                cluster.clusterDim.y, cluster.clusterDim.z, cooperative.cooperative, count, bytes,
                step.kernel.kernelParams ? "kernelParams" : (step.kernel.extra ? "extra" : "none"),
                name ? name : "(library kernel)");
}

const char* type_name(CUgraphNodeType type) {
  switch (type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: return "kernel";
    case CU_GRAPH_NODE_TYPE_MEMCPY: return "memcpy";
    case CU_GRAPH_NODE_TYPE_MEMSET: return "memset";
    case CU_GRAPH_NODE_TYPE_HOST: return "host";
    case CU_GRAPH_NODE_TYPE_GRAPH: return "child graph";
    case CU_GRAPH_NODE_TYPE_EMPTY: return "empty";
    default: return "other";
  }
}

// The nodes in an order that respects every edge (Kahn's algorithm), each described.
std::vector<Step> take_apart(CUgraph graph, std::string& report, bool& launchable) {
  std::size_t node_count = 0, edge_count = 0;
  check_driver(cuGraphGetNodes(graph, nullptr, &node_count), "cuGraphGetNodes");
  std::vector<CUgraphNode> nodes(node_count);
  check_driver(cuGraphGetNodes(graph, nodes.data(), &node_count), "cuGraphGetNodes");
  check_driver(cuGraphGetEdges(graph, nullptr, nullptr, nullptr, &edge_count), "cuGraphGetEdges");
  std::vector<CUgraphNode> from(edge_count), to(edge_count);
  check_driver(cuGraphGetEdges(graph, from.data(), to.data(), nullptr, &edge_count), "cuGraphGetEdges");
  report += format("%zu nodes, %zu edges\n", node_count, edge_count);
  std::vector<int> waiting(node_count, 0);
  auto index = [&](CUgraphNode n) {
    return static_cast<int>(std::find(nodes.begin(), nodes.end(), n) - nodes.begin());
  };
  for (CUgraphNode n : to) ++waiting[index(n)];
  std::vector<Step> steps;
  std::vector<bool> done(node_count, false);
  launchable = true;
  for (std::size_t placed = 0; placed < node_count; ++placed) {
    std::size_t next = 0;
    while (next < node_count && (done[next] || waiting[next] != 0)) ++next;
    if (next == node_count) throw fa::CudaError("the recording has a cycle");
    done[next] = true;
    for (std::size_t e = 0; e < edge_count; ++e) {
      if (from[e] == nodes[next]) --waiting[index(to[e])];
    }
    Step step;
    check_driver(cuGraphNodeGetType(nodes[next], &step.type), "cuGraphNodeGetType");
    std::string line = std::string("  ") + type_name(step.type);
    if (step.type == CU_GRAPH_NODE_TYPE_KERNEL) {
      line += ": " + describe_kernel(nodes[next], step);
      launchable = launchable && step.kernel.kernelParams != nullptr;
    } else if (step.type == CU_GRAPH_NODE_TYPE_MEMSET) {
      check_driver(cuGraphMemsetNodeGetParams(nodes[next], &step.memset), "cuGraphMemsetNodeGetParams");
      line += format(": %zu x %zu elements of %u bytes", step.memset.width, step.memset.height,
                     step.memset.elementSize);
    } else {
      launchable = false;
    }
    report += line + "\n";
    steps.push_back(step);
  }
  return steps;
}

void launch_steps(const std::vector<Step>& steps, CUstream stream) {
  for (const Step& step : steps) {
    if (step.type == CU_GRAPH_NODE_TYPE_KERNEL) {
      const CUDA_KERNEL_NODE_PARAMS& k = step.kernel;
      CUlaunchConfig config{};
      config.gridDimX = k.gridDimX;
      config.gridDimY = k.gridDimY;
      config.gridDimZ = k.gridDimZ;
      config.blockDimX = k.blockDimX;
      config.blockDimY = k.blockDimY;
      config.blockDimZ = k.blockDimZ;
      config.sharedMemBytes = k.sharedMemBytes;
      config.hStream = stream;
      config.attrs = const_cast<CUlaunchAttribute*>(step.attributes);
      config.numAttrs = step.attribute_count;
      CUfunction function = k.func ? k.func : reinterpret_cast<CUfunction>(k.kern);
      check_driver(cuLaunchKernelEx(&config, function, k.kernelParams, nullptr), "cuLaunchKernelEx");
    } else if (step.type == CU_GRAPH_NODE_TYPE_MEMSET) {
      const CUDA_MEMSET_NODE_PARAMS& m = step.memset;
      CUresult result = CUDA_ERROR_INVALID_VALUE;
      const auto value = m.value;
      if (m.elementSize == 1) {
        result = cuMemsetD2D8Async(m.dst, m.pitch, static_cast<unsigned char>(value), m.width, m.height, stream);
      } else if (m.elementSize == 2) {
        result = cuMemsetD2D16Async(m.dst, m.pitch, static_cast<unsigned short>(value), m.width, m.height, stream);
      } else if (m.elementSize == 4) {
        result = cuMemsetD2D32Async(m.dst, m.pitch, value, m.width, m.height, stream);
      }
      check_driver(result, "cuMemsetD2D*Async");
    }
  }
}

// O after `enqueue`, which first sees O poisoned.
std::vector<unsigned char> output_of(void* o, std::size_t bytes, cudaStream_t stream,
                                     const std::function<void()>& enqueue) {
  fa::check::check_cuda(cudaMemsetAsync(o, 0xff, bytes, stream), "cudaMemsetAsync(poison O)");
  enqueue();
  std::vector<unsigned char> host(bytes);
  fa::check::check_cuda(cudaMemcpyAsync(host.data(), o, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync(O)");
  fa::check::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return host;
}

// GPU microseconds per call of `calls` calls enqueued back to back behind `spin` (which keeps the
// GPU busy while they are enqueued, so that launch cost on the host is hidden).
double gpu_us_per_call(int calls, cudaStream_t stream, void (*spin)(), const std::function<void()>& enqueue) {
  cudaEvent_t start = nullptr, end = nullptr;
  fa::check::check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  fa::check::check_cuda(cudaEventCreate(&end), "cudaEventCreate");
  std::unique_ptr<CUevent_st, decltype(&cudaEventDestroy)> owned_start(start, &cudaEventDestroy);
  std::unique_ptr<CUevent_st, decltype(&cudaEventDestroy)> owned_end(end, &cudaEventDestroy);
  fa::check::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  spin();
  fa::check::check_cuda(cudaEventRecord(start, stream), "cudaEventRecord");
  for (int i = 0; i < calls; ++i) enqueue();
  fa::check::check_cuda(cudaEventRecord(end, stream), "cudaEventRecord");
  fa::check::check_cuda(cudaEventSynchronize(end), "cudaEventSynchronize");
  float ms = 0.0f;
  fa::check::check_cuda(cudaEventElapsedTime(&ms, start, end), "cudaEventElapsedTime");
  return ms * 1e3 / calls;
}

}  // namespace

/// Takes a forward's recording apart (a text report) and times, on the host, launching it as a
/// graph, launching its nodes one by one, cudaStreamIsCapturing and finding the thread's handle;
/// then, on the GPU (behind `spin`, which must keep `stream` busy for longer than `calls` launches
/// take to enqueue), the graph, the nodes one by one and cuDNN's execute, back to back.
extern "C" int fa_bench_recording_anatomy(const char* spec_text, const void* q, const void* k, const void* v, void* o,
                                          float scale, void* stream_handle, int calls, char* report, int report_len,
                                          double* us_graph_launch, double* us_steps_launch, double* us_is_capturing,
                                          double* us_handle_for, void (*spin)(), double* gpu_us_graph,
                                          double* gpu_us_nodes, double* gpu_us_cudnn, char* err, int errlen) {
  return fa::bench::guarded(err, errlen, [&] {
    const fa::bench::ForwardCall c = fa::bench::prepare_forward(spec_text, q, k, v, o, nullptr, scale, stream_handle);
    const fa::AttentionSpec& spec = c.spec;
    const cudaStream_t stream = c.stream;
    const fa::detail::RawForwardCall raw(c.plan, c.tensors, c.scale, stream, c.workspace.data);
    cudaGraph_t recording = nullptr;
    fa::check::check_cuda(cudaGraphCreate(&recording, 0), "cudaGraphCreate");
    std::unique_ptr<CUgraph_st, decltype(&cuGraphDestroy)> owned(reinterpret_cast<CUgraph>(recording),
                                                                 &cuGraphDestroy);
    if (!raw.record(recording)) throw fa::NotSupported("the plan's engine cannot be recorded");
    std::string text;
    bool launchable = false;
    const std::vector<Step> steps = take_apart(reinterpret_cast<CUgraph>(recording), text, launchable);
    cudaGraphExec_t exec = nullptr;
    fa::check::check_cuda(cudaGraphInstantiate(&exec, recording, 0), "cudaGraphInstantiate");
    std::unique_ptr<CUgraphExec_st, decltype(&cudaGraphExecDestroy)> owned_exec(exec, &cudaGraphExecDestroy);
    // O as the host section makes it: dense, 2-byte elements. The steps' argument pointers point
    // into the recording's nodes, which live as long as `owned` does.
    const std::size_t o_bytes =
        static_cast<std::size_t>(spec.batch() * spec.heads_q() * spec.seq_q() * spec.head_dim_v()) * 2;
    const auto launch_recording = [&] { fa::check::check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch"); };
    const auto launch_nodes = [&] { launch_steps(steps, reinterpret_cast<CUstream>(stream)); };
    const auto by_cudnn = output_of(o, o_bytes, stream, [&] { raw.execute(); });
    const auto same = [&](const std::vector<unsigned char>& out) {
      return out == by_cudnn ? "bit-equal" : "DIFFERENT";
    };
    text += std::string("graph launch writes cuDNN's O: ") + same(output_of(o, o_bytes, stream, launch_recording)) +
            "\n";
    if (launchable) {
      text += std::string("nodes launched one by one write cuDNN's O: ") +
              same(output_of(o, o_bytes, stream, launch_nodes)) + "\n";
    }
    const int device = c.plan->device();
    const std::function<void()> loops[4] = {
        launch_recording,
        [&] { if (launchable) launch_nodes(); },
        [&] { cudaStreamCaptureStatus s; cudaStreamIsCapturing(stream, &s); },
        [&] { fa::detail::handle_for(device, stream); },
    };
    double* medians[4] = {us_graph_launch, us_steps_launch, us_is_capturing, us_handle_for};
    fa::bench::interleaved_medians(calls, stream, loops, 4, medians);
    *gpu_us_graph = gpu_us_per_call(calls, stream, spin, launch_recording);
    *gpu_us_nodes = launchable ? gpu_us_per_call(calls, stream, spin, launch_nodes) : NAN;
    *gpu_us_cudnn = gpu_us_per_call(calls, stream, spin, [&] { raw.execute(); });
    if (!launchable) *us_steps_launch = NAN;
    std::snprintf(report, static_cast<std::size_t>(report_len), "%s", text.c_str());
  });
}
