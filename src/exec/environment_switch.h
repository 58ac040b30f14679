// Internal: the FUSEDATTN_* switches read from the environment. Each caller reads its switch once
// (a plan built one way must not meet one built the other way in a cache).
#pragma once

#include <cstdlib>
#include <cstring>

namespace fusedattn::detail {

/// A switch that is on by default: off only where the variable is "0".
inline bool switch_on_unless_zero(const char* name) noexcept {
  const char* value = std::getenv(name);
  return value == nullptr || std::strcmp(value, "0") != 0;
}

/// A switch that is off by default: on where the variable is set to anything but "" or "0".
inline bool switch_on_when_set(const char* name) noexcept {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
}

/// A count given in the variable: its value where it is a whole decimal number, else 0.
inline long long count_in_environment(const char* name) noexcept {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  const long long count = std::strtoll(value, &end, 10);
  return *end == '\0' && count > 0 ? count : 0;
}

}  // namespace fusedattn::detail
