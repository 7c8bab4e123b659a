#include "spindle/actors/fenced_store.hpp"

#include <caf/all.hpp>

#include "spindle/actors/records.hpp"

namespace spindle {

storage_actor::behavior_type fenced_store(storage_actor::pointer self,
                                          storage_actor store,
                                          std::string key, uint64_t epoch) {
  return {
    [=](store_atom, sql_write& write) -> caf::result<uint64_t> {
      return self->delegate(store, store_atom::value,
                            records::fenced(key, epoch, std::move(write)));
    },
    [=](store_atom, sql_write& write,
        write_hook_ptr& hook) -> caf::result<uint64_t> {
      return self->delegate(store, store_atom::value,
                            records::fenced(key, epoch, std::move(write)),
                            std::move(hook));
    },
    [=](load_atom, sql_statement& statement) -> caf::result<sql_rows> {
      return self->delegate(store, load_atom::value, std::move(statement));
    },
  };
}

} // namespace spindle
