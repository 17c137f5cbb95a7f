// store_bench: round-trip latency (p50/p99) and throughput of dtrain's TcpStore beside PyTorch's
// C++ c10d::TCPStore, measured in the same run, interleaved (ours, theirs, ours, theirs ... for
// each configuration) so that both see the same machine load.
//
//   store_bench [--iters N] [--warmup N] [--rounds N] [--clients 1,16,64] [--ops set,get,add]
//               [--value-bytes N] [--acknowledged-sets] [--no-flush] [--no-peer] [--smoke]
//
// Each client is a thread with its own connection. set: every client writes its own key; get:
// every client reads its own key; add: every client increments one shared counter (the
// rendezvous pattern). Results are checked: a get must return what was set, each client's key
// must end holding its last set, and the counter must end at exactly the number of adds
// (#wrong). Both stores' set() return once the request is sent,
// so each client's timed phase ends with one more round trip on its connection (dtrain: flush();
// c10d: check()), answered only after the sets before it: ops/s counts sets the server has
// applied. --no-flush stops the clock when the last set() returns instead (sets sent).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/stats.h"
#include "dtrain/base/tcp_store.h"
#include "dtrain/config.h"

#if DTRAIN_WITH_TORCH
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

namespace {

using Clock = std::chrono::steady_clock;
using dtrain::store::Bytes;

struct Config {
  int iters = 2000;
  int warmup = 200;
  int rounds = 3;
  std::vector<int> clients{1, 16, 64};
  std::vector<std::string> ops{"set", "get", "add"};
  size_t valueBytes = 32;
  bool acknowledgedSets = false;  // dtrain's set() waits for the server (TcpStoreOptions)
  bool flush = true;              // the timed phase ends once the server applied every set
  bool peer = true;
};

// The few operations measured, over either store.
struct Client {
  std::function<void(const std::string&, const Bytes&)> set;
  std::function<Bytes(const std::string&)> get;
  std::function<int64_t(const std::string&, int64_t)> add;
  std::function<void()> flush;  // one round trip, answered after every set before it
};

// One implementation under test: a server and a way to connect clients to it.
struct Subject {
  std::string name;
  std::function<Client()> connect;
  std::function<void()> keepAlive;  // holds the server
};

Subject dtrainSubject(bool acknowledgedSets) {
  dtrain::store::TcpStoreServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  std::shared_ptr<dtrain::store::TcpStoreServer> server = dtrain::store::TcpStoreServer::start(so);
  Subject s;
  s.name = "dtrain";
  s.connect = [server, acknowledgedSets] {
    dtrain::store::TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = server->port();
    o.timeout = std::chrono::milliseconds(60000);
    o.acknowledgedSets = acknowledgedSets;
    auto store = std::make_shared<dtrain::store::TcpStore>(o);
    return Client{[store](const std::string& k, const Bytes& v) { store->set(k, v); },
                  [store](const std::string& k) { return store->get(k); },
                  [store](const std::string& k, int64_t d) { return store->add(k, d); },
                  [store] { store->flush(); }};
  };
  s.keepAlive = [server] {};
  return s;
}

#if DTRAIN_WITH_TORCH
Subject c10dSubject() {
  c10d::TCPStoreOptions so;
  so.port = 0;
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = std::chrono::milliseconds(60000);
  auto server = std::make_shared<c10d::TCPStore>("127.0.0.1", so);
  uint16_t port = server->getPort();
  Subject s;
  s.name = "c10d";
  s.connect = [port] {
    c10d::TCPStoreOptions o;
    o.port = port;
    o.isServer = false;
    o.waitWorkers = false;
    o.timeout = std::chrono::milliseconds(60000);
    auto store = std::make_shared<c10d::TCPStore>("127.0.0.1", o);
    return Client{[store](const std::string& k, const Bytes& v) { store->set(k, v); },
                  [store](const std::string& k) { return store->get(k); },
                  [store](const std::string& k, int64_t d) { return store->add(k, d); },
                  // A round trip: the server answers it after the sets before it on this
                  // connection, so when it returns they are applied.
                  [store] { store->check({"bench/key0"}); }};
  };
  s.keepAlive = [server] {};
  return s;
}
#endif

struct Result {
  std::vector<double> micros;  // every timed operation of every round
  double seconds = 0;          // wall time of the timed phases, summed over rounds
  long ops = 0;
  long wrong = 0;
};

// One round of `op` with `n` clients on `subject`; appends to `out`.
void runRound(Subject& subject, const std::string& op, int n, const Config& cfg, int round,
              Result* out) {
  std::vector<Client> clients;
  for (int i = 0; i < n; ++i) clients.push_back(subject.connect());
  Bytes value(cfg.valueBytes, 'v');
  const std::string counter = "bench/counter/" + op + std::to_string(n) + "/" +
                              std::to_string(round);
  for (int i = 0; i < n; ++i) clients[i].set("bench/key" + std::to_string(i), value);

  std::vector<std::vector<double>> micros(n);
  std::vector<long> wrong(n, 0);
  std::vector<Bytes> lastSet(n, value);  // set: what each client wrote last, checked after
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<Clock::time_point> ends(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      Client& c = clients[i];
      const std::string key = "bench/key" + std::to_string(i);
      Bytes& mine = lastSet[i];
      auto once = [&](int it) {
        if (op == "set") {
          if (!mine.empty()) mine[0] = static_cast<uint8_t>(it);  // each set writes news
          c.set(key, mine);
        } else if (op == "get") {
          if (c.get(key) != value) ++wrong[i];
        } else {
          c.add(counter, 1);
        }
      };
      for (int w = 0; w < cfg.warmup; ++w) once(w);
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      micros[i].reserve(cfg.iters);
      for (int it = 0; it < cfg.iters; ++it) {
        auto t0 = Clock::now();
        once(it);
        micros[i].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
      if (cfg.flush) c.flush();
      ends[i] = Clock::now();
    });
  }
  while (ready.load() < n) std::this_thread::yield();
  auto start = Clock::now();
  go = true;
  for (auto& t : threads) t.join();
  auto end = *std::max_element(ends.begin(), ends.end());
  out->seconds += std::chrono::duration<double>(end - start).count();
  out->ops += static_cast<long>(n) * cfg.iters;
  for (int i = 0; i < n; ++i) {
    out->micros.insert(out->micros.end(), micros[i].begin(), micros[i].end());
    out->wrong += wrong[i];
  }
  if (op == "set") {
    // On the client's own connection: both stores answer it after that client's sets.
    for (int i = 0; i < n; ++i) {
      if (clients[i].get("bench/key" + std::to_string(i)) != lastSet[i]) ++out->wrong;
    }
  }
  if (op == "add") {
    int64_t expected = static_cast<int64_t>(n) * (cfg.iters + cfg.warmup);
    if (clients[0].add(counter, 0) != expected) ++out->wrong;
  }
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

int usage(const char* why, FILE* out = stderr) {
  std::fprintf(out,
               "store_bench: %s\nusage: store_bench [--iters N] [--warmup N] [--rounds N] "
               "[--clients 1,16,64] [--ops set,get,add] [--value-bytes N] "
               "[--acknowledged-sets] [--no-flush] [--no-peer] [--smoke]\n",
               why);
  return 2;
}

// Reads the command line into `cfg`; -1 to go on, else the exit code (--help: 0, a usage error: 2).
int parse(int argc, char** argv, Config& cfg) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--help" || a == "-h") {
      usage("round trips of TcpStore beside c10d::TCPStore", stdout);
      return 0;
    } else if (a == "--smoke") {
      cfg.iters = 50;
      cfg.warmup = 5;
      cfg.rounds = 1;
      cfg.clients = {1, 4};
    } else if (a == "--no-peer") {
      cfg.peer = false;
    } else if (a == "--no-flush") {
      cfg.flush = false;
    } else if (a == "--acknowledged-sets") {
      cfg.acknowledgedSets = true;
    } else if ((a == "--iters" || a == "--warmup" || a == "--rounds" || a == "--value-bytes" ||
                a == "--clients" || a == "--ops") &&
               (v = next()) != nullptr) {
      if (a == "--clients") {
        cfg.clients.clear();
        for (const auto& c : split(v)) cfg.clients.push_back(std::atoi(c.c_str()));
      } else if (a == "--ops") {
        cfg.ops = split(v);
      } else {
        long n = std::atol(v);
        if (n <= 0 && !(a == "--warmup" && n == 0)) return usage(("bad value for " + a).c_str());
        if (a == "--iters") cfg.iters = static_cast<int>(n);
        if (a == "--warmup") cfg.warmup = static_cast<int>(n);
        if (a == "--rounds") cfg.rounds = static_cast<int>(n);
        if (a == "--value-bytes") cfg.valueBytes = static_cast<size_t>(n);
      }
    } else {
      return usage(("unknown or incomplete option " + a).c_str());
    }
  }
  for (const auto& op : cfg.ops) {
    if (op != "set" && op != "get" && op != "add") return usage(("unknown op " + op).c_str());
  }
  for (int c : cfg.clients) {
    if (c <= 0) return usage("client counts must be positive");
  }
  return -1;
}

void printHeader(const Config& cfg, size_t subjects) {
  std::printf("# store_bench: %d iters + %d warm-up per client, %d round(s) interleaved, "
              "%zu-byte values, loopback\n",
              cfg.iters, cfg.warmup, cfg.rounds, cfg.valueBytes);
  std::printf("# ratio: p50 = c10d p50 / dtrain p50, ops = dtrain ops/s / c10d ops/s "
              "(above 1: dtrain is faster)\n");
  std::printf("# set: %s; ops/s %s\n",
              cfg.acknowledgedSets ? "dtrain's returns once applied (--acknowledged-sets), "
                                     "c10d's once sent"
                                   : "returns once sent, in both",
              cfg.flush ? "counts sets applied (each client ends with a round trip)"
                        : "counts sets sent (--no-flush)");
  std::printf("#\n");
  std::printf("# %-4s %7s  %9s %9s %10s", "op", "clients", "p50_us", "p99_us", "ops/s");
  if (subjects > 1) {
    std::printf("  %9s %9s %10s  %6s %6s", "c10d_p50", "c10d_p99", "c10d_ops/s", "r_p50", "r_ops");
  }
  std::printf("  %6s\n", "#wrong");
}

// One row: `op` with `n` clients, every subject in turn for --rounds rounds. Returns #wrong.
long measureRow(const std::string& op, int n, const Config& cfg, std::vector<Subject>& subjects) {
  std::vector<Result> results(subjects.size());
  for (int r = 0; r < cfg.rounds; ++r) {
    for (size_t s = 0; s < subjects.size(); ++s) runRound(subjects[s], op, n, cfg, r, &results[s]);
  }
  long wrong = 0;
  for (const auto& res : results) wrong += res.wrong;
  auto p50 = [&](size_t s) { return dtrain::bench::percentile(results[s].micros, 0.50); };
  auto p99 = [&](size_t s) { return dtrain::bench::percentile(results[s].micros, 0.99); };
  auto ops = [&](size_t s) { return results[s].ops / results[s].seconds; };
  std::printf("  %-4s %7d  %9.1f %9.1f %10.0f", op.c_str(), n, p50(0), p99(0), ops(0));
  if (subjects.size() > 1) {
    std::printf("  %9.1f %9.1f %10.0f  %6.2f %6.2f", p50(1), p99(1), ops(1), p50(1) / p50(0),
                ops(0) / ops(1));
  }
  std::printf("  %6ld\n", wrong);
  std::fflush(stdout);
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  if (const int code = parse(argc, argv, cfg); code >= 0) return code;
  std::vector<Subject> subjects{dtrainSubject(cfg.acknowledgedSets)};
#if DTRAIN_WITH_TORCH
  if (cfg.peer) subjects.push_back(c10dSubject());
#else
  if (cfg.peer) std::printf("# peer c10d::TCPStore unavailable: this build has no libtorch\n");
#endif
  printHeader(cfg, subjects.size());
  long totalWrong = 0;
  for (const auto& op : cfg.ops) {
    for (int n : cfg.clients) totalWrong += measureRow(op, n, cfg, subjects);
  }
  if (totalWrong > 0) {
    std::printf("# FAILED: %ld wrong results\n", totalWrong);
    return 1;
  }
  return 0;
}
