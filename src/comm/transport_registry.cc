// The one file that knows which transports are compiled in (STYLE.md section 3): adding a backend
// is one line here, no static self-registration (a static library would drop it at link time).
#include "comm/mpi/mpi_rma_transport.h"
#include "strata/comm/registry.h"
#include "strata/common/error.h"
#include "strata/config.h"
#if STRATA_HAVE_UCX
#include "comm/ucx/ucx_transport.h"
#endif

namespace strata::comm {

std::vector<std::string> compiled_transports() {
  std::vector<std::string> names = {"mpi"};
#if STRATA_HAVE_UCX
  names.push_back("ucx");
#endif
  return names;
}

std::unique_ptr<Transport> create_transport(const std::string& name, MPI_Comm comm) {
  if (name == "mpi") return std::make_unique<mpi::MpiRmaTransport>(comm);
#if STRATA_HAVE_UCX
  if (name == "ucx") return std::make_unique<ucx::UcxTransport>(comm);
#endif
  std::string known;
  for (const auto& n : compiled_transports()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError("unknown transport '" + name + "' (this build has: " + known + ")");
}

}  // namespace strata::comm
