// MPI-IO hints for the checkpoint files written with parallel HDF5 (ckpt-<step>.h5 and
// dynamic-<step>.h5 of a training job's PS ranks): STRATA_MPIIO_HINTS="key=value[,key=value...]".
// Every pair is set on the MPI_Info that H5Pset_fapl_mpio hands to MPI_File_open, so a user tunes
// the MPI library's file layer (striping_factor, striping_unit, romio_cb_write, cb_nodes,
// cb_buffer_size, ...) the way the MPI and file-system documentation describes. strata does not
// interpret the keys: which ones the MPI library's io component honours, and which apply only when
// a file is created (striping on Lustre), is theirs to say. Files read for a restore are opened
// without MPI-IO, so the hints never apply to them.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace strata {
class Env;
}

namespace strata::checkpoint {

inline constexpr char kMpiIoHintsVar[] = "STRATA_MPIIO_HINTS";
// More pairs than any MPI-IO tuning needs; the bound keeps a hostile value from growing an
// MPI_Info (and every file open) without limit.
inline constexpr std::size_t kMaxMpiIoHints = 64;

struct MpiIoHint {
  std::string key;
  std::string value;
  bool operator==(const MpiIoHint& o) const { return key == o.key && value == o.value; }
};

// Parses "key=value[,key=value...]" in the order given. Blanks (spaces, tabs) around a key or a
// value are dropped; empty or blank text means no hints. ConfigError, one line naming `what` and
// quoting the offending pair (bytes outside printable ASCII escaped, long pairs shortened), when:
// a pair is empty (",," or a trailing ','), has no '=' or more than one, has an empty key or
// value, a key longer than MPI_MAX_INFO_KEY - 1 or a value longer than MPI_MAX_INFO_VAL - 1
// characters (what MPI_Info_set accepts), a key or value holding anything but printable ASCII
// without blanks, a key given twice, or there are more than kMaxMpiIoHints pairs. Needs no MPI
// initialisation.
std::vector<MpiIoHint> parse_mpiio_hints(std::string_view text, std::string_view what = kMpiIoHintsVar);

// The hints of STRATA_MPIIO_HINTS in `env` (none when unset or empty); ConfigError as above.
std::vector<MpiIoHint> mpiio_hints_from_env(const Env& env);

// "key=value,key=value" (the variable's own syntax; "" for none), for messages and logs.
std::string format_mpiio_hints(const std::vector<MpiIoHint>& hints);

}  // namespace strata::checkpoint
