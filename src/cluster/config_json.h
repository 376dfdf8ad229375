// Reading cluster configuration JSON (--cluster, STRATA_CLUSTER, TF_CONFIG), which comes from a
// user, a launcher or a file someone else wrote: every failure is a ConfigError (exit status 2)
// whose one line names the source. Private to the cluster layer.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "strata/common/error.h"
#include "strata/common/parse.h"

namespace strata::cluster {

// Parses `text`; `origin` names the source in messages ("TF_CONFIG", "--cluster file 'x.json'").
//  - nesting deeper than kMaxJsonDepth is refused before the parser runs (check_json_depth), so no
//    recursive walk of the document (dump() in a message, a destructor) can exhaust the stack;
//  - a number beyond double's range (1e400, a 400-digit integer) is nlohmann's out_of_range 406,
//    not a parse_error: it is a usage error too, said as such.
inline nlohmann::ordered_json parse_config_json(const std::string& text, const std::string& origin) {
  check_json_depth(text, origin);
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::ordered_json::out_of_range& e) {
    throw ConfigError(origin + " has a number out of range: " + e.what());
  } catch (const nlohmann::ordered_json::exception& e) {
    throw ConfigError(origin + " is not valid JSON: " + e.what());
  }
}

// A value quoted in an error message: its JSON text, cut to `max_chars` so that a message stays
// one readable line whatever the document holds (dump() escapes newlines).
inline std::string json_excerpt(const nlohmann::ordered_json& value, std::size_t max_chars = 80) {
  std::string text = value.dump();
  if (text.size() > max_chars) text = text.substr(0, max_chars) + "... (" + std::to_string(text.size()) + " bytes)";
  return text;
}

}  // namespace strata::cluster
