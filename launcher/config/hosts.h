#pragma once
// Host lists of a multi-node job, as pure functions of text: DeepSpeed/MPI hostfiles
// (`host slots=N`), `--hosts a,b` / `--hosts a:4,b:4`, DeepSpeed's `--include` / `--exclude`
// (`host`, `host:0,2`, several joined by '@'), and Slurm's compressed node lists
// (`gpu[01-04,07],login1`). Nothing here resolves a name or touches the machine.

#include <string>
#include <vector>

namespace dtrain::launcher {

constexpr int kMaxSlotsPerHost = 4096;

// One node of the job. `slots` is the worker count the list gave it (0: not given, the node runs
// --nproc-per-node workers); `gpus` are the device slots chosen by --include / --exclude (empty:
// CUDA_VISIBLE_DEVICES is inherited). When `gpus` is not empty its size is the worker count.
struct HostEntry {
  std::string host;
  int slots = 0;
  std::vector<int> gpus;
  bool operator==(const HostEntry& o) const {
    return host == o.host && slots == o.slots && gpus == o.gpus;
  }
};

// A hostfile: one host a line, `host [slots=N]`, `#` comments, blank lines. `source` names the
// file in errors ("hostfile hosts.txt"); a duplicate host or a bad line is an InvalidArgument
// naming the line number.
std::vector<HostEntry> parseHostfile(const std::string& text, const std::string& source);

// --hosts: "a,b,c" or "a:4,b:4" (slots after the colon). Duplicates are refused.
std::vector<HostEntry> parseHostsOption(const std::string& text, const std::string& label);

// One --include / --exclude term: a host and, optionally, the slots named after it.
struct HostFilterTerm {
  std::string host;
  std::vector<int> slots;  // empty: the whole host
};
// "worker-0@worker-1:0,2" -> {worker-0}, {worker-1, [0, 2]}.
std::vector<HostFilterTerm> parseHostFilter(const std::string& text, const std::string& label);

// Applies DeepSpeed's rules: --include keeps only the named hosts (and, where slots are named,
// only those slots); --exclude removes named hosts, or named slots of a host. A filter that names
// a host not in the list, a slot the host does not have, or that leaves no host is an
// InvalidArgument. Slots of a host without `slots=N` are 0..defaultSlots-1. A host whose slots
// were narrowed gets them in `gpus` (its CUDA_VISIBLE_DEVICES).
std::vector<HostEntry> applyHostFilters(std::vector<HostEntry> hosts,
                                        const std::vector<HostFilterTerm>& include,
                                        const std::vector<HostFilterTerm>& exclude,
                                        int defaultSlots, const std::string& includeLabel,
                                        const std::string& excludeLabel);

// Slurm's compressed node list ("gpu[01-04,07],cpu-[1-2]-x", SLURM_JOB_NODELIST) expanded in
// order, without scontrol: ranges keep their zero padding; several bracket groups in one name
// multiply out. Throws InvalidArgument naming `label` for unbalanced brackets or bad ranges.
std::vector<std::string> expandSlurmNodelist(const std::string& text, const std::string& label);

}  // namespace dtrain::launcher
