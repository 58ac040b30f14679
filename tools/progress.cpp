// Progress lines on stderr at a modest rate (progress.h).
#include "progress.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace fusedattn::cli {
namespace {

constexpr double kDefaultEverySeconds = 2.0;

// FUSEDATTN_PROGRESS_SECONDS: seconds between lines, or "off" (-1); anything else, the default.
double seconds_between_lines() {
  const char* text = std::getenv("FUSEDATTN_PROGRESS_SECONDS");
  if (text == nullptr || *text == '\0') return kDefaultEverySeconds;
  if (std::strcmp(text, "off") == 0) return -1.0;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  return *end == '\0' && seconds >= 0.0 ? seconds : kDefaultEverySeconds;
}

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Progress::Progress(std::string task, std::string unit, std::size_t total)
    : task_(std::move(task)), unit_(std::move(unit)), total_(total), every_s_(seconds_between_lines()),
      start_(std::chrono::steady_clock::now()), last_line_(start_) {}

void Progress::update(std::size_t done, const std::string& note) {
  std::lock_guard<std::mutex> lock(mutex_);
  done_ = done;
  print_if_due(note);
}

void Progress::advance(const std::string& note) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++done_;
  print_if_due(note);
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (any_line_) print("done");
}

void Progress::print_if_due(const std::string& note) {
  if (every_s_ < 0.0 || seconds_between(last_line_, std::chrono::steady_clock::now()) < every_s_) return;
  print(note);
}

void Progress::print(const std::string& note) {
  last_line_ = std::chrono::steady_clock::now();
  std::fprintf(stderr, "%s: %zu/%zu %s (%.0f s)%s%s\n", task_.c_str(), done_, total_, unit_.c_str(),
               seconds_between(start_, last_line_), note.empty() ? "" : ": ", note.c_str());
  any_line_ = true;
}

}  // namespace fusedattn::cli
