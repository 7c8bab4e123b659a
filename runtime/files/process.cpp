#include "spindle/runtime/process.hpp"

#include <cerrno>
#include <fstream>
#include <sstream>

#include <signal.h>
#include <unistd.h>

namespace spindle {

namespace {

// Reads /proc/PID/stat and returns the fields after the command name, which
// may itself contain spaces and parentheses.
std::optional<std::string> stat_tail(pid_t pid) {
  std::ifstream in{"/proc/" + std::to_string(pid) + "/stat"};
  if (!in)
    return std::nullopt;
  std::string line;
  std::getline(in, line);
  auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 > line.size())
    return std::nullopt;
  return line.substr(close + 2);
}

bool all_digits(const std::string& text) {
  return !text.empty()
         && text.find_first_not_of("0123456789") == std::string::npos;
}

} // namespace

std::string process_identity::to_string() const {
  return std::to_string(pid) + ":" + std::to_string(start_time);
}

std::optional<process_identity>
process_identity::parse(const std::string& text) {
  process_identity result;
  auto colon = text.find(':');
  // Digits only: stoll and stoull also take leading blanks and a sign, and
  // stoull wraps "-1" to 2^64 - 1, a start time that makes a live holder
  // look like a reused PID.
  auto pid_text = text.substr(0, colon);
  auto start_text = colon == std::string::npos ? std::string{"0"}
                                               : text.substr(colon + 1);
  if (!all_digits(pid_text) || !all_digits(start_text))
    return std::nullopt;
  try {
    auto pid = std::stoll(pid_text);
    if (pid <= 0 || pid > 4194304)
      return std::nullopt;
    result.pid = static_cast<pid_t>(pid);
    result.start_time = std::stoull(start_text);
  } catch (...) {
    return std::nullopt;
  }
  return result;
}

std::optional<uint64_t> process_start_time(pid_t pid) {
  auto tail = stat_tail(pid);
  if (!tail)
    return std::nullopt;
  // After the command name: field 3 (state) is first; start time is 22.
  std::istringstream fields{*tail};
  std::string field;
  char state = '?';
  for (int index = 3; index <= 22; ++index) {
    if (!(fields >> field))
      return std::nullopt;
    if (index == 3)
      state = field.empty() ? '?' : field[0];
  }
  if (state == 'Z' || state == 'X')
    return std::nullopt; // a zombie has finished; only its entry remains
  try {
    return std::stoull(field);
  } catch (...) {
    return std::nullopt;
  }
}

std::optional<process_identity> identify(pid_t pid) {
  auto start = process_start_time(pid);
  if (!start)
    return std::nullopt;
  return process_identity{pid, *start};
}

process_identity self_identity() {
  return identify(getpid()).value_or(process_identity{getpid(), 0});
}

bool is_alive(const process_identity& who) {
  if (who.pid <= 0)
    return false;
  auto start = process_start_time(who.pid);
  if (!start) {
    // No /proc entry we can read: fall back to the kernel's answer.
    return ::kill(who.pid, 0) == 0 || errno == EPERM
             ? access(("/proc/" + std::to_string(who.pid)).c_str(), F_OK) == 0
             : false;
  }
  return who.start_time == 0 || who.start_time == *start;
}

} // namespace spindle
