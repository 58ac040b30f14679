// Internal: one plan's file in the disk cache — its format, an atomic write and a verified read.
//
// A file is "FAPLAN01", the format version, the whole key, the payload and a checksum over all of
// it (plan_checksum, 64 bits). A read accepts it only when every part is there and agrees, so a
// truncated, corrupted, half-written or foreign file is a miss with its reason, never a plan.
// Writes go to a temporary name in the same folder and are renamed over the final one, which
// POSIX makes atomic: readers in other processes see the old file or the new one, never a mix.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fusedattn::detail {

/// Bumped whenever the layout of a file or of the payload fusedattn puts in it changes.
/// 2: the backend's plan JSON kept apart (graph/plan_choice.cpp); 3: plan_checksum, not FNV-1a.
constexpr std::uint32_t kPlanFileFormat = 3;

/// What reading a plan file found.
enum class PlanFileCheck {
  loaded,       ///< complete, checksummed and for this key
  missing,      ///< no such file
  unreadable,   ///< it exists but cannot be read
  truncated,    ///< shorter (or longer) than its own header says
  corrupt,      ///< wrong magic or checksum
  old_format,   ///< another kPlanFileFormat
  other_key,    ///< a complete file for another key (a hash collision, or copied in from elsewhere)
};
const char* to_string(PlanFileCheck check) noexcept;

struct PlanFile {
  PlanFileCheck check = PlanFileCheck::missing;
  std::vector<std::uint8_t> payload;  ///< filled only when loaded
};

/// FNV-1a over `bytes`, continuing from `hash`.
std::uint64_t fnv1a64(const void* bytes, std::size_t size, std::uint64_t hash = 0xcbf29ce484222325ull) noexcept;

/// The files' checksum: 64 bits over four lanes of 64-bit words, so that checking a plan of
/// 100 KB costs microseconds; any one changed bit or word, or two words swapped, changes it.
std::uint64_t plan_checksum(const void* bytes, std::size_t size) noexcept;

/// The file name of `key`'s entry: 16 hex digits of its hash and ".plan".
std::string plan_file_name(const std::string& key);

/// The file's bytes for `key` and `payload`: what write_plan_file writes and read_plan_file reads.
std::vector<std::uint8_t> encode_plan_file(const std::string& key, const std::vector<std::uint8_t>& payload);
/// Checks `bytes` as the file of `key`.
PlanFile decode_plan_file(const std::vector<std::uint8_t>& bytes, const std::string& key);

/// Reads and checks the file at `path` as the entry of `key`.
PlanFile read_plan_file(const std::string& path, const std::string& key);

/// Writes `key`'s entry as `folder`/plan_file_name(key), creating the folder (and its parents) if
/// needed, atomically. False with the reason in `error` when the file system refuses; nothing
/// half-written is left under the final name either way.
bool write_plan_file(const std::string& folder, const std::string& key, const std::vector<std::uint8_t>& payload,
                     std::string& error);

/// Deletes the oldest entries (by modification time) until the folder's ".plan" files take at most
/// `cap_bytes`, and temporary files abandoned by writers that died more than an hour ago. Returns
/// how many entries it deleted.
std::size_t prune_plan_folder(const std::string& folder, std::uint64_t cap_bytes);

}  // namespace fusedattn::detail
