// GPU tier: the FP8 scale updates of fusedattn/fp8.h against hand-computed values: current
// scaling from an amax, delayed scaling's history step, and a step's updates in one launch
// (update_fp8_scales), in order, equal to one call each.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "device_copy.h"
#include "fp8_images.h"
#include "fusedattn/errors.h"
#include "fusedattn/fp8.h"
#include "gpu_skip.h"
#include "testing/cuda_check.h"
#include "testing/device_buffer.h"

namespace fusedattn {
namespace {

using namespace fp8_test;  // NOLINT: the helpers the FP8 tests share

// --- scales -----------------------------------------------------------------------------------

struct ScaleCase {
  float amax;
  DType dtype;
  int margin;
  float scale;  // worked by hand
};

TEST(Fp8ScalingGpu, ScaleFromAmax) {
  FUSEDATTN_REQUIRE_GPU();
  const ScaleCase cases[] = {
      {2.0f, DType::e4m3, 0, 224.0f},             // 448 / 2
      {2.0f, DType::e4m3, 1, 112.0f},             // 448 / (2 * 2)
      {448.0f, DType::e4m3, -2, 4.0f},            // 448 / (448 / 4)
      {14336.0f, DType::e5m2, 0, 4.0f},           // 57344 / 14336
      {3.0f, DType::e5m2, 0, 57344.0f / 3.0f},    // one float division, as on the device
      {0.0f, DType::e4m3, 0, 1.0f},               // nothing to scale
      {0.0f, DType::e5m2, 3, 1.0f},
      {kInf, DType::e4m3, 0, 1.0f},
      {kNan, DType::e4m3, 0, 1.0f},
      {-1.0f, DType::e4m3, 0, 1.0f},              // not an amax
      {1e-40f, DType::e4m3, 0, FLT_MAX},          // 448 / 1e-40 overflows float: clamped
      {FLT_MAX, DType::e4m3, 200, FLT_MIN},       // underflows: clamped
  };
  for (const ScaleCase& c : cases) {
    SCOPED_TRACE("amax " + std::to_string(c.amax) + " " + to_string(c.dtype) + " margin " + std::to_string(c.margin));
    DeviceBuffer d_amax = upload(std::vector<float>{c.amax});
    DeviceBuffer d_scale = poisoned_scalar(), d_descale = poisoned_scalar();
    scale_from_amax(d_amax.as<float>(), c.dtype, c.margin, d_scale.as<float>(), d_descale.as<float>(), nullptr);
    synchronize();
    EXPECT_EQ(download_scalar(d_scale), c.scale);
    EXPECT_EQ(download_scalar(d_descale), 1.0f / c.scale);
  }
}

struct DelayedResult {
  std::vector<float> history_in, history_out;
  float scale, descale;
};

// One step from `history` with `amax`, in place (history_out = history_in) or into a second buffer.
DelayedResult delayed_step(const std::vector<float>& history, float amax, DType dtype, int margin, bool in_place) {
  DeviceBuffer d_in = upload(history), d_out(in_place ? 0 : history.size() * sizeof(float));
  if (!in_place) check_cuda(cudaMemset(d_out.get(), 0xff, d_out.bytes()), "cudaMemset(poison)");
  DeviceBuffer d_amax = upload(std::vector<float>{amax}), d_scale = poisoned_scalar(), d_descale = poisoned_scalar();
  float* out = in_place ? d_in.as<float>() : d_out.as<float>();
  update_delayed_scaling(d_in.as<float>(), out, static_cast<std::int64_t>(history.size()), d_amax.as<float>(), dtype,
                         margin, d_scale.as<float>(), d_descale.as<float>(), nullptr);
  synchronize();
  DelayedResult result{download_floats(d_in), {}, download_scalar(d_scale), download_scalar(d_descale)};
  result.history_out = in_place ? result.history_in : download_floats(d_out);
  return result;
}

void expect_same_floats(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(same_float(got[i], want[i])) << "slot " << i << ": " << got[i];
  }
}

TEST(Fp8ScalingGpu, DelayedScalingOutOfPlace) {
  FUSEDATTN_REQUIRE_GPU();
  const std::vector<float> history = {1.0f, 2.0f, 3.0f, 4.0f, 100.0f};
  const DelayedResult r = delayed_step(history, 0.5f, DType::e4m3, 0, false);
  expect_same_floats(r.history_out, {0.5f, 1.0f, 2.0f, 3.0f, 4.0f});  // 100, the oldest, drops out
  expect_same_floats(r.history_in, history);                          // the input is left as it was
  EXPECT_EQ(r.scale, 112.0f);                                         // 448 / 4
  EXPECT_EQ(r.descale, 1.0f / 112.0f);
}

TEST(Fp8ScalingGpu, DelayedScalingInPlace) {
  FUSEDATTN_REQUIRE_GPU();
  const DelayedResult r = delayed_step({1.0f, 2.0f, 3.0f, 4.0f, 100.0f}, 0.5f, DType::e5m2, 1, true);
  expect_same_floats(r.history_out, {0.5f, 1.0f, 2.0f, 3.0f, 4.0f});
  EXPECT_EQ(r.scale, 7168.0f);  // 57344 / (4 * 2^1)
  EXPECT_EQ(r.descale, 1.0f / 7168.0f);
}

// Longer than one block's chunk of slots (256), so the shift runs in several rounds.
TEST(Fp8ScalingGpu, DelayedScalingLongHistory) {
  FUSEDATTN_REQUIRE_GPU();
  std::vector<float> history(1000);
  for (std::size_t i = 0; i < history.size(); ++i) history[i] = static_cast<float>(i + 1);
  std::vector<float> shifted(history.size());
  shifted[0] = 7.0f;
  for (std::size_t i = 1; i < history.size(); ++i) shifted[i] = history[i - 1];
  for (bool in_place : {true, false}) {
    SCOPED_TRACE(in_place ? "in place" : "out of place");
    const DelayedResult r = delayed_step(history, 7.0f, DType::e4m3, 0, in_place);
    expect_same_floats(r.history_out, shifted);
    EXPECT_EQ(r.scale, 448.0f / 999.0f);  // 1000 dropped out; 999 is the largest left
    EXPECT_EQ(r.descale, 1.0f / (448.0f / 999.0f));
  }
}

TEST(Fp8ScalingGpu, DelayedScalingEdgeCases) {
  FUSEDATTN_REQUIRE_GPU();
  {  // nothing seen yet: scale 1
    const DelayedResult r = delayed_step({0.0f, 0.0f, 0.0f}, 0.0f, DType::e4m3, 0, true);
    expect_same_floats(r.history_out, {0.0f, 0.0f, 0.0f});
    EXPECT_EQ(r.scale, 1.0f);
    EXPECT_EQ(r.descale, 1.0f);
  }
  {  // a NaN anywhere in the new history: scale 1, and the NaN moves along
    const DelayedResult r = delayed_step({1.0f, kNan, 2.0f}, 3.0f, DType::e4m3, 0, false);
    expect_same_floats(r.history_out, {3.0f, 1.0f, kNan});
    EXPECT_EQ(r.scale, 1.0f);
  }
  {  // a NaN amax
    const DelayedResult r = delayed_step({1.0f, 2.0f}, kNan, DType::e5m2, 0, true);
    expect_same_floats(r.history_out, {kNan, 1.0f});
    EXPECT_EQ(r.scale, 1.0f);
  }
  {  // a history of one slot holds only the newest amax
    const DelayedResult r = delayed_step({5.0f}, 2.0f, DType::e4m3, 0, true);
    expect_same_floats(r.history_out, {2.0f});
    EXPECT_EQ(r.scale, 224.0f);
  }
}

// --- a step's updates in one launch ----------------------------------------------------------

// Floats of one buffer, as a state keeps its scalars: update fields point into it.
struct Scalars {
  explicit Scalars(std::vector<float> values) : device(upload(values)) {}
  float* at(int i) { return device.as<float>() + i; }
  std::vector<float> now() const { return download_floats(device); }
  DeviceBuffer device;
};

Fp8ScaleUpdate from_amax(float* amax, DType dtype, int margin, float* scale, float* descale) {
  Fp8ScaleUpdate u;
  u.rule = Fp8ScaleRule::from_amax;
  u.amax = amax;
  u.dtype = dtype;
  u.margin = margin;
  u.scale = scale;
  u.descale = descale;
  return u;
}

Fp8ScaleUpdate delayed(float* amax, float* history, std::int64_t length, DType dtype, int margin, float* scale,
                       float* descale) {
  Fp8ScaleUpdate u = from_amax(amax, dtype, margin, scale, descale);
  u.rule = Fp8ScaleRule::delayed;
  u.history_in = history;
  u.history_out = history;
  u.length = length;
  return u;
}

// A forward's step as the adapters run it: V's delayed step reporting the descale it replaces, O's
// scale from V's amax, O's new descale reported by a keep, dP's from its amax with two bits of
// headroom; each later update reads what an earlier one wrote.
TEST(Fp8ScaleUpdatesGpu, UpdatesRunInOrderInOneLaunch) {
  FUSEDATTN_REQUIRE_GPU();
  // 0 amax V, 1 amax dP, 2 scale V, 3 descale V, 4 scale O, 5 descale O, 6 scale dP, 7 descale dP,
  // 8 V's descale used, 9 O's descale used; then V's history [4].
  Scalars s({2.0f, 8.0f, 4.0f, 0.25f, kNan, kNan, kNan, kNan, kNan, kNan, 1.0f, 8.0f, 3.0f, 0.0f});
  float* history = s.at(10);
  Fp8ScaleUpdate updates[4] = {delayed(s.at(0), history, 4, DType::e4m3, 0, s.at(2), s.at(3)),
                               from_amax(s.at(0), DType::e4m3, 0, s.at(4), s.at(5)),
                               Fp8ScaleUpdate{},
                               from_amax(s.at(1), DType::e5m2, 2, s.at(6), s.at(7))};
  updates[0].descale_used = s.at(8);
  updates[2].rule = Fp8ScaleRule::keep;
  updates[2].descale = s.at(5);
  updates[2].descale_used = s.at(9);
  update_fp8_scales(updates, 4, nullptr);
  synchronize();
  const std::vector<float> got = s.now();
  EXPECT_EQ(got[8], 0.25f);                         // V's descale before its step
  EXPECT_EQ(got[2], 56.0f);                         // 448 / 8, the largest of {2, 1, 8, 3}
  EXPECT_EQ(got[3], 1.0f / 56.0f);
  EXPECT_EQ(got[4], 224.0f);                        // 448 / 2
  EXPECT_EQ(got[9], 1.0f / 224.0f);                 // the keep saw what the update before it wrote
  EXPECT_EQ(got[6], 1792.0f);                       // 57344 / (8 * 2^2)
  EXPECT_EQ(got[7], 1.0f / 1792.0f);
  const std::vector<float> shifted(got.begin() + 10, got.end());
  expect_same_floats(shifted, {2.0f, 1.0f, 8.0f, 3.0f});
}

// Many updates in one call leave every byte as one call each does, histories of one slot to
// several chunks, in place and out of place.
TEST(Fp8ScaleUpdatesGpu, OneLaunchEqualsOneCallEach) {
  FUSEDATTN_REQUIRE_GPU();
  std::mt19937 rng(std::random_device{}());
  const unsigned seed = rng();
  SCOPED_TRACE("seed " + std::to_string(seed));
  rng.seed(seed);
  std::uniform_real_distribution<float> amax(0.0f, 600.0f);
  const std::int64_t lengths[5] = {1, 5, 300, 1000, 16};
  std::vector<float> host;  // per update: amax, scale, descale, then the history in and out
  std::vector<std::int64_t> at;
  for (std::int64_t length : lengths) {
    at.push_back(static_cast<std::int64_t>(host.size()));
    host.insert(host.end(), {amax(rng), kNan, kNan});
    for (std::int64_t i = 0; i < 2 * length; ++i) host.push_back(amax(rng));
  }
  Scalars together(host), alone(host);
  std::vector<Fp8ScaleUpdate> updates;
  for (int i = 0; i < 5; ++i) {
    const int a = static_cast<int>(at[static_cast<std::size_t>(i)]);
    const DType dtype = i % 2 ? DType::e5m2 : DType::e4m3;
    for (Scalars* s : {&together, &alone}) {
      Fp8ScaleUpdate u = delayed(s->at(a), s->at(a + 3), lengths[i], dtype, i, s->at(a + 1), s->at(a + 2));
      if (i % 2) u.history_out = s->at(a + 3 + static_cast<int>(lengths[i]));  // out of place
      if (i == 4) u = from_amax(s->at(a), dtype, 2, s->at(a + 1), s->at(a + 2));
      if (s == &together) {
        updates.push_back(u);
      } else {
        update_fp8_scales(&u, 1, nullptr);
      }
    }
  }
  update_fp8_scales(updates.data(), static_cast<int>(updates.size()), nullptr);
  synchronize();
  expect_same_floats(together.now(), alone.now());
}

// A bad update is named by its index, and nothing of the call runs.
TEST(Fp8ScaleUpdatesGpu, ABadUpdateIsNamedAndNothingRuns) {
  FUSEDATTN_REQUIRE_GPU();
  Scalars s({2.0f, kNan, kNan, kNan, kNan});
  Fp8ScaleUpdate updates[2] = {from_amax(s.at(0), DType::e4m3, 0, s.at(1), s.at(2)),
                               from_amax(nullptr, DType::e4m3, 0, s.at(3), s.at(4))};
  try {
    update_fp8_scales(updates, 2, nullptr);
    FAIL() << "a null amax was taken";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.field(), "updates[1].amax");
  }
  synchronize();
  EXPECT_TRUE(std::isnan(s.now()[1]));  // the first update did not run
}

TEST(Fp8ScaleUpdatesChecks, BadCallsAreRejectedNamingTheField) {
  float f[4] = {};
  Fp8ScaleUpdate keep;
  keep.rule = Fp8ScaleRule::keep;
  keep.descale = f;
  auto field_of = [](const std::vector<Fp8ScaleUpdate>& updates) {
    try {
      update_fp8_scales(updates.data(), static_cast<int>(updates.size()), nullptr);
    } catch (const InvalidArgument& error) {
      return error.field();
    }
    return std::string("none");
  };
  EXPECT_EQ(field_of({keep}), "updates[0].descale_used");
  Fp8ScaleUpdate bad_dtype = from_amax(f, DType::bf16, 0, f, f);
  EXPECT_EQ(field_of({from_amax(f, DType::e4m3, 0, f, f), bad_dtype}), "updates[1].dtype");
  Fp8ScaleUpdate short_history = delayed(f, f, 0, DType::e4m3, 0, f, f);
  EXPECT_EQ(field_of({short_history}), "updates[0].length");
  EXPECT_EQ(field_of(std::vector<Fp8ScaleUpdate>(kMaxScaleUpdates + 1, from_amax(f, DType::e4m3, 0, f, f))), "count");
}

}  // namespace
}  // namespace fusedattn
