#include "metrics.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>

#include <prometheus/text_serializer.h>

namespace spindle {

namespace {

int64_t steady_second() {
  return std::chrono::duration_cast<std::chrono::seconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

// The bucket of a latency: the i with 10 us * 2^((i-1)/4) <= seconds <
// 10 us * 2^(i/4), 0 below 10 us, the last one above ~1.5 hours.
int bucket_of(double seconds, int buckets) {
  if (!(seconds >= 1e-5))
    return 0;
  auto i = static_cast<int>(std::floor(std::log2(seconds / 1e-5) * 4)) + 1;
  return std::min(i, buckets - 1);
}

// The upper bound of bucket i, in seconds.
double bucket_bound(int i) {
  return 1e-5 * std::exp2(static_cast<double>(i) / 4);
}

} // namespace

void http_metrics::note(double seconds) {
  auto now = steady_second();
  auto& slot = window_[static_cast<size_t>(now) % window_slots];
  if (slot.second != now)
    slot = second_slot{now, 0, {}};
  ++slot.count;
  ++slot.buckets[bucket_of(seconds, latency_buckets)];
  ++total_;
}

http_metrics::recent_requests http_metrics::recent(int seconds) {
  seconds = std::clamp(seconds, 1, 60);
  recent_requests out;
  out.seconds = seconds;
  uint64_t merged[latency_buckets] = {};
  {
    std::lock_guard<std::mutex> guard{series_mx_};
    auto now = steady_second();
    for (auto& slot : window_) {
      // Whole seconds only: the current one is still filling.
      if (slot.second < now - seconds || slot.second >= now)
        continue;
      out.count += slot.count;
      for (int i = 0; i < latency_buckets; ++i)
        merged[i] += slot.buckets[i];
    }
  }
  auto quantile = [&](double q) {
    if (out.count == 0)
      return 0.0;
    auto rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(out.count)));
    uint64_t seen = 0;
    for (int i = 0; i < latency_buckets; ++i) {
      seen += merged[i];
      if (seen >= rank)
        return bucket_bound(i);
    }
    return bucket_bound(latency_buckets - 1);
  };
  out.p50 = quantile(0.50);
  out.p95 = quantile(0.95);
  out.p99 = quantile(0.99);
  return out;
}

uint64_t http_metrics::requests_total() {
  std::lock_guard<std::mutex> guard{series_mx_};
  return total_;
}

http_metrics::http_metrics()
  : registry_(std::make_shared<prometheus::Registry>()),
    requests_(prometheus::BuildCounter()
                .Name("spindle_http_requests_total")
                .Help("HTTP requests by route, method and status")
                .Register(*registry_)),
    latency_(prometheus::BuildHistogram()
               .Name("spindle_http_request_duration_seconds")
               .Help("HTTP request latency by route")
               .Register(*registry_)),
    turns_(prometheus::BuildCounter()
             .Name("spindle_turns_stored_total")
             .Help("Turns stored by this server's message routes")
             .Register(*registry_)),
    evictions_(prometheus::BuildCounter()
                 .Name("spindle_context_evictions_total")
                 .Help("Context items evicted from windows by item routes")
                 .Register(*registry_)),
    usage_tokens_(prometheus::BuildCounter()
                    .Name("spindle_usage_tokens_total")
                    .Help("Tokens exchanges spent, by kind (prompt, "
                          "completion) and source (counted by spindle, "
                          "reported by the upstream)")
                    .Register(*registry_)),
    usage_exchanges_(prometheus::BuildCounter()
                       .Name("spindle_usage_exchanges_total")
                       .Help("Exchanges whose usage was recorded, by source")
                       .Register(*registry_)) {
  turns_.Add({});
  evictions_.Add({});
  for (int source : {1, 2}) {
    std::string name = source == 1 ? "counted" : "upstream";
    usage_[source][0] = &usage_tokens_.Add({{"kind", "prompt"},
                                            {"source", name}});
    usage_[source][1] = &usage_tokens_.Add({{"kind", "completion"},
                                            {"source", name}});
    usage_[source][2] = &usage_exchanges_.Add({{"source", name}});
  }
}

void http_metrics::count_usage(uint8_t source, uint64_t prompt_tokens,
                               uint64_t completion_tokens) {
  if (source < 1 || source > 2)
    return;
  usage_[source][0]->Increment(static_cast<double>(prompt_tokens));
  usage_[source][1]->Increment(static_cast<double>(completion_tokens));
  usage_[source][2]->Increment();
}

void http_metrics::count(const std::string& what, double n) {
  if (what == "turns")
    turns_.Add({}).Increment(n);
  else if (what == "evictions")
    evictions_.Add({}).Increment(n);
}

void http_metrics::observe(const std::string& route, const std::string& method,
                           int status, double seconds) {
  // The series of a (route, method, status) are looked up in the families
  // once; afterwards a request costs one short lock and the increments.
  std::string key;
  key.reserve(route.size() + method.size() + 6);
  key += route;
  key += '\n';
  key += method;
  key += '\n';
  key += std::to_string(status);
  series* s = nullptr;
  {
    std::lock_guard<std::mutex> guard{series_mx_};
    auto it = series_.find(key);
    if (it == series_.end()) {
      static const prometheus::Histogram::BucketBoundaries buckets{
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
        0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5, 10};
      series fresh{&requests_.Add({{"route", route},
                                   {"method", method},
                                   {"status", std::to_string(status)}}),
                   &latency_.Add({{"route", route}}, buckets)};
      it = series_.emplace(std::move(key), fresh).first;
    }
    s = &it->second;
    note(seconds);
  }
  s->count->Increment();
  s->latency->Observe(seconds);
}

void http_metrics::add_gauge(const std::string& name, const std::string& help,
                             std::function<samples()> source) {
  auto& family = prometheus::BuildGauge().Name(name).Help(help).Register(
    *registry_);
  std::lock_guard<std::mutex> guard{mx_};
  gauges_.push_back({&family, std::move(source)});
}

std::string http_metrics::scrape() {
  {
    std::lock_guard<std::mutex> guard{mx_};
    for (auto& g : gauges_)
      for (auto& [lbls, value] : g.source())
        g.family->Add(lbls).Set(value);
  }
  std::ostringstream out;
  prometheus::TextSerializer{}.Serialize(out, registry_->Collect());
  return out.str();
}

} // namespace spindle
