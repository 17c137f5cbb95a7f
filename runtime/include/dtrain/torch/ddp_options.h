#pragma once
// Options of dtrain::DistributedDataParallel (dtrain/torch/ddp.h), with PyTorch's defaults.

#include <cstddef>

#include "dtrain/comm/communicator.h"
#include "dtrain/torch/detail/bucket_assignment.h"

namespace dtrain {

// How gradients travel. Compression halves the bytes on the wire for float32 gradients: they are
// averaged in float32, rounded to 16 bits, summed across ranks in 16 bits and widened again
// (PyTorch's fp16_compress_hook / bf16_compress_hook). Other dtypes travel uncompressed.
enum class GradientCompression { None, Fp16, Bf16 };

const char* gradientCompressionName(GradientCompression compression);

struct DdpOptions {
  // Bucket limits; see Note [Bucket order] in dtrain/torch/detail/bucket_assignment.h.
  size_t firstBucketBytes = kDefaultFirstBucketBytes;
  size_t bucketBytes = kDefaultBucketBytes;
  // Broadcast the module's buffers (BatchNorm running statistics) from rank 0 before every forward
  // outside noSync(). Every such forward is then a collective: call it on every rank.
  bool broadcastBuffers = true;
  // Allow parameters that get no gradient in an iteration: after each forward the autograd graph
  // is searched from the outputs, and parameters it cannot reach take part with a zero gradient.
  // Costs one graph walk per forward and one small allreduce per backward. Without it, a parameter
  // that gets no gradient fails the backward with an error naming it.
  bool findUnusedParameters = false;
  // Each parameter's .grad lives in its bucket: the gradient is reduced there, with no copy back
  // and no separate memory for the gradients (with shared memory, the bucket is in the segment: the
  // whole step's communication is then one allreduce in place). A gradient zeroed in place
  // (zero_grad(false)) is accumulated into the bucket by autograd, with no copy in either; one
  // reset to undefined (zero_grad(true), libtorch 2.x's default) is created anew by autograd and
  // copied into the bucket once, which costs less than zeroing the bucket and adding into it. On by
  // default, unlike PyTorch's gradient_as_bucket_view: dtrain's gradients are plain tensors over
  // the bucket's memory, not autograd views of it, so PyTorch's caveats (detach_() refused,
  // zero_grad() rewritten) do not apply. The one visible difference: a .grad tensor kept from an
  // earlier step, after .grad was replaced (set to an undefined tensor and recreated by autograd),
  // still shares memory with the bucket and changes with it. false: separate gradient tensors,
  // copied into the buckets and back (PyTorch's default). See docs/design.md "DDP".
  bool gradientAsBucketView = true;
  GradientCompression compression = GradientCompression::None;
  // After the first synchronised backward, rebuild the buckets in the order the gradients arrived
  // (rank 0's), as PyTorch does; see Note [Bucket rebuild] in
  // dtrain/torch/detail/bucket_assignment.h. Not with findUnusedParameters, whose arrival order
  // may change from one iteration to the next.
  bool rebuildBuckets = true;
  // Deadline of every collective DDP waits for; zero: the communicator's (Note [Zero timeouts] in
  // dtrain/base/timeout.h).
  comm::Millis timeout = comm::Millis::zero();
};

}  // namespace dtrain
