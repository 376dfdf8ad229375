// The --json file of `strata bench`: every op writes its table's rows the same way.
#pragma once

#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace strata::cli {

// Writes {"rows": rows} to `path` (nothing when `path` is empty). On a failed write, says so in
// one line on stderr and returns false (the caller exits with a failure status).
inline bool write_bench_rows(const std::string& path, const nlohmann::json& rows) {
  if (path.empty()) return true;
  std::ofstream out(path);
  out << nlohmann::json{{"rows", rows}}.dump(2) << "\n";
  if (out) return true;
  std::fprintf(stderr, "strata bench: cannot write %s\n", path.c_str());
  return false;
}

}  // namespace strata::cli
