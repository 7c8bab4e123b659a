#include "actor_scheduler.hpp"

#include <array>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <map>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <caf/all.hpp>
#include <caf/detail/set_thread_name.hpp>
#include <caf/detail/thread_safe_actor_clock.hpp>
#include <caf/policy/work_stealing.hpp>
#include <caf/scheduler/coordinator.hpp>

namespace spindle::detail {

namespace {

/// CAF's work stealing, except that a worker appends the jobs it schedules
/// itself instead of prepending them: first scheduled, first run.
struct fifo_work_stealing : caf::policy::work_stealing {
  template <class Worker>
  void internal_enqueue(Worker* self, caf::resumable* job) {
    d(self).queue.append(job);
  }
};

/// CAF's thread-safe clock for every timer but request timeouts, which live
/// in sharded buffers drained by one timer thread (see the header).
class request_timer_clock final : public caf::detail::thread_safe_actor_clock {
public:
  using super = caf::detail::thread_safe_actor_clock;

  void set_request_timeout(time_point t, caf::abstract_actor* self,
                           caf::message_id id) override {
    auto aid = self->id();
    auto& s = shard_of(aid);
    {
      std::lock_guard<std::mutex> guard{s.mtx};
      auto& p = s.pins[aid];
      if (!p)
        p = std::make_shared<pin>(pin{caf::strong_actor_ptr{self->ctrl()}});
      s.incoming.push_back(entry{t, p, id, aid});
    }
    if (idle_.load(std::memory_order_seq_cst))
      wake();
  }

  void cancel_request_timeout(caf::abstract_actor* self,
                              caf::message_id id) override {
    // CAF 0.17 never calls this (responses leave their timeouts pending);
    // honoured anyway, checked when the timeout is due.
    std::lock_guard<std::mutex> guard{cancelled_mtx_};
    cancelled_.insert(key(self->id(), id));
  }

  void set_ordinary_timeout(time_point t, caf::abstract_actor* self,
                            caf::atom_value type, uint64_t id) override {
    remember(self->id());
    super::set_ordinary_timeout(t, self, type, id);
  }

  void set_multi_timeout(time_point t, caf::abstract_actor* self,
                         caf::atom_value type, uint64_t id) override {
    remember(self->id());
    super::set_multi_timeout(t, self, type, id);
  }

  void cancel_timeouts(caf::abstract_actor* self) override {
    // Called whenever an actor terminates: its pending request timeouts no
    // longer keep it alive, and only actors that set other timers need
    // CAF's clock (each call there wakes its thread).
    auto aid = self->id();
    caf::strong_actor_ptr released;
    {
      auto& s = shard_of(aid);
      std::lock_guard<std::mutex> guard{s.mtx};
      if (auto i = s.pins.find(aid); i != s.pins.end()) {
        released.swap(i->second->self);
        s.pins.erase(i);
      }
    }
    {
      std::lock_guard<std::mutex> guard{timer_users_mtx_};
      if (timer_users_.erase(aid) == 0)
        return;
    }
    super::cancel_timeouts(self);
  }

  void cancel_all() override {
    super::cancel_all();
    for (auto& s : shards_) {
      std::lock_guard<std::mutex> guard{s.mtx};
      s.incoming.clear();
      for (auto& kvp : s.pins)
        kvp.second->self.reset();
      s.pins.clear();
    }
    std::lock_guard<std::mutex> guard{loop_mtx_};
    drop_all_ = true;
    loop_cv_.notify_one();
  }

  /// Fires due request timeouts until `stop_request_timer`.
  void run_request_timer() {
    std::vector<entry> batch;
    // Pending timeouts by the timer period they fall due in: most requests
    // of an actor share one timeout, so entries arrive nearly in order and
    // a slot is a vector appended to.
    std::map<int64_t, std::vector<entry>> due;
    auto take = [&] {
      collect(batch);
      auto* slot = static_cast<std::vector<entry>*>(nullptr);
      int64_t slot_key = 0;
      for (auto& e : batch) {
        auto k = slot_of(e.due);
        if (slot == nullptr || k != slot_key) {
          slot = &due[k];
          slot_key = k;
        }
        slot->push_back(std::move(e));
      }
      batch.clear();
    };
    std::unique_lock<std::mutex> guard{loop_mtx_};
    for (;;) {
      if (stop_)
        return;
      if (drop_all_) {
        due.clear();
        drop_all_ = false;
      }
      poked_ = false;
      guard.unlock();
      take();
      fire(due);
      guard.lock();
      if (stop_)
        return;
      if (due.empty()) {
        // Nothing pending: sleep until a request sets a timeout. A request
        // that sees idle_ pokes; one that did not is collected here.
        idle_.store(true, std::memory_order_seq_cst);
        guard.unlock();
        take();
        guard.lock();
        if (due.empty())
          loop_cv_.wait(guard, [this] { return poked_ || stop_ || drop_all_; });
        idle_.store(false, std::memory_order_seq_cst);
      } else {
        loop_cv_.wait_for(guard, request_timer_resolution,
                          [this] { return stop_ || drop_all_; });
      }
    }
  }

  void stop_request_timer() {
    std::lock_guard<std::mutex> guard{loop_mtx_};
    stop_ = true;
    loop_cv_.notify_one();
  }

private:
  /// Keeps an actor alive while it has request timeouts pending (as CAF's
  /// clock does: a requester nobody else holds still gets its timeout),
  /// until it terminates. Guarded by its shard's mutex.
  struct pin {
    caf::strong_actor_ptr self;
  };

  struct entry {
    time_point due;
    std::shared_ptr<pin> requester;
    caf::message_id id;
    caf::actor_id aid;
  };

  struct alignas(64) shard {
    std::mutex mtx;
    std::vector<entry> incoming;
    std::unordered_map<caf::actor_id, std::shared_ptr<pin>> pins;
  };

  static constexpr size_t shard_count = 16;

  static std::pair<caf::actor_id, uint64_t> key(caf::actor_id aid,
                                                caf::message_id mid) {
    return {aid, mid.integer_value()};
  }

  struct key_hash {
    size_t operator()(const std::pair<caf::actor_id, uint64_t>& k) const {
      return std::hash<uint64_t>{}(k.first * 0x9E3779B97F4A7C15ull ^ k.second);
    }
  };

  shard& shard_of(caf::actor_id aid) {
    return shards_[aid % shard_count];
  }

  void remember(caf::actor_id aid) {
    std::lock_guard<std::mutex> guard{timer_users_mtx_};
    timer_users_.insert(aid);
  }

  void wake() {
    std::lock_guard<std::mutex> guard{loop_mtx_};
    poked_ = true;
    loop_cv_.notify_one();
  }

  // Moves every shard's new entries into `out`.
  void collect(std::vector<entry>& out) {
    for (auto& s : shards_) {
      std::lock_guard<std::mutex> guard{s.mtx};
      if (s.incoming.empty())
        continue;
      if (out.empty()) {
        out.swap(s.incoming);
      } else {
        for (auto& e : s.incoming)
          out.push_back(std::move(e));
        s.incoming.clear();
      }
    }
  }

  static int64_t slot_of(time_point t) {
    // Rounded up: a slot is fired once all of it is due.
    auto period = std::chrono::duration_cast<time_point::duration>(
                    request_timer_resolution)
                    .count();
    auto ticks = t.time_since_epoch().count();
    return ticks / period + 1;
  }

  void fire(std::map<int64_t, std::vector<entry>>& due) {
    auto now_slot = slot_of(this->now()) - 1;
    while (!due.empty() && due.begin()->first <= now_slot) {
      auto slot = std::move(due.begin()->second);
      due.erase(due.begin());
      for (auto& e : slot) {
        if (is_cancelled(e))
          continue;
        // A requester that terminated took its timeouts with it.
        caf::strong_actor_ptr requester;
        {
          auto& sh = shard_of(e.aid);
          std::lock_guard<std::mutex> guard{sh.mtx};
          requester = e.requester->self;
        }
        if (requester) {
          auto* receiver = requester->get();
          receiver->eq_impl(e.id, std::move(requester), nullptr,
                            caf::sec::request_timeout);
        }
      }
    }
  }

  bool is_cancelled(const entry& e) {
    std::lock_guard<std::mutex> guard{cancelled_mtx_};
    return !cancelled_.empty() && cancelled_.erase(key(e.aid, e.id)) > 0;
  }

  std::array<shard, shard_count> shards_;
  std::atomic<bool> idle_{false};

  std::mutex loop_mtx_;
  std::condition_variable loop_cv_;
  bool stop_ = false;
  bool drop_all_ = false;
  bool poked_ = false;

  std::mutex cancelled_mtx_;
  std::unordered_set<std::pair<caf::actor_id, uint64_t>, key_hash> cancelled_;

  std::mutex timer_users_mtx_;
  std::unordered_set<caf::actor_id> timer_users_;
};

class actor_scheduler final
  : public caf::scheduler::coordinator<fifo_work_stealing> {
public:
  using super = caf::scheduler::coordinator<fifo_work_stealing>;

  explicit actor_scheduler(caf::actor_system& sys) : super(sys) {
    // nop
  }

  request_timer_clock& clock() noexcept override {
    return clock_;
  }

protected:
  void start() override {
    // Workers, and CAF's own clock thread, which stays idle: every timer
    // goes to clock_.
    super::start();
    dispatch_ = std::thread{[this] {
      run_named("caf.clock", [this] { clock_.run_dispatch_loop(); });
    }};
    requests_ = std::thread{[this] {
      run_named("spindle.timeouts", [this] { clock_.run_request_timer(); });
    }};
  }

  void stop() override {
    clock_.stop_request_timer();
    requests_.join();
    clock_.cancel_dispatch_loop();
    dispatch_.join();
    super::stop();
  }

private:
  template <class F>
  void run_named(const char* name, F body) {
    CAF_SET_LOGGER_SYS(&system());
    caf::detail::set_thread_name(name);
    system().thread_started();
    body();
    system().thread_terminates();
  }

  request_timer_clock clock_;
  std::thread dispatch_;
  std::thread requests_;
};

} // namespace

caf::actor_system::module* make_actor_scheduler(caf::actor_system& sys) {
  return new actor_scheduler(sys);
}

} // namespace spindle::detail
