// fusedattn/lru_cache.h — a bounded, thread-safe LRU map whose misses are built exactly once.
//
// The plan cache is one instance of this; tests drive it with fake builders. Single flight: when
// several threads miss the same key at once, one builds and the others wait for its result. A
// build that throws is not cached (its waiters see the same exception, a later call tries
// again); answers that are data, such as "not supported", are values and are cached like plans.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace fusedattn {

/// Counters of one cache, read together.
struct CacheStats {
  std::uint64_t hits = 0;           ///< lookups answered from the cache (including ones that waited on a build)
  std::uint64_t misses = 0;         ///< lookups that started a build
  std::uint64_t builds = 0;         ///< builds that finished with a value
  std::uint64_t failed_builds = 0;  ///< builds that threw
  std::uint64_t evictions = 0;      ///< entries dropped to stay within capacity
  double build_ms = 0.0;            ///< wall time spent in builds, successful or not
  std::size_t size = 0;             ///< entries held now
  std::size_t capacity = 0;         ///< most entries held at once
};

/// What the optional listener is told about. Hits are reported too, so keep listeners cheap.
enum class CacheEvent { hit, miss, build, build_failed, eviction };
const char* to_string(CacheEvent event) noexcept;

template <class Key, class Value, class Hash = std::hash<Key>>
class LruCache {
 public:
  using ValuePtr = std::shared_ptr<const Value>;
  /// Called with the event, the key, and the build time in milliseconds (0 for other events).
  using Listener = std::function<void(CacheEvent, const Key&, double)>;

  explicit LruCache(std::size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}
  LruCache(const LruCache&) = delete;
  LruCache& operator=(const LruCache&) = delete;

  /// The value for `key`, building it with `build(key)` (which returns a ValuePtr) on a miss.
  template <class Build>
  ValuePtr get_or_build(const Key& key, Build&& build) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto found = index_.find(key);
    if (found != index_.end()) {
      std::shared_ptr<Slot> slot = found->second->slot;
      lru_.splice(lru_.begin(), lru_, found->second);
      ++stats_.hits;
      if (listener_) listener_(CacheEvent::hit, key, 0.0);
      built_.wait(lock, [&] { return slot->ready; });
      if (slot->error) std::rethrow_exception(slot->error);
      return slot->value;
    }
    ++stats_.misses;
    auto slot = std::make_shared<Slot>();
    lru_.push_front(Entry{key, slot});
    index_.emplace(key, lru_.begin());
    if (listener_) listener_(CacheEvent::miss, key, 0.0);
    evict_over_capacity();
    lock.unlock();

    auto start = std::chrono::steady_clock::now();
    ValuePtr value;
    std::exception_ptr error;
    try {
      value = build(key);
    } catch (...) {
      error = std::current_exception();
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

    lock.lock();
    stats_.build_ms += ms;
    slot->ready = true;
    slot->value = value;
    slot->error = error;
    if (error) {
      ++stats_.failed_builds;
      erase_if_current(key, slot);  // not cached: the next caller retries
    } else {
      ++stats_.builds;
    }
    if (listener_) listener_(error ? CacheEvent::build_failed : CacheEvent::build, key, ms);
    lock.unlock();
    built_.notify_all();
    if (error) std::rethrow_exception(error);
    return value;
  }

  /// The finished value for `key` if one is cached, without building or counting.
  ValuePtr peek(const Key& key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = index_.find(key);
    if (found == index_.end() || !found->second->slot->ready) return nullptr;
    return found->second->slot->value;
  }

  CacheStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    CacheStats out = stats_;
    out.size = lru_.size();
    out.capacity = capacity_;
    return out;
  }

  /// Drops every finished entry and zeroes the counters (builds in flight finish normally).
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = lru_.begin(); it != lru_.end();) {
      if (it->slot->ready) {
        index_.erase(it->key);
        it = lru_.erase(it);
      } else {
        ++it;
      }
    }
    stats_ = CacheStats{};
  }

  void set_capacity(std::size_t capacity) {
    std::lock_guard<std::mutex> lock(mutex_);
    capacity_ = capacity < 1 ? 1 : capacity;
    evict_over_capacity();
  }

  /// Installs (or, with an empty function, removes) the event listener. It runs under the cache's
  /// lock, so it must not call back into the cache.
  void set_listener(Listener listener) {
    std::lock_guard<std::mutex> lock(mutex_);
    listener_ = std::move(listener);
  }

 private:
  struct Slot {
    bool ready = false;  // guarded by mutex_
    ValuePtr value;
    std::exception_ptr error;
  };
  struct Entry {
    Key key;
    std::shared_ptr<Slot> slot;
  };

  // Evicts least recently used finished entries. Entries still building are skipped: their
  // waiters hold the slot, and evicting them would only start a duplicate build.
  void evict_over_capacity() {
    auto it = lru_.end();
    while (lru_.size() > capacity_ && it != lru_.begin()) {
      --it;
      if (!it->slot->ready) continue;
      if (listener_) listener_(CacheEvent::eviction, it->key, 0.0);
      index_.erase(it->key);
      it = lru_.erase(it);
      ++stats_.evictions;
    }
  }

  void erase_if_current(const Key& key, const std::shared_ptr<Slot>& slot) {
    auto found = index_.find(key);
    if (found == index_.end() || found->second->slot != slot) return;
    lru_.erase(found->second);
    index_.erase(found);
  }

  mutable std::mutex mutex_;
  std::condition_variable built_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<Key, typename std::list<Entry>::iterator, Hash> index_;
  std::size_t capacity_;
  CacheStats stats_;
  Listener listener_;
};

}  // namespace fusedattn
