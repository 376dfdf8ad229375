// Input layer (strata_data in docs/ARCHITECTURE.md, "Layers"): in-memory datasets, readers,
// TF-style auto-sharding across workers, and a prefetching batch iterator.
//
// The layer is pure C++ and knows nothing of MPI: the runtime passes the worker index and count in.
// A worker's input for one epoch is
//   indices = shard_indices(dataset, policy, num_workers, worker, seed, epoch, shuffle);
//   BatchIterator it(dataset, indices, batch_size, drop_remainder);
//   while (it.next(batch)) { for (Batch& b : split_batch(batch, replicas)) ... }
// shard_indices is a pure function of its arguments, so every worker computes its own share
// without communicating, and the shares of one epoch partition the dataset (DATA and FILE).
//
// Thread-safety: readers, shard_indices and split_batch are reentrant and share no state, except
// load_hdf5, which calls the HDF5 library (built without thread safety on Debian): call it from one
// thread at a time and never concurrently with other HDF5 use in the process (checkpoints).
// A BatchIterator is used by one consumer thread.
//
// Errors: a reader that meets bad input (missing file, bad magic, truncation, shape mismatch,
// unparsable line) throws ConfigError with one line naming the file and the problem.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace strata::data {

// A dataset held in memory, row-major. Any of the two feature kinds may be absent (dim 0).
struct Dataset {
  std::int64_t size = 0;
  // Dense features [size x dense_dim].
  int dense_dim = 0;
  std::vector<float> features;
  // Sparse feature ids [size x num_fields]. Each example has up to num_fields ids; unused slots
  // hold kNoId (-1) and sit after the used ones. Ids are in [0, sparse_vocab).
  int num_fields = 0;
  std::vector<std::int64_t> sparse_ids;
  std::int64_t sparse_vocab = 0;  // 1 + the largest id (0 when there are no ids)
  // Class labels in [0, num_classes): one per example, or none (num_classes 0) when the dataset
  // carries regression targets instead.
  std::vector<std::int32_t> labels;
  int num_classes = 0;
  // Regression targets, one finite float per example; empty for classification data. A dataset
  // has labels, targets or both (a regressor reads targets, a classifier labels).
  std::vector<float> targets;
  // Source files (for FILE sharding): file_of[i] indexes `files`. Both may be empty (generated
  // data), in which case only DATA/OFF sharding applies.
  std::vector<std::string> files;
  std::vector<std::int32_t> file_of;
};

inline constexpr std::int64_t kNoId = -1;

// Throws strata::Error naming the first inconsistency (vector sizes against size x dims, labels
// out of range, neither labels nor targets, a non-finite target, file_of out of range). Readers return validated datasets; call this on a Dataset
// built by hand.
void validate(const Dataset& dataset);

// Concatenates datasets (e.g. one HDF5 file per part) into one whose `files` lists every part's
// files, so FILE sharding assigns whole parts to workers. dense_dim must agree; num_fields becomes
// the largest and shorter rows are padded with kNoId. A part without files counts as one file
// named "<part i>". Throws ConfigError on a dense_dim mismatch, or when some parts have labels
// (or targets) and others do not.
Dataset concatenate(const std::vector<Dataset>& parts);

// ---- readers ---------------------------------------------------------------------------------

// IDX (the MNIST format), gzip-compressed or raw (told apart by the gzip magic 1f 8b): images with
// magic 0x00000803, uint8 [n, rows, cols]; labels with magic 0x00000801, uint8 [n]. Pixels are
// scaled to [0, 1]; dense_dim = rows * cols; num_classes = 1 + the largest label. The file list
// is {images_path}.
Dataset load_idx(const std::string& images_path, const std::string& labels_path);

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
// Fashion-MNIST from Debian's dataset-fashion-mnist: train-{images-idx3,labels-idx1}-ubyte.gz
// (60000 examples) or t10k-* (10000), 28x28 pixels in [0, 1], num_classes 10. A missing file is a
// ConfigError naming it and the package to install.
Dataset load_fashion_mnist(const std::string& dir = kFashionMnistDir, bool train = true);

// HDF5: `images_dataset` of any integer or float type and shape [n, ...] (flattened to dense_dim,
// converted to float as stored, no scaling); `labels_dataset` of an integer type, shape [n] or
// [n, 1], values >= 0. Opened read-only with the default (sec2) driver, which needs no MPI even
// with the parallel HDF5 build. See the thread-safety note at the top.
Dataset load_hdf5(const std::string& path, const std::string& images_dataset = "images",
                  const std::string& labels_dataset = "labels");

// libsvm text: one example per line, `label idx:val idx:val ...` ('#' starts a comment; blank
// lines and `qid:` tokens are skipped).
// - Labels: integers. If any label is -1 the labels must be in {-1, +1} and -1 maps to 0, +1 to 1;
//   otherwise labels are class indices 0..K-1. num_classes = max(2, 1 + the largest label).
// - Features become sparse ids, for a wide (linear over one-hot ids) or embedding model: each
//   nonzero `idx:val` contributes the id `idx` (kept as written, so 1-based files leave id 0 unused;
//   sparse_vocab = 1 + the largest idx). Values are not kept: an entry with value 0 is dropped
//   and any other value counts as "present", so the format suits binary/one-hot data (a9a, rcv1
//   binarised, Criteo hashed); a warning is logged once per file when values other than 0/1 occur.
// - Each example stores up to num_fields ids in file order, padded with kNoId. num_fields = 0
//   means "the largest number of nonzeros on any line"; a line with more nonzeros than an explicit
//   num_fields is a ConfigError naming the file and line.
// Several files give several `files` entries (FILE sharding).
Dataset load_libsvm(const std::vector<std::string>& paths, int num_fields = 0);
Dataset load_libsvm(const std::string& path, int num_fields = 0);

// Synthetic click-style data that a wide or embedding model can learn, deterministic in `seed`
// (the same on every platform: the generator uses no std:: distributions).
// - Vocabulary: ids [0, vocab) split into num_fields contiguous slices; field f draws its id from
//   its own slice with a Zipf law of exponent zipf_s over the slice (rank r has probability
//   proportional to r^-zipf_s; the most frequent id is the slice's first; zipf_s = 0 is uniform).
// - Signal: every id has a hidden weight w(id) ~ N(0, 1) (synthetic_hidden_weight). An example's
//   clean score is the sum of its ids' weights; its label is 1 when the clean score plus Gaussian
//   noise of std noise * std(clean scores) exceeds the median of the noisy scores, so the classes
//   are balanced and chance accuracy is 0.5.
// - Dense features (dense_dim of them, default 4): the standardised clean score times a fixed
//   coefficient (0.8, -0.5, 0.3, 0.1, then repeating) plus N(0, 1) noise. They carry no
//   information beyond the ids, so the rule "clean score > median" is Bayes-optimal for the whole
//   example; synthetic_oracle_accuracy measures it (about 0.92 with the default noise 0.25).
// Requires n >= 1, num_fields >= 1, vocab >= num_fields, zipf_s >= 0 (ConfigError otherwise).
Dataset make_synthetic_sparse(std::int64_t n, int num_fields, std::int64_t vocab, double zipf_s,
                              std::uint64_t seed, int dense_dim = 4, double noise = 0.25);
// The hidden weight of `id` in the dataset generated with `seed`.
double synthetic_hidden_weight(std::uint64_t seed, std::int64_t id);
// Accuracy on `dataset` of the oracle that knows the hidden weights: predict 1 when the clean
// score is above the median clean score.
double synthetic_oracle_accuracy(const Dataset& dataset, std::uint64_t seed);

// ---- distribution ----------------------------------------------------------------------------

// tf.distribute.InputContext: which input pipeline (worker) this is and how many replicas share a
// step, handed to a DatasetFn.
struct InputContext {
  int num_input_pipelines = 1;
  int input_pipeline_id = 0;
  int num_replicas_in_sync = 1;
  // global_batch_size / num_replicas_in_sync; ConfigError when it does not divide (TF semantics)
  // or when either is not positive.
  int get_per_replica_batch_size(int global_batch_size) const;
};

// distribute_datasets_from_function: the strategy calls fn once on every worker with
// InputContext{num_workers, worker_index, replicas per worker}. The function builds (or loads)
// that worker's dataset and is responsible for its own sharding, typically
// shard_indices(ds, AutoShard::kOff, ...) over a dataset it already restricted to
// input_pipeline_id, or shard_indices(ds, kData/kFile, ctx.num_input_pipelines,
// ctx.input_pipeline_id, ...). The strategy then batches with get_per_replica_batch_size(global)
// * num_replicas_in_sync per worker step and splits each batch across replicas with split_batch.
using DatasetFn = std::function<Dataset(const InputContext&)>;

// tf.data.experimental.AutoShardPolicy.
enum class AutoShard { kAuto, kFile, kData, kOff };
// "auto", "file", "data", "off" (case-insensitive); ConfigError naming `what` otherwise.
AutoShard parse_auto_shard(const std::string& text, const std::string& what = "--auto-shard");
const char* to_string(AutoShard policy);

// The policy AUTO stands for on this dataset: kFile when it has at least num_workers files, else
// kData, logging a warning that says so. Other policies are returned unchanged. Resolve once per
// job and pass the result to shard_indices, so the warning is not repeated every epoch.
AutoShard resolve_auto_shard(const Dataset& dataset, AutoShard policy, int num_workers);

// The example indices worker `worker` of `num_workers` processes in `epoch`, in order:
// - kData: every worker permutes [0, size) with the same (seed, epoch) permutation (identity when
//   !shuffle) and keeps the positions p with p % num_workers == worker. The workers' shares
//   partition the dataset; sizes differ by at most one; a share may be empty when size < workers.
// - kFile: file f goes to worker f % num_workers; the worker's examples, in file order, are then
//   permuted with (seed, epoch, worker) when shuffle. Needs files.size() >= num_workers
//   (ConfigError naming both counts otherwise).
// - kAuto: resolve_auto_shard, then as above.
// - kOff: every worker gets every example, permuted with (seed, epoch, worker) when shuffle, so
//   workers do not walk the data in lockstep.
// Different epochs give different permutations. ConfigError when num_workers < 1 or worker is out
// of range. Deterministic across platforms (own RNG and Fisher-Yates, no std::shuffle).
std::vector<std::int64_t> shard_indices(const Dataset& dataset, AutoShard policy, int num_workers,
                                        int worker, std::uint64_t seed, int epoch, bool shuffle);

// ---- batching --------------------------------------------------------------------------------

// One batch, row-major like Dataset: features [size x dense_dim], sparse_ids [size x num_fields].
struct Batch {
  int size = 0;
  std::vector<float> features;
  int dense_dim = 0;
  std::vector<std::int64_t> sparse_ids;
  int num_fields = 0;
  std::vector<std::int32_t> labels;  // [size], or empty when the dataset has only targets
  std::vector<float> targets;        // [size], or empty when the dataset has none
};

// Splits a worker batch into k replica batches of size/k examples, the first size%k replicas
// taking one extra (TF's rebatching): a full batch of k * per_replica splits evenly; on a partial
// last batch earlier replicas get more and trailing replicas may get an empty batch (size 0),
// which must still take part in the replicas' collectives. Weight a MEAN by batch size.
// ConfigError when k < 1.
std::vector<Batch> split_batch(const Batch& batch, int k);

// Batches produced by a background thread into a bounded queue, so assembling the next batches
// overlaps the current step.
//
// Contract:
// - next() is called by one consumer thread at a time. It blocks until a batch is ready and
//   returns false at the end. An exception thrown by the producer is rethrown by next() after the
//   batches produced before it, and again by every later call.
// - At most `prefetch` ready batches wait in the queue (memory: about prefetch + 2 batches).
// - The destructor stops the producer and joins it without throwing, whether or not the consumer
//   reached the end; it never hangs on a full queue.
// - The Dataset overload borrows `dataset`: it must outlive the iterator and not change meanwhile.
// - Movable, not copyable: the queue and the producer thread live in a heap object that moves
//   with the iterator. A moved-from iterator may only be destroyed or assigned to.
class BatchIterator {
 public:
  // Fills `out` (reusing its buffers) with the next batch; returns false when there is none.
  // Runs on the producer thread.
  using Source = std::function<bool(Batch& out)>;

  // Batches of `batch_size` examples taken from `indices` in order; the last one is partial unless
  // drop_remainder (then it is dropped). ConfigError when batch_size < 1 or prefetch < 1; Error
  // when an index is out of range or the dataset is inconsistent.
  BatchIterator(const Dataset& dataset, std::vector<std::int64_t> indices, int batch_size,
                bool drop_remainder, int prefetch = 2);
  // A custom source (streaming readers, tests). ConfigError when prefetch < 1.
  explicit BatchIterator(Source source, int prefetch = 2);
  ~BatchIterator();
  BatchIterator(BatchIterator&&) noexcept;
  BatchIterator& operator=(BatchIterator&&) noexcept;
  BatchIterator(const BatchIterator&) = delete;
  BatchIterator& operator=(const BatchIterator&) = delete;

  bool next(Batch& out);

  // Number of batches `num_examples` examples make.
  static std::int64_t num_batches(std::int64_t num_examples, int batch_size, bool drop_remainder);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace strata::data
