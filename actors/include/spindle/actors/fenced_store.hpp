#pragma once

#include <cstdint>
#include <string>

#include "spindle/messages/storage.hpp"

namespace spindle {

/// A state store seen through a lease (docs/cluster.md, "One scheduler"):
/// every write it passes on begins with the fence of `key` at `epoch`
/// (`records::fenced`), so the database refuses it with `not_owner` once
/// the lease changed hands or its node's own lease ran out; reads pass
/// unchanged. The scheduler of a cluster node writes through one of these.
/// Spawn: `sys.spawn(fenced_store, store, key, epoch)`; stop it with its
/// user.
storage_actor::behavior_type fenced_store(storage_actor::pointer self,
                                          storage_actor store,
                                          std::string key, uint64_t epoch);

} // namespace spindle
