// Unit tests of the strict parsers (strata/common/parse.h) and the typed Env accessors
// (strata/common/env.h). The contract under test: every parser rejects empty text, surrounding
// spaces, signs where they make no sense, other bases, trailing garbage and overflow, and every
// rejection is a ConfigError whose message names `what` (the flag or variable) and quotes the bad
// text, so a user can find the input to fix from the message alone.
#include "common/test_util.h"
#include "strata/common/parse.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "strata/common/env.h"
#include "strata/common/error.h"

namespace strata {
namespace {

using strata::testing::config_error;
using strata::testing::Contains;

// The message must name the flag and quote the offending text.
void expect_names_and_quotes(const std::string& message, const std::string& what, const std::string& text) {
  EXPECT_TRUE(Contains(message, what));
  EXPECT_TRUE(Contains(message, "'" + text + "'"));
}

// ---- parse_int64 ----------------------------------------------------------------------------------

TEST(ParseInt64, AcceptsDecimalIntegers) {
  EXPECT_EQ(parse_int64("0", "--n"), 0);
  EXPECT_EQ(parse_int64("42", "--n"), 42);
  EXPECT_EQ(parse_int64("-17", "--n"), -17);
  EXPECT_EQ(parse_int64("-0", "--n"), 0);
  EXPECT_EQ(parse_int64("9223372036854775807", "--n"), std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(parse_int64("-9223372036854775808", "--n"), std::numeric_limits<std::int64_t>::min());
}

class ParseInt64Rejects : public ::testing::TestWithParam<const char*> {};

TEST_P(ParseInt64Rejects, WithMessageNamingFlagAndText) {
  const std::string text = GetParam();
  std::string message = config_error([&] { parse_int64(text, "--steps"); });
  expect_names_and_quotes(message, "--steps", text);
}

INSTANTIATE_TEST_SUITE_P(BadText, ParseInt64Rejects,
                         ::testing::Values("", " 1", "1 ", "+1", "0x10", "1e3", "1.0", "abc", "-", "12abc",
                                           "9223372036854775808", "-9223372036854775809",
                                           "99999999999999999999999"));

// ---- parse_int ------------------------------------------------------------------------------------

TEST(ParseInt, AcceptsValuesInsideInclusiveBounds) {
  EXPECT_EQ(parse_int("0", "--k", 0, 3), 0);
  EXPECT_EQ(parse_int("3", "--k", 0, 3), 3);
  EXPECT_EQ(parse_int("-5", "--k", -5, 5), -5);
  EXPECT_EQ(parse_int("2147483647", "--k", 0, std::numeric_limits<int>::max()),
            std::numeric_limits<int>::max());
}

TEST(ParseInt, RejectsBadTextWithMessage) {
  for (const char* text : {"", " 1", "1 ", "+1", "0x10", "1e3"}) {
    SCOPED_TRACE(text);
    expect_names_and_quotes(config_error([&] { parse_int(text, "--port-base", 0, 65535); }), "--port-base", text);
  }
}

// The header promises that every rejection quotes the bad text; out-of-range values included.
TEST(ParseInt, OutOfRangeMessageNamesFlagQuotesTextAndGivesBounds) {
  std::string message = config_error([] { parse_int("5", "--task-id", 0, 3); });
  expect_names_and_quotes(message, "--task-id", "5");
  EXPECT_TRUE(Contains(message, "3"));

  message = config_error([] { parse_int("-1", "--gpus", 0, 8); });
  expect_names_and_quotes(message, "--gpus", "-1");
}

TEST(ParseInt, RejectsValuesBeyondIntEvenWithWideBounds) {
  std::string message =
      config_error([] { parse_int("2147483648", "N", 0, std::numeric_limits<int>::max()); });
  EXPECT_TRUE(Contains(message, "N"));
  EXPECT_TRUE(Contains(message, "2147483648"));
}

// ---- parse_uint64 ---------------------------------------------------------------------------------

TEST(ParseUint64, AcceptsNonNegativeIntegers) {
  EXPECT_EQ(parse_uint64("0", "--b"), 0u);
  EXPECT_EQ(parse_uint64("12", "--b"), 12u);
  EXPECT_EQ(parse_uint64("18446744073709551615", "--b"), std::numeric_limits<std::uint64_t>::max());
}

TEST(ParseUint64, RejectsSignsSpacesOtherBasesAndOverflow) {
  for (const char* text : {"", "-1", "-0", "+1", " 1", "1 ", "0x10", "1e3", "1.5", "18446744073709551616"}) {
    SCOPED_TRACE(text);
    expect_names_and_quotes(config_error([&] { parse_uint64(text, "--bytes"); }), "--bytes", text);
  }
}

// ---- parse_double ---------------------------------------------------------------------------------

TEST(ParseDouble, AcceptsDecimalAndExponentForms) {
  EXPECT_DOUBLE_EQ(parse_double("1.5", "--lr"), 1.5);
  EXPECT_DOUBLE_EQ(parse_double("-2.25", "--lr"), -2.25);
  EXPECT_DOUBLE_EQ(parse_double("1e3", "--lr"), 1000.0);
  EXPECT_DOUBLE_EQ(parse_double("0", "--lr"), 0.0);
  EXPECT_DOUBLE_EQ(parse_double(".5", "--lr"), 0.5);
}

TEST(ParseDouble, RejectsGarbageSpacesAndNonFiniteValues) {
  for (const char* text : {"", " 1", "1 ", "abc", "1.5x", "1,5", "nan", "inf", "-inf", "1e999"}) {
    SCOPED_TRACE(text);
    expect_names_and_quotes(config_error([&] { parse_double(text, "--lr"); }), "--lr", text);
  }
}

// ---- parse_bool -----------------------------------------------------------------------------------

TEST(ParseBool, AcceptsTheDocumentedSpellingsInAnyCase) {
  for (const char* text : {"1", "true", "TRUE", "True", "yes", "Yes", "on", "ON"}) {
    SCOPED_TRACE(text);
    EXPECT_TRUE(parse_bool(text, "--flag"));
  }
  for (const char* text : {"0", "false", "FALSE", "no", "No", "off", "Off"}) {
    SCOPED_TRACE(text);
    EXPECT_FALSE(parse_bool(text, "--flag"));
  }
}

TEST(ParseBool, RejectsEverythingElse) {
  for (const char* text : {"", "2", "t", "y", " true", "true ", "truee", "-1", "enable"}) {
    SCOPED_TRACE(text);
    expect_names_and_quotes(config_error([&] { parse_bool(text, "STRATA_FLAG"); }), "STRATA_FLAG", text);
  }
}

// ---- parse_bytes ----------------------------------------------------------------------------------

TEST(ParseBytes, AcceptsPlainNumbersAndBinarySuffixes) {
  EXPECT_EQ(parse_bytes("0", "-b"), 0u);
  EXPECT_EQ(parse_bytes("4096", "-b"), 4096u);
  EXPECT_EQ(parse_bytes("4K", "-b"), 4096u);
  EXPECT_EQ(parse_bytes("4k", "-b"), 4096u);
  EXPECT_EQ(parse_bytes("16M", "-b"), 16ull << 20);
  EXPECT_EQ(parse_bytes("1G", "-b"), 1ull << 30);
  EXPECT_EQ(parse_bytes("1T", "-b"), 1ull << 40);
}

TEST(ParseBytes, RejectsFractionsBareSuffixesSignsAndOverflow) {
  for (const char* text : {"", "1.5M", "K", "-1", "+4K", "4KB", " 4K", "4 K", "4K ", "0x10", "16777216T",
                           "18446744073709551616"}) {
    SCOPED_TRACE(text);
    expect_names_and_quotes(config_error([&] { parse_bytes(text, "-e"); }), "-e", text);
  }
}

// ---- parse_int_list -------------------------------------------------------------------------------

TEST(ParseIntList, ParsesCommaSeparatedNonNegativeInts) {
  EXPECT_EQ(parse_int_list("0,3,5", "STRATA_LOG_RANKS"), (std::vector<int>{0, 3, 5}));
  EXPECT_EQ(parse_int_list("7", "STRATA_LOG_RANKS"), (std::vector<int>{7}));
  EXPECT_EQ(parse_int_list("5,1,5", "STRATA_LOG_RANKS"), (std::vector<int>{5, 1, 5}));
}

TEST(ParseIntList, RejectsEmptyFieldsNegativesAndGarbage) {
  for (const char* text : {"", "1,,2", "1,", ",1", "-1", "a", " 1", "1, 2"}) {
    SCOPED_TRACE(text);
    EXPECT_TRUE(Contains(config_error([&] { parse_int_list(text, "STRATA_LOG_RANKS"); }), "STRATA_LOG_RANKS"));
  }
}

// ---- split / trim ---------------------------------------------------------------------------------

TEST(Split, KeepsEmptyFields) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split("a,b,c", ','), (V{"a", "b", "c"}));
  EXPECT_EQ(split("a,,b", ','), (V{"a", "", "b"}));
  EXPECT_EQ(split("", ','), (V{""}));
  EXPECT_EQ(split(",", ','), (V{"", ""}));
  EXPECT_EQ(split(",a,", ','), (V{"", "a", ""}));
  EXPECT_EQ(split("3:1.5", ':'), (V{"3", "1.5"}));
  EXPECT_EQ(split("a,b", ':'), (V{"a,b"}));
}

TEST(Trim, StripsLeadingAndTrailingWhitespaceOnly) {
  EXPECT_EQ(trim("  a b \t\n"), "a b");
  EXPECT_EQ(trim("x"), "x");
  EXPECT_EQ(trim(""), "");
  EXPECT_EQ(trim(" \t\r\n "), "");
}

// ---- Env typed accessors --------------------------------------------------------------------------

Env make_env(Env::Vars vars) { return Env(std::move(vars)); }

TEST(Env, GetAndHasDistinguishUnsetEmptyAndSet) {
  Env env = make_env({{"EMPTY", ""}, {"SET", "v"}});
  EXPECT_FALSE(env.get("MISSING").has_value());
  ASSERT_TRUE(env.get("EMPTY").has_value());
  EXPECT_EQ(*env.get("EMPTY"), "");
  EXPECT_EQ(env.get("SET").value_or(""), "v");
  EXPECT_FALSE(env.has("MISSING"));
  EXPECT_FALSE(env.has("EMPTY"));  // set but empty counts as unset
  EXPECT_TRUE(env.has("SET"));
}

TEST(Env, WithReturnsAModifiedCopy) {
  Env env = make_env({{"A", "1"}});
  Env changed = env.with("A", "2").with("B", "3");
  EXPECT_EQ(env.get("A").value_or(""), "1");
  EXPECT_FALSE(env.get("B").has_value());
  EXPECT_EQ(changed.get("A").value_or(""), "2");
  EXPECT_EQ(changed.get("B").value_or(""), "3");
}

TEST(Env, TypedAccessorsParseOrFallBack) {
  Env env = make_env({{"I", "-42"}, {"D", "0.25"}, {"B", "off"}, {"S", "text"}, {"E", ""}});
  EXPECT_EQ(env.get_int("I", 7), -42);
  EXPECT_EQ(env.get_int("MISSING", 7), 7);
  EXPECT_EQ(env.get_int("E", 7), 7);
  EXPECT_DOUBLE_EQ(env.get_double("D", 1.0), 0.25);
  EXPECT_DOUBLE_EQ(env.get_double("E", 1.0), 1.0);
  EXPECT_FALSE(env.get_bool("B", true));
  EXPECT_TRUE(env.get_bool("MISSING", true));
  EXPECT_EQ(env.get_string("S", "fb"), "text");
  EXPECT_EQ(env.get_string("E", "fb"), "fb");
  EXPECT_EQ(env.get_string("MISSING", "fb"), "fb");
}

TEST(Env, TypedAccessorsNameTheVariableOnBadValues) {
  Env env = make_env({{"STRATA_TIMEOUT_S", "60s"}, {"STRATA_N", "4x"}, {"STRATA_ON", "maybe"}});
  expect_names_and_quotes(config_error([&] { env.get_int("STRATA_N", 0); }), "STRATA_N", "4x");
  expect_names_and_quotes(config_error([&] { env.get_double("STRATA_TIMEOUT_S", 0); }), "STRATA_TIMEOUT_S", "60s");
  expect_names_and_quotes(config_error([&] { env.get_bool("STRATA_ON", false); }), "STRATA_ON", "maybe");
}


// The one timeout contract (strata/common/env.h): --timeout, else STRATA_TIMEOUT_S, else 120 s,
// published back into the process environment for the layers that read the variable.
TEST(Timeout, FlagThenEnvironmentThenDefaultAndPublished) {
  EXPECT_EQ(resolve_timeout("", Env{}), kDefaultTimeoutS);
  EXPECT_STREQ(std::getenv("STRATA_TIMEOUT_S"), "120");
  EXPECT_EQ(resolve_timeout("", make_env({{"STRATA_TIMEOUT_S", "7.5"}})), 7.5);
  EXPECT_STREQ(std::getenv("STRATA_TIMEOUT_S"), "7.5");
  EXPECT_EQ(resolve_timeout("3", make_env({{"STRATA_TIMEOUT_S", "7.5"}})), 3.0);
  EXPECT_EQ(timeout_from_env(Env::from_process()), 3.0);
  EXPECT_THROW(resolve_timeout("0", Env{}), ConfigError);
  EXPECT_THROW(resolve_timeout("soon", Env{}), ConfigError);
  EXPECT_THROW(resolve_timeout("", make_env({{"STRATA_TIMEOUT_S", "-1"}})), ConfigError);
  EXPECT_THROW(resolve_timeout("", make_env({{"STRATA_TIMEOUT_S", "soon"}})), ConfigError);
  ::unsetenv("STRATA_TIMEOUT_S");
}

// ---- durations and JSON depth: what an untrusted flag, variable or document can do ----------------
// (Suites named *Security also carry the `security` label: tests/CMakeLists.txt.)

TEST(DurationSecurity, ParseSecondsAcceptsZeroFractionsAndTheMaximum) {
  EXPECT_EQ(parse_seconds("0", "--save-every-secs"), 0.0);
  EXPECT_EQ(parse_seconds("0.25", "--log-every-secs"), 0.25);
  EXPECT_EQ(parse_seconds("1e6", "--timeout"), kMaxDurationS);
  EXPECT_EQ(parse_seconds("120", "--timeout", ZeroSeconds::kRejected), 120.0);
}

// 1e10 s is past steady_clock's int64 nanoseconds once added to now(); before the clamp such a
// --timeout made every deadline lie in the past and the job ended at once.
TEST(DurationSecurity, HugeValuesAreClampedToTheDocumentedMaximum) {
  for (const char* text : {"1000001", "1e10", "9.3e9", "1e300", "179769313486231570000000000000000"}) {
    SCOPED_TRACE(text);
    EXPECT_EQ(parse_seconds(text, "--timeout", ZeroSeconds::kRejected), kMaxDurationS);
  }
  EXPECT_EQ(kMaxDurationS, 1e6);
  // The clamped value still leaves room for deadline arithmetic (now + t + t/2 + slack).
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  const auto t = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(parse_seconds("1e10", "--timeout")));
  EXPECT_GT((now + t + t / 2).count(), now.count());
}

TEST(DurationSecurity, NegativeZeroAndNonFiniteValuesAreUsageErrorsNamingTheFlag) {
  EXPECT_EQ(config_error([] { parse_seconds("-1", "--save-every-secs"); }),
            "--save-every-secs must not be negative, got '-1'");
  EXPECT_EQ(config_error([] { parse_seconds("0", "--timeout", ZeroSeconds::kRejected); }),
            "--timeout must be positive, got '0'");
  EXPECT_EQ(config_error([] { parse_seconds("-0", "--stall-timeout", ZeroSeconds::kRejected); }),
            "--stall-timeout must be positive, got '-0'");
  for (const char* text : {"nan", "inf", "-inf", "1e400", "", "10s", "0x10"}) {
    SCOPED_TRACE(text);
    expect_names_and_quotes(config_error([&] { parse_seconds(text, "--timeout"); }), "--timeout", text);
  }
}

TEST(DurationSecurity, ClampSecondsBoundsComputedValues) {
  EXPECT_EQ(clamp_seconds(std::numeric_limits<double>::quiet_NaN()), 0.0);
  EXPECT_EQ(clamp_seconds(-5), 0.0);
  EXPECT_EQ(clamp_seconds(std::numeric_limits<double>::infinity()), kMaxDurationS);
  EXPECT_EQ(clamp_seconds(2.5), 2.5);
}

TEST(DurationSecurity, EnvironmentTimeoutsAreClampedOrRefusedNamingTheVariable) {
  EXPECT_EQ(timeout_from_env(make_env({{"STRATA_TIMEOUT_S", "1e10"}})), kMaxDurationS);
  EXPECT_EQ(config_error([] { timeout_from_env(make_env({{"STRATA_TIMEOUT_S", "-3"}})); }),
            "STRATA_TIMEOUT_S must be positive, got '-3'");
  EXPECT_EQ(config_error([] { timeout_from_env(make_env({{"STRATA_TIMEOUT_S", "1e999"}})); }),
            "STRATA_TIMEOUT_S: '1e999' is not a finite number");
  const Env env = make_env({{"STRATA_PROGRESS_TIMEOUT_S", "1e12"}, {"STRATA_STALL_TIMEOUT_S", "-1"}});
  EXPECT_EQ(env.get_seconds("STRATA_PROGRESS_TIMEOUT_S", 120), kMaxDurationS);
  EXPECT_EQ(env.get_seconds("STRATA_UNSET_S", 7), 7.0);
  EXPECT_EQ(config_error([&] { env.get_seconds("STRATA_STALL_TIMEOUT_S", 10, ZeroSeconds::kRejected); }),
            "STRATA_STALL_TIMEOUT_S must be positive, got '-1'");
  // The published value is the clamped one, so the transports read a bound their clocks can hold.
  EXPECT_EQ(resolve_timeout("1e10", Env{}), kMaxDurationS);
  EXPECT_EQ(timeout_from_env(Env::from_process()), kMaxDurationS);
  ::unsetenv("STRATA_TIMEOUT_S");
}

TEST(DurationSecurity, TestHookSecondsAreClampedToo) {
  EXPECT_EQ(test_hook_delay(make_env({{"STRATA_TEST_DELAY_RANK", "1:1e30"}}), "STRATA_TEST_DELAY_RANK", 1),
            kMaxDurationS);
  EXPECT_TRUE(Contains(config_error([] {
                         test_hook_delay(make_env({{"STRATA_TEST_DELAY_RANK", "1:-2"}}), "STRATA_TEST_DELAY_RANK", 1);
                       }),
                       "STRATA_TEST_DELAY_RANK seconds must not be negative"));
}

TEST(JsonDepthSecurity, AcceptsDocumentsUpToTheBound) {
  EXPECT_NO_THROW(check_json_depth(R"({"cluster": {"worker": ["a:1"]}, "task": {"index": 0}})", "TF_CONFIG"));
  EXPECT_NO_THROW(check_json_depth(std::string(64, '[') + std::string(64, ']'), "TF_CONFIG"));
  EXPECT_NO_THROW(check_json_depth("", "TF_CONFIG"));
  // Brackets inside strings, escaped quotes included, are text, not nesting.
  const std::string in_string = "{\"k\": \"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"}";
  EXPECT_NO_THROW(check_json_depth(in_string, "TF_CONFIG"));
  // Closing brackets bring the depth back down: many shallow siblings are fine.
  std::string siblings = "[";
  for (int i = 0; i < 10000; ++i) siblings += "[[]],";
  siblings += "[]]";
  EXPECT_NO_THROW(check_json_depth(siblings, "--cluster"));
}

TEST(JsonDepthSecurity, DeeperNestingIsAUsageErrorNamingTheSourceAndTheBound) {
  EXPECT_EQ(config_error([] { check_json_depth(std::string(65, '['), "TF_CONFIG"); }),
            "TF_CONFIG: JSON nested deeper than 64 levels (at byte 64)");
  EXPECT_EQ(config_error([] { check_json_depth(R"({"a": [{"b": [[1]]}]})", "--cluster", 4); }),
            "--cluster: JSON nested deeper than 4 levels (at byte 14)");
  // The issue's input: a million unclosed brackets. Found at byte 64 in one linear pass.
  const std::string million(1000000, '[');
  EXPECT_TRUE(Contains(config_error([&] { check_json_depth(million, "--cluster"); }), "--cluster: JSON nested deeper"));
  // An escaped backslash ends before the quote: the quote closes the string, what follows counts.
  EXPECT_TRUE(Contains(config_error([] { check_json_depth("[\"\\\\\"" + std::string(70, '['), "TF_CONFIG"); }),
                       "nested deeper"));
}

}  // namespace
}  // namespace strata
