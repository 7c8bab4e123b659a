#pragma once

// What spindle sends one upstream as a whole (docs/limits.md, "The
// upstream"): calls at once and tokens in any 60 s. When calls wait for
// that capacity, tenants are served by weighted fair queueing (start-time
// fair queueing on the tenants' weights: each backlogged tenant gets its
// weight's share of the calls sent, a lone tenant all of them), and each
// tenant's calls in arrival order. Event-driven: a call is sent when
// another ends, or when the tokens window frees (one timer thread, which
// sleeps until then). Thread-safe.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "admission/limiter.hpp"

namespace spindle::admission {

class upstream_queue;

/// A call holding the upstream's capacity until `settle` (or its
/// destruction, which charges nothing).
class upstream_slot {
public:
  ~upstream_slot();
  upstream_slot(const upstream_slot&) = delete;
  upstream_slot& operator=(const upstream_slot&) = delete;
  /// The call ended having used `tokens`. Once.
  void settle(uint64_t tokens);
  uint64_t reserved() const noexcept {
    return reserved_;
  }

private:
  friend class upstream_queue;
  upstream_slot(std::shared_ptr<upstream_queue> owner, uint64_t reserved)
    : owner_(std::move(owner)), reserved_(reserved) {
  }
  std::shared_ptr<upstream_queue> owner_;
  uint64_t reserved_;
  bool settled_ = false;
};

using upstream_slot_ptr = std::shared_ptr<upstream_slot>;

/// What `acquire` decided: the slot, or a place in the queue.
struct upstream_wait {
  upstream_slot_ptr slot;
  /// Queued: the handle to `withdraw` it by.
  uint64_t ticket = 0;
  /// Queued: its place in its tenant's queue (1: next of its tenant).
  uint64_t position = 0;
  /// Queued: calls waiting for the upstream, all tenants.
  uint64_t waiting = 0;
};

/// Runs once for a queued call when it is sent (never when withdrawn
/// first): on the thread that freed the capacity, outside the queue's
/// lock; must not block.
using upstream_callback
  = std::function<void(upstream_slot_ptr, int64_t waited_ms)>;

class upstream_queue : public std::enable_shared_from_this<upstream_queue> {
public:
  /// A tenant's weight (1 to 1000); called when a tenant starts waiting.
  using weight_fn = std::function<uint64_t(std::string_view tenant)>;

  static std::shared_ptr<upstream_queue>
  make(upstream_limits limits, weight_fn weight, limiter::clock_fn clock = {});
  ~upstream_queue();

  const upstream_limits& limits() const noexcept {
    return limits_;
  }

  /// A call of `tenant` reserving `tokens` asks to be sent.
  upstream_wait acquire(std::string_view tenant, uint64_t tokens,
                        upstream_callback then);
  /// Takes a queued call out (its client's deadline passed): false when
  /// it was sent already.
  bool withdraw(uint64_t ticket);
  /// Sends what the tokens window lets through now (the timer does this
  /// on its own; for a test's clock).
  void poke();
  /// Stops the timer; calls still queued are never sent.
  void stop();

  struct totals {
    uint64_t running = 0;
    uint64_t waiting = 0;
    /// Calls sent since start, and those of them that waited.
    uint64_t sent = 0;
    uint64_t queued = 0;
    /// Sum and largest of the waits, ms.
    uint64_t waited_ms = 0;
    uint64_t max_wait_ms = 0;
  };
  totals counts();
  /// Calls waiting now, by tenant (those with any).
  std::vector<std::pair<std::string, uint64_t>> waiting_by_tenant();

private:
  friend class upstream_slot;
  struct waiter {
    uint64_t ticket;
    uint64_t tokens;
    int64_t since_ms;
    upstream_callback then;
  };
  struct tenant_queue {
    std::deque<waiter> calls;
    /// Start-time fair queueing: the virtual time of its next call.
    double vtime = 0;
    uint64_t weight = 1;
    uint64_t seq = 0; // its place in `ready_`
    bool ready = false;
  };
  using ready_key = std::tuple<double, uint64_t, const std::string*>;
  struct sent_call {
    upstream_callback then;
    upstream_slot_ptr slot;
    int64_t waited;
    uint64_t ticket;
  };

  /// What the timer thread shares with the queue: it outlives the queue
  /// when the queue's last owner lets go on the timer's own thread.
  struct timer_state {
    std::mutex mx;
    std::condition_variable cv;
    /// When to send again (the clock's ms); 0: not armed.
    int64_t wake_at = 0;
    bool stopping = false;
  };

  upstream_queue(upstream_limits limits, weight_fn weight,
                 limiter::clock_fn clock);
  int64_t now_ms() const;
  /// Sends what fits now (`mx_` held), into `out`.
  void dispatch(int64_t now, std::vector<sent_call>& out);
  void release(uint64_t reserved, uint64_t charged);
  static void run_timer(std::shared_ptr<timer_state> ts,
                        std::weak_ptr<upstream_queue> queue,
                        limiter::clock_fn clock);

  upstream_limits limits_;
  weight_fn weight_;
  limiter::clock_fn clock_;

  std::mutex mx_;
  std::unordered_map<std::string, tenant_queue> tenants_;
  std::set<ready_key> ready_;
  std::unordered_map<uint64_t, std::string> tickets_;
  double vnow_ = 0;
  uint64_t next_seq_ = 0;
  uint64_t next_ticket_ = 1;
  uint64_t running_ = 0;
  uint64_t reserved_ = 0;
  minute_window tokens_;
  totals totals_;

  bool stopping_ = false;
  std::shared_ptr<timer_state> timer_state_ = std::make_shared<timer_state>();
  std::thread timer_;
};

} // namespace spindle::admission
