#include "spindle/actors/event_log.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "spindle/messages/clock.hpp"
#include "spindle/messages/ids.hpp"

namespace spindle {

event_log::event_log() : event_log(options{}) {
}

event_log::event_log(options opts)
  : opts_(opts), epoch_(static_cast<uint64_t>(unix_time_ms())) {
  opts_.capacity = std::max<size_t>(opts_.capacity, 1);
  dispatcher_ = std::thread{[this] { dispatch_loop(); }};
}

event_log::~event_log() {
  {
    std::lock_guard<std::mutex> guard{mx_};
    stop_ = true;
  }
  cv_.notify_all();
  // The last reference may go away in a subscriber's wake-up, on the
  // dispatcher itself: it then ends on its own.
  if (dispatcher_.get_id() == std::this_thread::get_id())
    dispatcher_.detach();
  else
    dispatcher_.join();
}

void event_log::publish(std::vector<event> events) {
  if (events.empty())
    return;
  {
    std::lock_guard<std::mutex> guard{mx_};
    auto seq = last_.load(std::memory_order_relaxed);
    for (auto& e : events) {
      e.seq = ++seq;
      e.frame.reserve(e.type.size() + e.data.size() + 48);
      e.frame += "id: ";
      e.frame += std::to_string(epoch_);
      e.frame += '-';
      e.frame += std::to_string(e.seq);
      e.frame += "\nevent: ";
      e.frame += e.type;
      e.frame += "\ndata: ";
      e.frame += e.data;
      e.frame += "\n\n";
      backlog_.push_back(std::make_shared<const event>(std::move(e)));
    }
    while (backlog_.size() > opts_.capacity)
      backlog_.pop_front();
    last_.store(seq, std::memory_order_release);
    if (dirty_)
      return; // the dispatcher is woken already
    dirty_ = true;
  }
  cv_.notify_one();
}

uint64_t event_log::oldest() const {
  std::lock_guard<std::mutex> guard{mx_};
  return backlog_.empty() ? last_.load(std::memory_order_relaxed) + 1
                          : backlog_.front()->seq;
}

event_log::scan_result
event_log::scan(uint64_t after, size_t max,
                const std::function<void(const event_ptr&)>& visit) const {
  scan_result out;
  std::lock_guard<std::mutex> guard{mx_};
  auto last = last_.load(std::memory_order_relaxed);
  auto first = backlog_.empty() ? last + 1 : backlog_.front()->seq;
  if (after > last) {
    out.reset = true;
    out.next_after = last;
    return out;
  }
  if (after + 1 < first) {
    out.reset = true;
    after = first - 1;
  }
  auto begin = backlog_.begin() + static_cast<ptrdiff_t>(after + 1 - first);
  auto n = std::min<size_t>(max, static_cast<size_t>(backlog_.end() - begin));
  for (auto i = begin; i != begin + static_cast<ptrdiff_t>(n); ++i)
    visit(*i);
  out.seen = n;
  out.next_after = after + n;
  return out;
}

event_log::page event_log::read(uint64_t after, size_t max) const {
  page out;
  auto r = scan(after, max,
                [&out](const event_ptr& e) { out.events.push_back(e); });
  out.reset = r.reset;
  out.next_after = r.next_after;
  return out;
}

void event_log::subscription::resume() {
  due_.store(true, std::memory_order_release);
  paused_.store(false, std::memory_order_release);
  if (auto log = log_.lock())
    log->poke();
}

void event_log::poke() {
  {
    std::lock_guard<std::mutex> guard{mx_};
    dirty_ = true;
  }
  cv_.notify_one();
}

std::shared_ptr<event_log::subscription>
event_log::subscribe(std::function<void(const round&)> wake,
                     const std::string& orchestration,
                     const std::string& thread) {
  auto sub = std::make_shared<subscription>();
  sub->wake_ = std::move(wake);
  if (!orchestration.empty())
    sub->key_ = "o" + orchestration;
  else if (!thread.empty())
    sub->key_ = "t" + thread;
  sub->log_ = weak_from_this();
  std::lock_guard<std::mutex> guard{mx_};
  subs_.push_back(sub);
  return sub;
}

size_t event_log::subscribers() const {
  std::lock_guard<std::mutex> guard{mx_};
  return static_cast<size_t>(
    std::count_if(subs_.begin(), subs_.end(),
                  [](const std::weak_ptr<subscription>& s) {
                    return !s.expired();
                  }));
}

void event_log::dispatch_loop() {
  using clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lk{mx_};
  auto last_round = clock::now() - opts_.keepalive;
  auto next_keepalive = clock::now() + opts_.keepalive;
  std::vector<std::shared_ptr<subscription>> live;
  std::unordered_set<std::string> keys;
  while (!stop_) {
    cv_.wait_until(lk, next_keepalive, [this] { return stop_ || dirty_; });
    if (stop_)
      break;
    auto keepalive = clock::now() >= next_keepalive;
    // Gather: a round at most every `coalesce`, longer with many
    // subscribers (20 us each), so that each wake-up carries more events.
    auto gap = std::max<clock::duration>(
      opts_.coalesce, std::chrono::microseconds{20} * subs_.size());
    if (!keepalive && clock::now() < last_round + gap) {
      cv_.wait_until(lk, last_round + gap, [this] { return stop_; });
      if (stop_)
        break;
    }
    dirty_ = false;
    // What the new events are about: a subscriber to one orchestration or
    // thread is woken only for its own.
    keys.clear();
    live.clear();
    bool any_all = false;
    for (auto i = subs_.begin(); i != subs_.end();) {
      if (auto s = i->lock()) {
        any_all = any_all || s->key_.empty();
        live.push_back(std::move(s));
        ++i;
      } else {
        i = subs_.erase(i);
      }
    }
    auto last = last_.load(std::memory_order_relaxed);
    bool evicted = !backlog_.empty() && backlog_.front()->seq > dispatched_ + 1;
    round r;
    r.from = dispatched_;
    r.to = last;
    if (!backlog_.empty() && !evicted && last > dispatched_) {
      std::string frames;
      auto first = backlog_.begin()
                   + static_cast<ptrdiff_t>(dispatched_ + 1
                                            - backlog_.front()->seq);
      for (auto i = first; i != backlog_.end(); ++i) {
        if (!(*i)->orchestration.empty())
          keys.insert("o" + (*i)->orchestration);
        if (!(*i)->thread.empty())
          keys.insert("t" + (*i)->thread);
        if (any_all)
          frames += (*i)->frame;
      }
      if (any_all)
        r.frames = std::make_shared<const std::string>(std::move(frames));
    }
    dispatched_ = last;
    lk.unlock();
    for (auto& s : live) {
      auto due = s->due_.exchange(false, std::memory_order_acq_rel);
      if (s->paused_.load(std::memory_order_acquire))
        continue;
      if (keepalive || evicted || due || s->key_.empty()
          || keys.count(s->key_) > 0)
        s->wake_(r);
    }
    // Dropped outside the lock: the last reference may end a subscriber.
    live.clear();
    lk.lock();
    last_round = clock::now();
    if (keepalive || last_round >= next_keepalive)
      next_keepalive = last_round + opts_.keepalive;
  }
}

std::string json_quote(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false,
                                   nlohmann::json::error_handler_t::replace);
}

std::string task_event_data(const task_info& t, const std::string& extra) {
  std::string out;
  out.reserve(96 + t.worker.size() + extra.size());
  out += "{\"task\":\"";
  out += t.id; // task IDs are [0-9A-Z_.t]: nothing to escape
  out += "\",\"state\":\"";
  out += to_string(t.state);
  out += "\",\"worker\":";
  out += t.worker.empty() ? std::string{"null"} : json_quote(t.worker);
  out += ",\"attempts\":";
  out += std::to_string(t.attempts);
  if (t.retry_at_ms > 0) {
    out += ",\"retry_at\":";
    out += std::to_string(t.retry_at_ms);
  }
  out += extra;
  out += '}';
  return out;
}

event task_event(std::string type, const task_info& t,
                 const std::string& extra) {
  event e;
  e.type = std::move(type);
  auto cut = t.id.find('_');
  e.orchestration = cut == std::string::npos ? t.id : t.id.substr(0, cut);
  e.data = task_event_data(t, extra);
  return e;
}

event thread_event(std::string type, const std::string& thread,
                   const std::string& extra) {
  event e;
  e.type = std::move(type);
  e.thread = thread;
  e.tenant = std::string{tenant_of_id(thread)};
  // Its data names the thread as the tenant's clients know it.
  e.data = "{\"thread\":" + json_quote(std::string{local_id(thread)}) + extra
           + "}";
  return e;
}

} // namespace spindle
