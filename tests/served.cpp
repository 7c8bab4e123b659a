#include "served.hpp"

#include <stdexcept>

namespace spindle::test {

served_runtime::served_runtime(runtime_options ro, server_options so) {
  rt_ = std::make_unique<runtime>(std::move(ro));
  so.port = 0;
  srv_ = std::make_unique<spindle::server>(*rt_, so);
  auto bound = srv_->bind();
  if (!bound)
    throw std::runtime_error("served_runtime: cannot bind: "
                             + describe(bound.error()));
  port_ = *bound;
  serving_ = std::thread{[this] { srv_->run(); }};
}

served_runtime::~served_runtime() {
  srv_->stop();
  serving_.join();
}

} // namespace spindle::test
