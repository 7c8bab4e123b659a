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

// The longest the gate stays closed on one refusal, and the shortest.
constexpr int64_t max_closed_ms = 60000;
constexpr int64_t min_closed_ms = 10;
// Without a Retry-After: the first closing's length (doubling).
constexpr int64_t default_closed_ms = 1000;

upstream_slot::~upstream_slot() {
  if (!settled_)
    owner_->release(*this, 0);
}

void upstream_slot::settle(uint64_t tokens) {
  if (settled_)
    return;
  settled_ = true;
  owner_->release(*this, tokens);
}

void upstream_slot::signal(const upstream_signal& s) {
  owner_->on_signal(*this, s);
}

// -- upstream_queue -------------------------------------------------------------

std::shared_ptr<upstream_queue>
upstream_queue::make(upstream_limits limits, weight_fn weight,
                     limiter::clock_fn clock) {
  // The timer starts when something first waits for time (a tokens
  // window, the gate, the upstream's pacing).
  return std::shared_ptr<upstream_queue>{
    new upstream_queue(limits, std::move(weight), std::move(clock))};
}

upstream_queue::upstream_queue(upstream_limits limits, weight_fn weight,
                               limiter::clock_fn clock)
  : limits_(limits), weight_(std::move(weight)), clock_(std::move(clock)) {
}

upstream_queue::~upstream_queue() {
  stop();
}

void upstream_queue::stop() {
  std::thread timer;
  {
    std::lock_guard<std::mutex> guard{mx_};
    stopping_ = true;
    timer = std::move(timer_);
  }
  {
    std::lock_guard<std::mutex> guard{timer_state_->mx};
    timer_state_->stopping = true;
  }
  timer_state_->cv.notify_all();
  if (!timer.joinable())
    return;
  // The last owner let go on the timer's thread (a callback it ran): that
  // thread ends on its own, touching only the state it shares.
  if (timer.get_id() == std::this_thread::get_id())
    timer.detach();
  else
    timer.join();
}

void upstream_queue::arm(int64_t at) {
  if (stopping_)
    return;
  if (!timer_.joinable())
    timer_ = std::thread{run_timer, timer_state_, weak_from_this(), clock_};
  auto& ts = *timer_state_;
  std::lock_guard<std::mutex> guard{ts.mx};
  if (ts.wake_at == 0 || at < ts.wake_at) {
    ts.wake_at = at;
    ts.cv.notify_all();
  }
}

int64_t upstream_queue::now_ms() const {
  return clock_ ? clock_() : steady_now_ms();
}

upstream_wait upstream_queue::acquire(std::string_view tenant,
                                      uint64_t tokens,
                                      upstream_callback then, bool again) {
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
    if (again)
      t.calls.push_front(waiter{ticket, tokens, now, std::move(then)});
    else
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
      out.position = again ? 1 : t.calls.size();
      out.waiting = totals_.waiting;
      ++totals_.queued;
      (again ? t.calls.front() : t.calls.back()).queued = true;
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
    if (!gate_allows(now) || !pacing_allows(now, w.tokens))
      break;
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
        if (after > 0 || reserved_ == 0)
          arm(now + std::max<int64_t>(after, 1));
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
    if (gate_ == gate_state::probing) {
      s.slot->probe_ = true;
      probe_out_ = true;
      ++probes_;
    } else if (gate_ == gate_state::releasing) {
      if (++released_ >= release_total_)
        gate_ = gate_state::open;
      else
        next_release_at_ = next_release(released_);
    }
    if (requests_left_ > 0)
      --requests_left_;
    if (tokens_left_ >= 0)
      tokens_left_ -= std::min<int64_t>(tokens_left_,
                                        static_cast<int64_t>(w.tokens));
    tickets_.erase(w.ticket);
    bool was_queued = w.queued;
    t.calls.pop_front(); // `w` is gone
    --totals_.waiting;
    ++totals_.sent;
    auto waited = static_cast<uint64_t>(std::max<int64_t>(0, s.waited));
    totals_.waited_ms += waited;
    totals_.max_wait_ms = std::max(totals_.max_wait_ms, waited);
    if (was_queued) {
      ++t.queued;
      t.waited_ms += waited;
      t.max_wait_ms = std::max(t.max_wait_ms, waited);
    }
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

void upstream_queue::release(upstream_slot& slot, uint64_t charged) {
  std::vector<sent_call> sent;
  {
    std::lock_guard<std::mutex> guard{mx_};
    auto now = now_ms();
    tokens_.advance(second_of(now));
    if (running_ > 0)
      --running_;
    reserved_ -= std::min(reserved_, slot.reserved_);
    if (charged != 0)
      tokens_.add(second_of(now), charged);
    // A probe that ended without the upstream refusing it (it failed on
    // its own, or was cancelled) does not hold the gate shut.
    if (slot.probe_ && !slot.signalled_ && gate_ == gate_state::probing) {
      probe_out_ = false;
      start_release(now);
    }
    slot.probe_ = false;
    dispatch(now, sent);
  }
  for (auto& s : sent)
    s.then(std::move(s.slot), s.waited);
}

void upstream_queue::on_signal(upstream_slot& slot,
                               const upstream_signal& s) {
  std::vector<sent_call> sent;
  {
    std::lock_guard<std::mutex> guard{mx_};
    if (slot.signalled_)
      return;
    slot.signalled_ = true;
    auto now = now_ms();
    bool probe = slot.probe_;
    slot.probe_ = false;
    if (probe)
      probe_out_ = false;
    if (s.refused()) {
      ++refused_;
      close_gate(now, s.retry_after_ms);
    } else {
      if (probe && gate_ == gate_state::probing)
        start_release(now);
      // An answer (of any status) paces what follows by what it says
      // remains, for at most a minute.
      auto until = [now](int64_t reset_ms) {
        return now + std::clamp<int64_t>(reset_ms < 0 ? 1000 : reset_ms, 1,
                                         max_closed_ms);
      };
      if (s.remaining_requests >= 0) {
        requests_left_ = s.remaining_requests;
        requests_reset_at_ = until(s.reset_requests_ms);
      }
      if (s.remaining_tokens >= 0) {
        tokens_left_ = s.remaining_tokens;
        tokens_reset_at_ = until(s.reset_tokens_ms);
      }
    }
    dispatch(now, sent);
  }
  for (auto& c : sent)
    c.then(std::move(c.slot), c.waited);
}

void upstream_queue::close_gate(int64_t now, int64_t retry_after_ms) {
  if (gate_ == gate_state::open) {
    closed_since_ = now;
    closings_ = 0;
  }
  ++closings_;
  int64_t wait = retry_after_ms >= 0
                   ? retry_after_ms
                   : default_closed_ms << std::min<uint32_t>(closings_ - 1, 6);
  wait = std::clamp<int64_t>(wait, min_closed_ms, max_closed_ms);
  // A later refusal of a call sent before the gate closed never shortens
  // the wait.
  gate_until_ = gate_ == gate_state::closed ? std::max(gate_until_, now + wait)
                                            : now + wait;
  gate_ = gate_state::closed;
  arm(gate_until_);
}

void upstream_queue::start_release(int64_t now) {
  // Over a quarter of the time the gate was closed, each waiting call at
  // a jittered moment of its own slice of that span.
  release_total_ = totals_.waiting;
  release_start_ = now;
  release_span_ = std::max<int64_t>(0, now - closed_since_) / 4;
  released_ = 0;
  closings_ = 0;
  if (release_total_ == 0 || release_span_ == 0) {
    gate_ = gate_state::open;
    return;
  }
  gate_ = gate_state::releasing;
  next_release_at_ = next_release(0);
}

int64_t upstream_queue::next_release(uint64_t k) {
  std::uniform_real_distribution<double> jitter{0.0, 1.0};
  auto at = (static_cast<double>(k) + jitter(rng_))
            / static_cast<double>(release_total_)
            * static_cast<double>(release_span_);
  return release_start_ + static_cast<int64_t>(at);
}

bool upstream_queue::gate_allows(int64_t now) {
  switch (gate_) {
    case gate_state::open:
      return true;
    case gate_state::closed:
      if (now < gate_until_) {
        arm(gate_until_);
        return false;
      }
      gate_ = gate_state::probing;
      probe_out_ = false;
      [[fallthrough]];
    case gate_state::probing:
      return !probe_out_;
    case gate_state::releasing:
      if (released_ >= release_total_
          || now >= release_start_ + release_span_) {
        gate_ = gate_state::open;
        return true;
      }
      if (now >= next_release_at_)
        return true;
      arm(next_release_at_);
      return false;
  }
  return true;
}

bool upstream_queue::pacing_allows(int64_t now, uint64_t tokens) {
  if (requests_left_ >= 0 && now >= requests_reset_at_)
    requests_left_ = -1;
  if (tokens_left_ >= 0 && now >= tokens_reset_at_)
    tokens_left_ = -1;
  if (requests_left_ == 0) {
    arm(requests_reset_at_);
    return false;
  }
  // A call larger than all the upstream said remains waits for the reset
  // (then goes: nothing is known of the new window).
  if (tokens_left_ >= 0 && static_cast<int64_t>(tokens) > tokens_left_) {
    arm(tokens_reset_at_);
    return false;
  }
  return true;
}

upstream_queue::gate_view upstream_queue::gate() {
  std::lock_guard<std::mutex> guard{mx_};
  auto now = now_ms();
  gate_view g;
  g.state = gate_;
  if (gate_ == gate_state::closed)
    g.reopens_in_ms = std::max<int64_t>(0, gate_until_ - now);
  g.refused = refused_;
  g.probes = probes_;
  int64_t paced = 0;
  if (requests_left_ == 0)
    paced = std::max(paced, requests_reset_at_ - now);
  if (tokens_left_ == 0)
    paced = std::max(paced, tokens_reset_at_ - now);
  g.paced_for_ms = std::max<int64_t>(0, paced);
  return g;
}

int64_t upstream_queue::retry_after_s() {
  std::lock_guard<std::mutex> guard{mx_};
  auto now = now_ms();
  int64_t ms = 0;
  if (gate_ == gate_state::closed)
    ms = gate_until_ - now + std::max<int64_t>(0, gate_until_ - closed_since_) / 4;
  else if (gate_ == gate_state::releasing)
    ms = release_start_ + release_span_ - now;
  return std::max<int64_t>(1, (ms + 999) / 1000);
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

upstream_queue::totals upstream_queue::counts_of(std::string_view tenant) {
  std::lock_guard<std::mutex> guard{mx_};
  totals out;
  auto i = tenants_.find(std::string{tenant});
  if (i == tenants_.end())
    return out;
  out.waiting = i->second.calls.size();
  out.queued = i->second.queued;
  out.waited_ms = i->second.waited_ms;
  out.max_wait_ms = i->second.max_wait_ms;
  return out;
}

std::vector<std::pair<std::string, upstream_queue::totals>>
upstream_queue::counts_by_tenant() {
  std::lock_guard<std::mutex> guard{mx_};
  std::vector<std::pair<std::string, totals>> out;
  for (auto& [name, t] : tenants_)
    if (t.queued != 0) {
      totals c;
      c.waiting = t.calls.size();
      c.queued = t.queued;
      c.waited_ms = t.waited_ms;
      c.max_wait_ms = t.max_wait_ms;
      out.emplace_back(name, c);
    }
  std::sort(out.begin(), out.end(),
            [](auto& a, auto& b) { return a.first < b.first; });
  return out;
}

} // namespace spindle::admission
