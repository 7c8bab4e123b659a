#include "core/actor_scheduler.hpp"

#include "spindle/runtime/config.hpp"

#include <array>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <map>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <caf/all.hpp>
#include <caf/detail/set_thread_name.hpp>
#include <caf/detail/thread_safe_actor_clock.hpp>
#include <caf/detail/double_ended_queue.hpp>
#include <caf/policy/unprofiled.hpp>
#include <caf/scheduler/coordinator.hpp>

namespace spindle::detail {

namespace {

/// CAF's work stealing with two changes (see the header):
/// - FIFO: a worker appends the jobs it schedules itself instead of
///   prepending them: first scheduled, first run.
/// - Parking: a worker that finds no work spins briefly, then parks on its
///   condition variable; whoever enqueues a job while a worker is parked
///   wakes one. CAF's policy instead polls with 50 us sleeps (about 100 us
///   with the kernel's timer slack) for 25 ms, then 10 ms sleeps, so a job
///   enqueued from outside the pool (a reply of the detached state store, a
///   request of an HTTP thread) waited for the next poll, and the sleeps
///   themselves cost a context switch each.
struct parking_work_stealing : caf::policy::unprofiled {
  using queue_type = caf::detail::double_ended_queue<caf::resumable>;

  struct coordinator_data {
    explicit coordinator_data(caf::scheduler::abstract_coordinator*) {
      // nop
    }
    std::atomic<size_t> next_worker{0};
    /// Workers parked (or announcing that they park).
    std::atomic<size_t> parked{0};
  };

  struct worker_data {
    explicit worker_data(caf::scheduler::abstract_coordinator* p)
      : rengine(std::random_device{}()),
        uniform(0, p->num_workers() > 0 ? p->num_workers() - 1 : 0) {
      if (auto cfg = dynamic_cast<const spindle::config*>(
            &p->system().config()))
        park_timeout = cfg->park_timeout;
    }
    worker_data(const worker_data& other)
      : rengine(std::random_device{}()),
        uniform(other.uniform),
        park_timeout(other.park_timeout) {
      // nop
    }
    queue_type queue;
    std::default_random_engine rengine;
    std::uniform_int_distribution<size_t> uniform;
    std::mutex mtx;
    std::condition_variable cv;
    /// Guarded by mtx; cleared by whoever wakes the worker.
    bool parked = false;
    /// How long the worker sleeps before it looks again by itself: a
    /// safety net, since every enqueue wakes a parked worker.
    std::chrono::milliseconds park_timeout{10};
  };

  /// Polls of the own queue (and steals) before a worker parks.
  static constexpr size_t spin_attempts = 128;

  template <class Worker>
  caf::resumable* try_steal(Worker* self) {
    auto p = self->parent();
    if (p->num_workers() < 2)
      return nullptr;
    auto victim = d(self).uniform(d(self).rengine);
    if (victim == self->id())
      victim = p->num_workers() - 1;
    return d(p->worker_by_id(victim)).queue.take_tail();
  }

  // Steals from every other worker in turn.
  template <class Worker>
  caf::resumable* steal_any(Worker* self) {
    auto p = self->parent();
    for (size_t i = 0; i < p->num_workers(); ++i)
      if (i != self->id())
        if (auto job = d(p->worker_by_id(i)).queue.take_tail())
          return job;
    return nullptr;
  }

  // Dekker's handshake between an enqueuer (push a job, then read the
  // parked count) and a parking worker (raise the count, then look at the
  // queues): each side needs a full barrier between its write and its
  // read. A fence; under TSan, which does not model fences, a sequentially
  // consistent read-modify-write of the count on both sides instead.
  static size_t parked_after_push(std::atomic<size_t>& parked) {
#ifdef __SANITIZE_THREAD__
    return parked.fetch_add(0, std::memory_order_seq_cst);
#else
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return parked.load(std::memory_order_relaxed);
#endif
  }

  static void announce_parked(std::atomic<size_t>& parked) {
#ifdef __SANITIZE_THREAD__
    parked.fetch_add(1, std::memory_order_seq_cst);
#else
    parked.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
  }

  // Wakes `w` if it is parked; true if it was.
  template <class Worker, class Coordinator>
  static bool wake(Coordinator* parent, Worker* w) {
    auto& wd = d(w);
    std::unique_lock<std::mutex> guard{wd.mtx};
    if (!wd.parked)
      return false;
    wd.parked = false;
    d(parent).parked.fetch_sub(1, std::memory_order_relaxed);
    guard.unlock();
    wd.cv.notify_one();
    return true;
  }

  // After a job went into `owner`'s queue: wakes `owner` if it is parked,
  // else any parked worker (which steals it).
  template <class Coordinator, class Worker>
  static void wake_for(Coordinator* parent, Worker* owner) {
    // Pairs with `announce_parked`: either this sees the parked count or
    // the parking worker sees the job.
    if (parked_after_push(d(parent).parked) == 0)
      return;
    if (owner != nullptr && wake(parent, owner))
      return;
    for (size_t i = 0; i < parent->num_workers(); ++i) {
      auto w = parent->worker_by_id(i);
      if (w != owner && wake(parent, w))
        return;
    }
  }

  template <class Coordinator>
  void central_enqueue(Coordinator* self, caf::resumable* job) {
    auto w = self->worker_by_id(d(self).next_worker++ % self->num_workers());
    w->external_enqueue(job);
  }

  template <class Worker>
  void external_enqueue(Worker* self, caf::resumable* job) {
    d(self).queue.append(job);
    wake_for(self->parent(), self);
  }

  // A job a worker schedules itself wakes a parked worker only when it
  // queues behind another: a lone job runs next on this worker, with a warm
  // cache and without a wake-up's system call (a request/reply chain with
  // one message in flight stays on one core).
  template <class Worker>
  void internal_enqueue(Worker* self, caf::resumable* job) {
    auto backlog = !d(self).queue.empty();
    d(self).queue.append(job);
    if (backlog)
      wake_for(self->parent(), static_cast<Worker*>(nullptr));
  }

  template <class Worker>
  void resume_job_later(Worker* self, caf::resumable* job) {
    internal_enqueue(self, job);
  }

  template <class Worker>
  caf::resumable* dequeue(Worker* self) {
    for (;;) {
      for (size_t i = 0; i < spin_attempts; ++i) {
        if (auto job = d(self).queue.take_head())
          return job;
        if (i % 4 == 3)
          if (auto job = try_steal(self))
            return job;
        if (i % 32 == 31)
          std::this_thread::yield();
      }
      if (auto job = park(self))
        return job;
    }
  }

  // Parks until woken or `park_timeout`; returns a job found on the way.
  template <class Worker>
  caf::resumable* park(Worker* self) {
    auto parent = self->parent();
    auto& wd = d(self);
    {
      std::lock_guard<std::mutex> guard{wd.mtx};
      wd.parked = true;
    }
    announce_parked(d(parent).parked);
    // A job enqueued before the count went up has not woken anyone.
    auto job = wd.queue.take_head();
    if (job == nullptr)
      job = steal_any(self);
    std::unique_lock<std::mutex> guard{wd.mtx};
    if (job == nullptr)
      wd.cv.wait_for(guard, wd.park_timeout, [&] { return !wd.parked; });
    if (wd.parked) { // not woken by anyone: take the count back
      wd.parked = false;
      d(parent).parked.fetch_sub(1, std::memory_order_relaxed);
    }
    return job;
  }

  template <class Worker, class UnaryFunction>
  void foreach_resumable(Worker* self, UnaryFunction f) {
    auto next = [&] { return d(self).queue.take_head(); };
    for (auto job = next(); job != nullptr; job = next())
      f(job);
  }

  template <class Coordinator, class UnaryFunction>
  void foreach_central_resumable(Coordinator*, UnaryFunction) {
    // nop
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
  : public caf::scheduler::coordinator<parking_work_stealing> {
public:
  using super = caf::scheduler::coordinator<parking_work_stealing>;

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
