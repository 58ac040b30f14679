// What the spec's field table (spec.cpp) offers beyond equality, hashing, printing and parsing.
#pragma once

#include <string>

#include "fusedattn/spec.h"
#include "fusedattn/support.h"

namespace fusedattn::detail {

/// Resets every field that `pass`'s graph does not read to its default, as the field table says,
/// so that specs differing only there share one plan of that pass.
void reset_unread_fields(AttentionSpec& spec, Pass pass);

/// Sets the option `key` (a spec-string key that is not a tensor) from `text`, with the parser's
/// messages; InvalidArgument for an unknown key.
void parse_option(AttentionOptions& options, const std::string& key, const std::string& text);
/// Every option equal.
bool same_options(const AttentionOptions& a, const AttentionOptions& b) noexcept;
/// The options that differ from the defaults, as the spec string writes them ("window=-1,0 ...").
std::string options_text(const AttentionOptions& options);

}  // namespace fusedattn::detail
