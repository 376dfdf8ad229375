// Preemption signals (README.md, "Checkpoints"): SIGTERM and SIGUSR1 ask a job to stop at the next step
// boundary after saving a checkpoint, instead of dying mid-step. The handler only records the
// signal (async-signal-safe: one lock-free atomic store); the training loop and the PS service
// loop poll preemption_signal() and agree on it through the parameter servers.
//
// Slurm sends SIGTERM on scancel/preemption and, with `--signal=B:USR1@T`, SIGUSR1 to the batch
// shell, which slurm/strata-preempt.sbatch relays to every rank. A job that was asked to stop and
// saved exits with kExitPreempted, which the sbatch script turns into `scontrol requeue`.
#pragma once

namespace strata {

// EX_TEMPFAIL from <sysexits.h>: "stopped early after a checkpoint; run me again".
inline constexpr int kExitPreempted = 75;

// Installs handlers for SIGTERM and SIGUSR1 in this process (idempotent). Not thread-safe against
// itself; call once from the main thread before training starts.
void install_preemption_handlers();
// 0 when no preemption signal arrived, else the number of the first one. Thread-safe.
int preemption_signal();
// Test hook and programmatic preemption: behaves as if `signo` had been delivered.
void raise_preemption(int signo);

}  // namespace strata
