#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <caf/actor_addr.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>
#include "spindle/messages/options.hpp"

namespace spindle {

/// The bookkeeping of virtual actors, shared by the thread registry and the
/// context directory: a key (a thread ID) maps to an actor that is resident,
/// in transit (being loaded, created or passivated) or stored only.
///
/// - `resolve(key, create, next)` calls `next` with the resident actor, or
///   loads it through the `load` hook first (one load however many
///   requests arrive meanwhile; they wait in arrival order).
/// - `passivate(key)` asks the actor through the `passivate` hook to stop
///   if idle; requests arriving meanwhile wait, and load it again if it
///   stopped. `shed()` keeps at most `max_resident` actors, least recently
///   used first; `passivate_idle()` passivates actors unused for
///   `idle_timeout`.
///
/// Without persistence (`durable == false`) nothing is ever passivated and
/// `load` is only asked to create. Not thread-safe: it lives in the state
/// of one actor, whose hooks run in that actor's context.
template <class Handle>
class activation_table {
public:
  using clock = std::chrono::steady_clock;

  struct resolved {
    /// Invalid when the key does not exist (and was not to be created).
    Handle handle;
    /// This request created it.
    bool created = false;
  };

  using continuation = std::function<void(caf::expected<resolved>)>;

  /// Asks an actor to stop; `done(true)` once it stopped (or is gone),
  /// `done(false)` if it stays.
  using passivate_hook
    = std::function<void(const Handle& handle, std::function<void(bool)> done)>;

  struct hooks {
    /// Loads `key` (creating it when `create`), spawns and monitors its
    /// actor, then calls `done` with it; with an invalid handle when it
    /// does not exist and `create` is false.
    std::function<void(const std::string& key, bool create, continuation done)>
      load;
    /// Asks `handle` to stop if idle; calls `done(true)` once it stopped
    /// (or is gone), `done(false)` if it is busy and stays.
    passivate_hook passivate;
  };

  activation_table() = default;

  void init(bool durable, activation_options options, hooks h) {
    durable_ = durable;
    options_ = options;
    hooks_ = std::move(h);
  }

  bool durable() const noexcept {
    return durable_;
  }

  const activation_options& options() const noexcept {
    return options_;
  }

  void resolve(const std::string& key, bool create, continuation next) {
    if (auto i = resident_.find(key); i != resident_.end()) {
      touch(i->second);
      next(resolved{i->second.handle, false});
      return;
    }
    if (auto i = transit_.find(key); i != transit_.end()) {
      i->second.push_back({create, std::move(next)});
      return;
    }
    if (!durable_ && !create) {
      next(resolved{});
      return;
    }
    transit_[key].push_back({create, std::move(next)});
    load(key);
  }

  /// The resident actor of `key`, marked as just used; invalid if it is
  /// not resident (then `resolve` it). The fast path of every request.
  Handle use(const std::string& key) {
    auto i = resident_.find(key);
    if (i == resident_.end())
      return Handle{};
    touch(i->second);
    return i->second.handle;
  }

  /// The resident actor of `key`, if any (no load, no LRU update).
  Handle find(const std::string& key) const {
    auto i = resident_.find(key);
    return i == resident_.end() ? Handle{} : i->second.handle;
  }

  /// True while `key` is being loaded, created or passivated.
  bool in_transit(const std::string& key) const {
    return transit_.count(key) != 0;
  }

  /// Requests that wait for `key`, for an owner that creates it itself
  /// (a fork): mark it in transit, then call `admit` or `fail`.
  void reserve(const std::string& key, continuation next) {
    transit_[key].push_back({true, std::move(next)});
  }

  /// Settles `key` with a freshly spawned actor (or an error) and answers
  /// its waiting requests.
  void settle(const std::string& key, caf::expected<resolved> r) {
    if (r && r->handle) {
      lru_.push_front(key);
      resident_[key] = entry{r->handle, lru_.begin(), clock::now()};
      keys_[r->handle.address()] = key;
      if (!r->created)
        ++activations_;
    }
    finish(key, std::move(r));
    shed();
  }

  /// Forgets the actor that sent a down message (it failed or stopped);
  /// returns its key if it was resident.
  std::pair<bool, std::string> down(const caf::actor_addr& source) {
    auto i = keys_.find(source);
    if (i == keys_.end())
      return {false, {}};
    auto key = std::move(i->second);
    keys_.erase(i);
    auto j = resident_.find(key);
    if (j == resident_.end() || j->second.handle.address() != source)
      return {false, key}; // passivated, or already replaced
    lru_.erase(j->second.lru);
    resident_.erase(j);
    return {true, key};
  }

  void passivate(std::string key) { // by value: it may be an LRU node
    stop(std::move(key), hooks_.passivate, true);
  }

  /// Stops the resident actor of `key` through `hook` instead of the
  /// passivate hook (a deletion): requests for `key` arriving meanwhile
  /// wait, and once `hook` reports the actor stopped they load `key` again
  /// (finding whatever the store holds then).
  void retire(std::string key, passivate_hook hook) {
    stop(std::move(key), std::move(hook), false);
  }

private:
  void stop(std::string key, passivate_hook hook, bool passivation) {
    auto i = resident_.find(key);
    if (i == resident_.end())
      return;
    auto handle = i->second.handle;
    lru_.erase(i->second.lru);
    resident_.erase(i);
    transit_[key]; // requests for it wait from now on
    passivating_.emplace(key, handle);
    hook(handle, [this, key, handle, passivation](bool stopped) {
      passivating_.erase(key);
      if (!stopped) {
        // Busy: it stays, as the most recently used.
        lru_.push_front(key);
        resident_[key] = entry{handle, lru_.begin(), clock::now()};
        finish(key, resolved{handle, false});
        return;
      }
      if (passivation)
        ++passivations_;
      auto& waiting = transit_[key];
      if (waiting.empty())
        transit_.erase(key);
      else
        load(key);
    });
  }

public:
  void shed() {
    if (!durable_ || options_.max_resident == 0)
      return;
    auto excess = resident_.size() > options_.max_resident
                    ? resident_.size() - options_.max_resident
                    : 0;
    while (excess-- > 0 && !lru_.empty())
      passivate(lru_.back());
  }

  void passivate_idle() {
    if (!durable_ || options_.idle_timeout.count() == 0)
      return;
    auto deadline = clock::now() - options_.idle_timeout;
    while (!lru_.empty() && resident_.at(lru_.back()).used <= deadline)
      passivate(lru_.back());
  }

  /// How often `passivate_idle` should run.
  std::chrono::milliseconds tick_interval() const {
    using namespace std::chrono;
    return std::clamp<milliseconds>(options_.idle_timeout / 4,
                                    milliseconds{10}, milliseconds{5000});
  }

  /// Every actor in memory, resident or being passivated.
  template <class F>
  void for_each_actor(F f) const {
    for (auto& kvp : resident_)
      f(kvp.first, kvp.second.handle);
    for (auto& kvp : passivating_)
      f(kvp.first, kvp.second);
  }

  uint64_t resident() const noexcept {
    return resident_.size() + passivating_.size();
  }
  uint64_t activations() const noexcept {
    return activations_;
  }
  uint64_t passivations() const noexcept {
    return passivations_;
  }

private:
  struct waiter {
    bool create;
    continuation next;
  };

  struct entry {
    Handle handle;
    std::list<std::string>::iterator lru;
    clock::time_point used;
  };

  void touch(entry& e) {
    lru_.splice(lru_.begin(), lru_, e.lru);
    e.used = clock::now();
  }

  void load(const std::string& key) {
    auto& waiting = transit_[key];
    bool create = std::any_of(waiting.begin(), waiting.end(),
                              [](const waiter& w) { return w.create; });
    hooks_.load(key, create, [this, key](caf::expected<resolved> r) {
      settle(key, std::move(r));
    });
  }

  // Answers every request waiting for `key`, in arrival order; a creation
  // is reported to the first request that asked for one.
  void finish(const std::string& key, caf::expected<resolved> r) {
    auto i = transit_.find(key);
    if (i == transit_.end())
      return;
    auto waiting = std::move(i->second);
    transit_.erase(i);
    if (r && !r->handle) {
      // Not found by a load that was not to create: a request that does
      // create arrived while it ran (a read of a new thread, then its
      // first message). The others hear that it does not exist; the
      // creators wait for a load that creates it.
      std::vector<waiter> creators;
      for (auto& w : waiting) {
        if (w.create)
          creators.push_back(std::move(w));
        else
          w.next(resolved{});
      }
      if (!creators.empty() && transit_.count(key) == 0
          && resident_.count(key) == 0) {
        transit_[key] = std::move(creators);
        load(key);
      } else {
        for (auto& w : creators)
          resolve(key, true, std::move(w.next));
      }
      return;
    }
    bool created = r && r->created;
    for (auto& w : waiting) {
      if (!r) {
        w.next(r.error());
        continue;
      }
      w.next(resolved{r->handle, created && w.create});
      if (w.create)
        created = false;
    }
  }

  bool durable_ = false;
  activation_options options_;
  hooks hooks_;
  std::unordered_map<std::string, entry> resident_;
  std::list<std::string> lru_;
  std::unordered_map<std::string, std::vector<waiter>> transit_;
  std::unordered_map<std::string, Handle> passivating_;
  std::map<caf::actor_addr, std::string> keys_;
  uint64_t activations_ = 0;
  uint64_t passivations_ = 0;
};

} // namespace spindle
