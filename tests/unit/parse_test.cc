// Unit tests of the strict parsers (strata/common/parse.h) and the typed Env accessors
// (strata/common/env.h). The contract under test: every parser rejects empty text, surrounding
// spaces, signs where they make no sense, other bases, trailing garbage and overflow, and every
// rejection is a ConfigError whose message names `what` (the flag or variable) and quotes the bad
// text, so a user can find the input to fix from the message alone.
#include "common/test_util.h"
#include "strata/common/parse.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace strata
