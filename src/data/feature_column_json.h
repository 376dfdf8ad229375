// Feature columns from an already parsed JSON document (the model-spec reader's entry point; the
// public parse_feature_columns_json takes text). Private to strata: nlohmann stays out of the
// public headers. Schema and error contract: include/strata/data/feature_column.h.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/data/feature_column.h"

namespace strata::data {

// `columns` must be an array of column objects. Errors: ConfigError
// "<origin>: <path>[i].<member>: <problem>", with `path` the array's own path
// ("feature_columns"). Relative vocabulary_file paths are taken relative to base_dir (when set).
std::vector<FeatureColumn> feature_columns_from_json(const nlohmann::ordered_json& columns, const std::string& origin,
                                                     const std::string& path, const std::string& base_dir);

// One column object at `path`.
FeatureColumn feature_column_from_json(const nlohmann::ordered_json& column, const std::string& origin,
                                       const std::string& path, const std::string& base_dir);

// CSV options from JSON at `path` (csv.h's CsvOptions; docs/DATA.md has the schema):
//   {"preset": "criteo"?, "delimiter": "," | "\t" | "tab"?, "header": "detect" | "present" | "absent"?,
//    "columns": [{"name": N, "type": "int64" | "float" | "string", "default": TEXT?,
//                 "separator": "|"?}, ...]?, "max_record_bytes": N?}
// A preset gives the columns, delimiter and header; "columns" cannot be combined with it, the
// other members override it. Unknown members are errors; errors name the member's path.
CsvOptions csv_options_from_json(const nlohmann::ordered_json& options, const std::string& origin, const std::string& path);

}  // namespace strata::data
