#include "checkpoint/hdf5/save_ranks.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "checkpoint/hdf5/h5_util.h"
#include "strata/comm/mpi_group.h"
#include "strata/common/error.h"

namespace strata::checkpoint::detail {
namespace {

// The tag of gather_blobs' messages (below the group's own kCollectiveTag).
constexpr int kBlobTag = 0x5a7e;
constexpr std::size_t kMaxMessage = std::size_t{1} << 16;

template <typename T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, std::uint8_t>) return MPI_UINT8_T;
  else if constexpr (std::is_same_v<T, std::uint32_t>) return MPI_UINT32_T;
  else if constexpr (std::is_same_v<T, int>) return MPI_INT;
  else if constexpr (std::is_same_v<T, std::int64_t>) return MPI_INT64_T;
  else {
    static_assert(std::is_same_v<T, std::uint64_t>, "SaveRanks: unsupported element type");
    return MPI_UINT64_T;
  }
}

MPI_Op mpi_op(SaveRanks::Op op) {
  switch (op) {
    case SaveRanks::Op::kMin: return MPI_MIN;
    case SaveRanks::Op::kMax: return MPI_MAX;
    case SaveRanks::Op::kSum: return MPI_SUM;
  }
  return MPI_SUM;
}

template <typename T>
void combine(std::vector<T>& into, const std::string& bytes, SaveRanks::Op op) {
  if (bytes.size() != into.size() * sizeof(T))
    throw Error("checkpoint save: a rank contributed " + std::to_string(bytes.size()) + " bytes to a reduction of " +
                std::to_string(into.size() * sizeof(T)));
  for (std::size_t i = 0; i < into.size(); ++i) {
    T v;
    std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
    switch (op) {
      case SaveRanks::Op::kMin: into[i] = std::min(into[i], v); break;
      case SaveRanks::Op::kMax: into[i] = std::max(into[i], v); break;
      case SaveRanks::Op::kSum: into[i] = static_cast<T>(into[i] + v); break;
    }
  }
}

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename T>
void append_bytes(std::vector<T>& out, const std::string& bytes) {
  if (bytes.size() % sizeof(T) != 0) throw Error("checkpoint save: a rank contributed a torn element");
  const std::size_t at = out.size();
  out.resize(at + bytes.size() / sizeof(T));
  if (!bytes.empty()) std::memcpy(out.data() + at, bytes.data(), bytes.size());
}

}  // namespace

SaveRanks::SaveRanks(comm::Group& group, double timeout_s, std::string what)
    : group_(group), mpi_(comm::mpi_comm(group)), rank_(group.rank()), size_(group.size()),
      timeout_s_(timeout_s), what_(std::move(what)) {}

comm::Deadline SaveRanks::deadline() const { return comm::Deadline{timeout_s_, what_}; }

std::pair<int, std::string> SaveRanks::first_error(const std::string& local) {
  const std::string mine = local.substr(0, kMaxMessage);
  if (!parallel()) {
    const auto all = group_.allgather_strings(mine, deadline());
    for (int r = 0; r < size_; ++r)
      if (!all[static_cast<std::size_t>(r)].empty()) return {r, all[static_cast<std::size_t>(r)]};
    return {-1, ""};
  }
  int me = mine.empty() ? size_ : rank_, first = size_;
  STRATA_CHECK_MPI(MPI_Allreduce(&me, &first, 1, MPI_INT, MPI_MIN, mpi_));
  if (first == size_) return {-1, ""};
  std::string message = mine;
  int len = static_cast<int>(message.size());
  STRATA_CHECK_MPI(MPI_Bcast(&len, 1, MPI_INT, first, mpi_));
  message.resize(static_cast<std::size_t>(len));
  STRATA_CHECK_MPI(MPI_Bcast(message.data(), len, MPI_CHAR, first, mpi_));
  return {first, message};
}

template <typename T>
void SaveRanks::allreduce(std::vector<T>& values, Op op) {
  if (values.empty()) return;  // the same length on every rank: all skip alike
  if (parallel()) {
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), mpi_type<T>(),
                                   mpi_op(op), mpi_));
    return;
  }
  const auto all = group_.allgather_strings(bytes_of(values), deadline());
  for (int r = 0; r < size_; ++r)
    if (r != rank_) combine(values, all[static_cast<std::size_t>(r)], op);
}

template <typename T>
void SaveRanks::reduce_to_root(std::vector<T>& values, Op op) {
  if (values.empty()) return;
  if (parallel()) {
    std::vector<T> out(rank_ == 0 ? values.size() : 0);
    STRATA_CHECK_MPI(MPI_Reduce(values.data(), out.data(), static_cast<int>(values.size()), mpi_type<T>(), mpi_op(op),
                                0, mpi_));
    if (rank_ == 0) values = std::move(out);
    return;
  }
  const auto all = group_.allgather_strings(bytes_of(values), deadline());
  if (rank_ != 0) return;
  for (int r = 1; r < size_; ++r) combine(values, all[static_cast<std::size_t>(r)], op);
}

template <typename T>
std::vector<T> SaveRanks::allgather(const std::vector<T>& mine) {
  std::vector<T> all;
  if (parallel()) {
    all.resize(mine.size() * static_cast<std::size_t>(size_));
    if (!mine.empty())
      STRATA_CHECK_MPI(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), mpi_type<T>(), all.data(),
                                     static_cast<int>(mine.size()), mpi_type<T>(), mpi_));
    return all;
  }
  for (const auto& part : group_.allgather_strings(bytes_of(mine), deadline())) {
    if (part.size() != mine.size() * sizeof(T))
      throw Error("checkpoint save: the ranks gathered vectors of different lengths");
    append_bytes(all, part);
  }
  return all;
}

template <typename T>
std::vector<T> SaveRanks::gather(const std::vector<T>& mine) {
  std::vector<T> all;
  if (!parallel()) {
    const auto parts = group_.allgather_strings(bytes_of(mine), deadline());
    if (rank_ == 0)
      for (const auto& part : parts) append_bytes(all, part);
    return all;
  }
  int count = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<std::size_t>(size_)), displs(static_cast<std::size_t>(size_));
  STRATA_CHECK_MPI(MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, mpi_));
  if (rank_ == 0) {
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[static_cast<std::size_t>(r)] = total;
      total += counts[static_cast<std::size_t>(r)];
    }
    all.resize(static_cast<std::size_t>(total));
  }
  STRATA_CHECK_MPI(MPI_Gatherv(mine.data(), count, mpi_type<T>(), all.data(), counts.data(), displs.data(),
                               mpi_type<T>(), 0, mpi_));
  return all;
}

template <typename T>
void SaveRanks::broadcast(std::vector<T>& values, int root) {
  if (values.empty()) return;
  if (parallel())
    STRATA_CHECK_MPI(MPI_Bcast(values.data(), static_cast<int>(values.size()), mpi_type<T>(), root, mpi_));
  else
    group_.broadcast(values.data(), values.size() * sizeof(T), root, deadline());
}

void SaveRanks::barrier() {
  if (parallel())
    STRATA_CHECK_MPI(MPI_Barrier(mpi_));
  else
    group_.barrier(deadline());
}

bool SaveRanks::same_on_every_rank(const std::string& text) {
  if (parallel()) return detail::same_on_every_rank(mpi_, text);
  // The maximum of a value and of its complement: equal on every rank exactly when the maxima are
  // each other's complements.
  std::vector<std::uint64_t> sig{crc32_update(0, text.data(), text.size()) | (std::uint64_t{text.size()} << 32), 0};
  sig[1] = ~sig[0];
  allreduce(sig, Op::kMax);
  return sig[0] == ~sig[1];
}

std::vector<std::string> SaveRanks::gather_blobs(std::string blob) {
  if (parallel()) throw Error("checkpoint save: gather_blobs() is for a save without MPI-IO");
  std::vector<std::string> all;
  if (rank_ != 0) {
    group_.send(0, kBlobTag, blob.data(), blob.size(), deadline());
    return all;
  }
  all.push_back(std::move(blob));
  for (int r = 1; r < size_; ++r) {
    const auto got = group_.recv(r, kBlobTag, deadline());
    all.emplace_back(reinterpret_cast<const char*>(got.data()), got.size());
  }
  return all;
}

H5Id SaveRanks::create_file(const std::string& path, hsize_t userblock_bytes, const std::vector<MpiIoHint>& hints) {
  if (parallel()) return create_parallel_file(path, mpi_, userblock_bytes, hints);
  if (rank_ != 0) return H5Id();
  const H5Id fcpl(STRATA_CHECK_H5(H5Pcreate(H5P_FILE_CREATE)), H5Pclose);
  STRATA_CHECK_H5(H5Pset_userblock(fcpl.get(), userblock_bytes));
  return H5Id(STRATA_CHECK_H5(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), H5P_DEFAULT)), H5Fclose);
}

H5Id SaveRanks::piece_transfer() const {
  H5Id dxpl(STRATA_CHECK_H5(H5Pcreate(H5P_DATASET_XFER)), H5Pclose);
  // Independent: each piece is one contiguous byte range, so collective buffering has nothing to
  // merge, and a rank whose write fails is never left behind in a collective.
  if (parallel()) STRATA_CHECK_H5(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_INDEPENDENT));
  return dxpl;
}

#define STRATA_SAVE_RANKS_TYPE(T)                                                 \
  template void SaveRanks::allreduce<T>(std::vector<T>&, Op);                     \
  template void SaveRanks::reduce_to_root<T>(std::vector<T>&, Op);                \
  template std::vector<T> SaveRanks::allgather<T>(const std::vector<T>&);         \
  template std::vector<T> SaveRanks::gather<T>(const std::vector<T>&);            \
  template void SaveRanks::broadcast<T>(std::vector<T>&, int);
STRATA_SAVE_RANKS_TYPE(std::uint8_t)
STRATA_SAVE_RANKS_TYPE(std::uint32_t)
STRATA_SAVE_RANKS_TYPE(int)
STRATA_SAVE_RANKS_TYPE(std::int64_t)
STRATA_SAVE_RANKS_TYPE(std::uint64_t)
#undef STRATA_SAVE_RANKS_TYPE

}  // namespace strata::checkpoint::detail
