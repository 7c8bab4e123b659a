#pragma once

// /metrics: request counts and latencies by route, plus gauges that areas
// register as sources read at scrape time. Prometheus text format.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace spindle {

class http_metrics {
public:
  using labels = std::map<std::string, std::string>;
  using samples = std::vector<std::pair<labels, double>>;

  http_metrics();

  /// Counts one request and records its latency. Thread-safe.
  void observe(const std::string& route, const std::string& method,
               int status, double seconds);

  /// Counts `n` more of a server-side event: "turns" (turns stored by
  /// message routes), "evictions" (context items evicted by item routes).
  /// Thread-safe.
  void count(const std::string& what, double n);

  /// Counts what an exchange spent (docs/usage.md): its tokens by kind
  /// (prompt, completion) and source (counted, upstream), never added
  /// across sources. `source` is usage_source's number; 0 counts nothing.
  /// Thread-safe.
  void count_usage(uint8_t source, uint64_t prompt_tokens,
                   uint64_t completion_tokens);

  /// Adds a gauge family whose samples `source` computes at each scrape.
  /// Call before serving.
  void add_gauge(const std::string& name, const std::string& help,
                 std::function<samples()> source);

  /// The text exposition of every metric. Thread-safe.
  std::string scrape();

  /// Requests of the last `seconds` whole seconds (at most 60) before the
  /// current one, for GET /v1/stats: how many, and latency percentiles in
  /// seconds (0 when there were none), estimated from log-spaced buckets
  /// (each about 19% wide). Thread-safe.
  struct recent_requests {
    double seconds = 0;
    uint64_t count = 0;
    double p50 = 0, p95 = 0, p99 = 0;
  };
  recent_requests recent(int seconds = 10);

  /// Requests counted since the start. Thread-safe.
  uint64_t requests_total();

private:
  struct gauge_source {
    prometheus::Family<prometheus::Gauge>* family;
    std::function<samples()> source;
  };

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Counter>& turns_;
  prometheus::Family<prometheus::Counter>& evictions_;
  prometheus::Family<prometheus::Counter>& usage_tokens_;
  prometheus::Family<prometheus::Counter>& usage_exchanges_;
  /// By source (1 counted, 2 upstream): prompt, completion, exchanges.
  prometheus::Counter* usage_[3][3] = {};
  std::mutex mx_;
  std::vector<gauge_source> gauges_;
  struct series {
    prometheus::Counter* count;
    prometheus::Histogram* latency;
  };
  std::mutex series_mx_;
  std::unordered_map<std::string, series> series_;

  // The last minute of requests, a slot a second (guarded by series_mx_,
  // which observe() takes anyway): counts and latency buckets, bucket i
  // holding latencies below 10 us * 2^(i/4).
  static constexpr int window_slots = 64;
  static constexpr int latency_buckets = 96;
  struct second_slot {
    int64_t second = -1;
    uint64_t count = 0;
    uint32_t buckets[latency_buckets] = {};
  };
  second_slot window_[window_slots];
  // Counts one request in the window; series_mx_ held.
  void note(double seconds);
  uint64_t total_ = 0;
};

} // namespace spindle
