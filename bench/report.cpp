#include "report.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

#include <sys/utsname.h>

extern char** environ;

namespace spindle::bench {

double seconds_since(clock::time_point start) {
  return std::chrono::duration<double>(clock::now() - start).count();
}

double percentile(std::vector<double>& samples, double p) {
  if (samples.empty())
    return 0;
  std::sort(samples.begin(), samples.end());
  auto rank = p / 100.0 * static_cast<double>(samples.size() - 1);
  auto lo = static_cast<size_t>(std::floor(rank));
  auto hi = static_cast<size_t>(std::ceil(rank));
  return samples[lo] + (samples[hi] - samples[lo]) * (rank - std::floor(rank));
}

uint64_t rss_bytes() {
  std::ifstream in{"/proc/self/status"};
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0)
      return std::stoull(line.substr(6)) * 1024;
  return 0;
}

std::string fmt(double value, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << value;
  auto text = out.str();
  auto dot = text.find('.');
  auto int_end = dot == std::string::npos ? text.size() : dot;
  auto start = text[0] == '-' ? 1u : 0u;
  for (auto i = static_cast<long>(int_end) - 3; i > static_cast<long>(start);
       i -= 3)
    text.insert(static_cast<size_t>(i), ",");
  return text;
}

nlohmann::json machine() {
  nlohmann::json m;
  std::ifstream cpu{"/proc/cpuinfo"};
  std::string line;
  while (std::getline(cpu, line))
    if (line.rfind("model name", 0) == 0) {
      m["cpu"] = line.substr(line.find(':') + 2);
      break;
    }
  m["cores"] = std::thread::hardware_concurrency();
  std::ifstream mem{"/proc/meminfo"};
  while (std::getline(mem, line))
    if (line.rfind("MemTotal:", 0) == 0) {
      m["memory_gib"] = std::stod(line.substr(9)) / 1024.0 / 1024.0;
      break;
    }
  utsname u{};
  if (uname(&u) == 0)
    m["kernel"] = std::string{u.sysname} + " " + u.release;
  return m;
}

report::report(std::string benchmark) : name_(std::move(benchmark)) {
}

void report::add(table t) {
  std::vector<std::vector<std::string>> cells;
  std::vector<size_t> width(t.columns.size(), 0);
  for (size_t c = 0; c < t.columns.size(); ++c)
    width[c] = t.columns[c].size();
  for (auto& row : t.rows) {
    std::vector<std::string> out;
    for (size_t c = 0; c < row.size(); ++c) {
      auto text = row[c].is_string() ? row[c].get<std::string>()
                  : row[c].is_number_integer()
                    ? fmt(row[c].get<double>(), 0)
                    : row[c].is_number() ? fmt(row[c].get<double>(), 2)
                                         : row[c].dump();
      if (c < width.size())
        width[c] = std::max(width[c], text.size());
      out.push_back(std::move(text));
    }
    cells.push_back(std::move(out));
  }
  std::cout << "\n## " << t.title << "\n\n|";
  for (size_t c = 0; c < t.columns.size(); ++c)
    std::cout << " " << std::left << std::setw(static_cast<int>(width[c]))
              << t.columns[c] << " |";
  std::cout << "\n|";
  for (size_t c = 0; c < t.columns.size(); ++c)
    std::cout << std::string(width[c] + 2, '-') << "|";
  std::cout << "\n";
  for (auto& row : cells) {
    std::cout << "|";
    for (size_t c = 0; c < row.size(); ++c)
      std::cout << " " << std::right
                << std::setw(static_cast<int>(c < width.size() ? width[c] : 0))
                << row[c] << " |";
    std::cout << "\n";
  }
  for (auto& note : t.notes)
    std::cout << "\n" << note << "\n";
  std::cout << std::flush;
  tables_.push_back(std::move(t));
}

bool report::write(const std::string& path) const {
  nlohmann::json doc;
  doc["benchmark"] = name_;
  doc["machine"] = machine();
  doc["tables"] = nlohmann::json::array();
  for (auto& t : tables_) {
    nlohmann::json out{{"title", t.title},
                       {"columns", t.columns},
                       {"rows", t.rows},
                       {"notes", t.notes}};
    if (!t.beside.is_null())
      out["beside"] = t.beside;
    doc["tables"].push_back(std::move(out));
  }
  std::error_code ec;
  auto parent = std::filesystem::path{path}.parent_path();
  if (!parent.empty())
    std::filesystem::create_directories(parent, ec);
  std::ofstream out{path};
  if (!out)
    return false;
  out << doc.dump(2) << "\n";
  std::cout << "\nfigures written to " << path << "\n";
  return static_cast<bool>(out);
}

std::string report::json_path(int argc, char** argv,
                              const std::string& benchmark) {
  auto path = value(argc, argv, "--json");
  return path.empty() ? "bench/results/" + benchmark + ".json" : path;
}

std::string report::value(int argc, char** argv, const std::string& flag) {
  for (int i = 1; i + 1 < argc; ++i)
    if (flag == argv[i])
      return argv[i + 1];
  return {};
}

bool report::quick(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string{argv[i]} == "--quick")
      return true;
  return false;
}

bool report::selected(int argc, char** argv, const std::string& section) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string{argv[i]} == "--only")
      return section == argv[i + 1];
  return true;
}

uint64_t in_child(const std::function<uint64_t()>& fn) {
  int fds[2];
  if (pipe(fds) != 0)
    return 0;
  auto pid = fork();
  if (pid < 0)
    return 0;
  if (pid == 0) {
    close(fds[0]);
    uint64_t value = fn();
    auto n = write(fds[1], &value, sizeof(value));
    (void) n;
    _exit(0);
  }
  close(fds[1]);
  uint64_t value = 0;
  if (read(fds[0], &value, sizeof(value)) != sizeof(value))
    value = 0;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return value;
}

serve_child::serve_child(const std::vector<std::string>& args) {
  int out[2];
  if (pipe(out) != 0)
    std::abort();
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  std::vector<std::string> all{SPINDLE_BINARY, "serve",       "--port",
                               "0",            "--log-level", "warn"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  auto spawned = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(),
                             environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  std::string line;
  char c;
  while (spawned == 0 && read(out[0], &c, 1) == 1 && c != '\n')
    line += c;
  close(out[0]);
  auto colon = line.rfind(':');
  if (spawned == 0 && colon != std::string::npos)
    port_ = std::atoi(line.c_str() + colon + 1);
  if (port_ <= 0) {
    if (spawned == 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    std::cerr << SPINDLE_BINARY << " serve did not start (it printed '"
              << line << "')\n";
    std::exit(1);
  }
}

serve_child::~serve_child() {
  if (pid_ <= 0)
    return;
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
}

} // namespace spindle::bench
