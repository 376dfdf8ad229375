// STRATA_MPIIO_HINTS: the parser. The bounds are the MPI library's own (mpi.h), so a value that
// passes here is one MPI_Info_set accepts, and a bad one is refused with the variable's name
// before any file is created instead of as an MPI error inside a collective open.
#include "strata/checkpoint/mpiio_hints.h"

#include <mpi.h>

#include <cstdio>
#include <set>

#include "strata/common/env.h"
#include "strata/common/error.h"

namespace strata::checkpoint {
namespace {

// MPI_MAX_INFO_KEY and MPI_MAX_INFO_VAL count the terminating NUL: Open MPI's MPI_Info_set refuses
// a key of MPI_MAX_INFO_KEY characters and a value of MPI_MAX_INFO_VAL.
constexpr std::size_t kMaxKeyChars = MPI_MAX_INFO_KEY - 1;
constexpr std::size_t kMaxValueChars = MPI_MAX_INFO_VAL - 1;
// A quoted pair longer than this is shortened in messages (the value may be hostile and huge).
constexpr std::size_t kQuoteChars = 80;

bool is_blank(char c) { return c == ' ' || c == '\t'; }

std::string_view strip_blanks(std::string_view s) {
  while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
  return s;
}

// The pair as it can be printed on one line: bytes outside printable ASCII as \xNN, and at most
// kQuoteChars of it, with the full length when shortened.
std::string quote(std::string_view pair) {
  std::string out = "'";
  for (std::size_t i = 0; i < pair.size() && i < kQuoteChars; ++i) {
    const auto c = static_cast<unsigned char>(pair[i]);
    if (c < 0x20 || c > 0x7e || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (pair.size() > kQuoteChars) out += "...' (" + std::to_string(pair.size()) + " bytes)";
  else out += "'";
  return out;
}

bool printable_no_blank(std::string_view s) {
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace

std::vector<MpiIoHint> parse_mpiio_hints(std::string_view text, std::string_view what) {
  std::vector<MpiIoHint> hints;
  if (strip_blanks(text).empty()) return hints;
  const std::string name(what);
  std::set<std::string, std::less<>> seen;
  std::size_t begin = 0;
  for (std::size_t index = 1;; ++index) {
    const std::size_t comma = text.find(',', begin);
    const std::string_view raw = text.substr(begin, comma == std::string_view::npos ? text.npos : comma - begin);
    const std::string at = name + ": pair " + std::to_string(index) + " ";
    if (index > kMaxMpiIoHints)
      throw ConfigError(name + ": more than " + std::to_string(kMaxMpiIoHints) + " key=value pairs");
    const std::string_view pair = strip_blanks(raw);
    if (pair.empty())
      throw ConfigError(at + "is empty (expected key=value[,key=value...], no empty pair or trailing ',')");
    const std::size_t eq = pair.find('=');
    if (eq == std::string_view::npos)
      throw ConfigError(at + quote(pair) + " has no '=' (expected key=value[,key=value...])");
    if (pair.find('=', eq + 1) != std::string_view::npos)
      throw ConfigError(at + quote(pair) + " has more than one '=' (expected key=value[,key=value...])");
    const std::string_view key = strip_blanks(pair.substr(0, eq));
    const std::string_view value = strip_blanks(pair.substr(eq + 1));
    if (key.empty()) throw ConfigError(at + quote(pair) + " has an empty key");
    if (value.empty()) throw ConfigError(at + quote(pair) + " has an empty value");
    if (key.size() > kMaxKeyChars)
      throw ConfigError(at + quote(pair) + ": the key is " + std::to_string(key.size()) +
                        " characters, longer than the " + std::to_string(kMaxKeyChars) +
                        " MPI allows (MPI_MAX_INFO_KEY)");
    if (value.size() > kMaxValueChars)
      throw ConfigError(at + quote(pair) + ": the value is " + std::to_string(value.size()) +
                        " characters, longer than the " + std::to_string(kMaxValueChars) +
                        " MPI allows (MPI_MAX_INFO_VAL)");
    if (!printable_no_blank(key) || !printable_no_blank(value))
      throw ConfigError(at + quote(pair) + ": a key or value may hold printable ASCII only, without blanks");
    if (!seen.emplace(key).second) throw ConfigError(at + quote(pair) + " repeats the key '" + std::string(key) + "'");
    hints.push_back({std::string(key), std::string(value)});
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  return hints;
}

std::vector<MpiIoHint> mpiio_hints_from_env(const Env& env) {
  const auto text = env.get(kMpiIoHintsVar);
  return text ? parse_mpiio_hints(*text, kMpiIoHintsVar) : std::vector<MpiIoHint>{};
}

std::string format_mpiio_hints(const std::vector<MpiIoHint>& hints) {
  std::string out;
  for (const auto& h : hints) out += (out.empty() ? "" : ",") + h.key + "=" + h.value;
  return out;
}

}  // namespace strata::checkpoint
