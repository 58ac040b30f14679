// Internal: the current device, its capabilities, per-thread cuDNN handles, library versions.
#pragma once

#include <string>

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "fusedattn/support.h"

namespace fusedattn::detail {

/// cudaGetDevice, checked.
int current_device();

/// Empty where a CUDA GPU is usable; else why none is: "no NVIDIA driver found" or "no CUDA GPU
/// found" (exec/cuda_status.h). Any other failure reads empty here and is raised, in the runtime's
/// words, by the first call that needs the GPU. Probed once: a process cannot gain a GPU later.
const std::string& gpu_absence();

/// Capabilities of `device`, queried once per device and then served from memory.
const DeviceCaps& device_caps(int device);

/// Streaming multiprocessors of `device`, queried once per device.
int multiprocessor_count(int device);

/// What a compiled plan depends on besides its key's versions: "gpu=NAME sms=N driver=V" for
/// `device`, queried once per device (the disk cache's keys carry it).
const std::string& device_fingerprint(int device);

/// Versions of cuDNN (compiled and loaded) and of the frontend; queried once.
const Versions& versions();

/// This thread's cuDNN handle for `device`, bound to `stream`. cuDNN handles must not be used
/// by two threads at once, so each thread gets its own, created on first use; the stream is
/// only re-set when it changes, which keeps the steady state free of cuDNN calls.
cudnnHandle_t handle_for(int device, cudaStream_t stream);

}  // namespace fusedattn::detail
