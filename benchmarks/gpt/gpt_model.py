"""The GPT of examples/models/gpt.h in PyTorch: the same modules under the same names, the same
shapes and the same initialisation, so that a state_dict saved here (torch.save) loads into
train_gpt (--init-from) and an export of a train_gpt checkpoint loads here with
load_state_dict(strict=True).

  model = GPT(GPTConfig.preset("nano"))
  logits = model(tokens)            # [B, T] int64 -> [B, T, 256]
"""
import dataclasses
import math

import torch
from torch import nn
from torch.nn import functional as F


@dataclasses.dataclass
class GPTConfig:
    vocab: int = 256
    context: int = 128
    layers: int = 4
    heads: int = 4
    dim: int = 128
    dropout: float = 0.0
    lora: int = 0
    lora_alpha: float = 16.0

    @staticmethod
    def preset(name):
        if name == "nano":
            return GPTConfig()
        if name == "small":
            return GPTConfig(context=256, layers=6, heads=6, dim=384)
        if name == "gpt2":
            return GPTConfig(context=1024, layers=12, heads=12, dim=768)
        raise ValueError(f"unknown preset {name!r}: nano, small or gpt2")


class LoraLinear(nn.Module):
    """nn.Linear's weight and bias, with rank-r adapters lora_a, lora_b beside (the base frozen)."""

    def __init__(self, fan_in, fan_out, rank, alpha):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(fan_out, fan_in).normal_(0, 0.02))
        self.bias = nn.Parameter(torch.zeros(fan_out))
        self.scale = 0.0
        if rank > 0:
            self.lora_a = nn.Parameter(torch.empty(rank, fan_in))
            nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
            self.lora_b = nn.Parameter(torch.zeros(fan_out, rank))
            self.weight.requires_grad_(False)
            self.bias.requires_grad_(False)
            self.scale = alpha / rank
        else:
            self.lora_a = self.lora_b = None

    def forward(self, x):
        y = F.linear(x, self.weight, self.bias)
        if self.lora_a is None:
            return y
        return y + F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scale


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.qkv = LoraLinear(c.dim, 3 * c.dim, c.lora, c.lora_alpha)
        self.proj = LoraLinear(c.dim, c.dim, c.lora, c.lora_alpha)
        self.heads = c.heads
        self.dropout = c.dropout

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (part.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for part in self.qkv(x).split(c, 2))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return F.dropout(self.proj(y), self.dropout, self.training)


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc = LoraLinear(c.dim, 4 * c.dim, c.lora, c.lora_alpha)
        self.proj = LoraLinear(4 * c.dim, c.dim, c.lora, c.lora_alpha)
        self.dropout = c.dropout

    def forward(self, x):
        return F.dropout(self.proj(F.gelu(self.fc(x))), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1 = nn.LayerNorm(c.dim)
        self.attn = CausalSelfAttention(c)
        self.ln2 = nn.LayerNorm(c.dim)
        self.mlp = Mlp(c)
        with torch.no_grad():
            scale = 1.0 / math.sqrt(2.0 * c.layers)
            self.attn.proj.weight.mul_(scale)
            self.mlp.proj.weight.mul_(scale)
        if c.lora > 0:
            for p in [*self.ln1.parameters(), *self.ln2.parameters()]:
                p.requires_grad_(False)

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.mlp(self.ln2(h))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        assert c.dim % c.heads == 0, "the width must divide into the heads"
        self.config = c
        self.wte = nn.Embedding(c.vocab, c.dim)
        self.wpe = nn.Embedding(c.context, c.dim)
        with torch.no_grad():
            self.wte.weight.normal_(0, 0.02)
            self.wpe.weight.normal_(0, 0.02)
        self.blocks = nn.Sequential(*[Block(c) for _ in range(c.layers)])
        self.ln_f = nn.LayerNorm(c.dim)
        if c.lora > 0:
            for p in [*self.wte.parameters(), *self.wpe.parameters(), *self.ln_f.parameters()]:
                p.requires_grad_(False)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(t, device=tokens.device))
        x = F.dropout(x, self.config.dropout, self.training)
        x = self.blocks(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # the head tied to the token embedding


def validation_windows(val_bytes, context, batches, ranks):
    """The windows train_gpt's validation reads (Training::evaluateNow): each rank
    max(1, batches // ranks) of them, evenly spread over the validation bytes; inputs, targets."""
    each = max(1, batches // ranks)
    span = len(val_bytes) - context - 1
    data = torch.tensor(list(val_bytes), dtype=torch.long)
    offsets = [(i * span) // (each * ranks) for i in range(each * ranks)]
    seq = torch.stack([data[o:o + context + 1] for o in offsets])
    return seq[:, :-1], seq[:, 1:]
