// Quoting untrusted text (CSV values, column names, vocabulary terms, JSON member names) into
// error messages, and the readers' refusal of a file. Private to the data layer.
#pragma once

#include <string>
#include <string_view>

#include "strata/common/error.h"

namespace strata::data {

// `text` cut to `max_chars`, with every control byte (below 0x20, and 0x7f) shown as '?', so a
// message built from it stays one line whatever a file holds.
inline std::string printable(std::string_view text, std::size_t max_chars = 40) {
  std::string out;
  for (char c : text.substr(0, max_chars)) out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  if (text.size() > max_chars) out += "...";
  return out;
}

// True when `text` holds a control byte (names must not: they appear in messages and layouts).
inline bool has_control(std::string_view text) {
  for (char c : text)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return true;
  return false;
}

// A reader's refusal of the file at `path`: ConfigError "<path>: <problem>".
[[noreturn]] inline void fail_file(const std::string& path, const std::string& problem) {
  throw ConfigError(path + ": " + problem);
}

}  // namespace strata::data
