#include <iostream>

#include <spindle/runtime/runtime.hpp>
#include <spindle/version.hpp>

int main() {
  spindle::runtime rt;
  auto ctx = rt.next_context_id();
  auto task = rt.next_task_id("0001");
  if (!ctx || !task) {
    std::cerr << "error\n";
    return 1;
  }
  std::cout << "consumer got " << *ctx << " and " << *task << " from spindle "
            << spindle::version_string << "\n";
  return 0;
}
