// The ranks of a collective save (save() and write_dynamic_checkpoint()): the agreements of their
// protocols, and who writes the file.
//
// Over an MPI group (comm::mpi_comm(group) is a communicator) the agreements are MPI collectives
// on that communicator, blocking as parallel HDF5's own collectives are (a rank that never arrives
// is found by the job's liveness, docs/RELIABILITY.md), and every rank writes its own pieces into
// one file opened with MPI-IO. Over any other group (in-process ranks: threads of one process) the
// agreements are the group's collectives, each bounded by `timeout_s` (TimeoutError naming the late
// ranks), and rank 0 alone opens the file (HDF5's sec2 driver) and writes every piece: the other
// ranks send theirs to it (gather_blobs). Either way the file, its bytes and the protocol's
// verdicts are the same.
//
// Private to the checkpoint layer. Every method is collective (every rank, same order) unless it
// says otherwise; one thread of a rank uses a SaveRanks at a time.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/hdf5/h5_util.h"
#include "strata/comm/group.h"

namespace strata::checkpoint::detail {

class SaveRanks {
 public:
  enum class Op { kMin, kMax, kSum };

  // `what` starts the message of a timeout of the group's collectives ("checkpoint save").
  SaveRanks(comm::Group& group, double timeout_s, std::string what);

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Whether every rank writes into one MPI-IO file; otherwise rank 0 writes the whole file.
  bool parallel() const { return mpi_ != MPI_COMM_NULL; }
  // The communicator of a parallel save (MPI_COMM_NULL otherwise).
  MPI_Comm mpi() const { return mpi_; }

  // The lowest rank whose `local` is non-empty and its message (at most 64 KiB of it), on every
  // rank; {-1, ""} when every rank's is empty.
  std::pair<int, std::string> first_error(const std::string& local);

  // Element-wise over every rank (same length everywhere); the result on every rank.
  template <typename T>
  void allreduce(std::vector<T>& values, Op op);
  // As allreduce, the result on rank 0 only (the others' `values` unchanged).
  template <typename T>
  void reduce_to_root(std::vector<T>& values, Op op);
  // Every rank's `mine` (the same length everywhere), in rank order, on every rank.
  template <typename T>
  std::vector<T> allgather(const std::vector<T>& mine);
  // Every rank's `mine` (any length), concatenated in rank order, on rank 0; empty elsewhere.
  template <typename T>
  std::vector<T> gather(const std::vector<T>& mine);
  // Rank `root`'s `values` into every rank's (the same length everywhere).
  template <typename T>
  void broadcast(std::vector<T>& values, int root);
  void barrier();
  // Whether every rank passed the same `text` (compared by length and CRC-32).
  bool same_on_every_rank(const std::string& text);

  // Not parallel only: every rank's `blob`, in rank order, on rank 0 (rank 0's own at index 0);
  // empty elsewhere. The bytes travel as the group's messages (rank 0 receives them one rank after
  // the other, each within `timeout_s`).
  std::vector<std::string> gather_blobs(std::string blob);

  // Creates (truncating) `path` with a user block of `userblock_bytes`: parallel, the MPI-IO file
  // of every rank (create_parallel_file, `hints`); otherwise rank 0's file (sec2 driver, `hints`
  // unused) and an empty H5Id on the other ranks, without a collective. Throws Hdf5Error.
  H5Id create_file(const std::string& path, hsize_t userblock_bytes, const std::vector<MpiIoHint>& hints);
  // The transfer properties of a piece's H5Dwrite: independent MPI-IO when parallel.
  H5Id piece_transfer() const;

 private:
  comm::Deadline deadline() const;

  comm::Group& group_;
  MPI_Comm mpi_;
  int rank_ = 0, size_ = 1;
  double timeout_s_;
  std::string what_;
};

}  // namespace strata::checkpoint::detail
