#include "test_support.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "free_port.h"

namespace dtrain::testing {

std::string binaryDir() { return DTRAIN_TEST_BINARY_DIR; }
std::string sourceDir() { return DTRAIN_TEST_SOURCE_DIR; }
std::string python() { return DTRAIN_TEST_PYTHON; }

std::string binaryPath(const std::string& name) {
  std::string path = binaryDir() + "/" + name;
  EXPECT_EQ(::access(path.c_str(), X_OK), 0) << "built binary missing: " << path;
  return path;
}

std::string pythonImportError(const std::string& modules) {
  const std::string command = "'" + python() + "' -c 'import " + modules + "' 2>&1";
  std::string output;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) output.append(buf, n);
    if (::pclose(pipe) == 0) return "";
  }
  // The last line says why (ModuleNotFoundError: ..., or the shell's "not found"), not the trace.
  while (!output.empty() && output.back() == '\n') output.pop_back();
  output = output.substr(output.rfind('\n') + 1);
  return "DTRAIN_PYTHON " + python() + " cannot import " + modules + ": " + output +
         ". HINT: scripts/setup.sh makes the project's Python environment (.venv, "
         "scripts/requirements.txt); cmake -DDTRAIN_PYTHON=PATH chooses another Python";
}

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string templ = std::string(base && *base ? base : "/tmp") + "/dtrain-test-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp(" << templ << ") failed: errno " << errno;
  }
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void writeFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

bool processExists(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

int freeLoopbackPort() { return freePortOn("127.0.0.1"); }

}  // namespace dtrain::testing
