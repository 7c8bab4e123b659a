#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <utility>

namespace spindle {

/// The consumer's control of a streamed reply's producer (a provider
/// reading its upstream).
///
/// Backpressure: the consumer (the connection of a client that reads
/// slowly) pauses the producer while too much of the reply waits unsent,
/// and resumes it once the client caught up. The producer asks between two
/// reads, so it stops after the piece under way and the upstream's own TCP
/// window holds the rest (docs/api.md, "Limits").
///
/// Cancellation: anyone may cancel the reply (`POST .../cancel`); the
/// producer's abort runs at once and the call ends as interrupted with what
/// was generated.
///
/// Thread-safe: the consumer and the producer may run on different threads.
class flow_control {
public:
  /// Stops the reply for good: the producer's abort runs (now, on this
  /// thread; it posts to its own), and one that registers later runs it at
  /// once. Returns false if it was cancelled before.
  bool cancel() {
    std::function<void()> abort, go;
    {
      std::lock_guard<std::mutex> guard{mx_};
      if (cancelled_)
        return false;
      cancelled_ = true;
      paused_ = false;
      abort = std::move(abort_);
      abort_ = nullptr;
      go = std::move(waiting_);
      waiting_ = nullptr;
    }
    if (abort)
      abort();
    if (go)
      go();
    return true;
  }

  bool cancelled() const {
    std::lock_guard<std::mutex> guard{mx_};
    return cancelled_;
  }

  /// Producer: how to stop it at once (it must not own the producer, or
  /// only until `drop`). Runs at once if the reply is cancelled already.
  void on_cancel(std::function<void()> abort) {
    {
      std::lock_guard<std::mutex> guard{mx_};
      if (!cancelled_) {
        abort_ = std::move(abort);
        return;
      }
    }
    abort();
  }

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
    if (!paused_ || cancelled_)
      return false;
    waiting_ = std::move(then);
    ++holds_;
    return true;
  }

  /// Producer: it ended; a continuation and an abort it left are dropped
  /// unrun (they may own the producer: this breaks the cycle).
  void drop() {
    std::function<void()> gone, abort;
    std::lock_guard<std::mutex> guard{mx_};
    gone = std::move(waiting_);
    waiting_ = nullptr;
    abort = std::move(abort_);
    abort_ = nullptr;
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
  bool cancelled_ = false;
  std::function<void()> waiting_;
  std::function<void()> abort_;
  uint64_t holds_ = 0;
};

} // namespace spindle
