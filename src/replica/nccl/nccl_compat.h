// The one place for NCCL version checks: every feature strata uses that is
// newer than the minimum gets a STRATA_NCCL_HAS_* macro here, and the code tests that macro instead
// of comparing NCCL_VERSION_CODE itself (nccl-tests scatters such comparisons through its files).
//
// Minimum: NCCL 2.7 (ncclCommGetAsyncError / ncclCommAbort are 2.4, in-place ncclBroadcast 2.x).
// Optional features, by the version that introduced them:
//   2.10  ncclAvg                        MEAN in one pass (else sum, then a scale kernel)
//   2.13  ncclGetLastError               the detailed text of the last failure in error messages
//   2.14  ncclConfig_t, blocking = 0,    non-blocking communicators: no NCCL call can block the
//         ncclInProgress, ncclCommFinalize  host, so every wait is bounded by the group's timeout
// The headers decide what is compiled; require_runtime_version() checks, when a group is created,
// that the libnccl loaded at run time is not older than the headers' features need.
#pragma once

#include "strata/config.h"

#if !STRATA_HAVE_NCCL
#error "built without NCCL"
#endif

#include <nccl.h>

#include <string>

#if !defined(NCCL_VERSION_CODE) || !defined(NCCL_VERSION)
#error "nccl.h defines no NCCL_VERSION_CODE: strata needs NCCL >= 2.7"
#elif NCCL_VERSION_CODE < NCCL_VERSION(2, 7, 0)
#error "strata needs NCCL >= 2.7"
#endif

#define STRATA_NCCL_HAS_AVG (NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0))
#define STRATA_NCCL_HAS_LAST_ERROR (NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0))
#define STRATA_NCCL_HAS_NONBLOCKING (NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0))

namespace strata::replica::nccl_compat {

// The NCCL version the headers describe, e.g. 22809 for 2.28.9.
constexpr int kHeaderVersion = NCCL_VERSION_CODE;

// Lowest libnccl version that provides every feature compiled in above.
constexpr int kRequiredRuntimeVersion =
#if STRATA_NCCL_HAS_NONBLOCKING
    NCCL_VERSION(2, 14, 0);
#elif STRATA_NCCL_HAS_LAST_ERROR
    NCCL_VERSION(2, 13, 0);
#elif STRATA_NCCL_HAS_AVG
    NCCL_VERSION(2, 10, 0);
#else
    NCCL_VERSION(2, 7, 0);
#endif

// ncclGetLastError where it exists, else "" (the caller then prints only ncclGetErrorString).
inline const char* last_error(ncclComm_t comm) {
#if STRATA_NCCL_HAS_LAST_ERROR
  const char* text = ncclGetLastError(comm);
  return text != nullptr ? text : "";
#else
  (void)comm;
  return "";
#endif
}

// True for the "still working" state of a non-blocking communicator; never true before 2.14.
inline bool in_progress(ncclResult_t rc) {
#if STRATA_NCCL_HAS_NONBLOCKING
  return rc == ncclInProgress;
#else
  (void)rc;
  return false;
#endif
}

// "2.28.9" from a version code (both encodings: 2.8.x and older use X*1000 + Y*100 + Z).
std::string version_string(int code);

// Throws strata::NcclError when the loaded libnccl is older than kRequiredRuntimeVersion (a
// symbol from a newer NCCL would otherwise fail in the middle of a run, or not at all but wrongly).
void require_runtime_version();

}  // namespace strata::replica::nccl_compat
