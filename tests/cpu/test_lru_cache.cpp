// CPU tier: LruCache driven by fake builders — counters, LRU order, single flight, failures, events.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "fusedattn/lru_cache.h"

namespace fusedattn {
namespace {

using Cache = LruCache<int, std::string>;
using Ptr = Cache::ValuePtr;

// Long enough that a correct cache never hits it; a broken one fails instead of hanging.
constexpr auto kTimeout = std::chrono::seconds(5);

Ptr make_value(int key) { return std::make_shared<const std::string>("value " + std::to_string(key)); }

// A builder that counts its calls.
struct CountingBuilder {
  std::atomic<int>* calls;
  Ptr operator()(const int& key) const {
    ++*calls;
    return make_value(key);
  }
};

// A one-shot signal that threads can wait on with a timeout.
class Event {
 public:
  void set() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      set_ = true;
    }
    cv_.notify_all();
  }
  bool wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, kTimeout, [&] { return set_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool set_ = false;
};

TEST(LruCache, CountsHitsMissesAndBuilds) {
  Cache cache(4);
  std::atomic<int> calls{0};
  const Ptr first = cache.get_or_build(1, CountingBuilder{&calls});
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(*first, "value 1");
  CacheStats s = cache.stats();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.builds, 1u);
  EXPECT_EQ(s.hits, 0u);
  EXPECT_EQ(s.failed_builds, 0u);
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_EQ(s.size, 1u);
  EXPECT_EQ(s.capacity, 4u);
  EXPECT_GE(s.build_ms, 0.0);

  const Ptr again = cache.get_or_build(1, CountingBuilder{&calls});
  EXPECT_EQ(again.get(), first.get());  // the same object, not an equal copy
  cache.get_or_build(2, CountingBuilder{&calls});
  s = cache.stats();
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.builds, 2u);
  EXPECT_EQ(s.size, 2u);
}

TEST(LruCache, EvictsLeastRecentlyUsed) {
  Cache cache(2);
  std::atomic<int> calls{0};
  cache.get_or_build(1, CountingBuilder{&calls});
  cache.get_or_build(2, CountingBuilder{&calls});
  cache.get_or_build(1, CountingBuilder{&calls});  // touching 1 makes 2 the oldest
  cache.get_or_build(3, CountingBuilder{&calls});
  EXPECT_NE(cache.peek(1), nullptr);
  EXPECT_EQ(cache.peek(2), nullptr);
  EXPECT_NE(cache.peek(3), nullptr);
  EXPECT_EQ(cache.stats().evictions, 1u);
  EXPECT_EQ(cache.stats().size, 2u);

  cache.get_or_build(2, CountingBuilder{&calls});  // rebuilt; now 1 is the oldest
  EXPECT_EQ(calls.load(), 4);
  EXPECT_EQ(cache.peek(1), nullptr);
  EXPECT_NE(cache.peek(3), nullptr);
  EXPECT_EQ(cache.stats().evictions, 2u);
}

TEST(LruCache, ShrinkingCapacityEvictsOldestFirst) {
  Cache cache(4);
  std::atomic<int> calls{0};
  for (int key = 1; key <= 4; ++key) cache.get_or_build(key, CountingBuilder{&calls});
  cache.get_or_build(1, CountingBuilder{&calls});  // order, newest first: 1 4 3 2
  cache.set_capacity(2);
  EXPECT_EQ(cache.stats().evictions, 2u);
  EXPECT_EQ(cache.stats().size, 2u);
  EXPECT_EQ(cache.stats().capacity, 2u);
  EXPECT_EQ(cache.peek(2), nullptr);
  EXPECT_EQ(cache.peek(3), nullptr);
  EXPECT_NE(cache.peek(1), nullptr);
  EXPECT_NE(cache.peek(4), nullptr);

  cache.set_capacity(0);  // clamped to 1
  EXPECT_EQ(cache.stats().capacity, 1u);
  EXPECT_EQ(cache.stats().size, 1u);
  EXPECT_NE(cache.peek(1), nullptr);
  EXPECT_EQ(Cache(0).stats().capacity, 1u);
}

// 16 threads miss the same key together: one slow build, and everyone gets its result.
TEST(LruCache, SingleFlightBuildsOnce) {
  Cache cache(8);
  std::atomic<int> calls{0};
  Event go;
  constexpr int kThreads = 16;
  std::vector<Ptr> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      go.wait();
      results[t] = cache.get_or_build(5, [&](const int& key) {
        ++calls;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return make_value(key);
      });
    });
  }
  go.set();
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(calls.load(), 1);
  ASSERT_NE(results[0], nullptr);
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(results[t].get(), results[0].get()) << "thread " << t;
  const CacheStats s = cache.stats();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.builds, 1u);
  EXPECT_EQ(s.hits, static_cast<std::uint64_t>(kThreads - 1));
  EXPECT_GE(s.build_ms, 40.0);
}

// Builds of different keys must not serialize: each builder waits until the other has started,
// which only succeeds when both run at the same time.
TEST(LruCache, DistinctKeysBuildConcurrently) {
  Cache cache(8);
  Event a_started, b_started;
  bool a_saw_b = false, b_saw_a = false;
  std::thread a([&] {
    cache.get_or_build(1, [&](const int& key) {
      a_started.set();
      a_saw_b = b_started.wait();
      return make_value(key);
    });
  });
  std::thread b([&] {
    cache.get_or_build(2, [&](const int& key) {
      b_started.set();
      b_saw_a = a_started.wait();
      return make_value(key);
    });
  });
  a.join();
  b.join();
  EXPECT_TRUE(a_saw_b);
  EXPECT_TRUE(b_saw_a);
  EXPECT_EQ(cache.stats().builds, 2u);
}

// A build that throws reaches its caller and everyone waiting on it, is not cached, and the next
// lookup builds again.
TEST(LruCache, FailedBuildPropagatesAndIsRetried) {
  Cache cache(4);
  Event entered;
  std::atomic<int> second_builder_calls{0};
  std::string first_error, waiter_error;
  std::thread first([&] {
    try {
      cache.get_or_build(7, [&](const int&) -> Ptr {
        entered.set();
        // Fail only once the other thread is waiting on this build (it counts as a hit first).
        const auto deadline = std::chrono::steady_clock::now() + kTimeout;
        while (cache.stats().hits < 1 && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        throw std::runtime_error("boom");
      });
    } catch (const std::runtime_error& e) {
      first_error = e.what();
    }
  });
  std::thread waiter([&] {
    ASSERT_TRUE(entered.wait());
    try {
      cache.get_or_build(7, [&](const int& key) {
        ++second_builder_calls;
        return make_value(key);
      });
    } catch (const std::runtime_error& e) {
      waiter_error = e.what();
    }
  });
  first.join();
  waiter.join();
  EXPECT_EQ(first_error, "boom");
  EXPECT_EQ(waiter_error, "boom");
  EXPECT_EQ(second_builder_calls.load(), 0);
  EXPECT_EQ(cache.peek(7), nullptr);
  CacheStats s = cache.stats();
  EXPECT_EQ(s.failed_builds, 1u);
  EXPECT_EQ(s.builds, 0u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.size, 0u);

  std::atomic<int> calls{0};
  const Ptr value = cache.get_or_build(7, CountingBuilder{&calls});
  ASSERT_NE(value, nullptr);
  EXPECT_EQ(*value, "value 7");
  EXPECT_EQ(calls.load(), 1);
  s = cache.stats();
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.builds, 1u);
}

TEST(LruCache, ClearDropsEntriesAndZeroesCounters) {
  Cache cache(3);
  std::atomic<int> calls{0};
  cache.get_or_build(1, CountingBuilder{&calls});
  cache.get_or_build(2, CountingBuilder{&calls});
  cache.get_or_build(1, CountingBuilder{&calls});
  cache.clear();
  const CacheStats s = cache.stats();
  EXPECT_EQ(s.hits, 0u);
  EXPECT_EQ(s.misses, 0u);
  EXPECT_EQ(s.builds, 0u);
  EXPECT_EQ(s.failed_builds, 0u);
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_EQ(s.build_ms, 0.0);
  EXPECT_EQ(s.size, 0u);
  EXPECT_EQ(s.capacity, 3u);
  EXPECT_EQ(cache.peek(1), nullptr);
  cache.get_or_build(1, CountingBuilder{&calls});
  EXPECT_EQ(calls.load(), 3);
  EXPECT_EQ(cache.stats().misses, 1u);
}

TEST(LruCache, ListenerSeesEventsInOrder) {
  Cache cache(2);
  using Seen = std::tuple<CacheEvent, int>;
  std::vector<Seen> seen;
  std::vector<double> other_ms;
  cache.set_listener([&](CacheEvent event, const int& key, double ms) {
    seen.emplace_back(event, key);
    if (event != CacheEvent::build && event != CacheEvent::build_failed) other_ms.push_back(ms);
  });
  std::atomic<int> calls{0};
  cache.get_or_build(1, CountingBuilder{&calls});
  cache.get_or_build(2, CountingBuilder{&calls});
  cache.get_or_build(1, CountingBuilder{&calls});
  cache.get_or_build(3, CountingBuilder{&calls});  // evicts 2, the oldest
  EXPECT_THROW(cache.get_or_build(4, [](const int&) -> Ptr { throw std::runtime_error("no"); }), std::runtime_error);
  const std::vector<Seen> expected = {
      {CacheEvent::miss, 1},     {CacheEvent::build, 1},     {CacheEvent::miss, 2},
      {CacheEvent::build, 2},    {CacheEvent::hit, 1},       {CacheEvent::miss, 3},
      {CacheEvent::eviction, 2}, {CacheEvent::build, 3},     {CacheEvent::miss, 4},
      {CacheEvent::eviction, 1}, {CacheEvent::build_failed, 4},
  };
  EXPECT_EQ(seen, expected);
  for (double ms : other_ms) EXPECT_EQ(ms, 0.0);

  cache.set_listener({});  // removed: nothing more arrives
  cache.get_or_build(5, CountingBuilder{&calls});
  EXPECT_EQ(seen.size(), expected.size());
}

TEST(LruCache, PeekNeitherBuildsNorCounts) {
  Cache cache(4);
  EXPECT_EQ(cache.peek(1), nullptr);
  CacheStats s = cache.stats();
  EXPECT_EQ(s.hits + s.misses + s.builds, 0u);
  EXPECT_EQ(s.size, 0u);

  std::atomic<int> calls{0};
  const Ptr built = cache.get_or_build(1, CountingBuilder{&calls});
  EXPECT_EQ(cache.peek(1).get(), built.get());
  s = cache.stats();
  EXPECT_EQ(s.hits, 0u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(calls.load(), 1);

  // An entry still being built is not visible to peek.
  Event building, release;
  std::thread slow([&] {
    cache.get_or_build(2, [&](const int& key) {
      building.set();
      release.wait();
      return make_value(key);
    });
  });
  ASSERT_TRUE(building.wait());
  EXPECT_EQ(cache.peek(2), nullptr);
  release.set();
  slow.join();
  EXPECT_NE(cache.peek(2), nullptr);
}

}  // namespace
}  // namespace fusedattn
