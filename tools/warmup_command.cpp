// `fusedattn warmup [SPEC] [--file FILE]`: plans built ahead of time, in parallel, into the
// memory and disk caches, with the time each took.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "commands.h"
#include "common.h"
#include "progress.h"
#include "fusedattn/autotune.h"
#include "fusedattn/disk_cache.h"
#include "fusedattn/ragged.h"
#include "fusedattn/warmup.h"

namespace fusedattn::cli {
namespace {

// The spec argument and each line of --file ('-': standard input; blank lines and # comments
// skipped), every ragged spec's buckets too with --buckets.
std::vector<AttentionSpec> warmup_specs(const CommandLine& line) {
  std::vector<std::string> texts;
  if (!line.spec.empty()) texts.push_back(line.spec);
  if (line.has("--file")) {
    const std::string path = line.text("--file");
    std::ifstream file;
    if (path != "-") {
      file.open(path);
      if (!file) throw UsageError{"--file: cannot read '" + path + "'"};
    }
    std::istream& in = path == "-" ? std::cin : file;
    for (std::string text; std::getline(in, text);) {
      const std::size_t first = text.find_first_not_of(" \t");
      if (first == std::string::npos || text[first] == '#') continue;
      texts.push_back(text);
    }
  }
  if (texts.empty()) throw UsageError{"'warmup' needs a spec string or --file"};
  std::vector<AttentionSpec> specs;
  for (const std::string& text : texts) {
    const AttentionSpec spec = parse_spec(text);
    validate(spec);
    if (!line.has("--buckets")) {
      specs.push_back(spec);
      continue;
    }
    for (const AttentionSpec& bucket : ragged_buckets(spec)) specs.push_back(bucket);
  }
  return specs;
}

}  // namespace

int warmup_command(const CommandLine& line) {
  const std::vector<Pass> asked = passes(line);
  const std::vector<AttentionSpec> specs = warmup_specs(line);
  const std::string no_gpu = gpu_unavailable();
  if (!no_gpu.empty()) {
    std::cout << "no GPU (" << no_gpu << "): " << specs.size() << " specs parsed, nothing built\n";
    return kNoGpu;
  }
  WarmupOptions options;
  options.threads = static_cast<int>(line.count("--threads", 0));
  Progress progress("warmup", "plans", specs.size() * asked.size());
  options.progress = [&](std::size_t done, std::size_t) { progress.update(done); };
  const auto start = std::chrono::steady_clock::now();
  const std::vector<WarmupResult> results = warm_up(specs, asked, options);
  const double total_ms = ms_since(start);
  progress.finish();
  int ready = 0;
  for (const WarmupResult& r : results) {
    char head[64];
    std::snprintf(head, sizeof head, "%-13s %9.1f ms  %-8s ", r.ok ? "ready" : "not supported", r.ms,
                  to_string(r.pass));
    std::cout << head << quoted(r.spec) << "\n";
    if (!r.ok) std::cout << "  " << r.message << "\n";
    ready += r.ok ? 1 : 0;
  }
  const DiskCacheStats disk = disk_cache_stats();
  const std::string folder = plan_dir();
  std::cout << "warmup: " << ready << " of " << results.size() << " plans ready in " << total_ms << " ms"
            << (autotune_default() ? " (autotuned)" : "") << "\n"
            << "disk cache " << (folder.empty() ? std::string("off") : folder) << ": loaded=" << disk.loaded
            << " (" << disk.load_ms << " ms) stored=" << disk.stored << " missing=" << disk.missing
            << " rejected=" << disk.rejected << " store_failures=" << disk.store_failures << "\n";
  return ready == static_cast<int>(results.size()) ? kOk : kFailed;
}

}  // namespace fusedattn::cli
