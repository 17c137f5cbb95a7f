#!/usr/bin/env python3
"""train_gpt under launch with 2 ranks, the nano model: the loss falls, the ranks end bitwise
equal, the schedule and the metrics are what the flags say, a sample is generated; --zero 1, 2,
3 and --recompute end bitwise equal to DDP; a rank killed mid-run under --zero 3 is restarted
and resumes bitwise; a state_dict saved by PyTorch (benchmarks/gpt/gpt_model.py) starts a run
whose validation loss is PyTorch's, and an export of a run loads into the PyTorch model with
torch.load(weights_only=True) and load_state_dict(strict=True) and gives its validation loss;
--lora trains the adapters only (the base bitwise unchanged, at every stage); against the
PyTorch peer (DDP, FSDP2) every step's loss agrees; bad input exits with one clear message; a
node lost under --on-node-loss continue costs one step and the survivors end bitwise equal; a
node that comes under --on-node-join live is taken into the running job, under DDP and --zero 2,
all ranks ending bitwise equal.

Usage: train_gpt_test.py <build-dir> [test ...]   (tests: train, zero, resume, interop, lora,
peer, usage, node_loss, node_join, node_join_zero; default all)
"""
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

BUILD = os.path.abspath(sys.argv[1])
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.path.join(BUILD, "launch")
TRAINER = os.path.join(BUILD, "train_gpt")
CHECKPOINT = os.path.join(BUILD, "checkpoint")
sys.path.insert(0, os.path.join(SOURCE, "benchmarks", "gpt"))
COMMON = ["--threads", "1", "--log-every", "10", "--sample-tokens", "0"]


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def corpus(path, size=200_000):
    """Deterministic English-like text: words drawn from a small vocabulary by a fixed LCG."""
    words = ("the quick brown fox jumps over a lazy dog while seven wizards quietly box "
             "jugs of liquor and every lazy dwarf packs my box with five dozen jugs").split()
    out, x, length = [], 12345, 0
    while length < size:
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(words[x % len(words)])
        if x % 11 == 0:
            out[-1] += ".\n"
        length += len(out[-1]) + 1
    with open(path, "w") as f:
        f.write(" ".join(out))
    return path


class Run:
    def __init__(self, args, env=None, launch_args=()):
        self.proc = subprocess.Popen([LAUNCH, "--nproc-per-node", "2", *launch_args, TRAINER]
                                     + COMMON + args, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, **(env or {})))
        self.lines = []
        self.reader = threading.Thread(target=self._read)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            sys.stdout.write(line)
            self.lines.append(line.rstrip("\n"))

    def finish(self, timeout=240):
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail(f"launch did not finish within {timeout} s")
        self.reader.join()
        return rc

    def find(self, pattern):
        for line in self.lines:
            m = re.search(pattern, line)
            if m:
                return m
        fail(f"no line matching {pattern!r}")


def run_ok(args, **kw):
    run = Run(args, **kw)
    if run.finish() != 0:
        fail(f"train_gpt {' '.join(args)} failed")
    return run


def fingerprint(run):
    prints = {m.group(1): m.group(2) for line in run.lines
              for m in [re.search(r"fingerprint of rank (\d)'s model: ([0-9a-f]{16})", line)] if m}
    if sorted(prints) != ["0", "1"] or prints["0"] != prints["1"]:
        fail(f"ranks do not agree bitwise: {prints}")
    return prints["0"]


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def val_loss(path, step):
    found = [r["val_loss"] for r in records(path) if "val_loss" in r and r["step"] == step]
    if len(found) != 1:
        fail(f"expected one val_loss record at step {step} in {path}")
    return found[0]


def test_train():
    """60 steps on the default corpus (the fortunes package): the loss falls, the warm-up and
    cosine schedule is in the metrics, validation at 30 and 60, and a sample at the end."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        run = run_ok(["--steps", "60", "--eval-every", "30", "--warmup-steps", "10", "--lr",
                      "2e-3", "--metrics-file", metrics, "--sample-tokens", "64"])
        fingerprint(run)
        losses = [float(m.group(1)) for line in run.lines
                  for m in [re.search(r"step \d+/60  loss ([0-9.]+)", line)] if m]
        if len(losses) != 6 or not losses[-1] < 0.75 * losses[0]:
            fail(f"the loss did not fall to 75% of the first interval's: {losses}")
        steps = [r for r in records(metrics) if "loss" in r]
        if [r["step"] for r in steps] != list(range(1, 61)):
            fail("expected one loss record per step, 1 to 60")
        lrs = [r["lr"] for r in steps]
        if not (math.isclose(lrs[0], 2e-3 / 10) and math.isclose(lrs[9], 2e-3)
                and math.isclose(lrs[59], 2e-4, rel_tol=0.02)
                and lrs[10] > lrs[30] > lrs[59] >= 2e-4 * 0.999):
            fail(f"not a warm-up to 2e-3 over 10 steps and a cosine down to 2e-4: {lrs}")
        for r in steps:
            if not (r["tokens_per_s"] > 0 and r["grad_norm"] > 0):
                fail(f"a step record without its throughput or gradient norm: {r}")
        first, last = val_loss(metrics, 30), val_loss(metrics, 60)
        if not last < first:
            fail(f"validation loss did not fall: {first} -> {last}")
        m = run.find(r"sample:")
        index = run.lines.index(m.string)
        if len("".join(run.lines[index + 1:index + 4])) < 20:
            fail("no sample text after the sample: line")
    print("train: ok")


def test_zero():
    """10 steps on a corpus of the test's. Without clipping, --zero 1, 2, 3 and --zero 3
    --recompute end bitwise equal to DDP (the same arithmetic on the same gradients). With it,
    the norm is summed over shards at ZeRO and over whole tensors at DDP (rounding apart):
    ZeRO-1 and ZeRO-3 end bitwise equal, DDP within 1e-4 of their validation loss. --amp trains
    under DDP and under --zero 3 (blocks gathered in bfloat16) to about the same loss."""
    with tempfile.TemporaryDirectory() as tmp:
        args = ["--steps", "10", "--eval-every", "0", "--data", corpus(os.path.join(tmp, "t"))]
        expected = fingerprint(run_ok(args + ["--clip", "0"]))
        for extra in (["--zero", "1"], ["--zero", "2"], ["--zero", "3"],
                      ["--zero", "3", "--recompute"], ["--recompute"]):
            if fingerprint(run_ok(args + extra + ["--clip", "0"])) != expected:
                fail(f"{' '.join(extra)} does not end bitwise equal to DDP")
        clipped = {}
        for zero in ("0", "1", "3"):
            metrics = os.path.join(tmp, f"clip{zero}.jsonl")
            clipped[zero] = (fingerprint(run_ok(args + ["--zero", zero, "--metrics-file",
                                                         metrics])), val_loss(metrics, 10))
        if clipped["1"][0] != clipped["3"][0]:
            fail("clipped, --zero 1 and --zero 3 do not end bitwise equal")
        if not math.isclose(clipped["0"][1], clipped["3"][1], rel_tol=1e-4):
            fail(f"clipped, DDP and ZeRO end apart: {clipped}")
        amp = {}
        for zero in ("0", "3"):
            metrics = os.path.join(tmp, f"amp{zero}.jsonl")
            fingerprint(run_ok(args + ["--zero", zero, "--amp", "--metrics-file", metrics]))
            amp[zero] = val_loss(metrics, 10)
        if not math.isclose(amp["0"], amp["3"], rel_tol=0.02):
            fail(f"--amp under DDP and --zero 3 end far apart: {amp}")
    print("zero: ok")


def test_resume():
    """--zero 3 with sharded checkpoints every 5 steps: rank 1 SIGKILLed at step 8, launch
    restarts the job, it resumes from step 5 and ends bitwise equal to the uninterrupted run."""
    with tempfile.TemporaryDirectory() as tmp:
        common = ["--steps", "16", "--eval-every", "0", "--zero", "3", "--save-every", "5",
                  "--data", corpus(os.path.join(tmp, "t"))]
        expected = fingerprint(run_ok(common + ["--checkpoint-dir", os.path.join(tmp, "a")]))
        run = run_ok(common + ["--checkpoint-dir", os.path.join(tmp, "b")],
                     env={"DTRAIN_FAULT": "signal:KILL@rank=1,step=8,attempt=0"},
                     launch_args=["--max-restarts", "1"])
        run.find(r"resumed from the checkpoint of step 5 \(")
        if fingerprint(run) != expected:
            fail("the resumed run does not end bitwise equal to the uninterrupted one")
    print("resume: ok")


def loopback_port():
    """A port free on loopback now, for a job's store."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def finish_nodes(procs, outs, seconds=240):
    """Waits for every node's launch (all killed past `seconds`): their exit codes and logs."""
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(seconds))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            fail(f"a node's launch did not finish within {seconds} s")
    logs = []
    for out in outs:
        out.seek(0)
        logs.append(out.read())
        out.close()
    return codes, logs


def test_node_loss():
    """3 nodes of 1 rank each, started by hand on loopback, under --on-node-loss continue: rank 2
    SIGKILLed at step 4 leaves its node behind; the other two are told (epoch 1), discard that
    step, re-form as 2 ranks and train to the end, bitwise equal; launch on node 0 exits 0."""
    port = loopback_port()
    with tempfile.TemporaryDirectory() as tmp:
        data = corpus(os.path.join(tmp, "t"))
        procs, outs = [], []
        for node in range(3):
            out = open(os.path.join(tmp, f"node{node}.log"), "w+")
            outs.append(out)
            procs.append(subprocess.Popen(
                [LAUNCH, "--nnodes", "2:3", "--node-rank", str(node), "--rdzv-endpoint",
                 f"127.0.0.1:{port}", "--nproc-per-node", "1", "--on-node-loss", "continue",
                 "--heartbeat-interval", "0.5", "--heartbeat-timeout", "3", "--grace-period", "5",
                 TRAINER] + COMMON + ["--steps", "10", "--eval-every", "0", "--data", data],
                stdout=out, stderr=subprocess.STDOUT, text=True,
                env=dict(os.environ, DTRAIN_FAULT="signal:KILL@rank=2,step=4")))
        codes, logs = finish_nodes(procs, outs)
        sys.stdout.write(logs[0])
        if codes[0] != 0 or codes[1] != 0:
            fail(f"nodes 0 and 1 should end 0 after going on without node 2: {codes}")
        if not re.search(r"goes on without node 2 .*epoch 1: 2 nodes, 2 ranks", logs[0]):
            fail("node 0's launch did not go on without node 2 in epoch 1")
        if "a node was lost: step 4 runs again on 2 ranks" not in logs[0]:
            fail("the survivors did not run step 4 again on 2 ranks")
        prints = {m.group(1): m.group(2) for log in logs[:2]
                  for m in re.finditer(r"fingerprint of rank (\d)'s model: ([0-9a-f]{16})", log)}
        if sorted(prints) != ["0", "1"] or prints["0"] != prints["1"]:
            fail(f"the survivors do not agree bitwise: {prints}")
    print("node_loss: ok")


def test_node_join(zero=None):
    """Nodes 0 and 1 of 1 rank each start on loopback under --on-node-loss continue
    --on-node-join live (--nnodes 2:3); node 2 comes once they train and is taken into the running
    job (epoch 1): the members finish their step in flight and go on at 3 ranks from the next,
    node 2 starting from their state at their step, and all three end 0 in one round, bitwise
    equal. With `zero` (--zero 2, mirrored every 4 steps) the members re-shard for 3 ranks their
    blocks at that step boundary, node 2 receiving its shards; the
    sharded checkpoints after are of the 3-rank world on every node, and verify."""
    port = loopback_port()
    with tempfile.TemporaryDirectory() as tmp:
        data = corpus(os.path.join(tmp, "t"))
        # Under --zero, sharded checkpoints too: saved by 3 ranks after the join.
        extra = [] if zero is None else ["--zero", zero, "--mirror-every", "4", "--checkpoint-dir",
                                         os.path.join(tmp, "ckpt"), "--save-every", "16"]
        procs, outs = [], []

        def start(node):
            out = open(os.path.join(tmp, f"node{node}.log"), "w+")
            outs.append(out)
            procs.append(subprocess.Popen(
                [LAUNCH, "--nnodes", "2:3", "--node-rank", str(node), "--rdzv-endpoint",
                 f"127.0.0.1:{port}", "--rdzv-timeout", "3", "--nproc-per-node", "1",
                 "--on-node-loss", "continue", "--on-node-join", "live",
                 "--heartbeat-interval", "0.5", "--heartbeat-timeout", "3", "--grace-period", "5",
                 TRAINER] + COMMON + extra + ["--steps", "40", "--eval-every", "0",
                                              "--log-every", "1", "--data", data],
                stdout=out, stderr=subprocess.STDOUT, text=True))

        def stop(why):
            for q in procs:
                q.kill()
            fail(why)

        start(0)
        start(1)
        deadline = time.time() + 120
        while "step 3/" not in open(outs[0].name).read():
            if time.time() > deadline:
                stop("nodes 0 and 1 did not reach step 3 within 120 s")
            time.sleep(0.1)
        start(2)
        codes, logs = finish_nodes(procs, outs)
        sys.stdout.write(logs[0] + logs[2])
        if codes != [0, 0, 0]:
            fail(f"every node should end 0 with node 2 taken in: {codes}")
        if not re.search(r"takes in node 2 .*live .*epoch 1: 3 nodes, 3 ranks", logs[0]):
            fail("node 0's launch did not take node 2 into the running round in epoch 1")
        if "stopping round" in logs[0] or not re.search(r"a node joined: step (\d+) runs "
                                                        r"(?:again )?on 3 ranks", logs[0]):
            fail("the members did not go on at 3 ranks in the same round")
        rerun = re.search(r"a node joined: step (\d+) runs", logs[0]).group(1)
        if f"rank 2 joined the running job at step {rerun} on 3 ranks" not in logs[2]:
            fail(f"node 2 did not join at the members' step {rerun}")
        prints = {m.group(1): m.group(2) for log in logs
                  for m in re.finditer(r"fingerprint of rank (\d)'s model: ([0-9a-f]{16})", log)}
        if sorted(prints) != ["0", "1", "2"] or len(set(prints.values())) != 1:
            fail(f"the three ranks do not agree bitwise: {prints}")
        if zero is not None:
            # None: the members re-shard their blocks at the step boundary after the join is
            # ready (a rank past it when it saw the join: the step in flight again, or the
            # steps since the last mirror when it was in the optimizer step).
            m = re.search(r"restored from the mirrors on 3 ranks \(1 of them joined\) in .*; "
                          r"(\d+) step\(s\) run again", logs[0])
            if not m:
                fail("rank 0 did not restore the sharded state for 3 ranks, 1 of them joined")
            if not 0 <= int(m.group(1)) <= 4:
                fail(f"the members ran {m.group(1)} steps again, more than the mirror interval")
            # The last save is of the 3-rank world, node 2's shards among them, and whole.
            listed = subprocess.run([CHECKPOINT, "list", os.path.join(tmp, "ckpt")], text=True,
                                    capture_output=True).stdout
            last = re.findall(r"step-00000040  epoch \d+  world (\d)", listed)
            if last != ["3", "3", "3"]:
                fail(f"step 40 was not saved by the 3-rank world on every node:\n{listed}")
            verify = subprocess.run([CHECKPOINT, "verify", os.path.join(tmp, "ckpt")], text=True,
                                    capture_output=True)
            if verify.returncode != 0:
                fail(f"checkpoint verify failed:\n{verify.stdout}{verify.stderr}")
    print("node_join" + ("" if zero is None else f" --zero {zero}") + ": ok")


def peer_val_loss(model, text_path, val_fraction=0.1, batches=16, ranks=2):
    import torch
    from gpt_model import validation_windows
    data = open(text_path, "rb").read()
    val = data[len(data) - int(len(data) * val_fraction):]
    x, y = validation_windows(val, model.config.context, batches, ranks)
    model.eval()
    with torch.no_grad():
        logits = model(x)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                             reduction="sum").item() / y.numel()


def test_interop():
    """A state_dict saved by PyTorch starts train_gpt (--init-from) at PyTorch's validation
    loss; an export of the run's checkpoint loads back into the PyTorch model (weights_only,
    strict) and gives the run's final validation loss."""
    import torch
    from gpt_model import GPT, GPTConfig
    with tempfile.TemporaryDirectory() as tmp:
        text = corpus(os.path.join(tmp, "t"))
        torch.manual_seed(7)
        peer = GPT(GPTConfig.preset("nano"))
        init = os.path.join(tmp, "init.pt")
        torch.save(peer.state_dict(), init)
        metrics = os.path.join(tmp, "m.jsonl")
        run_ok(["--steps", "0", "--data", text, "--init-from", init, "--metrics-file", metrics])
        want, got = peer_val_loss(peer, text), val_loss(metrics, 0)
        if not math.isclose(got, want, rel_tol=1e-5):
            fail(f"train_gpt from PyTorch's state_dict: validation loss {got}, PyTorch {want}")
        metrics = os.path.join(tmp, "trained.jsonl")
        run_ok(["--steps", "12", "--eval-every", "0", "--data", text, "--init-from", init,
                "--zero", "2", "--checkpoint-dir", os.path.join(tmp, "ckpt"),
                "--metrics-file", metrics])
        exported = os.path.join(tmp, "model.pt")
        out = subprocess.run([CHECKPOINT, "export", os.path.join(tmp, "ckpt"), "--to", exported],
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            fail(f"checkpoint export failed: {out.stdout}{out.stderr}")
        state = torch.load(exported, weights_only=True)
        trained = GPT(GPTConfig.preset("nano"))
        trained.load_state_dict(state, strict=True)
        want, got = val_loss(metrics, 12), peer_val_loss(trained, text)
        if not math.isclose(got, want, rel_tol=1e-5):
            fail(f"the exported model in PyTorch: validation loss {got}, train_gpt's {want}")
    print("interop: ok")


def test_lora():
    """--lora 4 from a PyTorch base at stages 0, 2 and 3 (3: the frozen base sharded too): only
    the adapters are trained (the banner counts them), the exported base is bitwise the
    state_dict it started from, the adapters moved, and the stages end bitwise equal."""
    import torch
    from gpt_model import GPT, GPTConfig
    with tempfile.TemporaryDirectory() as tmp:
        text = corpus(os.path.join(tmp, "t"))
        torch.manual_seed(3)
        base = GPT(GPTConfig.preset("nano")).state_dict()
        init = os.path.join(tmp, "base.pt")
        torch.save(base, init)
        adapters = sum(p.numel() for n, p in GPT(GPTConfig(lora=4)).named_parameters()
                       if "lora_" in n)
        prints = []
        for zero in ("0", "2", "3"):
            ckpt = os.path.join(tmp, "ckpt" + zero)
            run = run_ok(["--steps", "8", "--eval-every", "0", "--data", text, "--lora", "4",
                          "--lr", "1e-2", "--clip", "0", "--init-from", init, "--zero", zero,
                          "--checkpoint-dir", ckpt])
            prints.append(fingerprint(run))
            m = run.find(r"([0-9.]+)M parameters \(([0-9.]+)M trained\)")
            if abs(float(m.group(2)) * 1e6 - adapters) > 5e3:
                fail(f"--zero {zero}: {m.group(2)}M trained, the adapters are {adapters}")
            # Adam's state is 8 bytes per adapter parameter (/ 2 ranks under ZeRO); at stage 3
            # the whole frozen base is sharded, the root's embeddings and ln_f with the blocks
            # (train_gpt marks the model itself as a unit, as FSDP2 shards its root).
            state = run.find(r"model state on rank 0 .*optimizer state ([0-9.]+)")
            want = 8 * adapters / (1 if zero == "0" else 2) / 2**20
            if abs(float(state.group(1)) - want) > 0.01:
                fail(f"--zero {zero}: optimizer state {state.group(1)} MiB, want {want:.3f}")
            if zero == "3":
                frozen = sum(t.numel() * 4 for t in base.values())
                m = run.find(r"frozen: ([0-9.]+) whole, ([0-9.]+) sharded")
                if float(m.group(1)) != 0 or abs(float(m.group(2)) - frozen / 2 / 2**20) > 0.01:
                    fail(f"--zero 3: frozen {m.group(0)}, want none whole and half of the "
                         f"base's {frozen / 2**20:.3f} MiB sharded")
            exported = os.path.join(tmp, f"lora{zero}.pt")
            subprocess.run([CHECKPOINT, "export", ckpt, "--to", exported], check=True,
                           capture_output=True, timeout=60)
            state = torch.load(exported, weights_only=True)
            for name, t in base.items():
                if not torch.equal(state[name], t):
                    fail(f"--zero {zero}: the frozen {name} changed")
            moved = [n for n in state if "lora_b" in n and state[n].abs().max() > 0]
            if len(moved) != 16:
                fail(f"--zero {zero}: expected every lora_b to move from zero, moved: {moved}")
        if len(set(prints)) != 1:
            fail(f"--lora at stages 0, 2, 3 does not end bitwise equal: {prints}")
    print("lora: ok")


def test_peer():
    """train_gpt against its PyTorch 2.14 peer (benchmarks/gpt/gpt_peer.py) on the same model,
    initial weights, batches and schedule, plain SGD in float32: DDP against PyTorch DDP, and
    ZeRO-3 with recompute against FSDP2 (fully_shard per block and on the root) with
    torch.utils.checkpoint, every step's loss and the closing validation loss within 1e-5; under
    bfloat16 autocast, ZeRO-3's blocks gathered in bfloat16 against FSDP2's
    MixedPrecisionPolicy(bfloat16, float32), within 1e-3."""
    import torch
    from gpt_model import GPT, GPTConfig
    with tempfile.TemporaryDirectory() as tmp:
        text = corpus(os.path.join(tmp, "t"))
        torch.manual_seed(11)
        init = os.path.join(tmp, "init.pt")
        torch.save(GPT(GPTConfig.preset("nano")).state_dict(), init)
        common = ["--steps", "8", "--optimizer", "sgd", "--lr", "0.05", "--clip", "0",
                  "--warmup-steps", "2", "--data", text, "--init-from", init]

        def losses(path):
            return [r["loss"] for r in records(path) if "loss" in r]

        for ours, theirs, tolerance in ((["--zero", "0"], ["--mode", "ddp"], 1e-5),
                                        (["--zero", "3", "--recompute"],
                                         ["--mode", "fsdp2", "--recompute"], 1e-5),
                                        (["--zero", "3", "--amp"], ["--mode", "fsdp2", "--amp"],
                                         1e-3)):
            name = "_".join(x.lstrip("-") for x in ours)
            mine = os.path.join(tmp, name + ".jsonl")
            run_ok(common + ours + ["--eval-every", "0", "--metrics-file", mine])
            peer = os.path.join(tmp, name + "-peer.jsonl")
            out = subprocess.run([LAUNCH, "--nproc-per-node", "2", "--python", sys.executable,
                                  os.path.join(SOURCE, "benchmarks", "gpt", "gpt_peer.py")]
                                 + common + theirs + ["--metrics-file", peer],
                                 capture_output=True, text=True, timeout=240)
            if out.returncode != 0:
                fail(f"the peer {' '.join(theirs)} failed:\n{out.stdout}{out.stderr}")
            a, b = losses(mine), losses(peer)
            if len(a) != 8 or len(b) != 8:
                fail(f"{name}: {len(a)} and {len(b)} steps recorded, want 8")
            worst = max(abs(x - y) / y for x, y in zip(a, b))
            if worst > tolerance:
                fail(f"{name} against PyTorch's {' '.join(theirs)}: a loss {worst:.2e} apart "
                     f"(tolerance {tolerance}):\n{a}\n{b}")
            va, vb = val_loss(mine, 8), val_loss(peer, 8)
            if abs(va - vb) / vb > tolerance:
                fail(f"{name} against PyTorch's {' '.join(theirs)}: validation losses {va} and "
                     f"{vb} (tolerance {tolerance})")
            print(f"peer: {name}: losses within {worst:.1e} of PyTorch's {' '.join(theirs)}, "
                  f"validation {abs(va - vb) / vb:.1e}")
    print("peer: ok")


def expect_exit(args, rc_expected, pattern):
    out = subprocess.run([TRAINER] + args, capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    if out.returncode != rc_expected or not re.search(pattern, text):
        fail(f"train_gpt {' '.join(args)}: exit {out.returncode} (want {rc_expected}), output "
             f"without {pattern!r}:\n{text}")
    return text


def test_usage():
    text = expect_exit(["--help"], 0, r"--accum-steps")
    for flag, default in (("preset", "nano"), ("steps", "500"), ("batch-size", "16"),
                          ("lr", "0.001"), ("weight-decay", "0.1"), ("clip", "1"),
                          ("warmup-steps", "50"), ("lora", "0"), ("zero", "0"),
                          ("data", "/usr/share/games/fortunes")):
        if not re.search(rf"--{flag}\b.*\(default: {re.escape(default)}\)", text):
            fail(f"--help does not list --{flag} with its default {default}:\n{text}")
    for flag in ("recompute", "offload", "amp", "init-from", "checkpoint-dir", "metrics-file",
                 "metrics-port", "tensorboard-dir", "sample-tokens", "prompt", "layers", "dim"):
        if f"--{flag}" not in text:
            fail(f"--help does not list --{flag}")
    expect_exit(["--preset", "huge"], 2, r"--preset must be nano, small or gpt2, got 'huge'")
    expect_exit(["--dim", "100", "--heads", "3"], 2, r"--dim \(100\) must be a multiple of "
                r"--heads \(3\)")
    expect_exit(["--zero", "4"], 2, r"--zero must be an integer in \[0, 3\], got '4'")
    expect_exit(["--offload"], 2, r"--offload needs --zero 2 or 3")
    with tempfile.TemporaryDirectory() as tmp:
        run = Run(["--data", os.path.join(tmp, "missing.txt")])
        if run.finish() == 0:
            fail("a missing corpus was accepted")
        run.find(r"cannot read the corpus .*missing\.txt\. HINT: give --data a text file")
        tiny = os.path.join(tmp, "tiny.txt")
        with open(tiny, "w") as f:
            f.write("too short")
        run = Run(["--data", tiny])
        if run.finish() == 0:
            fail("a corpus shorter than a sequence was accepted")
        run.find(r"has 9 bytes: .*HINT: more text, or a shorter --context")
        import torch
        from gpt_model import GPT, GPTConfig
        wide = os.path.join(tmp, "wide.pt")
        torch.save(GPT(GPTConfig(dim=64)).state_dict(), wide)
        run = Run(["--data", corpus(os.path.join(tmp, "t")), "--init-from", wide, "--steps", "1"])
        if run.finish() == 0:
            fail("a state_dict of another shape was accepted")
        run.find(r"--init-from .*wide\.pt: wte\.weight is 256x64 there, 256x128 here\. HINT: the "
                 r"same preset")
    print("usage: ok")


TESTS = {"train": test_train, "zero": test_zero, "resume": test_resume,
         "interop": test_interop, "lora": test_lora, "peer": test_peer, "usage": test_usage,
         "node_loss": test_node_loss, "node_join": test_node_join,
         "node_join_zero": lambda: test_node_join(zero="2")}

if __name__ == "__main__":
    for name in sys.argv[2:] or list(TESTS):
        TESTS[name]()
    print("train_gpt_test: ok")
