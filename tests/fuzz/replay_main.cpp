// Replays fuzz inputs through a target without libFuzzer, in the ordinary
// build: every file of every directory given (the committed corpus and
// the inputs of fixed findings) goes through LLVMFuzzerTestOneInput once.
// A finding aborts, so the test fails naming the file last printed.

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz.hpp"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    fs::path arg{argv[i]};
    if (fs::is_directory(arg)) {
      for (auto& entry : fs::recursive_directory_iterator(arg))
        if (entry.is_regular_file())
          files.push_back(entry.path());
    } else if (fs::exists(arg)) {
      files.push_back(arg);
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::cerr << "no inputs to replay\n";
    return 1;
  }
  for (auto& file : files) {
    std::cerr << "replaying " << file.string() << "\n";
    std::ifstream in{file, std::ios::binary};
    std::string data{std::istreambuf_iterator<char>{in},
                     std::istreambuf_iterator<char>{}};
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(data.data()),
                           data.size());
  }
  std::cout << files.size() << " inputs replayed" << std::endl;
  // Leave as libFuzzer's targets expect to be left: at once. A target may
  // keep threads running until the process ends (the HTTP target's
  // server), and static destructors would run while they still use what
  // those destroy.
  std::_Exit(0);
}
