#include "metrics.hpp"

#include <sstream>

#include <prometheus/text_serializer.h>

namespace spindle {

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
                 .Register(*registry_)) {
  turns_.Add({});
  evictions_.Add({});
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
