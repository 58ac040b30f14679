// testing/device_buffer.h — device memory owned by one object, for tests, tools and benchmarks.
#pragma once

#include <cstddef>

namespace fusedattn::check {

/// Device memory owned by one object; throws CudaError if cudaMalloc fails (out of memory is a
/// failure, never a reason to skip).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// `bytes` of uninitialized device memory; 0 allocates nothing and get() is null.
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  /// The first byte (null when empty).
  void* get() const noexcept { return data_; }
  /// The first element as a T.
  template <class T>
  T* as() const noexcept { return static_cast<T*>(data_); }
  /// The size asked for.
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace fusedattn::check
