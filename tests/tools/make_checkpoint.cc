// strata_test_make_checkpoint: writes a real checkpoint with the real collective writer
// (strata::checkpoint::save), for the CLI tests of `strata ckpt`. Run it under mpirun with any
// number of ranks: every variable's rows are split across the ranks in contiguous, uneven ranges
// (rank r holds [r*rows/np, (r+1)*rows/np), so some ranks may hold none), and every value is a pure
// function of (seed, step, dataset, flat index). The same --seed/--step therefore produces the same
// values whatever the rank count, and `strata ckpt diff` of a 1-rank and a 3-rank save must report
// "identical".
//
//   make_checkpoint --dir DIR --step N [--seed S] [--rows R] [--perturb DATASET:INDEX]...
//                   [--extra] [--optimizer NAME] [--max-to-keep K] [--keep-every-n-hours H]
//                   [--optimizer-step T]
//
// Variables (FORMAT.md names):
//   dense/kernel     f32 [6,4]     slots m, v
//   dense/bias       f64 [5]       element 3 is NaN in every checkpoint (diff treats NaN == NaN)
//   ids              i64 [7]
//   embedding/table  f32 [R,16]    slot accumulator; R = --rows (default 1000)
//   extra/only       f32 [3]       only with --extra (for "only in B" reports)
// --perturb DATASET:INDEX adds 0.5 (1 for i64) to the element at flat row-major INDEX of DATASET,
// given as its path in the file: "variables/embedding/table:777", "slots/dense/kernel/m:5".
// Prints the committed file's path on rank 0. Exit 2 on bad arguments, 1 on a failed save.
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/checkpoint/checkpoint.h"
#include "strata/common/parse.h"

namespace {

namespace ck = strata::checkpoint;

struct Options {
  std::string dir;
  std::int64_t step = -1;
  std::int64_t seed = 1;
  std::int64_t rows = 1000;
  std::map<std::string, std::vector<std::int64_t>> perturb;  // dataset path -> flat indices
  bool extra = false;
  std::string optimizer = "adam";
  int max_to_keep = 0;
  double keep_every_n_hours = 0;
  std::int64_t optimizer_step = 0;  // stored on dense/kernel (the variable with Adam slots)
};

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--dir") {
      o.dir = value();
    } else if (arg == "--step") {
      o.step = strata::parse_int64(value(), "--step");
    } else if (arg == "--seed") {
      o.seed = strata::parse_int64(value(), "--seed");
    } else if (arg == "--rows") {
      o.rows = strata::parse_int64(value(), "--rows");
    } else if (arg == "--perturb") {
      std::string spec = value();
      auto colon = spec.rfind(':');
      if (colon == std::string::npos) throw std::invalid_argument("--perturb takes DATASET:INDEX");
      o.perturb[spec.substr(0, colon)].push_back(strata::parse_int64(spec.substr(colon + 1), "--perturb index"));
    } else if (arg == "--extra") {
      o.extra = true;
    } else if (arg == "--optimizer") {
      o.optimizer = value();
    } else if (arg == "--keep-every-n-hours") {
      o.keep_every_n_hours = strata::parse_double(value(), "--keep-every-n-hours");
    } else if (arg == "--optimizer-step") {
      o.optimizer_step = strata::parse_int64(value(), "--optimizer-step");
    } else if (arg == "--max-to-keep") {
      o.max_to_keep = strata::parse_int(value(), "--max-to-keep", 0, 1 << 20);
    } else {
      throw std::invalid_argument("unknown argument '" + arg + "'");
    }
  }
  if (o.dir.empty() || o.step < 0) throw std::invalid_argument("--dir and --step are required");
  if (o.rows < 1) throw std::invalid_argument("--rows must be >= 1");
  return o;
}

// Deterministic, exactly representable values (multiples of 1/64 in [-64, 64)), distinct per
// dataset, seed, step and element, so any misplaced row shows up as a difference.
double value_at(const Options& o, std::uint64_t dataset_salt, std::int64_t index) {
  std::uint64_t h = static_cast<std::uint64_t>(index) * 0x9E3779B97F4A7C15ull;
  h ^= static_cast<std::uint64_t>(o.seed) * 0xC2B2AE3D27D4EB4Full + static_cast<std::uint64_t>(o.step) * 0x165667B1ull;
  h ^= dataset_salt * 0x27D4EB2F165667C5ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return static_cast<double>(static_cast<std::int64_t>(h % 8192) - 4096) / 64.0;
}

std::uint64_t salt_of(const std::string& dataset) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : dataset) h = (h ^ c) * 1099511628211ull;
  return h;
}

// This rank's rows of one dataset, as raw little-endian bytes (x86-64 is little-endian).
struct Buffer {
  std::vector<unsigned char> bytes;
};

Buffer fill(const Options& o, const ck::VariableMeta& v, const std::string& dataset, std::int64_t row_begin,
            std::int64_t row_end) {
  std::int64_t row_elems = 1;
  for (std::size_t d = 1; d < v.shape.size(); ++d) row_elems *= v.shape[d];
  std::int64_t first = row_begin * row_elems, count = (row_end - row_begin) * row_elems;
  Buffer b;
  b.bytes.resize(static_cast<std::size_t>(count) * ck::dtype_size(v.dtype));
  std::uint64_t salt = salt_of(dataset);
  auto it = o.perturb.find(dataset);
  for (std::int64_t k = 0; k < count; ++k) {
    std::int64_t index = first + k;
    double x = value_at(o, salt, index);
    if (dataset == "variables/dense/bias" && index == 3) x = std::nan("");
    bool perturbed = false;
    if (it != o.perturb.end())
      for (auto p : it->second) perturbed = perturbed || p == index;
    switch (v.dtype) {
      case ck::DType::kF32: {
        float f = static_cast<float>(x) + (perturbed ? 0.5f : 0.0f);
        std::memcpy(&b.bytes[static_cast<std::size_t>(k) * 4], &f, 4);
        break;
      }
      case ck::DType::kF64: {
        double d = x + (perturbed ? 0.5 : 0.0);
        std::memcpy(&b.bytes[static_cast<std::size_t>(k) * 8], &d, 8);
        break;
      }
      case ck::DType::kI64: {
        std::int64_t i = static_cast<std::int64_t>(x * 64) + (perturbed ? 1 : 0);
        std::memcpy(&b.bytes[static_cast<std::size_t>(k) * 8], &i, 8);
        break;
      }
    }
  }
  return b;
}

int run(const Options& o, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);

  ck::SaveRequest request;
  request.variables = {{"dense/kernel", {6, 4}, ck::DType::kF32, {"m", "v"}},
                       {"dense/bias", {5}, ck::DType::kF64, {}},
                       {"ids", {7}, ck::DType::kI64, {}},
                       {"embedding/table", {o.rows, 16}, ck::DType::kF32, {"accumulator"}}};
  request.variables[0].optimizer_step = o.optimizer_step;
  if (o.extra) request.variables.push_back({"extra/only", {3}, ck::DType::kF32, {}});

  // Owns every buffer until save() returns (ShardData borrows pointers).
  std::vector<Buffer> buffers;
  buffers.reserve(request.variables.size() * 3);
  for (const auto& v : request.variables) {
    std::int64_t rows = v.shape[0];
    std::int64_t b = rows * rank / size, e = rows * (rank + 1) / size;
    if (b == e) continue;  // this rank holds no rows of v
    ck::ShardData shard;
    shard.variable = v.name;
    shard.row_begin = b;
    shard.row_end = e;
    buffers.push_back(fill(o, v, "variables/" + v.name, b, e));
    shard.values = buffers.back().bytes.data();
    for (const auto& slot : v.slots) {
      buffers.push_back(fill(o, v, "slots/" + v.name + "/" + slot, b, e));
      shard.slots[slot] = buffers.back().bytes.data();
    }
    request.shards.push_back(std::move(shard));
  }

  ck::Attributes attributes;
  attributes.variable_sequence_hash = 0x5eed0000c0ffee01ull;
  attributes.optimizer = o.optimizer;
  attributes.training_position_json =
      "{\"epoch\": 1, \"workers\": [{\"worker\": 0, \"epoch\": 1, \"offset\": " + std::to_string(o.step * 32) + "}]}";
  ck::SaveOptions options;
  options.max_to_keep = o.max_to_keep;
  options.keep_every_n_hours = o.keep_every_n_hours;
  std::string path = ck::save(comm, o.dir, o.step, request, attributes, options);
  if (rank == 0) std::printf("%s\n", path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  Options options;
  try {
    options = parse_args(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_checkpoint: %s\n", e.what());
    MPI_Finalize();
    return 2;
  }
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  try {
    status = run(options, comm);
  } catch (const std::exception& e) {
    // save() raises the same error on every rank, so every rank exits here; no peer is left hung.
    std::fprintf(stderr, "make_checkpoint: %s\n", e.what());
    status = 1;
  }
  MPI_Comm_free(&comm);
  MPI_Finalize();
  return status;
}
