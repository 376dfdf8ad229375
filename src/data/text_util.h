// Quoting untrusted text (CSV values, column names, vocabulary terms, JSON member names) into
// error messages. Private to the data layer.
#pragma once

#include <string>
#include <string_view>

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

}  // namespace strata::data
