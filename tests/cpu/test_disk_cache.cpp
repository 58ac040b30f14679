// Tier 1: the disk cache's files and settings — every damaged form of a file refused with its
// reason, atomic writes, processes racing on one entry, pruning, and the folder setting.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cache/disk_cache.h"
#include "cache/plan_file.h"
#include "fusedattn/errors.h"

namespace fusedattn::detail {
namespace {

namespace fs = std::filesystem;

const std::string kKey = "fusedattn=0.1.0 graph=stamp gpu=NVIDIA_H200 sms=132 driver=13000 sm=90 cudnn=91900 "
                         "fe=13200 forward layout=bshd dtype=bf16 b=2 s_q=128 s_kv=128 h_q=8 h_kv=8 d_qk=64 d_v=64";

std::vector<std::uint8_t> payload_of(std::size_t size, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> bytes(size);
  for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
  return bytes;
}

// A fresh folder per test, removed afterwards.
class PlanFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/fusedattn-plans-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    folder_ = pattern;
  }
  void TearDown() override { fs::remove_all(folder_); }
  std::string folder_;
};

TEST(PlanFileFormat, RoundTrips) {
  const auto payload = payload_of(1000, 1);
  PlanFile file = decode_plan_file(encode_plan_file(kKey, payload), kKey);
  EXPECT_EQ(file.check, PlanFileCheck::loaded);
  EXPECT_EQ(file.payload, payload);
}

TEST(PlanFileFormat, EveryTruncationIsRefused) {
  const auto bytes = encode_plan_file(kKey, payload_of(300, 2));
  for (std::size_t size = 0; size < bytes.size(); ++size) {
    std::vector<std::uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(size));
    EXPECT_EQ(decode_plan_file(cut, kKey).check, PlanFileCheck::truncated) << "cut at " << size;
  }
  std::vector<std::uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_EQ(decode_plan_file(longer, kKey).check, PlanFileCheck::truncated);
}

TEST(PlanFileFormat, EveryFlippedBitIsRefused) {
  const auto bytes = encode_plan_file(kKey, payload_of(200, 3));
  for (std::size_t at = 0; at < bytes.size(); ++at) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<std::uint8_t> damaged = bytes;
      damaged[at] ^= static_cast<std::uint8_t>(1u << bit);
      const PlanFileCheck check = decode_plan_file(damaged, kKey).check;
      // A flipped size field makes the file the wrong length; anything else fails the checksum.
      EXPECT_TRUE(check == PlanFileCheck::corrupt || check == PlanFileCheck::truncated)
          << "byte " << at << " bit " << bit << ": " << to_string(check);
    }
  }
}

// The checksum's own cases beyond one flipped bit: the same bit flipped in two words (which cancel
// in a plain xor-and-multiply of words), in one lane and across lanes, and two words swapped.
TEST(PlanChecksum, PairedFlipsAndSwappedWordsChangeIt) {
  const auto bytes = payload_of(1024 + 13, 8);  // 32 rounds of four words, and a tail
  const std::uint64_t sum = plan_checksum(bytes.data(), bytes.size());
  const std::size_t words = bytes.size() / 8;
  for (std::size_t first : std::vector<std::size_t>{0, 1, 5, 64}) {
    for (std::size_t second : std::vector<std::size_t>{first + 1, first + 4, first + 12, words - 1}) {
      for (int bit = 0; bit < 64; ++bit) {
        std::vector<std::uint8_t> damaged = bytes;
        damaged[first * 8 + bit / 8] ^= static_cast<std::uint8_t>(1u << (bit % 8));
        damaged[second * 8 + bit / 8] ^= static_cast<std::uint8_t>(1u << (bit % 8));
        EXPECT_NE(plan_checksum(damaged.data(), damaged.size()), sum)
            << "bit " << bit << " of words " << first << " and " << second;
      }
      std::vector<std::uint8_t> swapped = bytes;
      std::swap_ranges(swapped.begin() + first * 8, swapped.begin() + first * 8 + 8, swapped.begin() + second * 8);
      if (swapped != bytes) {
        EXPECT_NE(plan_checksum(swapped.data(), swapped.size()), sum) << "words " << first << " and " << second;
      }
    }
  }
  std::vector<std::uint8_t> longer = bytes;
  longer.push_back(0);  // a zero byte more is another file
  EXPECT_NE(plan_checksum(longer.data(), longer.size()), sum);
}

// The checksum is part of the file format: changing it must bump kPlanFileFormat (plan_file.h),
// and this value with it.
TEST(PlanChecksum, IsPinnedByTheFormat) {
  const auto bytes = payload_of(100, 9);
  EXPECT_EQ(kPlanFileFormat, 3u);
  EXPECT_EQ(plan_checksum(bytes.data(), bytes.size()), 0x2215d912c095c1aaull);
}

TEST(PlanFileFormat, AnotherKeyOrFormatIsRefused) {
  const auto bytes = encode_plan_file(kKey, payload_of(64, 4));
  EXPECT_EQ(decode_plan_file(bytes, kKey + " tuned").check, PlanFileCheck::other_key);
  EXPECT_EQ(decode_plan_file(bytes, kKey.substr(1)).check, PlanFileCheck::other_key);
  // A well-formed file of another format version (checksum recomputed) is not read as this one.
  std::vector<std::uint8_t> other = bytes;
  other[8] = static_cast<std::uint8_t>(kPlanFileFormat + 1);
  other.resize(other.size() - 8);
  const std::uint64_t sum = plan_checksum(other.data(), other.size());
  for (int i = 0; i < 8; ++i) other.push_back(static_cast<std::uint8_t>(sum >> (8 * i)));
  EXPECT_EQ(decode_plan_file(other, kKey).check, PlanFileCheck::old_format);
}

TEST(PlanFileFormat, NamesAreTheKeysHash) {
  EXPECT_EQ(plan_file_name(kKey), plan_file_name(kKey));
  EXPECT_NE(plan_file_name(kKey), plan_file_name(kKey + " tuned"));
  EXPECT_EQ(plan_file_name(kKey).size(), 16u + 5u);
  EXPECT_EQ(plan_file_name(kKey).substr(16), ".plan");
}

TEST_F(PlanFolder, WritesAtomicallyAndReadsBack) {
  const std::string nested = folder_ + "/a/b";
  const auto payload = payload_of(70000, 5);
  std::string error;
  ASSERT_TRUE(write_plan_file(nested, kKey, payload, error)) << error;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(nested)) names.push_back(entry.path().filename().string());
  ASSERT_EQ(names.size(), 1u) << "a temporary file was left behind";
  EXPECT_EQ(names[0], plan_file_name(kKey));
  PlanFile file = read_plan_file(nested + "/" + names[0], kKey);
  EXPECT_EQ(file.check, PlanFileCheck::loaded);
  EXPECT_EQ(file.payload, payload);
  EXPECT_EQ(read_plan_file(nested + "/none.plan", kKey).check, PlanFileCheck::missing);
}

TEST_F(PlanFolder, AHalfWrittenFileOnDiskIsRefused) {
  std::string error;
  ASSERT_TRUE(write_plan_file(folder_, kKey, payload_of(5000, 6), error)) << error;
  const std::string path = folder_ + "/" + plan_file_name(kKey);
  fs::resize_file(path, 2000);  // what a writer that died mid-way would leave without the rename
  EXPECT_EQ(read_plan_file(path, kKey).check, PlanFileCheck::truncated);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "garbage that is not a plan file at all";
  EXPECT_EQ(read_plan_file(path, kKey).check, PlanFileCheck::corrupt);
}

TEST_F(PlanFolder, AFolderThatCannotBeMadeIsAReasonNotACrash) {
  const std::string blocker = folder_ + "/file";
  std::ofstream(blocker) << "x";
  std::string error;
  EXPECT_FALSE(write_plan_file(blocker + "/plans", kKey, payload_of(10, 7), error));
  EXPECT_NE(error.find(blocker), std::string::npos) << error;
}

// Eight processes write the same entry (each its own payload) and read it back in between, as
// processes sharing one folder do: every read finds nothing yet or one writer's complete file.
TEST_F(PlanFolder, ProcessesRacingOnOneEntryNeverSeeAPartialFile) {
  constexpr int kProcesses = 8, kRounds = 40;
  std::vector<std::vector<std::uint8_t>> payloads;
  for (int p = 0; p < kProcesses; ++p) payloads.push_back(payload_of(200000 + 997 * p, 100 + p));
  const std::string path = folder_ + "/" + plan_file_name(kKey);
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int bad = 0;
      for (int round = 0; round < kRounds; ++round) {
        std::string error;
        if (!write_plan_file(folder_, kKey, payloads[p], error)) bad |= 1;
        PlanFile file = read_plan_file(path, kKey);
        if (file.check != PlanFileCheck::loaded) bad |= 2;
        bool known = false;
        for (const auto& payload : payloads) known = known || file.payload == payload;
        if (!known) bad |= 4;
      }
      _exit(bad);
    }
    children.push_back(pid);
  }
  for (pid_t child : children) {
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "1: a write failed, 2: a read was not a whole file, 4: a mixed payload";
  }
  std::size_t files = 0;
  for (const auto& entry : fs::directory_iterator(folder_)) files += entry.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1u) << "temporary files were left behind";
}

TEST_F(PlanFolder, PruningDeletesTheOldestFirstAndAbandonedTemporaries) {
  std::string error;
  const auto now = fs::file_time_type::clock::now();
  std::vector<std::string> keys;
  for (int i = 0; i < 10; ++i) {
    keys.push_back(kKey + " #" + std::to_string(i));
    ASSERT_TRUE(write_plan_file(folder_, keys.back(), payload_of(1000, 200 + i), error)) << error;
    fs::last_write_time(folder_ + "/" + plan_file_name(keys.back()), now - std::chrono::minutes(100 - i));
  }
  const std::string abandoned = folder_ + "/" + plan_file_name(kKey) + ".tmp-1-2-3";
  const std::string fresh = folder_ + "/" + plan_file_name(kKey) + ".tmp-4-5-6";
  std::ofstream(abandoned) << "half";
  std::ofstream(fresh) << "being written";
  fs::last_write_time(abandoned, now - std::chrono::hours(2));
  const std::uint64_t entry_bytes = fs::file_size(folder_ + "/" + plan_file_name(keys[0]));
  EXPECT_EQ(prune_plan_folder(folder_, 6 * entry_bytes), 4u);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(fs::exists(folder_ + "/" + plan_file_name(keys[i])), i >= 4) << "entry " << i;
  }
  EXPECT_FALSE(fs::exists(abandoned));
  EXPECT_TRUE(fs::exists(fresh)) << "a writer's file of a minute ago may still be renamed";
  EXPECT_EQ(prune_plan_folder(folder_, 6 * entry_bytes), 0u);
}

TEST(PlanDirSetting, UnsetTakesTheUsersCacheFolder) {
  EXPECT_EQ(plan_dir_from_setting(nullptr, "/x/cache", "/home/u"), "/x/cache/fusedattn/plans");
  EXPECT_EQ(plan_dir_from_setting(nullptr, nullptr, "/home/u"), "/home/u/.cache/fusedattn/plans");
  EXPECT_EQ(plan_dir_from_setting(nullptr, "relative", "/home/u"), "/home/u/.cache/fusedattn/plans")
      << "XDG_CACHE_HOME must be absolute to count";
  EXPECT_EQ(plan_dir_from_setting(nullptr, nullptr, nullptr), "");
}

TEST(PlanDirSetting, OffAndExplicitFolders) {
  EXPECT_EQ(plan_dir_from_setting("off", "/x", "/h"), "");
  EXPECT_EQ(plan_dir_from_setting("0", "/x", "/h"), "");
  EXPECT_EQ(plan_dir_from_setting("", "/x", "/h"), "");
  EXPECT_EQ(plan_dir_from_setting("/data/plans/", "/x", "/h"), "/data/plans/");
  EXPECT_EQ(plan_dir_from_setting("rel/plans", "/x", "/h"), (fs::current_path() / "rel/plans").string());
}

TEST(PlanDirSetting, CapInMegabytes) {
  EXPECT_EQ(parse_cap_megabytes("512"), 512u);
  for (const char* bad : {"0", "-3", "ten", "", "1.5"}) {
    try {
      parse_cap_megabytes(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& error) {
      EXPECT_NE(std::string(error.what()).find("FUSEDATTN_PLAN_DIR_CAP_MB"), std::string::npos) << error.what();
    }
  }
}

}  // namespace
}  // namespace fusedattn::detail
