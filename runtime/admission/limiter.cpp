#include "admission/limiter.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>
#include <vector>

namespace spindle::admission {

namespace {

int64_t floor_div(int64_t a, int64_t b) noexcept {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// Tenant states kept past their use: swept when there are more.
constexpr size_t sweep_above = 1024;
constexpr int64_t sweep_every_ms = 10000;

} // namespace

// -- minute_window ------------------------------------------------------------

void minute_window::advance(int64_t now_s) noexcept {
  if (now_s <= head_s_)
    return;
  if (now_s - head_s_ >= slots) {
    slot_.fill(0);
    sum_ = 0;
  } else {
    for (auto s = head_s_ + 1; s <= now_s; ++s) {
      auto& x = slot_[static_cast<size_t>(s % slots)];
      sum_ -= x;
      x = 0;
    }
  }
  head_s_ = now_s;
}

void minute_window::add(int64_t now_s, uint64_t n) noexcept {
  advance(now_s);
  slot_[static_cast<size_t>(head_s_ % slots)] += n;
  sum_ += n;
}

void minute_window::take_back(int64_t at_s, uint64_t n) noexcept {
  if (at_s > head_s_ || at_s <= head_s_ - slots)
    return;
  auto& x = slot_[static_cast<size_t>(at_s % slots)];
  n = std::min(n, x);
  x -= n;
  sum_ -= n;
}

int64_t minute_window::freed_after(int64_t now_ms, uint64_t need) const
  noexcept {
  if (need == 0)
    return 0;
  uint64_t acc = 0;
  for (auto s = head_s_ - slots + 1; s <= head_s_; ++s) {
    acc += slot_[static_cast<size_t>(((s % slots) + slots) % slots)];
    if (acc >= need)
      return std::max<int64_t>(0, (s + slots) * 1000 - now_ms);
  }
  return -1;
}

int64_t minute_window::empty_after(int64_t now_ms) const noexcept {
  for (auto s = head_s_; s > head_s_ - slots; --s)
    if (slot_[static_cast<size_t>(((s % slots) + slots) % slots)] != 0)
      return std::max<int64_t>(0, (s + slots) * 1000 - now_ms);
  return 0;
}

// -- grant --------------------------------------------------------------------

grant::~grant() {
  if (!settled_)
    owner_->release(tenant_, reserved_, slot_, 0);
}

void grant::settle(uint64_t tokens) {
  if (settled_)
    return;
  settled_ = true;
  owner_->release(tenant_, reserved_, slot_, tokens);
}

// -- limiter ------------------------------------------------------------------

std::shared_ptr<limiter> limiter::make(limits_source source, clock_fn clock) {
  return std::shared_ptr<limiter>{
    new limiter(std::move(source), std::move(clock))};
}

limiter::limiter(limits_source source, clock_fn clock)
  : source_(std::move(source)), clock_(std::move(clock)) {
}

int64_t limiter::now_ms() const {
  if (clock_)
    return clock_();
  return std::chrono::duration_cast<std::chrono::milliseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

limiter::tenant_state& limiter::state_locked(std::string_view tenant,
                                             const rate_limits& l) {
  auto i = tenants_.find(std::string{tenant});
  if (i == tenants_.end()) {
    if (tenants_.size() >= sweep_above) {
      // Drop the states that hold nothing: no charge in the window, no
      // call running or waiting.
      auto now = now_ms();
      if (now - last_sweep_ms_ >= sweep_every_ms) {
        last_sweep_ms_ = now;
        auto now_s = floor_div(now, 1000);
        for (auto j = tenants_.begin(); j != tenants_.end();) {
          auto& t = j->second;
          t.requests.advance(now_s);
          t.tokens.advance(now_s);
          if (t.requests.sum() == 0 && t.tokens.sum() == 0 && t.running == 0
              && t.reserved == 0 && t.queue.empty())
            j = tenants_.erase(j);
          else
            ++j;
        }
      }
    }
    i = tenants_.emplace(std::string{tenant}, tenant_state{}).first;
  }
  i->second.limits = l;
  return i->second;
}

void limiter::fill_state(tenant_state& t, int64_t now,
                         rate_state& out) const {
  auto& l = t.limits;
  out.limited = true;
  if (l.requests_per_min != 0) {
    out.requests = true;
    out.limit_requests = l.requests_per_min;
    out.remaining_requests = l.requests_per_min
                             - std::min(l.requests_per_min, t.requests.sum());
    out.reset_requests_ms = t.requests.empty_after(now);
  }
  if (l.tokens_per_min != 0) {
    out.tokens = true;
    out.limit_tokens = l.tokens_per_min;
    auto used = t.tokens.sum() + t.reserved;
    out.remaining_tokens = l.tokens_per_min
                           - std::min(l.tokens_per_min, used);
    out.reset_tokens_ms = t.tokens.empty_after(now);
  }
}

rate_state limiter::take_request(std::string_view tenant,
                                 request_ticket& ticket) {
  rate_state out;
  ticket = request_ticket{};
  auto l = source_(tenant);
  if (!l.limited())
    return out;
  auto now = now_ms();
  auto now_s = floor_div(now, 1000);
  std::lock_guard<std::mutex> guard{mx_};
  auto& t = state_locked(tenant, l);
  t.requests.advance(now_s);
  t.tokens.advance(now_s);
  if (l.requests_per_min != 0 && t.requests.sum() >= l.requests_per_min) {
    out.refused_by = "requests_per_min";
    auto ms = t.requests.freed_after(
      now, t.requests.sum() - l.requests_per_min + 1);
    out.retry_after_s = std::max<int64_t>(1, (ms + 999) / 1000);
    ++totals_.refused_requests;
    ++record_of(tenant).refused_requests;
    fill_state(t, now, out);
    return out;
  }
  if (l.requests_per_min != 0) {
    t.requests.add(now_s, 1);
    ticket.tenant = std::string{tenant};
    ticket.at_s = now_s;
  }
  fill_state(t, now, out);
  return out;
}

void limiter::take_back(const request_ticket& ticket) {
  if (ticket.at_s < 0)
    return;
  std::lock_guard<std::mutex> guard{mx_};
  auto i = tenants_.find(ticket.tenant);
  if (i == tenants_.end())
    return;
  i->second.requests.advance(floor_div(now_ms(), 1000));
  i->second.requests.take_back(ticket.at_s, 1);
}

admission limiter::admit(std::string_view tenant, uint64_t prompt_tokens,
                         uint64_t max_tokens, admitted_callback then) {
  admission out;
  auto l = source_(tenant);
  if (!l.limited())
    return out;
  auto now = now_ms();
  auto now_s = floor_div(now, 1000);
  uint64_t reply = max_tokens != 0 ? max_tokens : l.reply_reserve;
  uint64_t bound = max_tokens == 0 && l.tokens_per_min != 0 ? l.reply_reserve
                                                             : 0;
  uint64_t reserve = l.tokens_per_min != 0 ? prompt_tokens + reply : 0;
  std::lock_guard<std::mutex> guard{mx_};
  auto& t = state_locked(tenant, l);
  t.requests.advance(now_s);
  t.tokens.advance(now_s);
  if (l.tokens_per_min != 0) {
    if (reserve > l.tokens_per_min) {
      out.result = admission::outcome::too_large;
      out.why = "the call reserves " + std::to_string(reserve)
                + " tokens (" + std::to_string(prompt_tokens)
                + " of prompt and " + std::to_string(reply)
                + " for the reply), more than the tenant's tokens_per_min of "
                + std::to_string(l.tokens_per_min);
      fill_state(t, now, out.state);
      return out;
    }
    auto used = t.tokens.sum() + t.reserved;
    if (used + reserve > l.tokens_per_min) {
      out.result = admission::outcome::refused;
      out.state.refused_by = "tokens_per_min";
      // Once enough of the window's charges left it; reservations not
      // yet settled are taken as charged now.
      auto need = used + reserve - l.tokens_per_min;
      auto ms = t.tokens.freed_after(now, need);
      if (ms < 0)
        ms = 60000;
      out.state.retry_after_s = std::max<int64_t>(1, (ms + 999) / 1000);
      ++totals_.refused_tokens;
      ++record_of(tenant).refused_tokens;
      fill_state(t, now, out.state);
      return out;
    }
  }
  if (l.concurrent_exchanges != 0
      && (t.running >= l.concurrent_exchanges || !t.queue.empty())) {
    if (t.queue.size() >= l.max_queued) {
      out.result = admission::outcome::refused;
      out.state.refused_by = "max_queued";
      out.state.retry_after_s = 1;
      ++totals_.refused_queue;
      ++record_of(tenant).refused_queue;
      fill_state(t, now, out.state);
      return out;
    }
    out.result = admission::outcome::queued;
    out.waiter = next_waiter_++;
    t.reserved += reserve;
    t.queue.push_back(
      waiter_entry{out.waiter, reserve, bound, now, std::move(then)});
    ++totals_.queued;
    ++totals_.waiting;
    out.state.queued = true;
    fill_state(t, now, out.state);
    return out;
  }
  t.reserved += reserve;
  bool slot = l.concurrent_exchanges != 0;
  if (slot)
    ++t.running;
  out.granted = grant_ptr{
    new grant(shared_from_this(), std::string{tenant}, reserve, slot, bound)};
  fill_state(t, now, out.state);
  return out;
}

bool limiter::withdraw(std::string_view tenant, uint64_t waiter) {
  std::lock_guard<std::mutex> guard{mx_};
  auto i = tenants_.find(std::string{tenant});
  if (i == tenants_.end())
    return false;
  auto& q = i->second.queue;
  auto w = std::find_if(q.begin(), q.end(), [waiter](const waiter_entry& e) {
    return e.id == waiter;
  });
  if (w == q.end())
    return false;
  i->second.reserved -= std::min(i->second.reserved, w->reserved);
  q.erase(w);
  --totals_.waiting;
  return true;
}

void limiter::release(const std::string& tenant, uint64_t reserved,
                      bool slot, uint64_t charged) {
  std::vector<std::pair<waiter_entry, grant_ptr>> admitted;
  rate_state state;
  {
    std::lock_guard<std::mutex> guard{mx_};
    auto i = tenants_.find(tenant);
    if (i == tenants_.end())
      return;
    auto& t = i->second;
    auto now = now_ms();
    auto now_s = floor_div(now, 1000);
    t.requests.advance(now_s);
    t.tokens.advance(now_s);
    t.reserved -= std::min(t.reserved, reserved);
    if (charged != 0)
      t.tokens.add(now_s, charged);
    if (slot && t.running > 0)
      --t.running;
    // Queued calls take the freed slots in arrival order; their tokens
    // were reserved when they were queued.
    auto cap = t.limits.concurrent_exchanges;
    while (!t.queue.empty() && (cap == 0 || t.running < cap)) {
      auto w = std::move(t.queue.front());
      t.queue.pop_front();
      --totals_.waiting;
      ++t.running;
      auto g = grant_ptr{new grant(shared_from_this(), tenant, w.reserved,
                                   true, w.reply_bound)};
      admitted.emplace_back(std::move(w), std::move(g));
    }
    if (!admitted.empty())
      fill_state(t, now, state);
    // The tenant's `queued` counts the calls whose wait ended admitted
    // (the server's counts each call queued, when it is).
    auto* mine = admitted.empty() ? nullptr : &record_of(tenant);
    for (auto& a : admitted) {
      a.first.since_ms = now - a.first.since_ms; // now: how long it waited
      auto waited = static_cast<uint64_t>(std::max<int64_t>(0, a.first.since_ms));
      ++mine->queued;
      for (auto* c : {&totals_, mine}) {
        c->waited_ms += waited;
        c->max_wait_ms = std::max(c->max_wait_ms, waited);
      }
    }
  }
  for (auto& a : admitted) {
    auto s = state;
    s.queued = true;
    s.waited_ms = a.first.since_ms;
    a.first.then(std::move(a.second), std::move(s));
  }
}

rate_state limiter::state_of(std::string_view tenant) {
  rate_state out;
  auto l = source_(tenant);
  if (!l.limited())
    return out;
  auto now = now_ms();
  std::lock_guard<std::mutex> guard{mx_};
  auto& t = state_locked(tenant, l);
  t.requests.advance(floor_div(now, 1000));
  t.tokens.advance(floor_div(now, 1000));
  fill_state(t, now, out);
  return out;
}

std::pair<uint64_t, uint64_t> limiter::load_of(std::string_view tenant) {
  std::lock_guard<std::mutex> guard{mx_};
  auto i = tenants_.find(std::string{tenant});
  if (i == tenants_.end())
    return {0, 0};
  return {i->second.running, i->second.queue.size()};
}

limiter::totals limiter::counts() {
  std::lock_guard<std::mutex> guard{mx_};
  return totals_;
}

limiter::totals& limiter::record_of(std::string_view tenant) {
  auto i = by_tenant_.find(std::string{tenant});
  if (i == by_tenant_.end())
    i = by_tenant_.emplace(std::string{tenant}, totals{}).first;
  return i->second;
}

limiter::totals limiter::counts_of(std::string_view tenant) {
  std::lock_guard<std::mutex> guard{mx_};
  totals out;
  auto i = by_tenant_.find(std::string{tenant});
  if (i != by_tenant_.end())
    out = i->second;
  auto t = tenants_.find(std::string{tenant});
  out.waiting = t == tenants_.end() ? 0 : t->second.queue.size();
  return out;
}

std::vector<std::pair<std::string, limiter::totals>>
limiter::counts_by_tenant() {
  std::lock_guard<std::mutex> guard{mx_};
  std::vector<std::pair<std::string, totals>> out{by_tenant_.begin(),
                                                  by_tenant_.end()};
  std::sort(out.begin(), out.end(),
            [](auto& a, auto& b) { return a.first < b.first; });
  return out;
}

// -- headers ------------------------------------------------------------------

std::string refusal_text(const rate_state& s) {
  if (s.refused_by == "requests_per_min")
    return "over the tenant's requests_per_min of "
           + std::to_string(s.limit_requests) + ": retry after "
           + std::to_string(s.retry_after_s) + " s";
  if (s.refused_by == "tokens_per_min")
    return "over the tenant's tokens_per_min of "
           + std::to_string(s.limit_tokens) + " ("
           + std::to_string(s.remaining_tokens)
           + " left in the last 60 s): retry after "
           + std::to_string(s.retry_after_s) + " s";
  return "the tenant's queue of calls waiting for one of its "
         "concurrent_exchanges is full (max_queued): retry after "
         + std::to_string(s.retry_after_s) + " s";
}

std::string reset_text(int64_t ms) {
  if (ms < 0)
    ms = 0;
  if (ms < 1000)
    return std::to_string(ms) + "ms";
  auto m = ms / 60000;
  auto rest = ms % 60000;
  char sec[32];
  if (rest % 1000 == 0)
    std::snprintf(sec, sizeof sec, "%llds",
                  static_cast<long long>(rest / 1000));
  else {
    std::snprintf(sec, sizeof sec, "%.3f", static_cast<double>(rest) / 1000);
    // "1.500" -> "1.5"
    std::string s{sec};
    while (s.back() == '0')
      s.pop_back();
    std::snprintf(sec, sizeof sec, "%ss", s.c_str());
  }
  return m > 0 ? std::to_string(m) + "m" + sec : std::string{sec};
}

std::vector<std::pair<std::string, std::string>>
rate_headers(const rate_state& s) {
  std::vector<std::pair<std::string, std::string>> out;
  if (s.requests) {
    out.emplace_back("x-ratelimit-limit-requests",
                     std::to_string(s.limit_requests));
    out.emplace_back("x-ratelimit-remaining-requests",
                     std::to_string(s.remaining_requests));
    out.emplace_back("x-ratelimit-reset-requests",
                     reset_text(s.reset_requests_ms));
  }
  if (s.tokens) {
    out.emplace_back("x-ratelimit-limit-tokens",
                     std::to_string(s.limit_tokens));
    out.emplace_back("x-ratelimit-remaining-tokens",
                     std::to_string(s.remaining_tokens));
    out.emplace_back("x-ratelimit-reset-tokens",
                     reset_text(s.reset_tokens_ms));
  }
  if (!s.refused_by.empty())
    out.emplace_back("Retry-After", std::to_string(s.retry_after_s));
  return out;
}

} // namespace spindle::admission
