// train::Model's defaults and the batch as model inputs.
#include "strata/train/model.h"

#include "strata/common/error.h"

namespace strata::train {

std::vector<std::int64_t> Model::rows_needed(const std::string& var, const Inputs&) const {
  throw Error("rows_needed('" + var + "'): the model has no sparse variable of that name");
}

Inputs inputs_of(const data::Batch& b) {
  Inputs in;
  in.size = b.size;
  in.dense = b.features.empty() ? nullptr : b.features.data();
  in.dense_dim = b.dense_dim;
  in.sparse_ids = b.sparse_ids.empty() ? nullptr : b.sparse_ids.data();
  in.num_fields = b.num_fields;
  in.labels = b.labels.empty() ? nullptr : b.labels.data();
  in.targets = b.targets.empty() ? nullptr : b.targets.data();
  return in;
}

}  // namespace strata::train
