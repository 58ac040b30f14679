// Private text and hashing helpers shared by the spec-layer parsers and printers (not public API).
#pragma once

#include <array>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace fusedattn::detail {

/// The whole of `text` as a decimal integer, or nothing. Strict on purpose: "12x", " 12", "+12"
/// and out-of-range numbers are rejected rather than half-read, so typos surface as errors.
inline std::optional<std::int64_t> parse_int64(std::string_view text) noexcept {
  if (text.empty()) return std::nullopt;
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc{} || stop != end) return std::nullopt;
  return value;
}

/// "[a,b,c,d]": the list form used by tensor descriptors and error values.
inline std::string format_list(const std::array<std::int64_t, 4>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(values[i]);
  }
  return out + "]";
}

/// The shortest text that reads back as the same double (%.17g always does; shorter is tried first),
/// so "0.1" prints as 0.1 and every value round-trips through the spec string.
inline std::string format_double(double value) {
  char text[32];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  return text;
}

/// Boost-style combine with the 64-bit golden ratio, so that field order matters and small
/// integers (dims, versions) spread over the whole word.
inline void hash_combine(std::size_t& seed, std::size_t value) noexcept {
  seed ^= value + 0x9e3779b97f4a7c15ULL + (seed << 12) + (seed >> 4);
}

}  // namespace fusedattn::detail
