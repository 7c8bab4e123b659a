// The bearer token parser of tenancy (docs/tenants.md, "Keys"): the input
// is presented as a key to a store (in memory) that holds one key of one
// tenant, through the cache and through the store.
//
// Invariants: only the exact secret authenticates; anything else that has
// a key's form is unknown, and anything without it is refused before the
// store is asked; the admin token's comparison holds for it alone.

#include <memory>
#include <string>

#include "fuzz.hpp"
#include "core/logging.hpp"
#include "server/auth.hpp"
#include "tenancy/tenant_store.hpp"

using namespace spindle;
using spindle::fuzz::check;

namespace {

struct fixture {
  std::unique_ptr<tenancy::tenant_store> store;
  std::string secret;
  std::string tenant;
};

fixture& the_fixture() {
  static fixture* f = [] {
    (void) setup_logging("off", "text");
    auto out = new fixture;
    storage_options so;
    so.data_dir = ":memory:";
    auto store = tenancy::tenant_store::open(so);
    check(static_cast<bool>(store), "the store opens");
    out->store = std::move(*store);
    auto t = out->store->create_tenant("fuzz", 1);
    check(static_cast<bool>(t), "a tenant is created");
    out->tenant = t->id;
    auto k = out->store->create_key(t->id, "k", tenancy::default_scopes, 0);
    check(static_cast<bool>(k), "a key is created");
    out->secret = k->secret;
    return out;
  }();
  return *f;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto& f = the_fixture();
  std::string input{fuzz::text(data, size)};
  // Inputs that start with '=' are tried as the secret with the rest
  // replacing its tail, so that near misses of the real key are tried.
  if (!input.empty() && input[0] == '=') {
    auto tail = input.substr(1, f.secret.size());
    input = f.secret.substr(0, f.secret.size() - tail.size()) + tail;
  }
  auto form = tenancy::tenant_store::looks_like_key(input);
  tenancy::key_record k;
  auto cached = f.store->cached(input, k);
  if (!form)
    check(cached && *cached == tenancy::key_check::unknown,
          "a token without a key's form is refused from the cache");
  auto verdict = f.store->authenticate(input, k);
  check(static_cast<bool>(verdict), "authentication answers");
  if (input == f.secret) {
    check(*verdict == tenancy::key_check::valid, "the secret authenticates");
    check(k.tenant == f.tenant, "in its tenant");
  } else {
    check(*verdict == tenancy::key_check::unknown,
          "nothing but the secret authenticates");
  }
  check(http::same_secret(input, input) == !input.empty(),
        "a token is the same as itself");
  check(http::same_secret(input, f.secret) == (input == f.secret),
        "the admin token's comparison holds for it alone");
  return 0;
}
