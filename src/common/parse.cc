#include "strata/common/parse.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "strata/common/error.h"

namespace strata {
namespace {

[[noreturn]] void bad(std::string_view what, std::string_view text, const char* expected) {
  throw ConfigError(std::string(what) + ": '" + std::string(text) + "' is not " + expected);
}

}  // namespace

std::int64_t parse_int64(std::string_view text, std::string_view what) {
  // from_chars rejects leading '+' and spaces; we accept neither, and require the full string.
  std::int64_t value = 0;
  if (text.empty()) bad(what, text, "an integer (empty)");
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 10);
  if (ec == std::errc::result_out_of_range) bad(what, text, "an integer in range");
  if (ec != std::errc() || ptr != text.data() + text.size()) bad(what, text, "an integer");
  return value;
}

int parse_int(std::string_view text, std::string_view what, int min_value, int max_value) {
  std::int64_t value = parse_int64(text, what);
  if (value < min_value || value > max_value) {
    throw ConfigError(std::string(what) + ": '" + std::string(text) + "' is out of range [" +
                      std::to_string(min_value) + ", " + std::to_string(max_value) + "]");
  }
  return static_cast<int>(value);
}

std::uint64_t parse_uint64(std::string_view text, std::string_view what) {
  std::uint64_t value = 0;
  if (text.empty()) bad(what, text, "a non-negative integer (empty)");
  if (!std::isdigit(static_cast<unsigned char>(text.front()))) bad(what, text, "a non-negative integer");
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 10);
  if (ec == std::errc::result_out_of_range) bad(what, text, "a non-negative integer in range");
  if (ec != std::errc() || ptr != text.data() + text.size()) bad(what, text, "a non-negative integer");
  return value;
}

double parse_double(std::string_view text, std::string_view what) {
  if (text.empty()) bad(what, text, "a number (empty)");
  // strtod alone would take leading spaces, '+', hex ("0x10") and "inf"; accept only plain
  // decimal notation, the same forms parse_int64 accepts plus a fraction and an exponent.
  for (char c : text) {
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == 'e' || c == 'E'))
      bad(what, text, "a number");
  }
  std::string copy(text);
  char* end = nullptr;
  errno = 0;
  double value = std::strtod(copy.c_str(), &end);
  if (end != copy.c_str() + copy.size()) bad(what, text, "a number");
  // ERANGE on underflow still yields a finite (tiny or zero) value: only overflow is an error.
  if (!std::isfinite(value) || (errno == ERANGE && std::fabs(value) > 1.0)) bad(what, text, "a finite number");
  return value;
}

double parse_seconds(std::string_view text, std::string_view what, ZeroSeconds zero) {
  const double value = parse_double(text, what);
  if (zero == ZeroSeconds::kRejected && !(value > 0))
    throw ConfigError(std::string(what) + " must be positive, got '" + std::string(text) + "'");
  if (value < 0) throw ConfigError(std::string(what) + " must not be negative, got '" + std::string(text) + "'");
  return clamp_seconds(value);
}

double clamp_seconds(double seconds) {
  if (!(seconds > 0)) return 0;  // NaN too
  return seconds < kMaxDurationS ? seconds : kMaxDurationS;
}

bool parse_bool(std::string_view text, std::string_view what) {
  std::string lower;
  for (char c : text) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (lower == "1" || lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "0" || lower == "false" || lower == "no" || lower == "off") return false;
  bad(what, text, "a boolean (1/0, true/false, yes/no, on/off)");
}

std::uint64_t parse_bytes(std::string_view text, std::string_view what) {
  if (text.empty()) bad(what, text, "a size (empty)");
  std::uint64_t multiplier = 1;
  std::string_view digits = text;
  switch (std::toupper(static_cast<unsigned char>(text.back()))) {
    case 'K': multiplier = 1ull << 10; break;
    case 'M': multiplier = 1ull << 20; break;
    case 'G': multiplier = 1ull << 30; break;
    case 'T': multiplier = 1ull << 40; break;
    default: break;
  }
  if (multiplier != 1) digits.remove_suffix(1);
  if (digits.empty() || !std::isdigit(static_cast<unsigned char>(digits.front())))
    bad(what, text, "a size such as 4096, 64K, 16M or 1G");
  std::uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value, 10);
  if (ec != std::errc() || ptr != digits.data() + digits.size())
    bad(what, text, "a size such as 4096, 64K, 16M or 1G");
  if (value > std::numeric_limits<std::uint64_t>::max() / multiplier) bad(what, text, "a size in range");
  return value * multiplier;
}

std::vector<int> parse_int_list(std::string_view text, std::string_view what) {
  std::vector<int> out;
  for (const std::string& field : split(text, ',')) {
    out.push_back(parse_int(field, what, 0, std::numeric_limits<int>::max()));
  }
  return out;
}

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    std::size_t pos = text.find(sep, start);
    if (pos == std::string_view::npos) {
      out.emplace_back(text.substr(start));
      return out;
    }
    out.emplace_back(text.substr(start, pos - start));
    start = pos + 1;
  }
}

std::string trim(std::string_view text) {
  std::size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return std::string(text.substr(begin, end - begin));
}

void check_json_depth(std::string_view text, std::string_view origin, int max_depth) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        throw ConfigError(std::string(origin) + ": JSON nested deeper than " + std::to_string(max_depth) +
                          " levels (at byte " + std::to_string(i) + ")");
    } else if (c == ']' || c == '}') {
      // An unbalanced closer is invalid JSON: the parser reports it.
      if (depth > 0) --depth;
    }
  }
}

}  // namespace strata
