// Slurm hostlist and tasks-per-node expansion.
//
// expand_hostlist() must print what `scontrol show hostnames` (Slurm 22.05) prints, name for name
// and in the same order, and reject what scontrol rejects (docs/ARCHITECTURE.md, "Where strata
// deliberately differs from TensorFlow's resolvers"). Slurm's parser
// (src/common/hostlist.c) has behaviours no clean grammar would invent, so this file models the
// steps Slurm takes rather than a grammar. Every rule below was checked against scontrol 22.05.8
// (tests/unit/hostlist_vs_scontrol.sh does so on every run):
//
//  1. Tokens are split on ',', ' ' and '\t', except where a separator sits inside a bracket pair.
//     Empty tokens vanish: "a,,b" and "" are valid ("" expands to nothing).
//  2. Only the LAST bracket group of a token is the "suffix group"; nothing may follow its ']'
//     ("n[1-2]-ib" is rejected). With no ']' after the last '[', Slurm appends one and keeps the
//     text before the '[' as a plain name ("n[1-2" -> "n]").
//  3. The other groups ("prefix groups") expand right to left: for a[..]b[..]c[..]d[..] the loop
//     order is c (outermost), b, a, then d (innermost). With two groups this is the familiar
//     leftmost-slowest order.
//  4. A range's zero padding is the length of its start text: n[8-010] -> n8 n9 n10, n[001-3] ->
//     n001 n002 n003. Numbers are read with strtoul semantics: leading blanks and '+' count towards
//     that length (n[ 1-2] -> n01 n02), values saturate at 2^64-1, and junk after the start is
//     ignored when an end follows (n[1a-2] -> n01 n02). An 'x' anywhere is rejected (box syntax).
//  5. A range holds at most 65536 names; a prefix group at most 65536 values per expansion.
//  6. Errors count only in the suffix group and the prefix group next to it. Slurm drops a failure
//     in any group further left: the names under it vanish and the hostlist still succeeds.
//  7. Names go through Slurm's range list, which merges a name into the previous range when the
//     numbers are adjacent and the prefixes compare equal under strnatcmp (which ignores blanks),
//     then come back out through hostlist_shift(), whose bookkeeping stops early, truncates or
//     crashes once a range reaches 2^64-1.
//
// Where scontrol never answers (an endless loop on a prefix range ending at 2^64-1, a segfault in
// the shift loop) we throw ConfigError. One deliberate difference: we refuse lists of more than
// kMaxHosts names or kMaxChars characters, which scontrol would print (for minutes, or until it
// runs out of memory) and no real cluster has.

#include "strata/cluster/hostlist.h"

#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "strata/common/error.h"

namespace strata::cluster {
namespace {

constexpr std::uint64_t kULongMax = UINT64_MAX;  // Slurm's (unsigned long)-1 on LP64
constexpr std::uint64_t kMaxRange = 64 * 1024;        // MAX_RANGE: names in one range
constexpr std::uint64_t kMaxPrefixCount = 64 * 1024;  // MAX_PREFIX_CNT: values per prefix group
constexpr std::size_t kMaxRangesPerGroup = 64 * 1024;  // MAX_RANGES: fatal() in Slurm
// strata's own guards (see the top of the file).
constexpr std::uint64_t kMaxHosts = std::uint64_t{1} << 22;
constexpr std::uint64_t kMaxChars = std::uint64_t{1} << 28;

// The expression as it can appear inside a one-line message: control characters escaped, long
// expressions shortened.
std::string quote_for_message(std::string_view text) {
  constexpr std::size_t kMaxShown = 200;
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < kMaxShown; ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > kMaxShown) out += "...";
  return out;
}

// The C locale's isspace/isdigit, which is what Slurm's strtoul and strnatcmp see.
bool is_c_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// strtoul(text, &end, 10) on LP64: returns the value and how many characters were consumed
// (0 when nothing converted, as strtoul then points `end` back at the start).
std::pair<std::uint64_t, std::size_t> c_strtoul(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size() && is_c_space(text[i])) ++i;
  bool negative = false;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) {
    negative = text[i] == '-';
    ++i;
  }
  std::size_t first_digit = i;
  std::uint64_t value = 0;
  bool overflow = false;
  for (; i < text.size() && is_digit(text[i]); ++i) {
    auto digit = static_cast<std::uint64_t>(text[i] - '0');
    if (value > (kULongMax - digit) / 10) overflow = true;
    value = value * 10 + digit;
  }
  if (i == first_digit) return {0, 0};
  if (overflow) return {kULongMax, i};   // ERANGE saturates, whatever the sign
  if (negative) value = 0 - value;       // strtoul negates in unsigned arithmetic
  return {value, i};
}

// printf("%0*lu", width, value).
std::string zero_padded(std::uint64_t value, int width) {
  std::string digits = std::to_string(value);
  if (static_cast<int>(digits.size()) < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

// True when Slurm's strnatcmp(a, b) returns 0: blanks are skipped at every step, and digit runs
// must match exactly. Only equality matters here, for merging ranges.
bool natural_equal(std::string_view a, std::string_view b) {
  std::size_t i = 0;
  std::size_t j = 0;
  auto at = [](std::string_view s, std::size_t k) { return k < s.size() ? s[k] : '\0'; };
  while (true) {
    while (is_c_space(at(a, i))) ++i;
    while (is_c_space(at(b, j))) ++j;
    if (is_digit(at(a, i)) && is_digit(at(b, j))) {
      for (std::size_t k = 0;; ++k) {
        char ca = at(a, i + k);
        char cb = at(b, j + k);
        if (!is_digit(ca) && !is_digit(cb)) break;
        if (ca != cb) return false;
      }
    }
    char ca = at(a, i);
    char cb = at(b, j);
    if (ca == '\0' && cb == '\0') return true;
    if (ca != cb) return false;
    ++i;
    ++j;
  }
}

// Zeros printf would add to print `value` in `width` characters.
int padding_zeros(std::uint64_t value, int width) {
  int digits = static_cast<int>(std::to_string(value).size());
  return width > digits ? width - digits : 0;
}

// Slurm's _width_equiv(): can n (printed with width wn) and m (width wm) share one width without
// changing how either prints? If so, one of the widths is adjusted to the other.
bool widths_compatible(std::uint64_t n, int& wn, std::uint64_t m, int& wm) {
  if (wn == wm) return true;
  bool n_changes = padding_zeros(n, wn) != padding_zeros(n, wm);
  bool m_changes = padding_zeros(m, wm) != padding_zeros(m, wn);
  if (n_changes && m_changes) return false;
  if (n_changes) {
    wm = wn;
  } else {
    wn = wm;
  }
  return true;
}

// One numeric range of a bracket group, e.g. "08-10": lo 8, hi 10, width 2.
struct NumRange {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  int width = 0;
  std::uint64_t count() const { return hi - lo + 1; }  // wraps to 0 for 0-(2^64-1), as in Slurm
};

// One entry of Slurm's range list: names prefix+lo .. prefix+hi, or a name without a number.
struct HostRange {
  std::string prefix;
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  int width = 0;
  bool single = false;
  std::uint64_t count() const { return single ? 1 : hi - lo + 1; }
};

// A prefix group of a token: its range text and the literal text between it and the next group.
struct PrefixGroup {
  std::string_view ranges;
  std::string_view tail;
};

class HostlistExpander {
 public:
  explicit HostlistExpander(std::string_view expr) : expr_(expr) {}

  std::vector<std::string> run() {
    // Slurm reads a C string: anything after an embedded NUL is not seen.
    std::string_view text = expr_.substr(0, expr_.find('\0'));
    std::size_t pos = 0;
    while (auto token = next_token(text, pos)) expand_token(*token);
    return shift_all();
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw ConfigError("invalid hostlist '" + quote_for_message(expr_) + "': " + why);
  }

  static bool is_separator(char c) { return c == ',' || c == ' ' || c == '\t'; }

  // Slurm's _next_tok(): a token ends at a separator unless an earlier '[' has its first ']'
  // further on, in which case the token runs on past that ']'.
  static std::optional<std::string_view> next_token(std::string_view text, std::size_t& pos) {
    while (pos < text.size() && is_separator(text[pos])) ++pos;
    if (pos == text.size()) return std::nullopt;
    std::size_t start = pos;
    std::size_t parse = pos;  // where the bracket search resumes
    while (true) {
      while (pos < text.size() && !is_separator(text[pos])) ++pos;
      bool extended = false;
      while (true) {
        std::size_t open = text.find('[', parse);
        if (open == std::string_view::npos || open > pos) break;
        std::size_t close = text.find(']', parse);
        if (close == std::string_view::npos || close < open) break;
        if (close < pos) {
          parse = close + 1;  // this pair is closed inside the token; look at the next one
          continue;
        }
        pos = close;  // the separator is inside brackets: keep scanning from the ']'
        extended = true;
        break;
      }
      if (!extended) break;
    }
    std::string_view token = text.substr(start, pos - start);
    while (pos < text.size() && is_separator(text[pos])) ++pos;
    return token;
  }

  // Slurm's _parse_single_range(). Returns the reason when the range is invalid.
  static std::optional<std::string> parse_range(std::string_view text, NumRange& out) {
    std::string quoted = "'" + quote_for_message(text) + "'";
    if (text.find('x') != std::string_view::npos)
      return "range " + quoted + " contains 'x' (multi-dimensional boxes are not supported)";
    std::size_t dash = text.find('-');
    std::string_view lo_text = text.substr(0, dash);
    std::optional<std::string_view> hi_text;
    if (dash != std::string_view::npos) {
      hi_text = text.substr(dash + 1);
      if (!hi_text->empty() && hi_text->front() == '-')
        return "range " + quoted + " has a negative number";
    }
    out.width = static_cast<int>(lo_text.size());
    auto [lo, lo_used] = c_strtoul(lo_text);
    if (text.empty()) return "empty element in a bracket list";
    if (lo_text.empty()) {
      return "range " + quoted + " has no start (negative numbers are not allowed)";
    }
    if (lo_used == 0) return "range " + quoted + " does not start with a number";
    out.lo = lo;
    if (hi_text && !hi_text->empty()) {
      // Junk after the start is not checked once an end is given (Slurm reuses its end pointer).
      auto [hi, hi_used] = c_strtoul(*hi_text);
      if (hi_used != hi_text->size()) return "range " + quoted + " does not end with a number";
      out.hi = hi;
    } else {
      if (lo_used != lo_text.size()) return "range " + quoted + " is not a number";
      out.hi = lo;  // "5" and "5-" are both the single value 5
    }
    if (out.lo > out.hi) {
      return "range start " + std::to_string(out.lo) + " is greater than end " +
             std::to_string(out.hi);
    }
    if (out.count() > kMaxRange) {
      return "range " + quoted + " has " + std::to_string(out.count()) +
             " names, more than Slurm's limit of " + std::to_string(kMaxRange);
    }
    return std::nullopt;
  }

  // Slurm's _parse_range_list(): the comma-separated ranges between one pair of brackets.
  std::optional<std::string> parse_group(std::string_view text, std::vector<NumRange>& out) const {
    out.clear();
    std::size_t start = 0;
    while (true) {
      if (out.size() == kMaxRangesPerGroup) {
        return "more than " + std::to_string(kMaxRangesPerGroup) +
               " ranges in one bracket group (Slurm aborts)";
      }
      std::size_t comma = text.find(',', start);
      NumRange range;
      if (auto why = parse_range(text.substr(start, comma - start), range)) return why;
      out.push_back(range);
      if (comma == std::string_view::npos) return std::nullopt;
      start = comma + 1;
    }
  }

  // Slurm's hostlist_push_host(): a name ending in digits becomes a one-name range, so that it can
  // merge with its neighbours; any other name is kept as it is.
  void push_name(std::string_view name) {
    std::size_t digits = 0;
    while (digits < name.size() && is_digit(name[name.size() - 1 - digits])) ++digits;
    if (digits == 0) {
      push_range(HostRange{std::string(name), 0, 0, 0, true});
      return;
    }
    std::uint64_t number = c_strtoul(name.substr(name.size() - digits)).first;
    push_range(HostRange{std::string(name.substr(0, name.size() - digits)), number, number,
                         static_cast<int>(digits), false});
  }

  // Slurm's hostlist_push_range(): merge into the last range when the numbers continue it.
  void push_range(HostRange range) {
    std::uint64_t count = range.count();
    guard(count, range.prefix.size() + static_cast<std::size_t>(range.width));
    bool merged = false;
    if (!ranges_.empty()) {
      HostRange& tail = ranges_.back();
      if (tail.hi == range.lo - 1 && tail.single == range.single &&
          natural_equal(tail.prefix, range.prefix) &&
          widths_compatible(tail.lo, tail.width, range.lo, range.width)) {
        tail.hi = range.hi;
        merged = true;
      }
    }
    if (!merged) ranges_.push_back(std::move(range));
    // Slurm keeps the total in an int; the shift loop below depends on it.
    nhosts_ = static_cast<std::int32_t>(static_cast<std::uint32_t>(nhosts_) +
                                        static_cast<std::uint32_t>(count));
  }

  void guard(std::uint64_t count, std::size_t name_length) {
    std::uint64_t names = count == 0 ? 1 : count;
    pushed_hosts_ += names;
    pushed_chars_ += names * (name_length + 1);
    if (pushed_hosts_ > kMaxHosts || pushed_chars_ > kMaxChars) {
      fail("expands to more than " + std::to_string(kMaxHosts) + " names or " +
           std::to_string(kMaxChars >> 20) + " MiB (strata's limit)");
    }
  }

  // One token of the expression (Slurm's _hostlist_create_bracketed() loop body).
  void expand_token(std::string_view token) {
    std::size_t open = token.rfind('[');
    if (open == std::string_view::npos) {
      push_name(token);
      return;
    }
    std::string_view prefix = token.substr(0, open);
    std::string_view rest = token.substr(open + 1);
    std::size_t close = rest.find(']');
    if (close == std::string_view::npos) {
      // No closing bracket: Slurm tacks one on after the text before the '[' (or, when that text
      // is empty, keeps what follows the '[').
      if (!prefix.empty()) {
        push_name(std::string(prefix) + "]");
      } else {
        push_name(rest);
      }
      return;
    }
    if (close + 1 < rest.size() && rest[close + 1] != ',') {
      fail("'" + quote_for_message(rest.substr(close + 1)) +
           "' follows the last ']' (only a bracket group may end a name)");
    }
    std::vector<NumRange> suffix;
    if (auto why = parse_group(rest.substr(0, close), suffix)) fail(*why);
    expand_prefix_groups(prefix, suffix);
  }

  // Slurm's _push_range_list(), which recurses once per prefix group; done here as an odometer so
  // that tens of thousands of groups (which scontrol accepts) cost no stack.
  void expand_prefix_groups(std::string_view prefix, const std::vector<NumRange>& suffix) {
    // Peel groups off the right end: the last '[' and the last ']' after it. Digits substituted
    // for a group contain no brackets, so peeling the text once matches Slurm peeling the
    // partially expanded name at every level.
    std::vector<PrefixGroup> groups;  // groups[0] is the rightmost, the outermost loop
    std::string_view base = prefix;
    while (true) {
      std::size_t open = base.rfind('[');
      if (open == std::string_view::npos) break;
      std::size_t close = base.rfind(']');
      if (close == std::string_view::npos || close < open) break;
      groups.push_back({base.substr(open + 1, close - open - 1), base.substr(close + 1)});
      base = base.substr(0, open);
    }
    if (groups.empty()) {
      for (const NumRange& r : suffix) {
        push_range(HostRange{std::string(prefix), r.lo, r.hi, r.width, false});
      }
      return;
    }

    // The values each group runs through. Slurm parses a group afresh at every visit, with the
    // same result, so parsing once is equivalent.
    std::vector<std::vector<NumRange>> values(groups.size());
    std::size_t dead_level = groups.size();  // first group that yields nothing
    for (std::size_t level = 0; level < groups.size(); ++level) {
      std::vector<NumRange>& ranges = values[level];
      if (auto why = parse_group(groups[level].ranges, ranges)) {
        if (level == 0) fail(*why);
        ranges.clear();  // Slurm ignores the failure of a nested group
      }
      // The value budget is counted per visit; a nested group that exceeds it runs through the
      // ranges that fit and then gives up, silently.
      std::uint64_t budget = 0;
      for (std::size_t i = 0; i < ranges.size(); ++i) {
        budget += ranges[i].count();
        if (budget > kMaxPrefixCount) {
          if (level == 0) {
            fail("bracket group '[" + quote_for_message(groups[0].ranges) + "]' has more than " +
                 std::to_string(kMaxPrefixCount) + " values (Slurm's limit)");
          }
          ranges.resize(i);
          break;
        }
      }
      if (ranges.empty() && dead_level == groups.size()) dead_level = level;
    }

    // Slurm loops `for (j = lo; j <= hi; j++)`, which never ends when hi is 2^64-1. Every group
    // before the first empty one is visited in full, so such a range anywhere there hangs scontrol.
    for (std::size_t level = 0; level < dead_level; ++level) {
      for (const NumRange& r : values[level]) {
        if (r.hi == kULongMax) {
          fail("bracket group '[" + quote_for_message(groups[level].ranges) +
               "]' reaches 18446744073709551615 (scontrol never terminates)");
        }
      }
    }
    if (dead_level < groups.size()) return;  // no name ever reaches the suffix group

    // Odometer over the groups, groups[0] slowest; one state per group: range index and value.
    std::vector<std::pair<std::size_t, std::uint64_t>> state(groups.size());
    for (std::size_t level = 0; level < groups.size(); ++level) {
      state[level] = {0, values[level][0].lo};
    }
    while (true) {
      // The name runs left to right: base, the leftmost group (the last level), ..., groups[0].
      std::string name(base);
      for (std::size_t level = groups.size(); level-- > 0;) {
        const NumRange& r = values[level][state[level].first];
        name += zero_padded(state[level].second, r.width);
        name += groups[level].tail;
      }
      for (const NumRange& r : suffix) push_range(HostRange{name, r.lo, r.hi, r.width, false});

      std::size_t level = groups.size();
      while (level-- > 0) {
        auto& [index, value] = state[level];
        if (value < values[level][index].hi) {
          ++value;
          break;
        }
        if (++index < values[level].size()) {
          value = values[level][index].lo;
          break;
        }
        index = 0;
        value = values[level][0].lo;
        if (level == 0) return;
      }
    }
  }

  // Slurm's hostlist_shift() loop in scontrol, bookkeeping included: it stops at the first range
  // that counts no names (0-(2^64-1) wraps to a count of 0), drops a range once its upper end is
  // 2^64-1, and dereferences a missing range when the int total outlives the list.
  std::vector<std::string> shift_all() {
    std::vector<std::string> names;
    std::size_t front = 0;
    while (nhosts_ > 0) {
      if (front == ranges_.size()) fail("the name count outlives the ranges (scontrol crashes)");
      HostRange& r = ranges_[front];
      bool produced = true;
      if (r.single) {
        names.push_back(r.prefix);
        ++r.lo;
      } else if (r.count() > 0) {
        std::string name = r.prefix + zero_padded(r.lo, r.width);
        // Slurm prints into a buffer of strlen(prefix) + width + 16 bytes; only a width shrunk by
        // a merge across 2^64-1 ever fills it.
        std::size_t limit = r.prefix.size() + static_cast<std::size_t>(r.width) + 15;
        if (name.size() > limit) name.resize(limit);
        names.push_back(std::move(name));
        ++r.lo;
      } else {
        produced = false;
      }
      --nhosts_;
      if (r.hi < r.lo || r.hi == kULongMax) ++front;
      if (!produced) break;
    }
    return names;
  }

  std::string_view expr_;
  std::vector<HostRange> ranges_;
  std::int32_t nhosts_ = 0;
  std::uint64_t pushed_hosts_ = 0;
  std::uint64_t pushed_chars_ = 0;
};

[[noreturn]] void bad_tasks(std::string_view expr, const std::string& why) {
  throw ConfigError("invalid tasks-per-node '" + quote_for_message(expr) + "': " + why);
}

// A run of ASCII digits as a non-negative int; no sign, no blanks.
int parse_count(std::string_view expr, std::string_view digits, const char* what) {
  if (digits.empty()) bad_tasks(expr, std::string("missing ") + what);
  std::int64_t value = 0;
  for (char c : digits) {
    if (!is_digit(c)) {
      bad_tasks(expr, std::string(what) + " '" + quote_for_message(digits) + "' is not a number");
    }
    value = value * 10 + (c - '0');
    if (value > INT_MAX) {
      bad_tasks(expr, std::string(what) + " '" + std::string(digits) + "' is too large");
    }
  }
  return static_cast<int>(value);
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view expr) {
  return HostlistExpander(expr).run();
}

// Slurm writes SLURM_TASKS_PER_NODE as comma-separated fields "N" or "N(xR)" (N tasks on each of
// R consecutive nodes). Unlike hostlists there is no quirk to reproduce, so this is strict: a
// field is exactly digits, optionally followed by "(x" digits ")", and R is at least 1.
std::vector<int> expand_tasks_per_node(std::string_view expr) {
  if (expr.empty()) bad_tasks(expr, "empty");
  std::vector<int> tasks;
  std::size_t start = 0;
  while (true) {
    std::size_t comma = expr.find(',', start);
    std::string_view field = expr.substr(start, comma - start);
    if (field.empty()) bad_tasks(expr, "empty field");
    std::size_t paren = field.find('(');
    int count = parse_count(expr, field.substr(0, paren), "task count");
    int repeat = 1;
    if (paren != std::string_view::npos) {
      std::string_view group = field.substr(paren);
      if (group.size() < 4 || group.substr(0, 2) != "(x" || group.back() != ')') {
        bad_tasks(expr, "'" + quote_for_message(field) + "' is not N or N(xR)");
      }
      repeat = parse_count(expr, group.substr(2, group.size() - 3), "repetition count");
      if (repeat == 0) bad_tasks(expr, "'" + quote_for_message(field) + "' repeats 0 times");
    }
    if (tasks.size() + static_cast<std::uint64_t>(repeat) > kMaxHosts) {
      bad_tasks(expr, "more than " + std::to_string(kMaxHosts) + " nodes");
    }
    tasks.insert(tasks.end(), static_cast<std::size_t>(repeat), count);
    if (comma == std::string_view::npos) return tasks;
    start = comma + 1;
  }
}

}  // namespace strata::cluster
