#!/usr/bin/env python3
"""docs.layering: the include graph keeps the layers of docs/design.md (Layout).

Reads every `#include` of launcher/, runtime/ (base, comm, torch and its folders, include/) and
examples/, resolves each quoted one to a file as the compiler would (the including file's folder,
then the include directories of the CMake targets), and fails, one line per include, on
  - an include that runs up a layer (LAYERS below: a folder includes only what is under it);
  - an include of a sibling folder on the same layer, or of another folder's internal header
    (INTERNAL below), unless SEAMS lists it;
  - `launch` (launcher/) reaching past dtrain_base (comm, torch) or any torch/CUDA/NCCL/Gloo
    header: it links dtrain_base only, so it starts on a node without CUDA or libtorch;
  - a torch header in the torch-free layers (runtime/base, runtime/comm and their public headers),
    and a CUDA/NCCL/Gloo header in runtime/base;
  - a quoted include that resolves to no file (and is not a generated header);
  - a seam that no include uses any more (remove it from SEAMS).

Usage: layering_test.py [SOURCE_DIR]   (default: the repository this script is in)
       layering_test.py --self-test     (the checks fail on a small tree that breaks each rule)
"""

import os
import re
import sys
import tempfile

# Units, bottom to top: (rank, path prefix, what it is). A file belongs to the longest prefix that
# names it. A unit includes only units of a lower rank; units of one rank are siblings (SEAMS).
LAYERS = [
    (0, "runtime/include/dtrain/base/", "dtrain_base's public headers"),
    (1, "runtime/base/", "dtrain_base: store, errors, logging, metrics, checkpoint format"),
    (2, "runtime/include/dtrain/comm/", "dtrain_comm's public headers"),
    (3, "runtime/comm/", "dtrain_comm: communicators (gloo, nccl, shm), world, collectives"),
    (4, "runtime/include/dtrain/torch/", "libdtrain's public headers"),
    (5, "runtime/include/dtrain/dtrain.h", "the one public include"),
    (6, "runtime/torch/", "the torch layer's shared internals (torch_compat.h, ...)"),
    (7, "runtime/torch/state/", "what a job's state is (TrainingState's registry)"),
    (8, "runtime/torch/checkpoint/", "checkpoints of model and optimizer state"),
    (8, "runtime/torch/ddp/", "DistributedDataParallel"),
    (8, "runtime/torch/recompute/", "activation recomputation"),
    (8, "runtime/torch/zero/", "ZeRO sharding"),
    (9, "examples/", "the sample trainers and their helpers"),
    # `launch`, on top of dtrain_base only (LAUNCH_REACHES).
    (10, "launcher/", "launch's shared headers: exit codes, seconds, directory entries"),
    (11, "launcher/config/", "what launch was asked to do: options, parsed, validated (pure)"),
    (12, "launcher/node/", "what one node makes of it: program, worker env, probe, NCCL env"),
    (13, "launcher/supervisor/", "one node's workers: start, watch, stop, restart, report"),
    (13, "launcher/monitor/", "what watches the job: samplers, metrics, stall detection"),
    (14, "launcher/job/", "the one-node job (runJob)"),
    (14, "launcher/cluster/plan/", "multi-node: the plan, resolved before anything starts"),
    (14, "launcher/cluster/remote/", "multi-node: ssh command lines and sessions"),
    (15, "launcher/cluster/protocol/", "multi-node: master <-> agent (store keys, stdin plan)"),
    (16, "launcher/cluster/master/", "multi-node: the master (coordinator, fan-out)"),
    (16, "launcher/cluster/agent/", "multi-node: a node's agent (rounds, heartbeats)"),
    (17, "launcher/cluster/", "the multi-node job (runMultiNode, --check)"),
    (18, "launcher/main.cpp", "launch's main()"),
]

# The one-node job and the multi-node job are two drivers side by side: neither includes the other.
SEPARATE = [("launcher/job/", "launcher/cluster/")]

# Units whose headers are internal: another unit includes one only through a seam (their public
# headers are under runtime/include/). Every launcher folder's headers are open to the layers above.
INTERNAL = ["runtime/base/", "runtime/comm/", "runtime/torch/"]

# The allowed seams: (including path prefix, included path prefix, why). Each must be in use.
SEAMS = [
    # dtrain_base's internal headers that the rest of the tree shares (CMake makes them visible).
    ("runtime/comm/", "runtime/base/parse_int.h", "one integer rule everywhere"),
    ("runtime/torch/", "runtime/base/parse_int.h", "one integer rule everywhere"),
    ("launcher/", "runtime/base/parse_int.h", "one integer rule everywhere"),
    ("runtime/comm/", "runtime/base/env_contract.h", "the worker environment's names"),
    ("runtime/torch/", "runtime/base/env_contract.h", "the worker environment's names"),
    ("launcher/", "runtime/base/env_contract.h",
     "the worker environment's names: launch writes what the runtime reads"),
    ("runtime/comm/", "runtime/base/byte_layout.h", "little-endian encoding of wire records"),
    ("runtime/comm/", "runtime/base/membership.h",
     "membership epochs: the runtime reads what the master writes"),
    ("runtime/torch/", "runtime/base/byte_layout.h", "little-endian checkpoint records"),
    ("runtime/comm/", "runtime/base/net/", "sockets and network interfaces"),
    ("launcher/", "runtime/base/net/", "sockets and network interfaces (ports, --check)"),
    ("launcher/", "runtime/base/text.h", "quoting user values in messages"),
    ("runtime/comm/", "runtime/base/fault.h", "DTRAIN_FAULT: the collectives' faults"),
    ("runtime/torch/", "runtime/base/fault.h", "DTRAIN_FAULT: nan-grad, a step's faults"),
    ("launcher/", "runtime/base/fault.h", "signalName(): the names of signals in messages"),
    ("launcher/", "runtime/base/membership.h",
     "membership epochs: the master writes what the runtime reads"),
    ("runtime/torch/checkpoint/", "runtime/base/checkpoint/",
     "the checkpoint file format, I/O and agreement, written by the torch layer"),
    ("runtime/torch/zero/", "runtime/base/checkpoint/format.h",
     "a shard's records in the checkpoint format"),
    # The torch layer's shared internals, for its folders.
    ("runtime/torch/", "runtime/torch/torch_compat.h",
     "every libtorch version difference in one place"),
    ("runtime/torch/", "runtime/torch/optimizer_state.h",
     "libtorch optimizer state, read by checkpoint/ and zero/"),
    # Between the torch layer's folders.
    ("runtime/torch/checkpoint/", "runtime/torch/state/registry.h",
     "a checkpoint saves and restores what the job's TrainingState registered"),
    ("runtime/torch/zero/", "runtime/torch/ddp/gradient_sync.h",
     "the one seam between DDP and ZeRO: the sharded gradient path is a GradientSync"),
    ("runtime/torch/zero/", "runtime/torch/ddp/backward_pass.h",
     "what DDP's reducer and ZeRO's backward share of a synchronised backward pass"),
    ("runtime/torch/zero/", "runtime/torch/ddp/nan_grad_fault.h",
     "DTRAIN_FAULT=nan-grad on both gradient paths"),
    ("runtime/torch/zero/", "runtime/torch/ddp/buffer_tensor.h",
     "tensors over communicator memory: DDP's buckets, ZeRO's flat parameters"),
    ("runtime/torch/zero/", "runtime/torch/ddp/model_sync.h",
     "the same model check and broadcast as DDP before sharding"),
    ("runtime/torch/ddp/", "runtime/torch/zero/built_unit.h",
     "DdpCore hands a fullyShard() unit to the stage-3 ShardedOptimizer"),
    ("runtime/torch/checkpoint/", "runtime/torch/zero/shard_group.h",
     "a stage-3 checkpoint reads and writes the units' shards"),
    # Between the launcher's folders of one layer.
    ("launcher/monitor/", "launcher/supervisor/job_observer.h",
     "the observer interface the monitor implements, so the supervisor needs no monitor"),
]

# `launch` links dtrain_base only: what launcher/ may include besides itself.
LAUNCH_REACHES = ["launcher/", "runtime/base/", "runtime/include/dtrain/base/", "<generated>"]
TORCH_FREE = ["runtime/base/", "runtime/include/dtrain/base/", "runtime/comm/",
              "runtime/include/dtrain/comm/", "launcher/"]
DEVICE_FREE = ["runtime/base/", "runtime/include/dtrain/base/", "launcher/"]
TORCH_HEADER = re.compile(r"(torch|ATen|c10|caffe2)/")
DEVICE_HEADER = re.compile(r"(cuda|cudnn|cublas|cufft|curand|nccl|nvml|nvToolsExt)[a-z_]*\.h$"
                           r"|(gloo|cub|thrust|cuda)/")

SCANNED = ["launcher", "runtime/base", "runtime/comm", "runtime/torch", "runtime/include",
           "examples"]
# The include directories of the targets that compile them (runtime/*/*.cmake, launcher.cmake,
# examples.cmake), in no particular order: one file per name is all the tree has.
INCLUDE_DIRS = ["", "runtime/include", "runtime/base", "runtime/comm", "runtime/comm/shm",
                "runtime/comm/nccl", "runtime/comm/gloo", "examples"]
# Headers CMake writes at configure time (DTRAIN_GENERATED_INCLUDE).
GENERATED = {"dtrain/config.h": "runtime/include/dtrain/base/"}
SOURCE_EXT = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def unit_of(path):
    best = None
    for rank, prefix, _ in LAYERS:
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            if best is None or len(prefix) > len(best[1]):
                best = (rank, prefix)
    return best


def layer_text(unit):
    rank, prefix = unit
    what = next(w for r, p, w in LAYERS if p == prefix)
    return f"{prefix} (layer {rank}: {what})"


def starts(path, prefixes):
    return any(path.startswith(p) for p in prefixes)


def resolve(root, src, name):
    for base in [os.path.dirname(src)] + INCLUDE_DIRS:
        cand = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def check(root, seams_in_use=True):
    problems = []
    used = set()
    files = []
    for top in SCANNED:
        for d, dirs, names in os.walk(os.path.join(root, top)):
            dirs.sort()
            for n in sorted(names):
                if n.endswith(SOURCE_EXT):
                    files.append(os.path.relpath(os.path.join(d, n), root))

    def fail(src, line, text, rule, hint):
        problems.append(f"{src}:{line}: {text}: {rule}. HINT: {hint}")

    for src in files:
        me = unit_of(src)
        if me is None:
            continue
        with open(os.path.join(root, src), errors="replace") as f:
            lines = f.readlines()
        for n, raw in enumerate(lines, 1):
            m = INCLUDE.match(raw)
            if not m:
                continue
            kind, name = m.groups()
            text = f"#include {kind}{name}{'>' if kind == '<' else kind}"
            if kind == "<":
                if starts(src, TORCH_FREE) and TORCH_HEADER.match(name):
                    fail(src, n, text, f"{me[1]} is torch-free",
                         "torch code belongs in runtime/torch/ (libdtrain); launch and "
                         "dtrain_base/dtrain_comm must build and run without libtorch")
                elif starts(src, DEVICE_FREE) and DEVICE_HEADER.match(name):
                    fail(src, n, text, f"{me[1]} is free of CUDA, NCCL and Gloo headers",
                         "launch and dtrain_base start on a node without CUDA libraries: put "
                         "device code in runtime/comm/ (behind a DTRAIN_WITH_* macro)")
                continue
            target = resolve(root, src, name)
            if target is None and name in GENERATED:
                target = "<generated>"
                tu = unit_of(GENERATED[name])
            elif target is None:
                fail(src, n, text, "resolves to no file of the tree",
                     "fix the path (relative to the including file, or to an include directory "
                     "of tests/scripts/layering_test.py's INCLUDE_DIRS)")
                continue
            else:
                tu = unit_of(target)
            if src.startswith("launcher/") and not starts(target, LAUNCH_REACHES):
                fail(src, n, text, "launch links dtrain_base only",
                     "keep launch free of dtrain_comm and libtorch (it starts on nodes without "
                     "CUDA); move what it needs into runtime/base or launcher/")
                continue
            if tu is None or tu[1] == me[1]:
                continue
            seam = next((s for s in SEAMS if src.startswith(s[0]) and target.startswith(s[1])),
                        None)
            if seam:
                used.add(seam[:2])
            sep = next(((a, b) for a, b in SEPARATE
                        if (me[1].startswith(a) and tu[1].startswith(b))
                        or (me[1].startswith(b) and tu[1].startswith(a))), None)
            if sep:
                fail(src, n, text, f"{sep[0]} and {sep[1]} are separate drivers",
                     "move what both use down (launcher/node, launcher/monitor, ...)")
            elif tu[0] > me[0]:
                fail(src, n, text,
                     f"runs up a layer: {layer_text(me)} includes {layer_text(tu)}",
                     "move what it needs down into a lower layer (a type into its own header), "
                     "or the code that needs it up; the order is LAYERS in "
                     "tests/scripts/layering_test.py")
            elif seam:
                continue
            elif tu[0] == me[0]:
                fail(src, n, text,
                     f"crosses into a sibling: {layer_text(me)} includes {layer_text(tu)}",
                     "move the shared part down a layer, or, if this is a seam the design "
                     "wants, add it with its reason to SEAMS in tests/scripts/layering_test.py")
            elif starts(tu[1], INTERNAL) and target != "<generated>":
                fail(src, n, text, f"reaches into {tu[1]}'s internal headers",
                     "use its public header under runtime/include/dtrain/, or add the seam "
                     "with its reason to SEAMS in tests/scripts/layering_test.py")
    for s in SEAMS if seams_in_use else []:
        if s[:2] not in used:
            problems.append(f"tests/scripts/layering_test.py: the seam {s[0]} -> {s[1]} ({s[2]}) "
                            "is used by no include. HINT: remove it from SEAMS")
    return problems, len(files)


def self_test():
    cases = {
        "launcher/config/a.h": '#include "launcher/node/b.h"\n',  # up a layer
        "launcher/node/b.h": "",
        "launcher/job/c.cpp": '#include "launcher/cluster/agent/d.h"\n',  # the other driver
        "launcher/cluster/agent/d.h": '#include "launcher/cluster/master/e.h"\n',  # sibling
        "launcher/cluster/master/e.h": '#include "runtime/comm/f.h"\n',  # past dtrain_base
        "launcher/monitor/g.h": "#include <cuda_runtime.h>\n",  # device header in launch
        "runtime/comm/f.h": "#include <torch/torch.h>\n",  # torch in a torch-free layer
        "examples/h.cpp": '#include "runtime/torch/i.h"\n#include "missing.h"\n',  # internal
        "runtime/torch/i.h": "",
        # the training state under the checkpointer that saves it
        "runtime/torch/state/j.h": '#include "runtime/torch/checkpoint/k.h"\n',
        "runtime/torch/checkpoint/k.h": "",
    }
    expect = ["launcher/config/a.h:1: ", "launcher/job/c.cpp:1: ", "launcher/cluster/agent/d.h:1: ",
              "launcher/cluster/master/e.h:1: ", "launcher/monitor/g.h:1: ",
              "runtime/comm/f.h:1: ", "examples/h.cpp:1: ", "examples/h.cpp:2: ",
              "runtime/torch/state/j.h:1: "]
    with tempfile.TemporaryDirectory() as root:
        for path, text in cases.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        problems, _ = check(root, seams_in_use=False)
    missing = [e for e in expect if not any(p.startswith(e) for p in problems)]
    for p in problems:
        print("  (expected) " + p)
    if missing:
        print("layering self-test: no failure reported for " + ", ".join(missing))
        return 1
    print(f"layering self-test: all {len(expect)} violations reported")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    problems, count = check(os.path.abspath(root))
    for p in problems:
        print(p)
    if problems:
        print(f"docs.layering: {len(problems)} problem(s) in the include graph of {count} files "
              "(the layers: docs/design.md, Layout)")
        return 1
    print(f"docs.layering: {count} files, every include keeps the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
