#include "admission/upstream.hpp"

#include <algorithm>
#include <chrono>

namespace spindle::admission {

namespace {

int64_t steady_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

int64_t second_of(int64_t ms) {
  return ms >= 0 ? ms / 1000 : -((-ms + 999) / 1000);
}

} // namespace

// -- upstream_slot --------------------------------------------------------------

upstream_slot::~upstream_slot() {
  if (!settled_)
    owner_->release(reserved_, 0);
}

void upstream_slot::settle(uint64_t tokens) {
  if (settled_)
    return;
  settled_ = true;
  owner_->release(reserved_, tokens);
}

// -- upstream_queue -------------------------------------------------------------

std::shared_ptr<upstream_queue>
upstream_queue::make(upstream_limits limits, weight_fn weight,
                     limiter::clock_fn clock) {
  std::shared_ptr<upstream_queue> out{
    new upstream_queue(limits, std::move(weight), std::move(clock))};
  // Only a tokens window frees on its own: only it needs the timer.
  if (limits.tokens_per_min != 0)
    out->timer_ = std::thread{run_timer, out->timer_state_,
                              std::weak_ptr<upstream_queue>{out},
                              out->clock_};
  return out;
}

upstream_queue::upstream_queue(upstream_limits limits, weight_fn weight,
                               limiter::clock_fn clock)
  : limits_(limits), weight_(std::move(weight)), clock_(std::move(clock)) {
}

upstream_queue::~upstream_queue() {
  stop();
}

void upstream_queue::stop() {
  {
    std::lock_guard<std::mutex> guard{mx_};
    stopping_ = true;
  }
  {
    std::lock_guard<std::mutex> guard{timer_state_->mx};
    timer_state_->stopping = true;
  }
  timer_state_->cv.notify_all();
  if (!timer_.joinable())
    return;
  // The last owner let go on the timer's thread (a callback it ran): that
  // thread ends on its own, touching only the state it shares.
  if (timer_.get_id() == std::this_thread::get_id())
    timer_.detach();
  else
    timer_.join();
}

int64_t upstream_queue::now_ms() const {
  return clock_ ? clock_() : steady_now_ms();
}

upstream_wait upstream_queue::acquire(std::string_view tenant,
                                      uint64_t tokens,
                                      upstream_callback then) {
  uint64_t weight = weight_ ? std::clamp<uint64_t>(weight_(tenant), 1, 1000)
                            : 1;
  upstream_wait out;
  std::vector<sent_call> sent;
  {
    std::lock_guard<std::mutex> guard{mx_};
    auto now = now_ms();
    auto ticket = next_ticket_++;
    auto [i, fresh] = tenants_.try_emplace(std::string{tenant});
    auto& t = i->second;
    t.weight = weight;
    t.calls.push_back(waiter{ticket, tokens, now, std::move(then)});
    tickets_.emplace(ticket, i->first);
    if (!t.ready) {
      // A tenant that starts waiting starts at the virtual time now: it
      // banks no credit for the time it sent nothing.
      t.vtime = std::max(t.vtime, vnow_);
      t.seq = next_seq_++;
      t.ready = true;
      ready_.emplace(t.vtime, t.seq, &i->first);
    }
    ++totals_.waiting;
    dispatch(now, sent);
    // Sent at once: the caller goes on without its callback.
    for (auto s = sent.begin(); s != sent.end(); ++s)
      if (s->ticket == ticket) {
        out.slot = std::move(s->slot);
        sent.erase(s);
        break;
      }
    if (!out.slot) {
      out.ticket = ticket;
      out.position = t.calls.size();
      out.waiting = totals_.waiting;
      ++totals_.queued;
    }
  }
  for (auto& s : sent)
    s.then(std::move(s.slot), s.waited);
  return out;
}

void upstream_queue::dispatch(int64_t now, std::vector<sent_call>& out) {
  if (stopping_)
    return;
  tokens_.advance(second_of(now));
  while (!ready_.empty()
         && (limits_.concurrency == 0 || running_ < limits_.concurrency)) {
    auto first = ready_.begin();
    auto& name = *std::get<2>(*first);
    auto& t = tenants_.find(name)->second;
    auto& w = t.calls.front();
    if (limits_.tokens_per_min != 0) {
      auto used = tokens_.sum() + reserved_;
      // A call larger than the whole window goes alone.
      bool fits = used + w.tokens <= limits_.tokens_per_min || used == 0;
      if (!fits) {
        // Until enough of the window's charges leave it; with calls in
        // flight that are not settled yet, their end wakes it too.
        auto need = used + w.tokens - limits_.tokens_per_min;
        auto after = tokens_.freed_after(now, need);
        if (after < 0)
          after = tokens_.empty_after(now);
        if (after > 0 || reserved_ == 0) {
          auto at = now + std::max<int64_t>(after, 1);
          auto& ts = *timer_state_;
          std::lock_guard<std::mutex> guard{ts.mx};
          if (ts.wake_at == 0 || at < ts.wake_at) {
            ts.wake_at = at;
            ts.cv.notify_all();
          }
        }
        break;
      }
    }
    sent_call s;
    s.ticket = w.ticket;
    s.waited = now - w.since_ms;
    s.then = std::move(w.then);
    ++running_;
    reserved_ += w.tokens;
    s.slot = upstream_slot_ptr{
      new upstream_slot(shared_from_this(), w.tokens)};
    tickets_.erase(w.ticket);
    t.calls.pop_front();
    --totals_.waiting;
    ++totals_.sent;
    totals_.waited_ms += static_cast<uint64_t>(std::max<int64_t>(0, s.waited));
    totals_.max_wait_ms = std::max<uint64_t>(
      totals_.max_wait_ms, static_cast<uint64_t>(std::max<int64_t>(0, s.waited)));
    // The tenant's next call starts where this one's share ends. An idle
    // tenant keeps its virtual time: one that comes back before the
    // others caught up waits its turn (a few bytes a tenant).
    vnow_ = std::get<0>(*first);
    auto key = std::get<2>(*first);
    ready_.erase(first);
    t.vtime = vnow_ + 1.0 / static_cast<double>(t.weight);
    if (t.calls.empty()) {
      t.ready = false;
    } else {
      t.seq = next_seq_++;
      ready_.emplace(t.vtime, t.seq, key);
    }
    out.push_back(std::move(s));
  }
  totals_.running = running_;
}

bool upstream_queue::withdraw(uint64_t ticket) {
  std::vector<sent_call> sent;
  {
    std::lock_guard<std::mutex> guard{mx_};
    auto i = tickets_.find(ticket);
    if (i == tickets_.end())
      return false;
    auto name = i->second;
    tickets_.erase(i);
    auto& t = tenants_.find(name)->second;
    auto w = std::find_if(t.calls.begin(), t.calls.end(),
                          [ticket](const waiter& x) {
                            return x.ticket == ticket;
                          });
    if (w == t.calls.end())
      return false;
    bool was_front = w == t.calls.begin();
    t.calls.erase(w);
    --totals_.waiting;
    if (t.calls.empty()) {
      ready_.erase(ready_key{t.vtime, t.seq, &tenants_.find(name)->first});
      t.ready = false;
    }
    // The call ahead of the others may have held them (tokens).
    if (was_front)
      dispatch(now_ms(), sent);
  }
  for (auto& s : sent)
    s.then(std::move(s.slot), s.waited);
  return true;
}

void upstream_queue::release(uint64_t reserved, uint64_t charged) {
  std::vector<sent_call> sent;
  {
    std::lock_guard<std::mutex> guard{mx_};
    auto now = now_ms();
    tokens_.advance(second_of(now));
    if (running_ > 0)
      --running_;
    reserved_ -= std::min(reserved_, reserved);
    if (charged != 0)
      tokens_.add(second_of(now), charged);
    dispatch(now, sent);
  }
  for (auto& s : sent)
    s.then(std::move(s.slot), s.waited);
}

void upstream_queue::poke() {
  std::vector<sent_call> sent;
  {
    std::lock_guard<std::mutex> guard{mx_};
    dispatch(now_ms(), sent);
  }
  for (auto& s : sent)
    s.then(std::move(s.slot), s.waited);
}

void upstream_queue::run_timer(std::shared_ptr<timer_state> ts,
                               std::weak_ptr<upstream_queue> queue,
                               limiter::clock_fn clock) {
  auto now = [&clock] { return clock ? clock() : steady_now_ms(); };
  std::unique_lock<std::mutex> lock{ts->mx};
  while (!ts->stopping) {
    if (ts->wake_at == 0) {
      ts->cv.wait(lock);
      continue;
    }
    // At most a quarter of a second at a time: a clock other than the
    // steady one (a test's) is read again soon after it moved.
    auto wait = ts->wake_at - now();
    if (wait > 0) {
      ts->cv.wait_for(lock,
                      std::chrono::milliseconds{std::min<int64_t>(wait, 250)});
      continue;
    }
    ts->wake_at = 0;
    lock.unlock();
    // The queue is released here, without the timer's lock: its
    // destruction (when this was its last owner) stops the timer.
    if (auto q = queue.lock())
      q->poke();
    lock.lock();
  }
}

upstream_queue::totals upstream_queue::counts() {
  std::lock_guard<std::mutex> guard{mx_};
  return totals_;
}

std::vector<std::pair<std::string, uint64_t>>
upstream_queue::waiting_by_tenant() {
  std::lock_guard<std::mutex> guard{mx_};
  std::vector<std::pair<std::string, uint64_t>> out;
  for (auto& [name, t] : tenants_)
    if (!t.calls.empty())
      out.emplace_back(name, t.calls.size());
  return out;
}

} // namespace spindle::admission
