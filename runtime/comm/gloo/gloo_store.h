#pragma once
// GlooStore: Gloo's rendezvous::Store interface over a dtrain Store, so Gloo's full-mesh connect
// exchanges its addresses through the job's store (with its token, its deadlines, its round
// prefix). Every key goes under `prefix`.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "dtrain/base/store.h"

namespace dtrain::comm {

class GlooStore : public gloo::rendezvous::Store {
 public:
  // `waitTimeout`: deadline of waits that Gloo issues without one.
  GlooStore(std::shared_ptr<store::Store> store, std::string prefix,
            std::chrono::milliseconds waitTimeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string join(const std::string& key) const { return prefix_ + "/" + key; }

  std::shared_ptr<store::Store> store_;
  std::string prefix_;
  std::chrono::milliseconds waitTimeout_;
};

}  // namespace dtrain::comm
