#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace spindle {

/// A cluster node's view of its own lease (docs/cluster.md), shared by the
/// node's heartbeat, which renews the lease in the database, and by those
/// who may act on it only while it runs: the thread registry and
/// `/healthz`. Thread-safe.
///
/// The database's row says the lease runs until `expires_at` on the
/// database's clock. The node cannot read that clock, so it keeps its own,
/// earlier deadline: the time it *sent* the last renewal that succeeded,
/// plus the lease, minus a margin. Whatever the delays, the node stops
/// trusting its lease before the database lets another node take its
/// threads.
///
/// Every period in which the lease ran without a break is a *term*: the
/// term rises when a renewal succeeds after the deadline had passed (the
/// node was cut off, or paused). Whatever the node held under an earlier
/// term may have moved meanwhile: the registry drops the threads it
/// activated in an earlier term before it serves them again.
class cluster_standing {
public:
  using clock = std::chrono::steady_clock;

  cluster_standing(std::string name, uint64_t incarnation)
    : name_(std::move(name)), incarnation_(incarnation) {
  }

  const std::string& name() const noexcept {
    return name_;
  }
  uint64_t incarnation() const noexcept {
    return incarnation_;
  }

  /// Whether the lease runs now; and the current term.
  struct reading {
    bool live;
    uint64_t term;
  };
  reading read() const {
    std::lock_guard<std::mutex> guard{mtx_};
    return {!superseded_ && clock::now() < deadline_, term_};
  }
  bool live() const {
    return read().live;
  }

  /// A renewal sent at `sent` succeeded: the lease runs until `sent +
  /// valid`. Starts a new term when the deadline had passed.
  void renewed(clock::time_point sent, clock::duration valid) {
    std::lock_guard<std::mutex> guard{mtx_};
    if (clock::now() >= deadline_)
      ++term_;
    deadline_ = std::max(deadline_, sent + valid);
  }

  /// Another process took the node's name (a newer incarnation): the
  /// lease never runs again in this process.
  void supersede() {
    std::lock_guard<std::mutex> guard{mtx_};
    superseded_ = true;
  }
  bool superseded() const {
    std::lock_guard<std::mutex> guard{mtx_};
    return superseded_;
  }

  /// The node left the cluster (a clean stop).
  void end() {
    std::lock_guard<std::mutex> guard{mtx_};
    deadline_ = clock::time_point{};
  }

  /// When the lease stops running (a past time once it has).
  clock::time_point deadline() const {
    std::lock_guard<std::mutex> guard{mtx_};
    return deadline_;
  }

private:
  const std::string name_;
  const uint64_t incarnation_;
  mutable std::mutex mtx_;
  clock::time_point deadline_{};
  uint64_t term_ = 0;
  bool superseded_ = false;
};

} // namespace spindle
