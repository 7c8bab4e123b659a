#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <utility>

namespace spindle {

/// Backpressure between the consumer of a streamed reply (the connection of
/// a client that reads slowly) and its producer (a provider reading its
/// upstream): the consumer pauses the producer while too much of the reply
/// waits unsent, and resumes it once the client caught up. The producer
/// asks between two reads, so it stops after the piece under way and the
/// upstream's own TCP window holds the rest (docs/api.md, "Limits").
/// Thread-safe: the consumer and the producer may run on different threads.
class flow_control {
public:
  /// Consumer: stop producing after the piece under way.
  void pause() {
    std::lock_guard<std::mutex> guard{mx_};
    paused_ = true;
  }

  /// Consumer: go on. A producer that waits runs its continuation, on this
  /// thread (it posts to its own). Also called when the client went away,
  /// so that a waiting producer reads on, learns it and stops.
  void resume() {
    std::function<void()> go;
    {
      std::lock_guard<std::mutex> guard{mx_};
      paused_ = false;
      go = std::move(waiting_);
      waiting_ = nullptr;
    }
    if (go)
      go();
  }

  /// Producer: false means go on now. True means paused: `then` runs once
  /// on `resume` instead, and the producer does nothing meanwhile.
  bool hold(std::function<void()> then) {
    std::lock_guard<std::mutex> guard{mx_};
    if (!paused_)
      return false;
    waiting_ = std::move(then);
    ++holds_;
    return true;
  }

  /// Producer: it ended; a continuation it left is dropped unrun (it may
  /// own the producer: this breaks the cycle).
  void drop() {
    std::function<void()> gone;
    std::lock_guard<std::mutex> guard{mx_};
    gone = std::move(waiting_);
    waiting_ = nullptr;
  }

  bool paused() const {
    std::lock_guard<std::mutex> guard{mx_};
    return paused_;
  }

  /// How many times the producer found itself paused.
  uint64_t holds() const {
    std::lock_guard<std::mutex> guard{mx_};
    return holds_;
  }

private:
  mutable std::mutex mx_;
  bool paused_ = false;
  std::function<void()> waiting_;
  uint64_t holds_ = 0;
};

} // namespace spindle
