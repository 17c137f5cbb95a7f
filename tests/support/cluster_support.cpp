#include "cluster_support.h"

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "test_support.h"

namespace dtrain::testing {

namespace {

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

int shell(const std::string& command, std::string* out) {
  FILE* p = ::popen(command.c_str(), "r");
  if (!p) return -1;
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
  int status = ::pclose(p);
  if (out) *out = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string root() {
  const char* r = std::getenv("DTRAIN_CLUSTER_ROOT");
  return r && *r ? r : "/var/tmp";
}

// Clusters whose test process is gone (killed at a ctest timeout): down.
void removeStale() {
  DIR* d = ::opendir(root().c_str());
  if (!d) return;
  std::vector<std::string> stale;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n.rfind("dtrain-cluster-e", 0) != 0) continue;
    std::ifstream owner(root() + "/" + n + "/owner");
    pid_t pid = 0;
    if (owner >> pid && pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) {
      stale.push_back(n.substr(std::string("dtrain-cluster-").size()));
    }
  }
  ::closedir(d);
  for (const auto& name : stale) shell(quote(clusterScript()) + " down " + name + " 2>&1", nullptr);
}

}  // namespace

std::string clusterScript() { return sourceDir() + "/scripts/netns-cluster.sh"; }

std::unique_ptr<Cluster> Cluster::up(int n, std::string* skipReason) {
  if (::geteuid() != 0) {
    *skipReason = "not root: network namespaces and sshd need root";
    return nullptr;
  }
  if (::access("/usr/sbin/sshd", X_OK) != 0) {
    *skipReason = "no /usr/sbin/sshd (openssh-server)";
    return nullptr;
  }
  std::string probe;
  const std::string probeName = "dtrainprobe" + std::to_string(::getpid());
  if (shell("ip netns add " + probeName + " 2>&1 && ip netns del " + probeName, &probe) != 0) {
    *skipReason = "no network namespaces here: " + probe;
    return nullptr;
  }
  removeStale();
  // The hosts' sshd daemons (and every orphan of their sessions) are reparented to this process,
  // which reaps them (launcher_support.h's reapOrphans):
  // this machine's pid 1 may not reap promptly.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  static std::atomic<int> counter{0};
  std::unique_ptr<Cluster> c(new Cluster);
  c->name_ = "e" + std::to_string(::getpid() % 100000) + static_cast<char>('a' + (counter++ % 26));
  std::string out;
  int rc = shell("DTRAIN_CLUSTER_OWNER=" + std::to_string(::getpid()) + " " +
                     quote(clusterScript()) + " up " + std::to_string(n) + " " + c->name_ + " 2>&1",
                 &out);
  if (rc != 0) {
    shell(quote(clusterScript()) + " down " + c->name_, nullptr);
    *skipReason = "netns-cluster.sh up failed: " + out;
    return nullptr;
  }
  c->dir_ = root() + "/dtrain-cluster-" + c->name_;
  std::ifstream hosts(c->dir_ + "/hosts");
  for (std::string h; std::getline(hosts, h);) {
    if (!h.empty()) c->hosts_.push_back(h);
  }
  c->sshConfig_ = c->dir_ + "/ssh_config";
  c->work_ = c->dir_ + "/work";
  c->bridge_ = c->hosts_.at(0).substr(0, c->hosts_[0].rfind('.')) + ".254";
  return c;
}

Cluster::~Cluster() { shell(quote(clusterScript()) + " down " + name_ + " 2>&1", nullptr); }

std::string Cluster::hostList() const {
  std::string out;
  for (const auto& h : hosts_) out += (out.empty() ? "" : ",") + h;
  return out;
}

std::vector<std::string> Cluster::on(int k) const {
  return {clusterScript(), "exec", name_, std::to_string(k)};
}

int Cluster::run(int k, const std::string& command, std::string* out) const {
  std::string line;
  for (const auto& w : on(k)) line += quote(w) + " ";
  return shell(line + "sh -c " + quote(command), out);
}

void Cluster::killHost(int k) const {
  shell(quote(clusterScript()) + " kill " + name_ + " " + std::to_string(k), nullptr);
}

void Cluster::link(int k, bool up) const {
  shell(quote(clusterScript()) + " link " + name_ + " " + std::to_string(k) +
            (up ? " up" : " down"),
        nullptr);
}

}  // namespace dtrain::testing
