// testing/twins.cpp — dense twins of ragged and paged specs, and the calls laid over them.
#include "testing/twins.h"

#include <algorithm>
#include <array>
#include <optional>
#include <random>
#include <string>

#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "testing/cuda_check.h"

namespace fusedattn::check {
namespace {

// int32 values copied to a new device buffer (synchronous).
DeviceBuffer upload_ints(const std::vector<std::int32_t>& host, const char* what) {
  DeviceBuffer device(host.size() * sizeof(std::int32_t));
  check_cuda(cudaMemcpy(device.get(), host.data(), device.bytes(), cudaMemcpyHostToDevice), what);
  return device;
}

// Page j of sequence b (tokens j * page ..) goes to pool page table[b * per_seq + j]: one 2-D copy
// of `page` token rows of h * d elements, each side with its own token stride.
DeviceBuffer fill_pool(const TensorDesc& pool, const TensorDesc& dense, const void* source,
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

}  // namespace

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

void set_ragged_lengths(const AttentionSpec& ragged, AttentionBuffers& buffers) {
  std::vector<std::int32_t> q = buffers.seq_len_q(), kv = buffers.seq_len_kv();
  const std::optional<Layout> layout = named_layout(ragged);
  if (layout && packs_qkv(*layout)) kv = q;
  if (q.size() >= 3) q[1] = kv[1] = 0;
  buffers.set_lengths(q, kv);
}

std::vector<float> statistics_by_head(const std::vector<float>& by_token, const AttentionSpec& twin) {
  std::vector<float> out(by_token.size());
  const std::int64_t h = twin.heads_q(), s = twin.seq_q();
  for (std::int64_t b = 0; b < twin.batch(); ++b) {
    for (std::int64_t i = 0; i < s; ++i) {
      for (std::int64_t j = 0; j < h; ++j) out[static_cast<std::size_t>((b * h + j) * s + i)] = by_token[static_cast<std::size_t>((b * s + i) * h + j)];
    }
  }
  return out;
}

RaggedTwinCall::RaggedTwinCall(const AttentionSpec& twin, const AttentionBuffers& buffers) {
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

PagedTwinCall::PagedTwinCall(const AttentionSpec& paged, const AttentionSpec& twin, const ForwardTensors& dense,
                             std::uint64_t seed) {
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

}  // namespace fusedattn::check
