#pragma once
// A simulated cluster for one e2e test: scripts/netns-cluster.sh up on construction, down on
// destruction (also when the test failed), with a name unique to this test process, so tests
// run in parallel never touch each other's hosts. Clusters of test processes that died (a
// ctest timeout's SIGKILL) are removed by the next one that starts.

#include <memory>
#include <string>
#include <vector>

namespace dtrain::testing {

class Cluster {
 public:
  // Brings up `n` hosts. Returns nullptr with *skipReason set when this machine cannot (not root,
  // no network namespaces, no sshd): the caller reports SKIP with the reason.
  static std::unique_ptr<Cluster> up(int n, std::string* skipReason);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  const std::string& name() const { return name_; }
  const std::vector<std::string>& hosts() const { return hosts_; }  // one address each
  std::string hostList() const;                                     // "a,b,c"
  const std::string& sshConfig() const { return sshConfig_; }
  const std::string& bridgeAddress() const { return bridge_; }  // this namespace's address
  const std::string& workDir() const { return work_; }          // same path, private on every host
  const std::string& dir() const { return dir_; }

  // A wrapper that runs a command on host k: {script, "exec", name, k}, then the command.
  std::vector<std::string> on(int k) const;
  // Runs `sh -c command` on host k; returns its exit status and stdout.
  int run(int k, const std::string& command, std::string* out = nullptr) const;
  // SIGKILLs every process on host k (its sshd too); takes its cable out / puts it back.
  void killHost(int k) const;
  void link(int k, bool up) const;

 private:
  Cluster() = default;
  std::string name_;
  std::string dir_;
  std::vector<std::string> hosts_;
  std::string sshConfig_;
  std::string bridge_;
  std::string work_;
};

// scripts/netns-cluster.sh in the source tree.
std::string clusterScript();

}  // namespace dtrain::testing
