// tools/progress.h — progress of long work on stderr ("warmup: 37/412 plans (12 s)"), so that a
// user sees it is moving while stdout keeps the result alone.
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>
#include <string>

namespace fusedattn::cli {

/// Lines at a modest rate: one when FUSEDATTN_PROGRESS_SECONDS (default 2) have passed since the
/// last, so hundreds of plans print a handful of lines and work shorter than that prints none. 0
/// prints a line for every item; "off" prints nothing. Safe to call from several threads.
class Progress {
 public:
  /// `task` names the work ("warmup"), `unit` its items ("plans"), `total` how many there are.
  Progress(std::string task, std::string unit, std::size_t total);

  /// `done` items are finished; `note` (optional) says what the last one was.
  void update(std::size_t done, const std::string& note = "");
  /// One more item is finished.
  void advance(const std::string& note = "");
  /// The closing line, "warmup: 412/412 plans (95 s): done", where a line came before it.
  void finish();

 private:
  void print_if_due(const std::string& note);  // these two under mutex_
  void print(const std::string& note);

  std::string task_, unit_;
  std::size_t total_;
  double every_s_;  // < 0: off
  std::chrono::steady_clock::time_point start_, last_line_;
  std::size_t done_ = 0;
  bool any_line_ = false;
  std::mutex mutex_;
};

}  // namespace fusedattn::cli
