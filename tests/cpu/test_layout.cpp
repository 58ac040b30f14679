// Tier 1: layout names to strides — every element's address checked against the layout letters.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "fusedattn/errors.h"
#include "fusedattn/layout.h"

namespace fusedattn {
namespace {

using Strides = std::array<std::int64_t, 4>;

ProblemShape shape_of(std::int64_t b, std::int64_t s_q, std::int64_t s_kv, std::int64_t h_q, std::int64_t h_kv,
                      std::int64_t d_qk, std::int64_t d_v) {
  ProblemShape shape;
  shape.batch = b;
  shape.seq_q = s_q;
  shape.seq_kv = s_kv;
  shape.heads_q = h_q;
  shape.heads_kv = h_kv;
  shape.head_dim_qk = d_qk;
  shape.head_dim_v = d_v;
  shape.page_size = s_kv;  // paged layouts: one page a sequence, so their pools read like bshd / sbhd
  shape.pages = b;
  return shape;
}

// The buffer formats read straight off the layout's name, independently of the library's table:
// "x_y" is Q in x and K, V in y; a name with "3" is one buffer for all three; O drops the digit.
struct Formats {
  std::string q, kv, o;
};

Formats formats_from_name(const std::string& name) {
  Formats out;
  std::size_t underscore = name.find('_');
  out.q = name.substr(0, underscore);
  out.kv = underscore == std::string::npos ? name : name.substr(underscore + 1);
  if (out.kv.rfind("paged_", 0) == 0) out.kv = out.kv.substr(6);  // "q_paged_kv": the pages' format
  const std::size_t second = out.kv.find('_');  // "q_k_v": one format each, K's and V's alike
  if (second != std::string::npos) out.kv = out.kv.substr(0, second);
  for (char c : out.q) {
    if (c != '3') out.o += c;
  }
  return out;
}

// Row-major address of element (b, h, s, d) of tensor `slot` in a buffer whose axes, slowest
// first, are the letters of `format` (Horner's rule over the letters; no strides involved). The
// token axis 't' of a ragged format is read as "bs": sequences back to back, each at full length.
std::int64_t address(const std::string& format, const TensorDesc& desc, const Strides& index, int slot) {
  std::int64_t out = 0;
  for (char c : format) {
    switch (c) {
      case 't': out = (out * desc.dims[kBatch] + index[kBatch]) * desc.dims[kSeq] + index[kSeq]; break;
      case 'b': out = out * desc.dims[kBatch] + index[kBatch]; break;
      case 'h': out = out * desc.dims[kHead] + index[kHead]; break;
      case 's': out = out * desc.dims[kSeq] + index[kSeq]; break;
      case 'd': out = out * desc.dims[kDim] + index[kDim]; break;
      default: out = out * (c - '0') + slot; break;
    }
  }
  return out;
}

std::int64_t product_of_format(const std::string& format, const TensorDesc& desc) {
  std::int64_t out = 1;
  for (char c : format) {
    switch (c) {
      case 't': out *= desc.dims[kBatch] * desc.dims[kSeq]; break;
      case 'b': out *= desc.dims[kBatch]; break;
      case 'h': out *= desc.dims[kHead]; break;
      case 's': out *= desc.dims[kSeq]; break;
      case 'd': out *= desc.dims[kDim]; break;
      default: out *= c - '0'; break;
    }
  }
  return out;
}

// Compares every element's strided address with the letter formula and marks it in `hits`
// (address -> count), so that a buffer's tensors can be checked to tile it exactly once.
void expect_addresses(const std::string& what, const std::string& format, const TensorDesc& desc, std::int64_t offset,
                      int slot, std::map<std::int64_t, int>& hits) {
  Strides i{};
  for (i[0] = 0; i[0] < desc.dims[0]; ++i[0])
    for (i[1] = 0; i[1] < desc.dims[1]; ++i[1])
      for (i[2] = 0; i[2] < desc.dims[2]; ++i[2])
        for (i[3] = 0; i[3] < desc.dims[3]; ++i[3]) {
          // A ragged tensor's batch position comes from its runtime offsets; with full-length
          // sequences back to back, sequence b starts b * s tokens in.
          const std::int64_t batch_start =
              desc.ragged() ? i[0] * desc.dims[kSeq] * desc.strides[kSeq] : i[0] * desc.strides[0];
          std::int64_t strided = offset + batch_start + i[1] * desc.strides[1] + i[2] * desc.strides[2] +
                                 i[3] * desc.strides[3];
          std::int64_t expected = address(format, desc, i, slot);
          ASSERT_EQ(strided, expected) << what << " in " << format << " at [" << i[0] << "," << i[1] << "," << i[2]
                                       << "," << i[3] << "]";
          ++hits[strided];
        }
}

void expect_tiles(const std::string& what, const std::map<std::int64_t, int>& hits, std::int64_t buffer) {
  EXPECT_EQ(static_cast<std::int64_t>(hits.size()), buffer) << what << ": every element of the buffer is used";
  for (const auto& [addr, count] : hits) {
    ASSERT_EQ(count, 1) << what << ": address " << addr << " used twice";
    ASSERT_GE(addr, 0);
    ASSERT_LT(addr, buffer);
  }
}

void expect_layout_matches_letters(Layout layout, const ProblemShape& shape) {
  const std::string name = to_string(layout);
  SCOPED_TRACE(name);
  const Formats f = formats_from_name(name);
  const LayoutTensors t = make_layout(layout, shape);
  const bool qkv = packs_qkv(layout), kv = packs_kv(layout);

  const Strides q_dims{shape.batch, shape.heads_q, shape.seq_q, shape.head_dim_qk};
  const Strides k_dims{shape.batch, shape.heads_kv, shape.seq_kv, shape.head_dim_qk};
  const Strides v_dims{shape.batch, shape.heads_kv, shape.seq_kv, shape.head_dim_v};
  const Strides o_dims{shape.batch, shape.heads_q, shape.seq_q, shape.head_dim_v};
  EXPECT_EQ(t.q.dims, q_dims);
  EXPECT_EQ(t.k.dims, k_dims);
  EXPECT_EQ(t.v.dims, v_dims);
  EXPECT_EQ(t.o.dims, o_dims);
  for (const TensorDesc* desc : {&t.q, &t.k, &t.v, &t.o}) EXPECT_EQ(desc->dtype, shape.dtype);

  std::map<std::int64_t, int> q_hits, k_hits, v_hits, o_hits;
  expect_addresses("q", f.q, t.q, t.q_offset, 0, q_hits);
  expect_addresses("k", f.kv, t.k, t.k_offset, qkv ? 1 : 0, qkv ? q_hits : k_hits);
  expect_addresses("v", f.kv, t.v, t.v_offset, qkv ? 2 : (kv ? 1 : 0), qkv ? q_hits : kv ? k_hits : v_hits);
  expect_addresses("o", f.o, t.o, 0, 0, o_hits);

  EXPECT_EQ(t.q_buffer, product_of_format(f.q, t.q));
  EXPECT_EQ(t.k_buffer, product_of_format(f.kv, t.k));
  EXPECT_EQ(t.v_buffer, product_of_format(f.kv, t.v));
  EXPECT_EQ(t.o_buffer, product_of_format(f.o, t.o));
  expect_tiles("q buffer", q_hits, t.q_buffer);
  expect_tiles("o buffer", o_hits, t.o_buffer);
  if (qkv) {
    EXPECT_EQ(t.k_buffer, t.q_buffer);
    EXPECT_EQ(t.v_buffer, t.q_buffer);
  } else {
    expect_tiles("k buffer", k_hits, t.k_buffer);
    if (kv) {
      EXPECT_EQ(t.v_buffer, t.k_buffer);
    } else {
      expect_tiles("v buffer", v_hits, t.v_buffer);
    }
  }
  // Each tensor fits its buffer: what the adapters check against the framework tensor's size.
  EXPECT_LE(t.q_offset + t.q.extent(), t.q_buffer);
  EXPECT_LE(t.k_offset + t.k.extent(), t.k_buffer);
  EXPECT_LE(t.v_offset + t.v.extent(), t.v_buffer);
  EXPECT_LE(t.o.extent(), t.o_buffer);
}

TEST(LayoutNames, EveryLayoutRoundTrips) {
  const std::vector<std::string> names = {"bshd",       "sbhd",       "bhsd",       "bs3hd",      "bsh3d",
                                          "sb3hd",      "sbh3d",      "bshd_bs2hd", "bshd_bsh2d", "sbhd_sb2hd",
                                          "sbhd_sbh2d", "thd_thd_thd", "t3hd",      "th3d",       "thd_t2hd",
                                          "thd_th2d",   "sbhd_bshd_bshd", "bshd_sbhd_sbhd", "thd_bshd_bshd",
                                          "thd_sbhd_sbhd", "bshd_paged_bshd", "bshd_paged_sbhd", "sbhd_paged_bshd",
                                          "sbhd_paged_sbhd", "thd_paged_bshd", "thd_paged_sbhd"};
  ASSERT_EQ(all_layouts().size(), names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(to_string(all_layouts()[i]), names[i]);
    EXPECT_EQ(parse_layout(names[i], "layout"), all_layouts()[i]);
  }
}

TEST(LayoutNames, UnknownNameListsTheKnownOnes) {
  try {
    parse_layout("bhds", "layout");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "layout");
    EXPECT_EQ(e.value(), "bhds");
    EXPECT_NE(e.requirement().find("sbhd_sbh2d"), std::string::npos);
  }
}

TEST(LayoutNames, PackingPredicates) {
  for (Layout layout : all_layouts()) {
    const std::string name = to_string(layout);
    EXPECT_EQ(packs_qkv(layout), name.find('3') != std::string::npos) << name;
    EXPECT_EQ(packs_kv(layout), name.find('2') != std::string::npos) << name;
    EXPECT_EQ(ragged_q(layout), name[0] == 't') << name;
    EXPECT_EQ(ragged_kv(layout), formats_from_name(name).kv[0] == 't') << name;
  }
}

// A paged K/V is its pool: [pages, h_kv, page_size, d] in the pages' format.
TEST(LayoutStrides, PagedLayoutsDescribeThePool) {
  ProblemShape shape = shape_of(3, 5, 64, 6, 2, 16, 8);
  shape.page_size = 16;
  shape.pages = 20;
  const LayoutTensors t = make_layout(Layout::bshd_paged_sbhd, shape);
  EXPECT_EQ(t.q.strides, (Strides{5 * 6 * 16, 16, 6 * 16, 1}));
  EXPECT_EQ(t.k.dims, (Strides{20, 2, 16, 16}));
  EXPECT_EQ(t.k.strides, (Strides{2 * 16, 16, 20 * 2 * 16, 1}));  // sbhd pages: a page's tokens 20 pages apart
  EXPECT_EQ(t.v.dims, (Strides{20, 2, 16, 8}));
  EXPECT_EQ(t.k_buffer, 20 * 2 * 16 * 16);
  shape.seq_kv = 70;
  try {
    make_layout(Layout::bshd_paged_bshd, shape);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "s_kv");
    EXPECT_NE(e.requirement().find("multiple of page_size = 16"), std::string::npos);
  }
  for (Layout layout : all_layouts()) EXPECT_EQ(paged_kv(layout), std::string(to_string(layout)).find("_paged_") != std::string::npos);
}

// Ragged tensors have no batch stride: their sequences are placed by runtime offsets.
TEST(LayoutStrides, RaggedLayoutsHaveNoBatchStride) {
  for (Layout layout : all_layouts()) {
    const LayoutTensors t = make_layout(layout, shape_of(3, 5, 5, 2, 2, 8, 8));
    for (const TensorDesc* desc : {&t.q, &t.o}) EXPECT_EQ(desc->ragged(), ragged_q(layout)) << to_string(layout);
    for (const TensorDesc* desc : {&t.k, &t.v}) EXPECT_EQ(desc->ragged(), ragged_kv(layout)) << to_string(layout);
  }
  const LayoutTensors thd = make_layout(Layout::thd_thd_thd, shape_of(3, 5, 7, 6, 2, 16, 8));
  EXPECT_EQ(thd.q.strides, (Strides{0, 16, 96, 1}));
  EXPECT_EQ(thd.k.strides, (Strides{0, 16, 32, 1}));
  EXPECT_EQ(thd.v.strides, (Strides{0, 8, 16, 1}));
  EXPECT_EQ(thd.o.strides, (Strides{0, 8, 48, 1}));
  EXPECT_EQ(thd.q_buffer, 3 * 5 * 96);  // room for b full sequences
  EXPECT_EQ(thd.k_buffer, 3 * 7 * 32);
}

TEST(LayoutStrides, EveryAddressMatchesTheLettersAtASymmetricShape) {
  ProblemShape shape = shape_of(2, 5, 5, 3, 3, 8, 8);
  for (Layout layout : all_layouts()) expect_layout_matches_letters(layout, shape);
}

TEST(LayoutStrides, UnpackedLayoutsAllowGqaAndDifferentSizes) {
  ProblemShape shape = shape_of(2, 5, 7, 6, 3, 16, 8);
  shape.dtype = DType::f16;
  for (Layout layout : {Layout::bshd, Layout::sbhd, Layout::bhsd}) expect_layout_matches_letters(layout, shape);
}

TEST(LayoutStrides, KvPackedLayoutsAllowGqaAndDifferentSequences) {
  ProblemShape shape = shape_of(2, 5, 7, 6, 3, 8, 8);
  for (Layout layout : {Layout::bshd_bs2hd, Layout::bshd_bsh2d, Layout::sbhd_sb2hd, Layout::sbhd_sbh2d}) {
    expect_layout_matches_letters(layout, shape);
  }
}

// The documented strides, written out as numbers at B=2 S=5 H=3 D=8.
TEST(LayoutStrides, DocumentedNumbers) {
  struct Row {
    Layout layout;
    Strides q, kv, o;
    std::int64_t k_offset, v_offset;
  };
  const Strides bshd{120, 8, 24, 1}, sbhd{24, 8, 48, 1}, bhsd{120, 40, 8, 1};
  const std::vector<Row> rows = {
      {Layout::bshd, bshd, bshd, bshd, 0, 0},
      {Layout::sbhd, sbhd, sbhd, sbhd, 0, 0},
      {Layout::bhsd, bhsd, bhsd, bhsd, 0, 0},
      {Layout::bs3hd, {360, 8, 72, 1}, {360, 8, 72, 1}, bshd, 24, 48},
      {Layout::bsh3d, {360, 24, 72, 1}, {360, 24, 72, 1}, bshd, 8, 16},
      {Layout::sb3hd, {72, 8, 144, 1}, {72, 8, 144, 1}, sbhd, 24, 48},
      {Layout::sbh3d, {72, 24, 144, 1}, {72, 24, 144, 1}, sbhd, 8, 16},
      {Layout::bshd_bs2hd, bshd, {240, 8, 48, 1}, bshd, 0, 24},
      {Layout::bshd_bsh2d, bshd, {240, 16, 48, 1}, bshd, 0, 8},
      {Layout::sbhd_sb2hd, sbhd, {48, 8, 96, 1}, sbhd, 0, 24},
      {Layout::sbhd_sbh2d, sbhd, {48, 16, 96, 1}, sbhd, 0, 8},
      {Layout::thd_thd_thd, {0, 8, 24, 1}, {0, 8, 24, 1}, {0, 8, 24, 1}, 0, 0},
      {Layout::t3hd, {0, 8, 72, 1}, {0, 8, 72, 1}, {0, 8, 24, 1}, 24, 48},
      {Layout::th3d, {0, 24, 72, 1}, {0, 24, 72, 1}, {0, 8, 24, 1}, 8, 16},
      {Layout::thd_t2hd, {0, 8, 24, 1}, {0, 8, 48, 1}, {0, 8, 24, 1}, 0, 24},
      {Layout::thd_th2d, {0, 8, 24, 1}, {0, 16, 48, 1}, {0, 8, 24, 1}, 0, 8},
      {Layout::sbhd_bshd_bshd, sbhd, bshd, sbhd, 0, 0},
      {Layout::bshd_sbhd_sbhd, bshd, sbhd, bshd, 0, 0},
      {Layout::thd_bshd_bshd, {0, 8, 24, 1}, bshd, {0, 8, 24, 1}, 0, 0},
      {Layout::thd_sbhd_sbhd, {0, 8, 24, 1}, sbhd, {0, 8, 24, 1}, 0, 0},
      {Layout::bshd_paged_bshd, bshd, bshd, bshd, 0, 0},  // one page a sequence: the pool reads as bshd
      {Layout::bshd_paged_sbhd, bshd, sbhd, bshd, 0, 0},
      {Layout::sbhd_paged_bshd, sbhd, bshd, sbhd, 0, 0},
      {Layout::sbhd_paged_sbhd, sbhd, sbhd, sbhd, 0, 0},
      {Layout::thd_paged_bshd, {0, 8, 24, 1}, bshd, {0, 8, 24, 1}, 0, 0},
      {Layout::thd_paged_sbhd, {0, 8, 24, 1}, sbhd, {0, 8, 24, 1}, 0, 0},
  };
  ASSERT_EQ(rows.size(), all_layouts().size());
  for (const Row& row : rows) {
    SCOPED_TRACE(to_string(row.layout));
    LayoutTensors t = make_layout(row.layout, shape_of(2, 5, 5, 3, 3, 8, 8));
    EXPECT_EQ(t.q.strides, row.q);
    EXPECT_EQ(t.k.strides, row.kv);
    EXPECT_EQ(t.v.strides, row.kv);
    EXPECT_EQ(t.o.strides, row.o);
    EXPECT_EQ(t.q_offset, 0);
    EXPECT_EQ(t.k_offset, row.k_offset);
    EXPECT_EQ(t.v_offset, row.v_offset);
  }
}

TEST(LayoutStrides, OutputUsesHeadsQAndHeadDimV) {
  LayoutTensors t = make_layout(Layout::bshd_bs2hd, shape_of(2, 5, 7, 6, 3, 16, 16));
  LayoutTensors plain = make_layout(Layout::bshd, shape_of(2, 5, 7, 6, 3, 16, 16));
  EXPECT_EQ(t.o, plain.o);
  LayoutTensors wide = make_layout(Layout::sbhd, shape_of(2, 5, 7, 6, 3, 16, 8));
  const Strides sbhd_o{6 * 8, 8, 2 * 6 * 8, 1};
  EXPECT_EQ(wide.o.strides, sbhd_o);
}

void expect_layout_error(Layout layout, const ProblemShape& shape, const std::vector<std::string>& fragments) {
  try {
    make_layout(layout, shape);
    FAIL() << "accepted " << to_string(layout);
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "layout");
    EXPECT_EQ(e.value(), to_string(layout));
    for (const std::string& fragment : fragments) EXPECT_NE(e.requirement().find(fragment), std::string::npos) << e.what();
  }
}

TEST(LayoutPacking, QkvPackedNeedsEqualSizes) {
  expect_layout_error(Layout::bs3hd, shape_of(1, 128, 256, 4, 4, 64, 64),
                      {"packs Q, K and V in one buffer, so needs s_q == s_kv (got 128 and 256)"});
  expect_layout_error(Layout::sb3hd, shape_of(1, 128, 128, 8, 2, 64, 64), {"h_q == h_kv", "8 and 2"});
  expect_layout_error(Layout::bsh3d, shape_of(1, 128, 128, 4, 4, 128, 64), {"d_qk == d_v", "128 and 64"});
}

TEST(LayoutPacking, KvPackedNeedsEqualHeadDims) {
  for (Layout layout : {Layout::bshd_bs2hd, Layout::bshd_bsh2d, Layout::sbhd_sb2hd, Layout::sbhd_sbh2d}) {
    expect_layout_error(layout, shape_of(1, 64, 64, 4, 4, 192, 128), {"packs K and V in one buffer", "192 and 128"});
  }
}

TEST(LayoutPacking, SizesMustBePositive) {
  const std::vector<std::pair<std::string, std::int64_t ProblemShape::*>> fields = {
      {"b", &ProblemShape::batch},        {"s_q", &ProblemShape::seq_q},           {"s_kv", &ProblemShape::seq_kv},
      {"h_q", &ProblemShape::heads_q},    {"h_kv", &ProblemShape::heads_kv},       {"d_qk", &ProblemShape::head_dim_qk},
      {"d_v", &ProblemShape::head_dim_v},
  };
  for (const auto& [field, member] : fields) {
    for (std::int64_t bad : {0, -3}) {
      ProblemShape shape = shape_of(2, 5, 5, 3, 3, 8, 8);
      shape.*member = bad;
      try {
        make_layout(Layout::bshd, shape);
        FAIL() << field << " = " << bad;
      } catch (const InvalidArgument& e) {
        EXPECT_EQ(e.field(), field);
        EXPECT_EQ(e.value(), std::to_string(bad));
      }
    }
  }
}

TEST(LayoutCheck, AcceptsWhatMakeLayoutGives) {
  ProblemShape shape = shape_of(2, 5, 5, 3, 3, 8, 8);
  for (Layout layout : all_layouts()) {
    LayoutTensors t = make_layout(layout, shape);
    EXPECT_NO_THROW(check_layout_strides(layout, "q", t.q)) << to_string(layout);
    EXPECT_NO_THROW(check_layout_strides(layout, "k", t.k)) << to_string(layout);
    EXPECT_NO_THROW(check_layout_strides(layout, "v", t.v)) << to_string(layout);
    EXPECT_NO_THROW(check_layout_strides(layout, "o", t.o)) << to_string(layout);
  }
}

TEST(LayoutCheck, RejectsOtherStridesNamingTheTensor) {
  LayoutTensors t = make_layout(Layout::bshd, shape_of(2, 5, 5, 3, 3, 8, 8));
  TensorDesc k = t.k;
  k.strides[kSeq] += 8;  // padded rows: valid strides, just not bshd's
  try {
    check_layout_strides(Layout::bshd, "k", k);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "k.strides");
    EXPECT_EQ(e.value(), "[120,8,32,1]");
    EXPECT_NE(e.requirement().find("[120,8,24,1]"), std::string::npos) << e.what();
  }
  // A bshd tensor is not an sbhd one.
  EXPECT_THROW(check_layout_strides(Layout::sbhd, "q", t.q), InvalidArgument);
  // O of a packed layout is unpacked: Q's packed strides are wrong for it.
  LayoutTensors packed = make_layout(Layout::bs3hd, shape_of(2, 5, 5, 3, 3, 8, 8));
  EXPECT_THROW(check_layout_strides(Layout::bs3hd, "o", packed.q), InvalidArgument);
}

TEST(LayoutCheck, RejectsUnknownTensorAndEmptyDims) {
  LayoutTensors t = make_layout(Layout::bshd, shape_of(2, 5, 5, 3, 3, 8, 8));
  try {
    check_layout_strides(Layout::bshd, "x", t.q);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "tensor");
    EXPECT_EQ(e.value(), "x");
  }
  TensorDesc empty = t.v;
  empty.dims[kHead] = 0;
  try {
    check_layout_strides(Layout::bshd, "v", empty);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "v.dims");
  }
}

}  // namespace
}  // namespace fusedattn
