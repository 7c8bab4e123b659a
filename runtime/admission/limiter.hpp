#pragma once

// The limits of each tenant on what it asks of the model (docs/limits.md):
// requests and tokens in any 60 s, calls at once with a queue behind
// them. Thread-safe; no call blocks (a queued call is admitted later
// through its callback).

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <caf/expected.hpp>

#include "spindle/runtime/limits.hpp"

namespace spindle::admission {

/// 60 one-second slots: what was charged in the last minute. A charge
/// stays in the window until 60 s after the second it was made in, so
/// that no 60 whole seconds ever hold more than the window admitted.
class minute_window {
public:
  static constexpr int64_t slots = 60;

  /// Moves the window to `now_s`, dropping what left it.
  void advance(int64_t now_s) noexcept;
  void add(int64_t now_s, uint64_t n) noexcept;
  /// Takes back `n` charged in second `at_s`, if still in the window.
  void take_back(int64_t at_s, uint64_t n) noexcept;
  uint64_t sum() const noexcept {
    return sum_;
  }
  /// Milliseconds from `now_ms` until at least `need` of the window's
  /// charges have left it (0 when `need` is 0; -1 when the window holds
  /// less than `need`).
  int64_t freed_after(int64_t now_ms, uint64_t need) const noexcept;
  /// Milliseconds from `now_ms` until the window holds nothing.
  int64_t empty_after(int64_t now_ms) const noexcept;

private:
  std::array<uint64_t, slots> slot_{};
  int64_t head_s_ = 0;
  uint64_t sum_ = 0;
};

class limiter;

/// An admitted call: holds its slot of `concurrent_exchanges` and its
/// token reservation until `settle` (or its destruction, which charges
/// nothing more than what was settled).
class grant {
public:
  ~grant();
  grant(const grant&) = delete;
  grant& operator=(const grant&) = delete;

  /// The call ended having used `tokens` (prompt and reply): the
  /// reservation is replaced by them and the slot freed. Once.
  void settle(uint64_t tokens);
  /// The tokens reserved for the call.
  uint64_t reserved() const noexcept {
    return reserved_;
  }
  /// The reply's bound when the call set none and tokens are limited
  /// (the reserve); 0: none.
  uint64_t reply_bound() const noexcept {
    return reply_bound_;
  }

private:
  friend class limiter;
  grant(std::shared_ptr<limiter> owner, std::string tenant, uint64_t reserved,
        bool slot, uint64_t reply_bound)
    : owner_(std::move(owner)),
      tenant_(std::move(tenant)),
      reserved_(reserved),
      slot_(slot),
      reply_bound_(reply_bound) {
  }
  std::shared_ptr<limiter> owner_;
  std::string tenant_;
  uint64_t reserved_;
  bool slot_;
  uint64_t reply_bound_;
  bool settled_ = false;
};

using grant_ptr = std::shared_ptr<grant>;

/// A counted request (`take_request`), to take back when the call is
/// refused later on.
struct request_ticket {
  std::string tenant;
  /// The second it was counted in; -1: nothing was counted.
  int64_t at_s = -1;
};

/// What `admit` decided.
struct admission {
  enum class outcome : uint8_t { admitted, queued, refused, too_large };
  outcome result = outcome::admitted;
  /// Set when admitted.
  grant_ptr granted;
  rate_state state;
  /// For `queued`: the handle to `withdraw` it by.
  uint64_t waiter = 0;
  /// For `too_large`: why.
  std::string why;
};

/// Called once for a queued call: with its grant when a slot freed, or
/// never when it was withdrawn first. Runs on the thread that freed the
/// slot, outside the limiter's lock; must not block.
using admitted_callback = std::function<void(grant_ptr, rate_state)>;

class limiter : public std::enable_shared_from_this<limiter> {
public:
  /// Milliseconds since some fixed point; steady.
  using clock_fn = std::function<int64_t()>;

  static std::shared_ptr<limiter> make(limits_source source,
                                       clock_fn clock = {});

  /// Counts one request of `tenant` against its `requests_per_min`:
  /// refused (`refused_by` set, nothing counted) when the window is full.
  /// Quick for a tenant without limits.
  rate_state take_request(std::string_view tenant, request_ticket& ticket);
  /// Takes back a request counted by `take_request` (the call was refused
  /// later, by another limit).
  void take_back(const request_ticket& ticket);

  /// Admits a call of `tenant` that reserves `prompt_tokens` plus its
  /// reply's reserve (`max_tokens`, else the tenant's `reply_reserve`):
  /// admitted, queued behind `concurrent_exchanges` (then `then` runs
  /// once it is admitted, unless it is withdrawn first), refused by
  /// `tokens_per_min` or `max_queued`, or too large for `tokens_per_min`
  /// whatever the wait.
  admission admit(std::string_view tenant, uint64_t prompt_tokens,
                  uint64_t max_tokens, admitted_callback then);
  /// Withdraws a queued call (its client's deadline passed): false when it
  /// was admitted already (its callback ran or is running).
  bool withdraw(std::string_view tenant, uint64_t waiter);

  /// The limits in force for `tenant` (its source's answer).
  rate_limits limits_of(std::string_view tenant) const {
    return source_(tenant);
  }
  /// Where `tenant`'s limits stand now.
  rate_state state_of(std::string_view tenant);
  /// Calls of `tenant` holding a slot and waiting for one.
  std::pair<uint64_t, uint64_t> load_of(std::string_view tenant);

  struct totals {
    uint64_t refused_requests = 0;
    uint64_t refused_tokens = 0;
    uint64_t refused_queue = 0;
    uint64_t queued = 0;
    uint64_t waiting = 0;
    /// Of the queued calls admitted since start: their waits' sum and the
    /// longest, ms.
    uint64_t waited_ms = 0;
    uint64_t max_wait_ms = 0;
  };
  totals counts();
  /// The same for one tenant since start (`waiting`: now; `queued`: its
  /// calls admitted after a wait, those `waited_ms` adds up).
  totals counts_of(std::string_view tenant);
  /// Every tenant that was refused or queued since start, with its counts.
  std::vector<std::pair<std::string, totals>> counts_by_tenant();

private:
  friend class grant;
  struct waiter_entry {
    uint64_t id;
    uint64_t reserved;
    uint64_t reply_bound;
    int64_t since_ms;
    admitted_callback then;
  };
  struct tenant_state {
    rate_limits limits;
    minute_window requests;
    minute_window tokens;
    /// Tokens reserved by calls admitted or queued and not settled.
    uint64_t reserved = 0;
    uint64_t running = 0;
    std::deque<waiter_entry> queue;
  };

  limiter(limits_source source, clock_fn clock);
  int64_t now_ms() const;
  /// The state of `tenant` with its limits as they are now; `mx_` held.
  tenant_state& state_locked(std::string_view tenant, const rate_limits& l);
  void fill_state(tenant_state& t, int64_t now, rate_state& out) const;
  void release(const std::string& tenant, uint64_t reserved, bool slot,
               uint64_t charged);

  limits_source source_;
  clock_fn clock_;
  std::mutex mx_;
  std::unordered_map<std::string, tenant_state> tenants_;
  /// Per tenant, kept while the server runs (a few words for each tenant
  /// ever refused or queued; `tenants_` forgets idle tenants).
  std::unordered_map<std::string, totals> by_tenant_;
  totals& record_of(std::string_view tenant);
  uint64_t next_waiter_ = 1;
  int64_t last_sweep_ms_ = 0;
  totals totals_;
};

/// `x-ratelimit-*` headers of `s` (those of the kinds limited), and
/// `Retry-After` for a refusal.
std::vector<std::pair<std::string, std::string>>
rate_headers(const rate_state& s);

/// Why a call was refused (`refused_by` set), for its error's message.
std::string refusal_text(const rate_state& s);

/// A duration as OpenAI writes it in `x-ratelimit-reset-*`: "120ms",
/// "1.5s", "1m0s".
std::string reset_text(int64_t ms);

} // namespace spindle::admission
