// Device capabilities, versions and per-thread cuDNN handles, each created once and reused.
#include "exec/device.h"

#include <array>
#include <mutex>
#include <string>

#include "exec/cuda_check.h"
#include "graph/sdpa_graph.h"

namespace fusedattn::detail {
namespace {

constexpr int kMaxDevices = 64;

struct ThreadHandles {
  std::array<cudnnHandle_t, kMaxDevices> handle{};
  std::array<cudaStream_t, kMaxDevices> stream{};
  ~ThreadHandles() {
    for (cudnnHandle_t h : handle) {
      if (h) cudnnDestroy(h);  // errors at thread exit have nowhere to go
    }
  }
};

void check_device_index(int device) {
  if (device < 0 || device >= kMaxDevices) {
    throw CudaError("device ordinal " + std::to_string(device) + " is outside the supported 0.." +
                    std::to_string(kMaxDevices - 1));
  }
}

}  // namespace

int current_device() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

const std::string& gpu_absence() {
  static const std::string absence = [] {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status == cudaSuccess && count > 0) return std::string();
    cudaGetLastError();  // clear what cudaGetDeviceCount left, so later calls start clean
    int driver_version = -1;
    cudaDriverGetVersion(&driver_version);
    return std::string(gpu_missing(status == cudaSuccess ? cudaErrorNoDevice : status, driver_version));
  }();
  return absence;
}

const DeviceCaps& device_caps(int device) {
  check_device_index(device);
  static std::array<DeviceCaps, kMaxDevices> caps;
  static std::array<std::once_flag, kMaxDevices> once;
  std::call_once(once[device], [device] {
    int major = 0, minor = 0;
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute");
    caps[device] = DeviceCaps{major, minor};
  });
  return caps[device];
}

int multiprocessor_count(int device) {
  check_device_index(device);
  static std::array<int, kMaxDevices> counts;
  static std::array<std::once_flag, kMaxDevices> once;
  std::call_once(once[device], [device] {
    check_cuda(cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  });
  return counts[device];
}

const std::string& device_fingerprint(int device) {
  check_device_index(device);
  static std::array<std::string, kMaxDevices> fingerprints;
  static std::array<std::once_flag, kMaxDevices> once;
  std::call_once(once[device], [device] {
    cudaDeviceProp properties{};
    check_cuda(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
    int driver = 0;
    check_cuda(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
    std::string name = properties.name;
    for (char& c : name) c = c == ' ' ? '_' : c;  // one token in the key's line
    fingerprints[device] = "gpu=" + name + " sms=" + std::to_string(properties.multiProcessorCount) +
                           " driver=" + std::to_string(driver);
  });
  return fingerprints[device];
}

const Versions& versions() {
  static const Versions cached{static_cast<int>(cudnnGetVersion()), CUDNN_VERSION, graph::frontend_version()};
  return cached;
}

cudnnHandle_t handle_for(int device, cudaStream_t stream) {
  check_device_index(device);
  thread_local ThreadHandles handles;
  cudnnHandle_t& handle = handles.handle[device];
  if (!handle) {
    check_cudnn(cudnnCreate(&handle), "cudnnCreate");
    handles.stream[device] = nullptr;  // cudnnCreate binds the legacy default stream
    check_cudnn(cudnnSetStream(handle, stream), "cudnnSetStream");
    handles.stream[device] = stream;
  } else if (handles.stream[device] != stream) {
    check_cudnn(cudnnSetStream(handle, stream), "cudnnSetStream");
    handles.stream[device] = stream;
  }
  return handle;
}

}  // namespace fusedattn::detail
