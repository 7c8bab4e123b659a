#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "spindle/messages/orchestration.hpp"
#include "spindle/messages/storage.hpp"

namespace spindle {

/// One change as the event stream (`GET /v1/events`) shows it.
struct event {
  /// Its place in the log: consecutive from 1, in publication order.
  uint64_t seq = 0;
  /// "task.completed", "thread.turn_appended", ... (docs/api.md, "Events").
  std::string type;
  /// The orchestration (task events) or the thread (thread events) it is
  /// about, for filters; empty when it is about neither.
  std::string orchestration;
  std::string thread;
  /// The tenant it belongs to (docs/tenants.md); empty: the default
  /// tenant. A subscriber sees only its tenant's events.
  std::string tenant;
  /// A JSON object.
  std::string data;
  /// The event as a text/event-stream frame (id, event, data), made once
  /// when it is published.
  std::string frame;
};

using event_ptr = std::shared_ptr<const event>;

/// The events of one process: a bounded backlog of the latest `capacity`
/// events and a dispatcher thread that tells subscribers about new ones.
///
/// Writers publish after their change committed (`publish_hook` runs in
/// the state store, in commit order), and pay the event's framing, a lock
/// and a push: fanning out is the dispatcher's work, never a writer's. The
/// dispatcher gathers what arrived for at least `coalesce` (longer with
/// many subscribers: a subscriber is woken at most once per round), then
/// wakes every subscriber that is not paused; a subscriber reads what it
/// has not seen from the backlog. Every `keepalive` it wakes them all even
/// without events. Thread-safe.
class event_log : public std::enable_shared_from_this<event_log> {
public:
  struct options {
    size_t capacity = 10000;
    std::chrono::milliseconds coalesce{5};
    std::chrono::milliseconds keepalive{15000};
  };

  event_log();
  explicit event_log(options opts);
  ~event_log();

  event_log(const event_log&) = delete;
  event_log& operator=(const event_log&) = delete;

  /// Appends `events` in order, numbering them.
  void publish(std::vector<event> events);

  /// What a subscriber reads: the events after `after` (at most `max`),
  /// oldest first, and where to read on. `reset` says that events after
  /// `after` were dropped from the backlog (or `after` is not of this
  /// log): `events` then starts at the oldest one kept.
  struct page {
    bool reset = false;
    uint64_t next_after = 0;
    std::vector<event_ptr> events;
  };
  page read(uint64_t after, size_t max) const;

  /// The same without copies: calls `visit` for each event, under the
  /// log's lock (so it must be quick and must not publish).
  struct scan_result {
    bool reset = false;
    uint64_t next_after = 0;
    size_t seen = 0;
  };
  scan_result scan(uint64_t after, size_t max,
                   const std::function<void(const event_ptr&)>& visit) const;

  /// The newest event's number (0 before the first).
  uint64_t last() const noexcept {
    return last_.load(std::memory_order_acquire);
  }
  /// The oldest kept event's number (last() + 1 when none is kept).
  uint64_t oldest() const;

  /// Tells this log's numbering from a previous process's: the time it
  /// started, in milliseconds since the Unix epoch. An event's ID is
  /// "EPOCH-SEQ".
  uint64_t epoch() const noexcept {
    return epoch_;
  }
  size_t capacity() const noexcept {
    return opts_.capacity;
  }

  /// What a round brings: the events after `from` up to `to`, and when a
  /// subscriber to every event exists, their frames in one string (one
  /// copy for all of them instead of a scan each; else null).
  struct round {
    uint64_t from = 0;
    uint64_t to = 0;
    std::shared_ptr<const std::string> frames;
  };

  /// A subscriber: `wake` runs on the dispatcher thread when events it
  /// watches arrived (or a keep-alive is due) and the subscription is not
  /// paused. Dropping the last reference unsubscribes; `wake` may be
  /// running meanwhile.
  class subscription {
  public:
    /// While paused (a slow client), the subscriber is not woken.
    void pause() noexcept {
      paused_.store(true, std::memory_order_release);
    }
    /// Resumes and has the subscriber woken in the next round.
    void resume();

  private:
    friend class event_log;
    std::function<void(const round&)> wake_;
    /// "" (every event), "o" + an orchestration, or "t" + a thread.
    std::string key_;
    std::atomic<bool> paused_{false};
    /// Woken in the next round whatever arrived (after a resume).
    std::atomic<bool> due_{false};
    std::weak_ptr<event_log> log_;
  };

  /// Subscribes to every event, or with `orchestration` or `thread` set,
  /// only to that one's: the others do not wake it.
  std::shared_ptr<subscription> subscribe(std::function<void(const round&)> wake,
                                          const std::string& orchestration = {},
                                          const std::string& thread = {});

  /// How many subscribers are attached.
  size_t subscribers() const;

private:
  void dispatch_loop();
  void poke();

  options opts_;
  uint64_t epoch_;
  std::atomic<uint64_t> last_{0};
  mutable std::mutex mx_;
  std::deque<event_ptr> backlog_;
  /// The last event a round has looked at (dispatcher only, under `mx_`).
  uint64_t dispatched_ = 0;
  std::vector<std::weak_ptr<subscription>> subs_;
  std::condition_variable cv_;
  bool dirty_ = false;
  bool stop_ = false;
  std::thread dispatcher_;
};

/// Publishes `events` once their write committed, on the state store's
/// thread, in commit order (a `write_hook`). A null log publishes nothing.
class publish_hook final : public write_hook {
public:
  publish_hook(std::shared_ptr<event_log> log, std::vector<event> events)
    : log_(std::move(log)), events_(std::move(events)) {
  }

  uint64_t committed(uint64_t changes) override {
    if (log_)
      log_->publish(std::move(events_));
    return changes;
  }

  caf::error failed(caf::error reason) override {
    return reason;
  }

private:
  std::shared_ptr<event_log> log_;
  std::vector<event> events_;
};

/// The data of a task event: its ID, state, worker, attempts, and the
/// extra JSON members `extra` (",\"k\":v..." or empty).
std::string task_event_data(const task_info& t, const std::string& extra = {});

/// A task event of `type` about `t`.
event task_event(std::string type, const task_info& t,
                 const std::string& extra = {});

/// A thread event of `type` about thread `thread`; `extra` as for
/// `task_event_data`.
event thread_event(std::string type, const std::string& thread,
                   const std::string& extra = {});

/// The hook that publishes `events` to `log` after its write committed.
inline write_hook_ptr publish_on_commit(std::shared_ptr<event_log> log,
                                        std::vector<event> events) {
  return std::make_shared<publish_hook>(std::move(log), std::move(events));
}

/// A JSON string literal of `text` (quoted and escaped).
std::string json_quote(const std::string& text);

} // namespace spindle
