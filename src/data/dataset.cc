// Dataset invariants and concatenation.
//
// Dataset is a plain struct so that a DatasetFn can build one by hand; validate() is the single
// place that checks the shape invariants every consumer (sharding, BatchIterator) relies on, so
// those can index without bounds checks of their own.
#include "strata/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "strata/common/error.h"

namespace strata::data {

void validate(const Dataset& d) {
  // Checked in an order where each message names the root cause, not a consequence of it.
  STRATA_CHECK(d.size >= 0, "dataset size ", d.size, " is negative");
  STRATA_CHECK(d.dense_dim >= 0 && d.num_fields >= 0, "negative dense_dim ", d.dense_dim,
               " or num_fields ", d.num_fields);
  const auto n = static_cast<std::size_t>(d.size);
  STRATA_ENFORCE_EQ(d.features.size(), n * static_cast<std::size_t>(d.dense_dim),
                    "features must hold size x dense_dim floats");
  STRATA_ENFORCE_EQ(d.sparse_ids.size(), n * static_cast<std::size_t>(d.num_fields),
                    "sparse_ids must hold size x num_fields ids");
  STRATA_CHECK(d.labels.size() == n || (d.labels.empty() && !d.targets.empty()), "the dataset has ",
               d.labels.size(), " labels for ", n, " examples (one label per example, or none when it has targets)");
  STRATA_CHECK(d.targets.empty() || d.targets.size() == n, "the dataset has ", d.targets.size(), " targets for ", n,
               " examples (one per example, or none)");
  for (float t : d.targets) STRATA_CHECK(std::isfinite(t), "a regression target is not finite: ", t);
  for (std::int64_t id : d.sparse_ids)
    STRATA_CHECK(id == kNoId || (id >= 0 && id < d.sparse_vocab), "sparse id ", id,
                 " is outside [0, sparse_vocab=", d.sparse_vocab, ")");
  for (std::int32_t label : d.labels)
    STRATA_CHECK(label >= 0 && label < d.num_classes, "label ", label, " is outside [0, num_classes=",
                 d.num_classes, ")");
  if (!d.file_of.empty()) {
    STRATA_ENFORCE_EQ(d.file_of.size(), n, "file_of must be empty or hold one file per example");
    for (std::int32_t f : d.file_of)
      STRATA_CHECK(f >= 0 && static_cast<std::size_t>(f) < d.files.size(), "file_of entry ", f,
                   " is outside the ", d.files.size(), " files");
  }
}

Dataset concatenate(const std::vector<Dataset>& parts) {
  Dataset out;
  if (parts.empty()) return out;
  // First pass: the combined shape, so the second pass appends into reserved storage.
  out.dense_dim = parts.front().dense_dim;
  std::int64_t first_sized = -1;
  bool has_labels = true, has_targets = false;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const Dataset& part = parts[p];
    validate(part);
    if (part.dense_dim != out.dense_dim)
      throw ConfigError("cannot concatenate datasets: part " + std::to_string(p) + " has " +
                        std::to_string(part.dense_dim) + " dense features, part 0 has " +
                        std::to_string(out.dense_dim));
    out.size += part.size;
    out.num_fields = std::max(out.num_fields, part.num_fields);
    out.sparse_vocab = std::max(out.sparse_vocab, part.sparse_vocab);
    out.num_classes = std::max(out.num_classes, part.num_classes);
    // Labels and targets are all-or-none over the non-empty parts, so every row of the result has
    // what its first row has.
    if (part.size > 0) {
      const bool labels = !part.labels.empty(), targets = !part.targets.empty();
      if (first_sized < 0) {
        first_sized = static_cast<std::int64_t>(p);
        has_labels = labels;
        has_targets = targets;
      } else if (labels != has_labels || targets != has_targets) {
        throw ConfigError("cannot concatenate datasets: part " + std::to_string(p) + (labels ? " has" : " has no") +
                          " class labels and" + (targets ? "" : " no") + " regression targets, part " +
                          std::to_string(first_sized) + (has_labels ? " has" : " has no") + " class labels and" +
                          (has_targets ? "" : " no") + " regression targets");
      }
    }
  }
  const auto n = static_cast<std::size_t>(out.size);
  out.features.reserve(n * static_cast<std::size_t>(out.dense_dim));
  out.sparse_ids.reserve(n * static_cast<std::size_t>(out.num_fields));
  out.labels.reserve(n);
  out.targets.reserve(has_targets ? n : 0);
  out.file_of.reserve(n);
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const Dataset& part = parts[p];
    out.features.insert(out.features.end(), part.features.begin(), part.features.end());
    out.labels.insert(out.labels.end(), part.labels.begin(), part.labels.end());
    out.targets.insert(out.targets.end(), part.targets.begin(), part.targets.end());
    // Narrower parts are padded so every row has out.num_fields slots, used ones first.
    for (std::int64_t i = 0; i < part.size; ++i) {
      const auto row = part.sparse_ids.begin() + i * part.num_fields;
      out.sparse_ids.insert(out.sparse_ids.end(), row, row + part.num_fields);
      out.sparse_ids.insert(out.sparse_ids.end(), static_cast<std::size_t>(out.num_fields - part.num_fields),
                            kNoId);
    }
    const auto first_file = static_cast<std::int32_t>(out.files.size());
    if (part.files.empty()) {
      out.files.push_back("<part " + std::to_string(p) + ">");
      out.file_of.insert(out.file_of.end(), static_cast<std::size_t>(part.size), first_file);
    } else {
      out.files.insert(out.files.end(), part.files.begin(), part.files.end());
      if (part.file_of.empty()) {
        out.file_of.insert(out.file_of.end(), static_cast<std::size_t>(part.size), first_file);
      } else {
        for (std::int32_t f : part.file_of) out.file_of.push_back(first_file + f);
      }
    }
  }
  return out;
}

}  // namespace strata::data
