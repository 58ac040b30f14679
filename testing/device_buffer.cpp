// testing/device_buffer.cpp — DeviceBuffer: cudaMalloc on construction, cudaFree on destruction.
#include "testing/device_buffer.h"

#include <string>

#include <cuda_runtime_api.h>

#include "testing/cuda_check.h"

namespace fusedattn::check {

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

}  // namespace fusedattn::check
