#include "gloo_algorithms.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace dtrain::comm {

// Note [Direct exchange]
// Gloo's ring allreduce splits even a 4 KiB buffer into 2n segments and moves them in 2(n-1)
// dependent steps; on loopback each step costs a notification round trip and a thread wake-up,
// ~150 us in all for 4 KiB at 2 ranks, and on a loaded 2-core machine any of those wake-ups may
// wait for a scheduler tick (4 ms). Below kDefaultSmallAllreduceBytes we instead post every
// receive, send the whole buffer to each peer and reduce locally: one round trip. With two ranks
// this moves exactly the bytes a ring moves (B per rank), so it is used at every size there:
// large buffers go in chunks, each reduced as soon as it has arrived while the next ones are in
// flight, through a window of kDirectWindow scratch chunks per peer (scratch stays a few MiB for
// any buffer). With more ranks it would move (n-1)B instead of 2(n-1)/n B, so large buffers take
// the ring. Every rank reduces the contributions in rank order, so all ranks hold
// bitwise-identical results (what the ring also guarantees). Reduce-scatter uses the same pattern
// at every size: sending block j to rank j moves exactly as many bytes as a ring would.

namespace {

// Chunks of a direct allreduce in flight per peer, and the smallest chunk (see allreduceDirect).
constexpr size_t kDirectWindow = 8;
constexpr size_t kMinDirectChunkBytes = 256 * 1024;

// Slot prefixes of our own algorithms; Gloo's own use 0x01..0x08.
constexpr uint8_t kDirectAllreducePrefix = 0x40;
constexpr uint8_t kReduceScatterPrefix = 0x41;
constexpr uint8_t kFingerprintPrefix = 0x42;

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds remaining(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

// One buffer per peer and direction, so a timeout names exactly the peers that did not deliver
// (an UnboundBuffer only remembers the rank of its latest completion).
struct PeerBuffers {
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> recv;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> send;
};

bool isTimeout(const std::exception& e) {
  return std::string(e.what()).find("Timed out") != std::string::npos;
}

// One wait on `buf`, interruptible through `interrupt` (may be null). Gloo's wait returns false
// when woken by abortWait*(): only WaitInterrupt does that.
void waitBuffer(gloo::transport::UnboundBuffer& buf, bool receive, WaitInterrupt* interrupt,
                Clock::time_point deadline) {
  std::optional<WaitInterrupt::Waiting> waiting;
  if (interrupt != nullptr) waiting.emplace(interrupt, buf, receive);
  const bool done = receive ? buf.waitRecv(nullptr, remaining(deadline))
                            : buf.waitSend(nullptr, remaining(deadline));
  if (!done) throw GlooInterrupted();
}

// Waits for one receive (or send) on `buf`, naming `peer` when the deadline passes.
void waitOne(gloo::transport::UnboundBuffer& buf, bool receive, int peer, WaitInterrupt* interrupt,
             Clock::time_point deadline) {
  try {
    waitBuffer(buf, receive, interrupt, deadline);
  } catch (const gloo::IoException& e) {
    if (!isTimeout(e)) throw;
    throw GlooWaitTimeout(receive ? "waiting for data from" : "sending to", std::vector<int>{peer});
  }
}

void waitAll(PeerBuffers& bufs, const std::vector<int>& peers, WaitInterrupt* interrupt,
             Clock::time_point deadline) {
  for (size_t i = 0; i < peers.size(); ++i) {
    try {
      waitBuffer(*bufs.recv[i], /*receive=*/true, interrupt, deadline);
    } catch (const gloo::IoException& e) {
      if (!isTimeout(e)) throw;
      std::vector<int> missing(peers.begin() + static_cast<long>(i), peers.end());
      throw GlooWaitTimeout("waiting for data from", missing);
    }
  }
  for (size_t i = 0; i < peers.size(); ++i) {
    try {
      waitBuffer(*bufs.send[i], /*receive=*/false, interrupt, deadline);
    } catch (const gloo::IoException& e) {
      if (!isTimeout(e)) throw;
      throw GlooWaitTimeout("sending to", std::vector<int>{peers[i]});
    }
  }
}

std::vector<int> peersOf(const gloo::Context& ctx) {
  std::vector<int> peers;
  for (int r = 0; r < ctx.size; ++r) {
    if (r != ctx.rank) peers.push_back(r);
  }
  return peers;
}

// Reduces contributions[0..n) in rank order into `out` (which may be one of them).
void reduceInRankOrder(const std::vector<const uint8_t*>& contributions, uint8_t* out,
                       uint8_t* accumulator, size_t count, ReduceFn reduce) {
  const size_t n = contributions.size();
  if (n == 1) return;
  // acc = c0 op c1, then acc op c2, ...; the last step writes `out`. `out` may alias a
  // contribution: element-wise kernels read both inputs before writing.
  const uint8_t* acc = contributions[0];
  for (size_t k = 1; k < n; ++k) {
    uint8_t* dst = (k == n - 1) ? out : accumulator;
    reduce(dst, acc, contributions[k], count);
    acc = dst;
  }
}

}  // namespace

WaitInterrupt::Waiting::Waiting(WaitInterrupt* owner, gloo::transport::UnboundBuffer& buffer,
                                bool receive)
    : owner_(owner) {
  std::lock_guard<std::mutex> lock(owner_->mutex_);
  if (owner_->interrupted_) throw GlooInterrupted();
  owner_->buffer_ = &buffer;
  owner_->receive_ = receive;
}

WaitInterrupt::Waiting::~Waiting() {
  // The buffer dies after this: interrupt() never touches it once it is unregistered.
  std::lock_guard<std::mutex> lock(owner_->mutex_);
  owner_->buffer_ = nullptr;
}

void WaitInterrupt::interrupt() {
  std::lock_guard<std::mutex> lock(mutex_);
  interrupted_ = true;
  if (buffer_ == nullptr) return;
  // Set before the wait begins, the flag makes it return at once; during it, it wakes it.
  if (receive_) {
    buffer_->abortWaitRecv();
  } else {
    buffer_->abortWaitSend();
  }
}

uint8_t* Scratch::reserve(size_t bytes) {
  if (bytes > capacity_) {
    size_t grown = std::max(bytes, capacity_ + capacity_ / 2);
    data_.reset(new uint8_t[grown]);
    std::memset(data_.get(), 0, grown);  // touch every page now, not inside a collective
    capacity_ = grown;
  }
  return data_.get();
}

void allreduceDirect(const GlooCall& call, void* data, size_t count, size_t elementSize,
                     ReduceFn reduce, Scratch& scratch, size_t chunkBytes) {
  gloo::Context& ctx = *call.context;
  const int n = ctx.size;
  const int me = ctx.rank;
  const auto deadline = Clock::now() + call.timeout;
  const uint64_t slot = gloo::Slot::build(kDirectAllreducePrefix, call.tag);
  const auto peers = peersOf(ctx);
  const size_t npeers = peers.size();
  uint8_t* const out = static_cast<uint8_t*>(data);

  // Chunks of the buffer flow through a window of kDirectWindow scratch slots per peer, so
  // scratch stays small for any size while several chunks are in flight (Note [Direct exchange]).
  // At least two chunks from 512 KiB up, so the reduction of the first overlaps the transfer of
  // the second (measured: 1 MiB as 2 x 512 KiB beats one 1 MiB message by ~25%).
  const size_t bytes = count * elementSize;
  const size_t effectiveChunk = std::min(chunkBytes, std::max(bytes / 2, kMinDirectChunkBytes));
  const size_t chunkElems = std::max<size_t>(1, effectiveChunk / elementSize);
  const size_t chunkLen = std::min(count, chunkElems) * elementSize;
  const size_t chunks = (count + chunkElems - 1) / chunkElems;
  const size_t window = std::min(chunks, kDirectWindow);
  uint8_t* base = scratch.reserve(chunkLen * (window * npeers + 1));
  uint8_t* accumulator = base + chunkLen * window * npeers;
  auto scratchOf = [&](size_t chunk, size_t p) {
    return base + chunkLen * ((chunk % window) * npeers + p);
  };
  auto elemsOf = [&](size_t chunk) { return std::min(chunkElems, count - chunk * chunkElems); };

  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> recvs(chunks * npeers);
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends(chunks * npeers);
  auto postRecvs = [&](size_t chunk) {
    for (size_t p = 0; p < npeers; ++p) {
      auto& r = recvs[chunk * npeers + p];
      r = ctx.createUnboundBuffer(scratchOf(chunk, p), elemsOf(chunk) * elementSize);
      r->recv(peers[p], slot);
    }
  };
  // Sends first: each is then written by Gloo's event loop once the peer's receive is posted,
  // never by this thread (see Note [Gloo's event loop and the scheduler]).
  for (size_t k = 0; k < chunks; ++k) {
    for (size_t p = 0; p < npeers; ++p) {
      auto& snd = sends[k * npeers + p];
      snd = ctx.createUnboundBuffer(out + k * chunkElems * elementSize, elemsOf(k) * elementSize);
      snd->send(peers[p], slot);
    }
  }
  for (size_t k = 0; k < window; ++k) postRecvs(k);

  std::vector<const uint8_t*> contributions(n);
  for (size_t k = 0; k < chunks; ++k) {
    for (size_t p = 0; p < npeers; ++p) {
      waitOne(*recvs[k * npeers + p], /*receive=*/true, peers[p], call.interrupt, deadline);
    }
    // This rank's chunk has left (the kernel copied it) before the result overwrites it.
    for (size_t p = 0; p < npeers; ++p) {
      waitOne(*sends[k * npeers + p], /*receive=*/false, peers[p], call.interrupt, deadline);
    }
    uint8_t* chunkOut = out + k * chunkElems * elementSize;
    for (int r = 0, p = 0; r < n; ++r) {
      contributions[r] = (r == me) ? chunkOut : scratchOf(k, static_cast<size_t>(p++));
    }
    reduceInRankOrder(contributions, chunkOut, accumulator, elemsOf(k), reduce);
    recvs[k * npeers].reset();
    if (k + window < chunks) postRecvs(k + window);  // its scratch slot is free now
  }
}

void allreduceRing(const GlooCall& call, void* data, size_t count, size_t elementSize,
                   ReduceFn reduce, size_t segmentBytes) {
  gloo::AllreduceOptions opts(call.context);
  auto buffer = call.context->createUnboundBuffer(data, count * elementSize);
  switch (elementSize) {
    case 1: opts.setOutput<uint8_t>(std::move(buffer)); break;
    case 2: opts.setOutput<uint16_t>(std::move(buffer)); break;
    case 4: opts.setOutput<uint32_t>(std::move(buffer)); break;
    default: opts.setOutput<uint64_t>(std::move(buffer)); break;
  }
  opts.setReduceFunction(reduce);
  opts.setMaxSegmentSize(segmentBytes);
  opts.setTag(call.tag);
  opts.setTimeout(call.timeout);
  gloo::allreduce(opts);
}

void reduceScatterDirect(const GlooCall& call, const void* send, void* recv, size_t count,
                         size_t elementSize, ReduceFn reduce, Scratch& scratch) {
  gloo::Context& ctx = *call.context;
  const int n = ctx.size;
  const int me = ctx.rank;
  const size_t bytes = count * elementSize;
  const auto deadline = Clock::now() + call.timeout;
  const uint64_t slot = gloo::Slot::build(kReduceScatterPrefix, call.tag);
  const auto peers = peersOf(ctx);
  const uint8_t* input = static_cast<const uint8_t*>(send);

  uint8_t* base = scratch.reserve(bytes * (static_cast<size_t>(n) + 1));
  // Sends first, as in allreduceDirect (Note [Gloo's event loop and the scheduler]).
  PeerBuffers bufs;
  for (int peer : peers) {
    // Gloo only reads from a buffer it sends.
    bufs.send.push_back(ctx.createUnboundBuffer(const_cast<uint8_t*>(input) + bytes * peer, bytes));
    bufs.send.back()->send(peer, slot);
  }
  for (int peer : peers) {
    bufs.recv.push_back(ctx.createUnboundBuffer(base + bytes * peer, bytes));
    bufs.recv.back()->recv(peer, slot);
  }
  waitAll(bufs, peers, call.interrupt, deadline);

  std::vector<const uint8_t*> contributions(n);
  for (int r = 0; r < n; ++r) {
    contributions[r] = (r == me) ? input + bytes * me : base + bytes * r;
  }
  reduceInRankOrder(contributions, static_cast<uint8_t*>(recv), base + bytes * n, count, reduce);
}

void broadcastGloo(const GlooCall& call, void* data, size_t bytes, int root) {
  gloo::BroadcastOptions opts(call.context);
  opts.setOutput(static_cast<uint8_t*>(data), bytes);
  opts.setRoot(root);
  opts.setTag(call.tag);
  opts.setTimeout(call.timeout);
  gloo::broadcast(opts);
}

void allgatherGloo(const GlooCall& call, const void* send, void* recv, size_t bytes) {
  gloo::AllgatherOptions opts(call.context);
  opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(send)), bytes);
  opts.setOutput(static_cast<uint8_t*>(recv), bytes * call.context->size);
  opts.setTag(call.tag);
  opts.setTimeout(call.timeout);
  gloo::allgather(opts);
}

void barrierGloo(const GlooCall& call) {
  gloo::BarrierOptions opts(call.context);
  opts.setTag(call.tag);
  opts.setTimeout(call.timeout);
  gloo::barrier(opts);
}

std::vector<Fingerprint> allgatherFingerprints(const GlooCall& call, const Fingerprint& mine) {
  gloo::Context& ctx = *call.context;
  std::vector<Fingerprint> all(ctx.size);
  all[ctx.rank] = mine;
  if (ctx.size == 1) return all;
  // A fixed slot: fingerprints match in order even when ranks disagree on the sequence number,
  // which is exactly what the check must see.
  const uint64_t slot = gloo::Slot::build(kFingerprintPrefix, 0);
  const auto deadline = Clock::now() + call.timeout;
  const auto peers = peersOf(ctx);
  const size_t bytes = sizeof(Fingerprint);
  PeerBuffers bufs;
  for (int peer : peers) {
    bufs.recv.push_back(ctx.createUnboundBuffer(&all[peer], bytes));
    bufs.recv.back()->recv(peer, slot);
  }
  for (int peer : peers) {
    bufs.send.push_back(ctx.createUnboundBuffer(&all[ctx.rank], bytes));
    bufs.send.back()->send(peer, slot);
  }
  waitAll(bufs, peers, call.interrupt, deadline);
  return all;
}

}  // namespace dtrain::comm
