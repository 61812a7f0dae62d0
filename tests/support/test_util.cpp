#include "support/test_util.h"

#include <array>
#include <cstdio>
#include <sys/wait.h>

namespace numattn::test {

int run_command(const std::string& cmd, std::string* out) {
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return -1;
  std::array<char, 4096> buf;
  std::string s;
  std::size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) s.append(buf.data(), n);
  int st = pclose(f);
  if (out) *out = s;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace numattn::test
