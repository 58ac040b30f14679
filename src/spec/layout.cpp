// Layout names (bshd, bs3hd, ...) turned into strides and buffer offsets, and checked against strides.
#include "fusedattn/layout.h"

#include <cstring>

#include "fusedattn/errors.h"
#include "spec/text.h"

namespace fusedattn {
namespace {

// Each layout as the memory order of its buffers, slowest axis first, exactly as the name reads:
// b, s, h, d are the logical axes, and "3" / "2" is the axis that selects Q, K or V (K or V)
// inside a packed buffer. K and V use kv_buffer (one buffer each unless it packs them); O is
// always the unpacked form of Q's family, so writing it never needs to know about packing.
struct LayoutInfo {
  Layout layout;
  const char* name;
  const char* q_buffer;
  const char* kv_buffer;
  const char* o_buffer;
  bool paged = false;  // kv_buffer is the format of a pool of pages ("b" counts pages, "s" a page's tokens)
};

constexpr LayoutInfo kLayouts[] = {
    {Layout::bshd, "bshd", "bshd", "bshd", "bshd"},
    {Layout::sbhd, "sbhd", "sbhd", "sbhd", "sbhd"},
    {Layout::bhsd, "bhsd", "bhsd", "bhsd", "bhsd"},
    {Layout::bs3hd, "bs3hd", "bs3hd", "bs3hd", "bshd"},
    {Layout::bsh3d, "bsh3d", "bsh3d", "bsh3d", "bshd"},
    {Layout::sb3hd, "sb3hd", "sb3hd", "sb3hd", "sbhd"},
    {Layout::sbh3d, "sbh3d", "sbh3d", "sbh3d", "sbhd"},
    {Layout::bshd_bs2hd, "bshd_bs2hd", "bshd", "bs2hd", "bshd"},
    {Layout::bshd_bsh2d, "bshd_bsh2d", "bshd", "bsh2d", "bshd"},
    {Layout::sbhd_sb2hd, "sbhd_sb2hd", "sbhd", "sb2hd", "sbhd"},
    {Layout::sbhd_sbh2d, "sbhd_sbh2d", "sbhd", "sbh2d", "sbhd"},
    {Layout::thd_thd_thd, "thd_thd_thd", "thd", "thd", "thd"},
    {Layout::t3hd, "t3hd", "t3hd", "t3hd", "thd"},
    {Layout::th3d, "th3d", "th3d", "th3d", "thd"},
    {Layout::thd_t2hd, "thd_t2hd", "thd", "t2hd", "thd"},
    {Layout::thd_th2d, "thd_th2d", "thd", "th2d", "thd"},
    {Layout::sbhd_bshd_bshd, "sbhd_bshd_bshd", "sbhd", "bshd", "sbhd"},
    {Layout::bshd_sbhd_sbhd, "bshd_sbhd_sbhd", "bshd", "sbhd", "bshd"},
    {Layout::thd_bshd_bshd, "thd_bshd_bshd", "thd", "bshd", "thd"},
    {Layout::thd_sbhd_sbhd, "thd_sbhd_sbhd", "thd", "sbhd", "thd"},
    {Layout::bshd_paged_bshd, "bshd_paged_bshd", "bshd", "bshd", "bshd", true},
    {Layout::bshd_paged_sbhd, "bshd_paged_sbhd", "bshd", "sbhd", "bshd", true},
    {Layout::sbhd_paged_bshd, "sbhd_paged_bshd", "sbhd", "bshd", "sbhd", true},
    {Layout::sbhd_paged_sbhd, "sbhd_paged_sbhd", "sbhd", "sbhd", "sbhd", true},
    {Layout::thd_paged_bshd, "thd_paged_bshd", "thd", "bshd", "thd", true},
    {Layout::thd_paged_sbhd, "thd_paged_sbhd", "thd", "sbhd", "thd", true},
};

const LayoutInfo& info(Layout layout) noexcept {
  for (const LayoutInfo& entry : kLayouts) {
    if (entry.layout == layout) return entry;
  }
  return kLayouts[0];  // unreachable for valid enum values
}

std::string known_names() {
  std::string out = "one of";
  for (const LayoutInfo& entry : kLayouts) out += std::string(" ") + entry.name;
  return out;
}

struct Placed {
  TensorDesc desc;
  std::int64_t offset = 0;  // first element inside the buffer
  std::int64_t buffer = 0;  // elements of the whole buffer
};

int axis_index(char letter) noexcept {
  switch (letter) {
    case 'b': return kBatch;
    case 'h': return kHead;
    case 's': return kSeq;
    default: return kDim;
  }
}

// a * b, or InvalidArgument naming the tensor's sizes where the product leaves int64 (a buffer no
// stride can address; found by the spec parser's fuzz test as signed overflow).
std::int64_t times(std::int64_t a, std::int64_t b, const std::array<std::int64_t, 4>& dims) {
  std::int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    throw InvalidArgument("sizes", "[" + std::to_string(dims[kBatch]) + ", " + std::to_string(dims[kHead]) + ", " +
                                       std::to_string(dims[kSeq]) + ", " + std::to_string(dims[kDim]) + "]",
                          "a tensor of fewer than 2^63 elements (its strides are int64)");
  }
  return out;
}

// Places tensor number `slot` of a buffer with memory order `format`: walking from the fastest
// axis outwards, each axis's stride is the product of the sizes of the axes faster than it.
Placed place(const char* format, DType dtype, const std::array<std::int64_t, 4>& dims, int slot) {
  Placed out;
  out.desc.dtype = dtype;
  out.desc.dims = dims;
  std::int64_t stride = 1;
  for (std::size_t i = std::strlen(format); i-- > 0;) {
    char letter = format[i];
    if (letter == '2' || letter == '3') {  // the axis that picks the packed tensor
      out.offset = slot * stride;
      stride = times(stride, letter - '0', dims);
      continue;
    }
    if (letter == 't') {  // tokens: the sequence axis, with room for b sequences; no batch stride
      out.desc.strides[kSeq] = stride;
      out.desc.strides[kBatch] = 0;
      stride = times(stride, times(dims[kSeq], dims[kBatch], dims), dims);
      continue;
    }
    int axis = axis_index(letter);
    out.desc.strides[axis] = stride;
    stride = times(stride, dims[axis], dims);
  }
  out.buffer = stride;
  return out;
}

void check_positive(const char* field, std::int64_t value) {
  if (value <= 0) throw InvalidArgument(field, std::to_string(value), "a positive size");
}

void check_same(Layout layout, const char* what, const char* a_name, std::int64_t a, const char* b_name, std::int64_t b) {
  if (a == b) return;
  throw InvalidArgument("layout", to_string(layout),
                        std::string(what) + ", so needs " + a_name + " == " + b_name + " (got " + std::to_string(a) +
                            " and " + std::to_string(b) + ")");
}

// A packed buffer interleaves its tensors row by row, which only works when they have the same
// shape in every packed axis; unpacked K and V are free to differ from Q (GQA, s_q != s_kv).
void check_packing(Layout layout, const ProblemShape& shape) {
  if (packs_qkv(layout)) {
    const char* what = "packs Q, K and V in one buffer";
    check_same(layout, what, "s_q", shape.seq_q, "s_kv", shape.seq_kv);
    check_same(layout, what, "h_q", shape.heads_q, "h_kv", shape.heads_kv);
    check_same(layout, what, "d_qk", shape.head_dim_qk, "d_v", shape.head_dim_v);
  } else if (packs_kv(layout)) {
    check_same(layout, "packs K and V in one buffer", "d_qk", shape.head_dim_qk, "d_v", shape.head_dim_v);
  }
}

}  // namespace

const std::vector<Layout>& all_layouts() {
  static const std::vector<Layout> layouts = [] {
    std::vector<Layout> out;
    for (const LayoutInfo& entry : kLayouts) out.push_back(entry.layout);
    return out;
  }();
  return layouts;
}

const char* to_string(Layout layout) noexcept { return info(layout).name; }

Layout parse_layout(const std::string& text, const std::string& field) {
  for (const LayoutInfo& entry : kLayouts) {
    if (text == entry.name) return entry.layout;
  }
  throw InvalidArgument(field, text, known_names());
}

bool packs_qkv(Layout layout) noexcept { return std::strchr(info(layout).q_buffer, '3') != nullptr; }
bool packs_kv(Layout layout) noexcept { return std::strchr(info(layout).kv_buffer, '2') != nullptr; }
bool ragged_q(Layout layout) noexcept { return info(layout).q_buffer[0] == 't'; }
bool ragged_kv(Layout layout) noexcept { return info(layout).kv_buffer[0] == 't'; }
bool paged_kv(Layout layout) noexcept { return info(layout).paged; }

LayoutTensors make_layout(Layout layout, const ProblemShape& shape) {
  check_positive("b", shape.batch);
  check_positive("s_q", shape.seq_q);
  check_positive("s_kv", shape.seq_kv);
  check_positive("h_q", shape.heads_q);
  check_positive("h_kv", shape.heads_kv);
  check_positive("d_qk", shape.head_dim_qk);
  check_positive("d_v", shape.head_dim_v);
  check_packing(layout, shape);

  const LayoutInfo& entry = info(layout);
  const bool qkv = packs_qkv(layout);
  const bool kv = packs_kv(layout);
  // A paged K or V is its pool: one "batch entry" a page, one "sequence" a page's tokens.
  std::int64_t kv_entries = shape.batch, kv_tokens = shape.seq_kv;
  if (entry.paged) {
    check_positive("page_size", shape.page_size);
    check_positive("pages", shape.pages);
    if (shape.seq_kv % shape.page_size != 0) {
      throw InvalidArgument("s_kv", std::to_string(shape.seq_kv),
                            "a multiple of page_size = " + std::to_string(shape.page_size) +
                                " for a paged cache (s_kv / page_size pages a sequence)");
    }
    kv_entries = shape.pages;
    kv_tokens = shape.page_size;
  }
  Placed q = place(entry.q_buffer, shape.dtype, {shape.batch, shape.heads_q, shape.seq_q, shape.head_dim_qk}, 0);
  Placed k = place(entry.kv_buffer, shape.dtype, {kv_entries, shape.heads_kv, kv_tokens, shape.head_dim_qk}, qkv ? 1 : 0);
  Placed v = place(entry.kv_buffer, shape.dtype, {kv_entries, shape.heads_kv, kv_tokens, shape.head_dim_v},
                   qkv ? 2 : (kv ? 1 : 0));
  Placed o = place(entry.o_buffer, shape.dtype, {shape.batch, shape.heads_q, shape.seq_q, shape.head_dim_v}, 0);

  LayoutTensors out;
  out.q = q.desc;
  out.k = k.desc;
  out.v = v.desc;
  out.o = o.desc;
  out.q_offset = q.offset;
  out.k_offset = k.offset;
  out.v_offset = v.offset;
  // Packed tensors report the shared buffer, so each one's buffer covers its offset + extent.
  out.q_buffer = q.buffer;
  out.k_buffer = k.buffer;
  out.v_buffer = v.buffer;
  out.o_buffer = o.buffer;
  return out;
}

// Every stride of a layout is a function of the tensor's own dims (packing needs the packed
// sizes to agree), so the expected strides come from a layout built with this tensor's sizes.
void check_layout_strides(Layout layout, const std::string& tensor, const TensorDesc& desc) {
  if (tensor != "q" && tensor != "k" && tensor != "v" && tensor != "o") {
    throw InvalidArgument("tensor", tensor, "one of q, k, v, o");
  }
  for (std::int64_t dim : desc.dims) {
    if (dim <= 0) throw InvalidArgument(tensor + ".dims", detail::format_list(desc.dims), "every dim positive");
  }
  ProblemShape shape;
  shape.dtype = desc.dtype;
  shape.batch = desc.batch();
  shape.heads_q = shape.heads_kv = desc.heads();
  shape.seq_q = shape.seq_kv = desc.seq();
  shape.head_dim_qk = shape.head_dim_v = desc.head_dim();
  shape.page_size = desc.seq();  // a paged layout's K or V: the pool of desc.batch() pages
  shape.pages = desc.batch();
  LayoutTensors expected = make_layout(layout, shape);
  const TensorDesc& want = tensor == "q" ? expected.q : tensor == "k" ? expected.k : tensor == "v" ? expected.v : expected.o;
  if (desc.strides != want.strides) {
    throw InvalidArgument(tensor + ".strides", detail::format_list(desc.strides),
                          std::string("the strides layout ") + to_string(layout) + " gives " + tensor + " with dims " +
                              detail::format_list(desc.dims) + ": " + detail::format_list(want.strides));
  }
}

}  // namespace fusedattn
