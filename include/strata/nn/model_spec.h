// A model described in a JSON file: `strata train --model-spec FILE.json --data csv:TRAIN
// --eval-data csv:EVAL`. The file names the estimator (strata/nn/estimator.h), its feature columns
// (strata/data/feature_column.h, same JSON schema), its parameters, the label and how the CSV
// files are laid out. docs/MODELS.md describes it for users; examples/specs/ holds ready files.
//
//   {
//     "estimator": "DNNLinearCombinedClassifier",   // estimator.h's names
//     "n_classes": 2,                                // classifiers (default 2)
//     "label": "label",                              // the label column (default "label")
//     "scope": "ctr",                                // variable name scope (default none)
//     "csv": {"layout": "criteo"},                   // or {"delimiter": ",", "header": true,
//                                                    //     "columns": [...], "separators": {"tags": "|"}}
//     "linear_feature_columns": [ ... ],             // Linear*: "feature_columns"
//     "dnn_feature_columns": [ ... ],                // DNN*, DLRM: "feature_columns"
//     "dnn_hidden_units": [256, 128],                // DNN*: "hidden_units"; DLRM: "top_units"
//     "dnn_dropout": 0.0, "dnn_activation": "relu",  // DNN*: "dropout", "activation"
//     "bottom_units": [64, 16],                      // DLRM only
//     "optimizer": "adagrad", "learning_rate": 0.05, // optional; flags win
//     "epochs": 5, "batch_size": 256                 // optional; flags win
//   }
//
// csv: "layout": "criteo" reads Criteo's TSV layout (label, I1..I13, C1..C26; data/csv.h).
// Otherwise "delimiter" ("," default, "\t" or "tab" for TSV), "header" (true: the first line
// names the columns, the default; false: "columns" must list every column in file order),
// "columns" (names in file order), "separators" (multi-valued columns: name -> one character).
// Column types come from the feature columns that read them (numeric float, identity int64,
// the others string), the label int64 (classifiers) or float (regressors).
//
// Every member is checked: an unknown member, a wrong type, a value out of range or a member
// that does not belong to the chosen estimator is a ConfigError with one line naming the file and
// the member path ("spec.json: dnn_hidden_units[1]: expected a positive integer, got 0").
// The file is at most kMaxModelSpecBytes and nested at most as deep as config_json.h allows.
//
// Thread-safety: reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "strata/data/csv.h"
#include "strata/data/feature_column.h"
#include "strata/nn/estimator.h"

namespace strata::nn {

inline constexpr std::int64_t kMaxModelSpecBytes = std::int64_t{16} << 20;

struct ModelSpec {
  EstimatorConfig estimator;
  data::LabelSpec label;
  data::CsvOptions csv;
  // Optional training defaults (empty / 0: the estimator's or the flags').
  std::string optimizer;
  double learning_rate = 0;
  int epochs = 0;
  int batch_size = 0;
};

// Parses spec text; `origin` names it in errors, `base_dir` resolves relative vocabulary files.
ModelSpec parse_model_spec(std::string_view text, const std::string& origin, const std::string& base_dir = "");
// Reads and parses a file (relative vocabulary files resolve against its directory).
ModelSpec load_model_spec(const std::string& path);

}  // namespace strata::nn
