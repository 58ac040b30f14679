// The FP8 element kernels against the GPU's own copy: each kernel's bytes moved per second as a
// fraction of what cudaMemcpyAsync moves device to device, at 64 MB of 16-bit data a tensor (the
// size of Q at 2 x 8k x h16 x d128). GPU time of calls run back to back (testing/kernel_timing.h).
//
//   fusedattn_fp8_bandwidth [--json FILE]
//
// Rows: quantize of one dense bshd tensor (the memory-order path), of Q, K and V in one call, of a
// bshd tensor into an h-fastest one (the logical walk, for comparison), dequantize of one and of
// three, and the amax alone.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "fusedattn/fp8.h"
#include "testing/cuda_check.h"
#include "testing/device_buffer.h"
#include "testing/kernel_timing.h"

namespace {

using fusedattn::check::check_cuda;
using fusedattn::check::DeviceBuffer;

fusedattn::TensorDesc bshd(fusedattn::DType dtype, std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
  fusedattn::TensorDesc desc;
  desc.dtype = dtype;
  desc.dims = {b, h, s, d};
  desc.strides = {s * h * d, d, h * d, 1};
  return desc;
}

// GPU milliseconds of `work`, calls back to back (testing/kernel_timing.h): 5 untimed, median of 50.
double median_ms(const std::function<void()>& work) {
  return fusedattn::check::median_kernel_ms(work, 5, 50, nullptr);
}

}  // namespace

int run(int argc, char** argv) {
  using fusedattn::DType;
  std::string json_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--json") json_path = argv[i + 1];
  }
  const std::int64_t b = 2, h = 16, s = 8192, d = 128, n = b * h * s * d;  // 32M elements: 64 MB in 16 bits
  const fusedattn::TensorDesc wide = bshd(DType::bf16, b, h, s, d), fp8 = bshd(DType::e4m3, b, h, s, d);
  fusedattn::TensorDesc h_fastest = fp8;  // [b, s, d, h] memory: no row in common with bshd
  h_fastest.strides = {s * d * h, 1, d * h, h};
  std::vector<DeviceBuffer> sources, quantized, restored;
  void *src[3], *dst8[3], *back[3];
  for (int i = 0; i < 3; ++i) {
    src[i] = sources.emplace_back(n * 2).get();
    dst8[i] = quantized.emplace_back(n).get();
    back[i] = restored.emplace_back(n * 2).get();
    check_cuda(cudaMemset(src[i], 0x3c, n * 2), "cudaMemset");  // 0x3c3c: about 0.0115 in bf16
  }
  DeviceBuffer scalar_buffer(16 * sizeof(float));
  float* scalars = scalar_buffer.as<float>();
  const std::vector<float> ones(16, 1.0f);
  check_cuda(cudaMemcpy(scalars, ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  float* amax = scalars + 8;

  const double copy_ms =
      median_ms([&] { check_cuda(cudaMemcpyAsync(back[0], src[0], n * 2, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync"); });
  const double copy_bytes_per_ms = 2.0 * n * 2 / copy_ms;  // read and write
  struct Row {
    std::string name;
    double bytes, ms;
  };
  std::vector<Row> rows;
  auto quantizations = [&](int count, const fusedattn::TensorDesc& to) {
    std::vector<fusedattn::Fp8Quantization> jobs;
    for (int i = 0; i < count; ++i) jobs.push_back({wide, src[i], to, dst8[i], scalars + i, amax + i});
    return jobs;
  };
  const auto one = quantizations(1, fp8), three = quantizations(3, fp8), logical = quantizations(1, h_fastest);
  auto time_row = [&](const char* name, double bytes, const std::function<void()>& work) {
    rows.push_back({name, bytes, median_ms(work)});
  };
  time_row("quantize (one tensor, memory order)", 3.0 * n, [&] { fusedattn::quantize_fp8_many(one.data(), 1, nullptr); });
  time_row("quantize (Q, K, V in one call)", 9.0 * n, [&] { fusedattn::quantize_fp8_many(three.data(), 3, nullptr); });
  time_row("quantize (one tensor, logical walk)", 3.0 * n,
           [&] { fusedattn::quantize_fp8_many(logical.data(), 1, nullptr); });
  std::vector<fusedattn::Fp8Dequantization> back_jobs;
  for (int i = 0; i < 3; ++i) back_jobs.push_back({fp8, dst8[i], wide, back[i], scalars + i});
  time_row("dequantize (one tensor)", 3.0 * n, [&] { fusedattn::dequantize_fp8_many(back_jobs.data(), 1, nullptr); });
  time_row("dequantize (dQ, dK, dV in one call)", 9.0 * n,
           [&] { fusedattn::dequantize_fp8_many(back_jobs.data(), 3, nullptr); });
  time_row("amax (one tensor)", 2.0 * n, [&] { fusedattn::measure_amax(wide, src[0], amax, nullptr); });
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

  std::printf("copy: %.1f GB/s (64 MB device to device, %.3f ms)\n", copy_bytes_per_ms / 1e6, copy_ms);
  std::string json = "{\"copy_gb_per_s\": " + std::to_string(copy_bytes_per_ms / 1e6) + ", \"kernels\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const double rate = rows[i].bytes / rows[i].ms, fraction = rate / copy_bytes_per_ms;
    std::printf("%-40s %8.3f ms %8.1f GB/s %5.2f of copy\n", rows[i].name.c_str(), rows[i].ms, rate / 1e6, fraction);
    json += std::string(i ? ", " : "") + "{\"name\": \"" + rows[i].name + "\", \"ms\": " +
            std::to_string(rows[i].ms) + ", \"gb_per_s\": " + std::to_string(rate / 1e6) +
            ", \"fraction_of_copy\": " + std::to_string(fraction) + "}";
  }
  json += "]}\n";
  if (!json_path.empty()) std::ofstream(json_path) << json;
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {  // a CUDA error, said plainly
    std::fprintf(stderr, "fusedattn_fp8_bandwidth: %s\n", error.what());
    return 1;
  }
}
