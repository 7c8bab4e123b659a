#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "spindle/actors/cluster_standing.hpp"

// A node of a spindle cluster: several `spindle serve` processes on one
// PostgreSQL database (docs/cluster.md). The database is the only place
// the nodes meet: each registers and renews its own lease there, owns the
// threads whose lease rows name it, and finds the others' addresses
// there.

namespace spindle {

/// How a node joins its cluster (`spindle serve --node-name --advertise`).
struct cluster_options {
  /// The node's name, unique in the cluster; empty: not a cluster node
  /// (the runtime does not join, and nothing is leased or fenced).
  std::string node_name;
  /// The base URL other nodes reach this node's HTTP API at
  /// (`http://host:port`); empty until known (`advertise`).
  std::string advertise;
  /// How long a renewal keeps the node's lease running, on the database's
  /// clock. A node killed outright has its threads taken over by others
  /// at most this long after its last renewal.
  std::chrono::milliseconds lease{5000};
  /// How often the node renews its lease.
  std::chrono::milliseconds heartbeat{1000};
  /// The node stops trusting its lease this long before the database lets
  /// it go (clock rates, the renewal's own trip).
  std::chrono::milliseconds margin{1000};
  /// How long a start waits for a node of the same name, whose lease still
  /// runs, to let it run out (a restart right after a crash) before it
  /// gives up.
  std::chrono::milliseconds name_wait{12000};
};

/// One node as the cluster table shows it (`GET /v1/cluster`).
struct cluster_node_info {
  std::string name;
  std::string advertise;
  uint64_t incarnation = 0;
  int64_t started_ms = 0;
  /// Milliseconds since its last renewal (the database's clock).
  int64_t heartbeat_age_ms = 0;
  /// Milliseconds its lease runs on (negative: ran out that long ago).
  int64_t lease_left_ms = 0;
  /// "serving" (its lease runs), "expired" (it stopped renewing: killed,
  /// cut off, paused) or "stopped" (it left cleanly).
  std::string state;
  /// Threads whose lease it holds now.
  uint64_t threads = 0;
  /// Whether it holds the scheduler seat.
  bool scheduler = false;
};

/// A node's membership: its row in `cluster_nodes` and the heartbeat that
/// renews it, on a connection and a thread of its own (a state store busy
/// with writes never delays a renewal). Thread-safe.
class cluster_membership {
public:
  /// Registers the node (a new incarnation of its name) and starts the
  /// heartbeat. A name whose lease still runs is waited for up to
  /// `name_wait`; then, or if the database cannot be reached, an error
  /// (`already_exists`, `storage_unavailable`, ...).
  static caf::expected<std::unique_ptr<cluster_membership>>
  join(const std::string& url, cluster_options options);

  ~cluster_membership();

  cluster_membership(const cluster_membership&) = delete;
  cluster_membership& operator=(const cluster_membership&) = delete;

  /// The node's own standing, for those who may act only while its lease
  /// runs.
  std::shared_ptr<const cluster_standing> standing() const noexcept {
    return standing_;
  }

  const cluster_options& options() const noexcept {
    return options_;
  }

  /// Every node the cluster table holds, by name.
  caf::expected<std::vector<cluster_node_info>> nodes();

  /// The nodes serving now (their lease runs), this one included, as the
  /// last renewal counted them (every heartbeat); at least 1. A tenant's
  /// limits are shared among them (docs/limits.md, "In a cluster").
  /// Thread-safe.
  uint32_t live_nodes() const noexcept;

  /// Changes the address the node advertises in the cluster table (a
  /// server on port 0 learns its port after it joined); `options()` keeps
  /// the address it joined with.
  caf::error advertise(const std::string& url);

  // -- the scheduler seat (docs/cluster.md, "One scheduler") ---------------

  /// The lease key of the scheduler seat in `thread_leases` (no thread ID
  /// can take this form).
  static constexpr const char* scheduler_key = "#scheduler";

  /// Who holds the scheduler seat, as this node last learned.
  struct seat {
    /// This node holds it and its own lease runs now.
    bool here = false;
    /// The epoch its writes are fenced with (when `here`).
    uint64_t epoch = 0;
    /// The holder (this node when `here`; empty: none known).
    std::string holder;
    std::string holder_url;
  };
  seat scheduler_seat() const;

  /// Called (on the heartbeat's thread, or the caller of
  /// `contend_for_scheduler`) with the epoch each time this node takes the
  /// seat, and with 0 when it loses it (its lease lapsed). Replacing it
  /// waits for a call in progress: after `on_scheduler_seat({})` returns,
  /// none runs.
  void on_scheduler_seat(std::function<void(uint64_t epoch)> f);

  /// Takes the seat if it is free, this node's, or held by a node whose
  /// lease ran out, else learns its holder; the heartbeat does this at
  /// every renewal. Returns whether this node holds it.
  bool contend_for_scheduler();

  /// The scheduler this node ran under the seat stopped by itself (its
  /// load failed): the next renewal takes the seat again, with a new
  /// epoch, and the callback starts a fresh one.
  void scheduler_failed(uint64_t epoch);

  /// Leaves the cluster: stops the heartbeat, lets the node's thread
  /// leases go and marks it stopped, so others take its threads at once.
  /// Call after the threads stopped; idempotent.
  void leave();

private:
  struct impl;
  explicit cluster_membership(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
  cluster_options options_;
  std::shared_ptr<cluster_standing> standing_;
};

/// Checks a node name (1-64 of [A-Za-z0-9._-]) and an advertised URL
/// (`http://host:port`); the message says what is wrong.
caf::error validate_cluster_options(const cluster_options& options);

} // namespace spindle
