// STRATA_MPIIO_HINTS's parser (strata/checkpoint/mpiio_hints.h): valid strings parse exactly, in
// order; every malformed one is one ConfigError line naming the variable and the pair. No MPI.
#include "strata/checkpoint/mpiio_hints.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "strata/common/env.h"
#include "strata/common/error.h"

namespace strata::checkpoint {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_mpiio_hints(text);
  } catch (const ConfigError& e) {
    return e.message();
  }
  return "(accepted)";
}

TEST(MpiIoHintsParse, ValidStringsParseExactlyInOrder) {
  using V = std::vector<MpiIoHint>;
  EXPECT_EQ(parse_mpiio_hints(""), V{});
  EXPECT_EQ(parse_mpiio_hints("  \t "), V{});
  EXPECT_EQ(parse_mpiio_hints("romio_cb_write=enable"), (V{{"romio_cb_write", "enable"}}));
  EXPECT_EQ(parse_mpiio_hints("striping_factor=8,striping_unit=4194304,romio_cb_write=enable,cb_nodes=4"),
            (V{{"striping_factor", "8"}, {"striping_unit", "4194304"}, {"romio_cb_write", "enable"}, {"cb_nodes", "4"}}));
  // Blanks around keys and values are dropped; values may hold ':' '*' '/' and the like.
  EXPECT_EQ(parse_mpiio_hints(" cb_buffer_size = 16777216 ,\tcb_config_list=*:1 "),
            (V{{"cb_buffer_size", "16777216"}, {"cb_config_list", "*:1"}}));
  // The longest key and value MPI_Info_set takes.
  const std::string key(MPI_MAX_INFO_KEY - 1, 'k'), value(MPI_MAX_INFO_VAL - 1, 'v');
  EXPECT_EQ(parse_mpiio_hints(key + "=" + value), (V{{key, value}}));
  std::string many;
  for (std::size_t i = 0; i < kMaxMpiIoHints; ++i) many += (i ? "," : "") + std::string("k") + std::to_string(i) + "=1";
  EXPECT_EQ(parse_mpiio_hints(many).size(), kMaxMpiIoHints);
  EXPECT_EQ(format_mpiio_hints(parse_mpiio_hints(" a=1, b = 2")), "a=1,b=2");
}

TEST(MpiIoHintsParse, MalformedStringsNameTheVariableAndThePair) {
  const std::string key36(MPI_MAX_INFO_KEY, 'k'), value256(MPI_MAX_INFO_VAL, 'v');
  const struct {
    std::string text;
    std::string message;
  } cases[] = {
      {"romio_cb_write=enable,cb_nodes", "STRATA_MPIIO_HINTS: pair 2 'cb_nodes' has no '=' (expected key=value[,key=value...])"},
      {"=enable", "STRATA_MPIIO_HINTS: pair 1 '=enable' has an empty key"},
      {" = 4", "STRATA_MPIIO_HINTS: pair 1 '= 4' has an empty key"},
      {"cb_nodes=", "STRATA_MPIIO_HINTS: pair 1 'cb_nodes=' has an empty value"},
      {"a=1,,b=2", "STRATA_MPIIO_HINTS: pair 2 is empty (expected key=value[,key=value...], no empty pair or trailing ',')"},
      {"a=1,", "STRATA_MPIIO_HINTS: pair 2 is empty (expected key=value[,key=value...], no empty pair or trailing ',')"},
      {",a=1", "STRATA_MPIIO_HINTS: pair 1 is empty (expected key=value[,key=value...], no empty pair or trailing ',')"},
      {"a=b=c", "STRATA_MPIIO_HINTS: pair 1 'a=b=c' has more than one '=' (expected key=value[,key=value...])"},
      {"cb nodes=2", "STRATA_MPIIO_HINTS: pair 1 'cb nodes=2': a key or value may hold printable ASCII only, without blanks"},
      {"a=1,a=2", "STRATA_MPIIO_HINTS: pair 2 'a=2' repeats the key 'a'"},
      {key36 + "=1", "STRATA_MPIIO_HINTS: pair 1 '" + key36 + "=1': the key is 36 characters, longer than the 35 MPI allows (MPI_MAX_INFO_KEY)"},
      {"k=" + value256, "STRATA_MPIIO_HINTS: pair 1 'k=" + value256.substr(0, 78) + "...' (258 bytes): the value is 256 characters, longer than the 255 MPI allows (MPI_MAX_INFO_VAL)"},
  };
  for (const auto& c : cases) EXPECT_EQ(error_of(c.text), c.message) << "input: " << c.text;

  // Control and non-ASCII bytes are refused and printed escaped, so the message stays one line.
  const std::string newline = error_of("a=1\nb");
  EXPECT_EQ(newline, "STRATA_MPIIO_HINTS: pair 1 'a=1\\x0ab': a key or value may hold printable ASCII only, without blanks");
  EXPECT_EQ(error_of("k=\xc3\xa9"), "STRATA_MPIIO_HINTS: pair 1 'k=\\xc3\\xa9': a key or value may hold printable ASCII only, without blanks");

  std::string too_many;
  for (std::size_t i = 0; i <= kMaxMpiIoHints; ++i) too_many += (i ? "," : "") + std::string("k") + std::to_string(i) + "=1";
  EXPECT_EQ(error_of(too_many), "STRATA_MPIIO_HINTS: more than 64 key=value pairs");

  // Another origin's name in the message.
  try {
    parse_mpiio_hints("x", "--hints");
    ADD_FAILURE() << "accepted 'x'";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.message(), "--hints: pair 1 'x' has no '=' (expected key=value[,key=value...])");
  }
}

TEST(MpiIoHintsParse, FromTheEnvironmentSnapshot) {
  EXPECT_TRUE(mpiio_hints_from_env(Env()).empty());
  EXPECT_TRUE(mpiio_hints_from_env(Env().with("STRATA_MPIIO_HINTS", "")).empty());
  EXPECT_EQ(mpiio_hints_from_env(Env().with("STRATA_MPIIO_HINTS", "cb_nodes=2")), (std::vector<MpiIoHint>{{"cb_nodes", "2"}}));
  EXPECT_THROW(mpiio_hints_from_env(Env().with("STRATA_MPIIO_HINTS", "cb_nodes")), ConfigError);
}

}  // namespace
}  // namespace strata::checkpoint
