// fusedattn/autotune.h — choosing a plan by measurement instead of by cuDNN's heuristics.
//
// With autotune, a plan's first build compiles every plan cuDNN's heuristics offer for the spec,
// times each on the GPU with stand-in data of the spec's shapes (so no caller's memory is
// touched), and keeps the fastest. The choice is remembered in the disk cache
// (fusedattn/disk_cache.h), so each machine tunes a shape once; tuned and untuned plans are
// separate entries. Tuning synchronizes the GPU and takes about a second per plan: do it ahead of
// time (fusedattn/warmup.h, `fusedattn warmup --autotune`) or in the first step.
#pragma once

namespace fusedattn {

/// The process-wide default: FUSEDATTN_AUTOTUNE=1 turns it on (read once), set_autotune changes it.
bool autotune_default() noexcept;
/// Sets the default that PlanOptions take from now on; returns the previous one.
bool set_autotune(bool enabled) noexcept;

/// Whether get_plan times the candidates and keeps the fastest (on), or takes the heuristics' first (off).
enum class Autotune { process_default, off, on };

/// How get_plan picks a plan among those cuDNN offers.
struct PlanOptions {
  Autotune autotune = Autotune::process_default;  ///< process_default: autotune_default() decides
};

}  // namespace fusedattn
