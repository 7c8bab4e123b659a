#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

// A tenant's limits on what it asks of the model, and where they stand
// (docs/limits.md).

namespace spindle {

/// What a tenant may ask of the model. 0: no limit of that kind.
struct rate_limits {
  /// Exchanges (and stateless completions) started in any 60 s.
  uint64_t requests_per_min = 0;
  /// Tokens charged in any 60 s: each call reserves its prompt's exact
  /// count plus its reply's reserve when admitted, and is charged what it
  /// used when it ends.
  uint64_t tokens_per_min = 0;
  /// Calls to the model at once; the next waits in its tenant's queue.
  uint64_t concurrent_exchanges = 0;
  /// Calls that may wait for a slot of `concurrent_exchanges`; past it
  /// the call is refused at once.
  uint64_t max_queued = 64;
  /// Tokens reserved for a reply that sets no max_tokens; with
  /// `tokens_per_min` such a reply is bounded by it.
  uint64_t reply_reserve = 1024;

  bool limited() const noexcept {
    return requests_per_min != 0 || tokens_per_min != 0
           || concurrent_exchanges != 0;
  }
  bool operator==(const rate_limits& o) const noexcept {
    return requests_per_min == o.requests_per_min
           && tokens_per_min == o.tokens_per_min
           && concurrent_exchanges == o.concurrent_exchanges
           && max_queued == o.max_queued && reply_reserve == o.reply_reserve;
  }
};

/// The limits of `tenant` ("default" for the implicit one). Called once
/// per call to the model, from any thread: it must be quick and
/// thread-safe.
using limits_source = std::function<rate_limits(std::string_view tenant)>;

/// What the runtime sends its provider as a whole (docs/limits.md, "The
/// upstream"): past it calls wait, tenants served by their weights.
struct upstream_limits {
  /// Calls to the upstream at once; 0: no bound.
  uint64_t concurrency = 0;
  /// Tokens its calls may use in any 60 s (reserved when sent, settled
  /// when they end); 0: no bound.
  uint64_t tokens_per_min = 0;
  /// The reserve of a reply that sets no max_tokens under
  /// `tokens_per_min`, and then its bound.
  uint64_t reply_reserve = 1024;

  bool bounded() const noexcept {
    return concurrency != 0 || tokens_per_min != 0;
  }
};

/// A tenant's weight toward the upstream (1 to 1000).
using weight_source = std::function<uint64_t(std::string_view tenant)>;

/// A call waiting for the upstream: its place in its tenant's queue (1:
/// its tenant's next) and how many calls wait, all tenants.
struct upstream_place {
  uint64_t position = 0;
  uint64_t waiting = 0;
};

/// Where a tenant's limits stand, as OpenAI's `x-ratelimit-*` headers
/// tell it; and, for a refusal, which limit refused and when to retry.
struct rate_state {
  /// The tenant has limits: the call is admitted (or refused) by them.
  bool limited = false;
  /// The tenant has a `requests_per_min`: the three figures below count.
  bool requests = false;
  uint64_t limit_requests = 0;
  uint64_t remaining_requests = 0;
  /// Until the window holds none of its requests again.
  int64_t reset_requests_ms = 0;
  bool tokens = false;
  uint64_t limit_tokens = 0;
  uint64_t remaining_tokens = 0;
  int64_t reset_tokens_ms = 0;
  /// Empty when admitted; else the limit that refused the call:
  /// "requests_per_min", "tokens_per_min" or "max_queued".
  std::string refused_by;
  /// For a refusal: seconds until the same call would be admitted (at
  /// least 1).
  int64_t retry_after_s = 0;
  /// The call waited for a slot of `concurrent_exchanges`, this long.
  bool queued = false;
  int64_t waited_ms = 0;
};

} // namespace spindle
