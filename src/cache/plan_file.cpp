// Plan files of the disk cache: the format, the atomic write, the verified read and the pruning.
#include "cache/plan_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <system_error>
#include <thread>

namespace fusedattn::detail {
namespace {

constexpr char kMagic[8] = {'F', 'A', 'P', 'L', 'A', 'N', '0', '1'};
// magic, format, key size, payload size: then the key, the payload and the checksum.
constexpr std::size_t kHeaderBytes = sizeof kMagic + 4 + 8 + 8;
constexpr std::size_t kChecksumBytes = 8;
// Far above any plan (cuDNN's serialized plans are kilobytes): a size field past these is corrupt.
constexpr std::uint64_t kMaxKeyBytes = 1u << 20;
constexpr std::uint64_t kMaxPayloadBytes = 1ull << 30;

void put(std::vector<std::uint8_t>& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
}

std::uint64_t rotate_left(std::uint64_t x, int bits) { return (x << bits) | (x >> (64 - bits)); }

std::uint64_t get(const std::uint8_t* in, int bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<std::uint64_t>(in[i]) << (8 * i);
  return value;
}

// The file's bytes in one read into a buffer of its size (a 64 KB buffer appended to a growing
// vector took two copies and a regrowth for a 100 KB plan). Of a file larger than any valid one
// only the header is read: decode_plan_file then refuses it by its size or its magic.
bool read_whole_file(const std::string& path, std::vector<std::uint8_t>& bytes, int& error) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    error = errno;
    return false;
  }
  struct stat status {};
  if (::fstat(fd, &status) != 0) {
    error = errno;
    ::close(fd);
    return false;
  }
  constexpr std::uint64_t kLargest = kHeaderBytes + kMaxKeyBytes + kMaxPayloadBytes + kChecksumBytes;
  const auto file_size = static_cast<std::uint64_t>(status.st_size);
  const std::size_t size = file_size > kLargest ? kHeaderBytes : static_cast<std::size_t>(file_size);
  bytes.resize(size);
  std::size_t got_bytes = 0;
  while (got_bytes < size) {  // a file another process replaces meanwhile reads as what it was, or short
    ssize_t got = ::read(fd, bytes.data() + got_bytes, size - got_bytes);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      error = errno;
      ::close(fd);
      return false;
    }
    if (got == 0) break;
    got_bytes += static_cast<std::size_t>(got);
  }
  bytes.resize(got_bytes);
  ::close(fd);
  return true;
}

bool write_all(int fd, const std::uint8_t* data, std::size_t size) {
  while (size > 0) {
    ssize_t put_bytes = ::write(fd, data, size);
    if (put_bytes < 0 && errno == EINTR) continue;
    if (put_bytes <= 0) return false;
    data += put_bytes;
    size -= static_cast<std::size_t>(put_bytes);
  }
  return true;
}

// Unique among the processes and threads writing into one folder at once.
std::string temporary_name(const std::string& final_name) {
  static std::atomic<std::uint64_t> counter{0};
  char suffix[96];
  std::snprintf(suffix, sizeof suffix, ".tmp-%ld-%zx-%llu", static_cast<long>(::getpid()),
                std::hash<std::thread::id>{}(std::this_thread::get_id()),
                static_cast<unsigned long long>(counter.fetch_add(1)));
  return final_name + suffix;
}

}  // namespace

const char* to_string(PlanFileCheck check) noexcept {
  switch (check) {
    case PlanFileCheck::loaded: return "loaded";
    case PlanFileCheck::missing: return "missing";
    case PlanFileCheck::unreadable: return "unreadable";
    case PlanFileCheck::truncated: return "truncated";
    case PlanFileCheck::corrupt: return "corrupt";
    case PlanFileCheck::old_format: return "old_format";
    case PlanFileCheck::other_key: return "other_key";
  }
  return "unknown";
}

std::uint64_t fnv1a64(const void* bytes, std::size_t size, std::uint64_t hash) noexcept {
  const auto* p = static_cast<const std::uint8_t*>(bytes);
  for (std::size_t i = 0; i < size; ++i) {
    hash ^= p[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

std::uint64_t plan_checksum(const void* bytes, std::size_t size) noexcept {
  // Four independent lanes, each taking every fourth 64-bit word through a multiply-add, a
  // rotation and a multiply (the round of xxHash64's lanes): the processor runs the four chains
  // side by side. Bytewise FNV-1a's single chain of dependent multiplies took 131 µs over 110 KB on
  // the development machine's CPU, this 18; on the H200 machine a restore's reading went from
  // 0.18-0.46 ms to 0.04-0.18. The rotation carries a word's high bits down, so that flips in the
  // same bit of two words do not cancel as they would in a plain xor-and-multiply.
  constexpr std::uint64_t kOne = 0x9e3779b185ebca87ull, kTwo = 0xc2b2ae3d27d4eb4full;
  std::uint64_t lanes[4] = {kOne + kTwo, kTwo, 0, 0 - kOne};
  const auto* p = static_cast<const std::uint8_t*>(bytes);
  std::size_t at = 0;
  for (; at + 32 <= size; at += 32) {
    for (int k = 0; k < 4; ++k) {
      std::uint64_t word;
      std::memcpy(&word, p + at + 8 * k, sizeof word);  // the host's byte order: files stay on their machine
      lanes[k] = rotate_left(lanes[k] + word * kTwo, 31) * kOne;
    }
  }
  std::uint64_t hash = fnv1a64(p + at, size - at) ^ static_cast<std::uint64_t>(size);  // the last size % 32 bytes
  for (std::uint64_t lane : lanes) hash = rotate_left(hash ^ lane, 27) * kOne + kTwo;
  return hash ^ (hash >> 32);
}

std::string plan_file_name(const std::string& key) {
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.plan", static_cast<unsigned long long>(fnv1a64(key.data(), key.size())));
  return name;
}

std::vector<std::uint8_t> encode_plan_file(const std::string& key, const std::vector<std::uint8_t>& payload) {
  std::vector<std::uint8_t> out(kMagic, kMagic + sizeof kMagic);
  out.reserve(kHeaderBytes + key.size() + payload.size() + kChecksumBytes);
  put(out, kPlanFileFormat, 4);
  put(out, key.size(), 8);
  put(out, payload.size(), 8);
  out.insert(out.end(), key.begin(), key.end());
  out.insert(out.end(), payload.begin(), payload.end());
  put(out, plan_checksum(out.data(), out.size()), 8);
  return out;
}

PlanFile decode_plan_file(const std::vector<std::uint8_t>& bytes, const std::string& key) {
  PlanFile file;
  if (bytes.size() < kHeaderBytes + kChecksumBytes) {
    file.check = bytes.size() >= sizeof kMagic && std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0
                     ? PlanFileCheck::corrupt
                     : PlanFileCheck::truncated;
    return file;
  }
  const std::uint8_t* p = bytes.data();
  if (std::memcmp(p, kMagic, sizeof kMagic) != 0) {
    file.check = PlanFileCheck::corrupt;
    return file;
  }
  const std::uint64_t key_bytes = get(p + 12, 8), payload_bytes = get(p + 20, 8);
  if (key_bytes > kMaxKeyBytes || payload_bytes > kMaxPayloadBytes) {
    file.check = PlanFileCheck::corrupt;
    return file;
  }
  const std::size_t whole = kHeaderBytes + key_bytes + payload_bytes + kChecksumBytes;
  if (bytes.size() != whole) {
    file.check = PlanFileCheck::truncated;
    return file;
  }
  if (get(p + whole - kChecksumBytes, 8) != plan_checksum(p, whole - kChecksumBytes)) {
    file.check = PlanFileCheck::corrupt;
    return file;
  }
  // Checked after the checksum, so that a damaged format field reads as damage.
  if (get(p + 8, 4) != kPlanFileFormat) {
    file.check = PlanFileCheck::old_format;
    return file;
  }
  if (key_bytes != key.size() || std::memcmp(p + kHeaderBytes, key.data(), key.size()) != 0) {
    file.check = PlanFileCheck::other_key;
    return file;
  }
  const std::uint8_t* payload = p + kHeaderBytes + key_bytes;
  file.payload.assign(payload, payload + payload_bytes);
  file.check = PlanFileCheck::loaded;
  return file;
}

PlanFile read_plan_file(const std::string& path, const std::string& key) {
  std::vector<std::uint8_t> bytes;
  int error = 0;
  if (!read_whole_file(path, bytes, error)) {
    PlanFile file;
    file.check = error == ENOENT ? PlanFileCheck::missing : PlanFileCheck::unreadable;
    return file;
  }
  return decode_plan_file(bytes, key);
}

bool write_plan_file(const std::string& folder, const std::string& key, const std::vector<std::uint8_t>& payload,
                     std::string& error) {
  std::error_code made;
  std::filesystem::create_directories(folder, made);
  if (made) {
    error = "cannot create " + folder + ": " + made.message();
    return false;
  }
  const std::string final_path = folder + "/" + plan_file_name(key);
  const std::string temporary = temporary_name(final_path);
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    error = "cannot create " + temporary + ": " + std::strerror(errno);
    return false;
  }
  const std::vector<std::uint8_t> bytes = encode_plan_file(key, payload);
  // fsync before the rename: after a crash the final name holds the whole file or nothing new.
  bool ok = write_all(fd, bytes.data(), bytes.size()) && ::fsync(fd) == 0;
  const int write_error = errno;
  ok = (::close(fd) == 0) && ok;
  if (ok && ::rename(temporary.c_str(), final_path.c_str()) == 0) return true;
  error = "cannot write " + final_path + ": " + std::strerror(ok ? errno : write_error);
  ::unlink(temporary.c_str());
  return false;
}

std::size_t prune_plan_folder(const std::string& folder, std::uint64_t cap_bytes) {
  namespace fs = std::filesystem;
  struct Entry {
    fs::path path;
    fs::file_time_type written;
    std::uint64_t bytes;
  };
  std::vector<Entry> entries;
  std::uint64_t total = 0;
  std::error_code error;
  const auto abandoned_before = fs::file_time_type::clock::now() - std::chrono::hours(1);
  for (auto it = fs::directory_iterator(folder, error); !error && it != fs::directory_iterator(); it.increment(error)) {
    std::error_code stat_error;
    const fs::path& path = it->path();
    const auto written = fs::last_write_time(path, stat_error);
    const auto bytes = it->file_size(stat_error);
    if (stat_error) continue;  // gone meanwhile: another process pruned it
    const std::string name = path.filename().string();
    if (name.find(".plan.tmp-") != std::string::npos) {
      if (written < abandoned_before) fs::remove(path, stat_error);
    } else if (path.extension() == ".plan") {
      entries.push_back(Entry{path, written, bytes});
      total += bytes;
    }
  }
  if (total <= cap_bytes) return 0;
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.written < b.written; });
  std::size_t deleted = 0;
  for (const Entry& entry : entries) {
    if (total <= cap_bytes) break;
    std::error_code remove_error;
    if (fs::remove(entry.path, remove_error)) ++deleted;
    total -= entry.bytes;  // removed by us or by another process: gone either way
  }
  return deleted;
}

}  // namespace fusedattn::detail
