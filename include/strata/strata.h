// strata: the public API in one include.
#pragma once

#include "strata/cluster/cluster_spec.h"
#include "strata/cluster/hostlist.h"
#include "strata/cluster/liveness.h"
#include "strata/cluster/resolve.h"
#include "strata/cluster/runtime.h"
#include "strata/common/env.h"
#include "strata/common/error.h"
#include "strata/common/logging.h"
#include "strata/common/parse.h"
#include "strata/common/rank_context.h"
#include "strata/ps/parameter_servers.h"
#include "strata/strategy/parameter_server_strategy.h"
#include "strata/config.h"
