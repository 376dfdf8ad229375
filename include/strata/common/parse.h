// Strict parsing of numbers and flags. Unlike atoi/strtol used bare, every function here rejects
// empty strings, trailing garbage, overflow and (for unsigned quantities) signs, and raises
// ConfigError whose message names `what` (a flag or variable name) and quotes the bad text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

std::int64_t parse_int64(std::string_view text, std::string_view what);
// An int in [min_value, max_value].
int parse_int(std::string_view text, std::string_view what, int min_value, int max_value);
// A non-negative integer ("0", "12"); no sign, no spaces.
std::uint64_t parse_uint64(std::string_view text, std::string_view what);
double parse_double(std::string_view text, std::string_view what);

// Durations. Every duration strata takes from a flag or a variable (timeouts, intervals, delays)
// goes through parse_seconds before it reaches a clock: steady_clock counts int64 nanoseconds, so
// `now() + seconds` overflows past about 9.2e9 s and a deadline then lies in the past (a job that
// asked for a long timeout would end at once). Longer values are clamped to kMaxDurationS, about
// 11.6 days: longer than a batch system lets one job run on most systems, so a huge value still
// means "never" in practice, and deadline arithmetic (now + t + t/2 and the like) stays far from
// overflow. Negative and non-finite values are usage errors.
inline constexpr double kMaxDurationS = 1e6;
// --keep-every-n-hours is a retention age compared with checkpoint file times, never added to a
// clock; it is capped at a million hours (114 years: "never"), where hours * 3600 still fits any
// integer seconds count.
inline constexpr double kMaxKeepHours = 1e6;
enum class ZeroSeconds { kAllowed, kRejected };
// A duration in seconds: a finite number, >= 0 (> 0 with ZeroSeconds::kRejected), clamped to
// kMaxDurationS. ConfigError naming `what` otherwise: "<what> must be positive, got '<text>'" or
// "<what> must not be negative, got '<text>'".
double parse_seconds(std::string_view text, std::string_view what, ZeroSeconds zero = ZeroSeconds::kAllowed);
// The same bound for a duration computed in code or given through the C++ API: NaN and negatives
// become 0, values above kMaxDurationS become kMaxDurationS.
double clamp_seconds(double seconds);
// 1/0, true/false, yes/no, on/off (case-insensitive).
bool parse_bool(std::string_view text, std::string_view what);
// Byte sizes with optional binary suffix: "4096", "4K", "16M", "1G" (K = 1024).
std::uint64_t parse_bytes(std::string_view text, std::string_view what);
// Comma-separated list of non-negative ints ("0,3,5"), used by STRATA_LOG_RANKS.
std::vector<int> parse_int_list(std::string_view text, std::string_view what);

// Splits on a single character, keeping empty fields.
std::vector<std::string> split(std::string_view text, char sep);
std::string trim(std::string_view text);

// JSON configuration (--cluster, STRATA_CLUSTER, TF_CONFIG) may nest at most this deep; a cluster
// description needs 3 levels. The bound keeps code that walks a document recursively (nlohmann's
// dump() in an error message, a destructor) far from the stack's limit.
inline constexpr int kMaxJsonDepth = 64;
// Throws ConfigError "<origin>: JSON nested deeper than <max_depth> levels (at byte N)" when the
// arrays and objects of `text` nest deeper than max_depth. One linear pass that tracks strings
// (escapes included) and counts brackets outside them; no recursion, no allocation. Text that is
// not valid JSON is left to the parser, whose own error then names the problem.
void check_json_depth(std::string_view text, std::string_view origin, int max_depth = kMaxJsonDepth);

}  // namespace strata
