#pragma once

// What spindle sends one upstream as a whole (docs/limits.md, "The
// upstream"): calls at once and tokens in any 60 s. When calls wait for
// that capacity, tenants are served by weighted fair queueing (start-time
// fair queueing on the tenants' weights: each backlogged tenant gets its
// weight's share of the calls sent, a lone tenant all of them), and each
// tenant's calls in arrival order. Event-driven: a call is sent when
// another ends, or when the tokens window frees (one timer thread, which
// sleeps until then). Thread-safe.
//
// One gate per upstream (docs/limits.md, "When the upstream refuses"): a
// 429 or 503 closes it for the upstream's Retry-After (at most 60 s;
// without one 1 s, doubling while it keeps refusing); when it reopens one
// call goes alone (the probe); once the probe is answered the calls that
// waited are released spread over a quarter of the time it was closed,
// each at a jittered moment of its own slice. A waiting call is never
// failed by the gate: only by its client's deadline (`withdraw`). The
// upstream's `x-ratelimit-remaining-*` headers pace the calls sent until
// their reset, so that it rarely has to refuse.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "admission/limiter.hpp"
#include "spindle/runtime/llm.hpp"

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
  /// What the upstream said with the call's answer (the provider's
  /// `on_signal`): a refusal closes the gate, the probe's answer opens
  /// it, rate-limit headers pace what follows. Any thread.
  void signal(const upstream_signal& s);
  /// The call went alone after the gate reopened.
  bool probe() const noexcept {
    return probe_;
  }

private:
  friend class upstream_queue;
  upstream_slot(std::shared_ptr<upstream_queue> owner, uint64_t reserved)
    : owner_(std::move(owner)), reserved_(reserved) {
  }
  std::shared_ptr<upstream_queue> owner_;
  uint64_t reserved_;
  bool settled_ = false;
  // Guarded by the queue's lock.
  bool probe_ = false;
  bool signalled_ = false;
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

  /// A call of `tenant` reserving `tokens` asks to be sent; `again`: it
  /// was sent and refused, and goes first of its tenant's calls.
  upstream_wait acquire(std::string_view tenant, uint64_t tokens,
                        upstream_callback then, bool again = false);
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

  enum class gate_state : uint8_t { open, closed, probing, releasing };
  /// Where the gate stands.
  struct gate_view {
    gate_state state = gate_state::open;
    /// Closed: until the probe may go.
    int64_t reopens_in_ms = 0;
    /// Answers that refused (429, 503) and probes sent, since start.
    uint64_t refused = 0;
    uint64_t probes = 0;
    /// Paced by the upstream's rate-limit headers: until then.
    int64_t paced_for_ms = 0;
  };
  gate_view gate();
  /// What a client refused for the upstream's load waits: until the gate
  /// reopens and the release that follows (at least 1 s).
  int64_t retry_after_s();
  /// Calls waiting now, by tenant (those with any).
  std::vector<std::pair<std::string, uint64_t>> waiting_by_tenant();
  /// One tenant's calls since start: `waiting` now, `queued` (those that
  /// waited), and their waits' sum and longest.
  totals counts_of(std::string_view tenant);
  /// The same for every tenant that ever waited, by name.
  std::vector<std::pair<std::string, totals>> counts_by_tenant();

private:
  friend class upstream_slot;
  struct waiter {
    uint64_t ticket;
    uint64_t tokens;
    int64_t since_ms;
    upstream_callback then;
    /// It was not sent at once.
    bool queued = false;
  };
  struct tenant_queue {
    std::deque<waiter> calls;
    /// Start-time fair queueing: the virtual time of its next call.
    double vtime = 0;
    uint64_t weight = 1;
    uint64_t seq = 0; // its place in `ready_`
    bool ready = false;
    /// Its calls sent after a wait since start, and their waits, ms.
    uint64_t queued = 0;
    uint64_t waited_ms = 0;
    uint64_t max_wait_ms = 0;
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
  void release(upstream_slot& slot, uint64_t charged);
  void on_signal(upstream_slot& slot, const upstream_signal& s);
  /// The gate lets the next call go now (`mx_` held); else arms the timer.
  bool gate_allows(int64_t now);
  /// The upstream's rate-limit headers let a call of `tokens` go now.
  bool pacing_allows(int64_t now, uint64_t tokens);
  void close_gate(int64_t now, int64_t retry_after_ms);
  void start_release(int64_t now);
  int64_t next_release(uint64_t k);
  /// Wakes the timer at `at` (or sooner), starting it the first time.
  void arm(int64_t at);
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

  // The gate.
  gate_state gate_ = gate_state::open;
  int64_t gate_until_ = 0;
  int64_t closed_since_ = 0;
  uint32_t closings_ = 0;
  bool probe_out_ = false;
  int64_t release_start_ = 0;
  int64_t release_span_ = 0;
  uint64_t release_total_ = 0;
  uint64_t released_ = 0;
  int64_t next_release_at_ = 0;
  uint64_t refused_ = 0;
  uint64_t probes_ = 0;
  std::minstd_rand rng_{std::random_device{}()};
  // Pacing by the upstream's headers: what it said remains, less what was
  // sent since, until its reset (-1: nothing known).
  int64_t requests_left_ = -1;
  int64_t requests_reset_at_ = 0;
  int64_t tokens_left_ = -1;
  int64_t tokens_reset_at_ = 0;

  bool stopping_ = false;
  std::shared_ptr<timer_state> timer_state_ = std::make_shared<timer_state>();
  std::thread timer_;
};

} // namespace spindle::admission
